"""Time from applying a DisaggregatedDeployment to all of its children being present (local control plane).

Brings up the local control plane (or reuses the one `disagg cluster up` started), installs the CRDs,
runs the operator as a real process (`disagg run --standalone --namespace NS`), then applies N small
deployments one after another and, for each, measures the wall time from the apply request to the moment
the API server has announced every rendered child (Deployments, Services, PDBs, ConfigMaps, RBAC) on a
watch the bench holds open (label ``disagg.dev/deployment``, one per child kind). A watch costs the server
nothing per apply and stamps each child when it is stored; polling with LISTs (``--measure poll``, what
this bench did first) adds its own 13 sequential LISTs to every sample and loads the server while the
operator applies. Each deployment is deleted after it is measured so every apply meets the same cluster.

It does this --runs times (a fresh operator each) at the operator's default apply concurrency and, side
by side, with one request at a time (--baseline-concurrency, DISAGG_APPLY_CONCURRENCY), and prints each
run's p50/p90/p99/max, the spread of p50 and p99 over the runs, the ratio of the two settings and the
target (p99 <= 300 ms for one deployment's children, issue 13).

    .venv/bin/python bench/apply_to_children.py [--applies 50] [--runs 5] [--state-dir DIR] [--keep-cluster]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from disagg.chaos.latency import (
    P99_TARGET_MS,
    ChildName,
    ChildWatch,
    LatencyRun,
    rendered_children,
    settle,
    time_apply,
    wait_deleted,
)
from disagg.cluster.local import LocalCluster, default_state_dir, free_ports
from disagg.demo.scenario import tiny_deployment_manifest
from disagg.k8s.apply import DEPLOYMENT_LABEL
from disagg.k8s.client import (
    CHILD_KINDS,
    CONFIGMAP,
    DEPLOYMENT,
    DISAGG_DEPLOYMENT,
    PDB,
    ROLE,
    ROLEBINDING,
    SERVICE,
    SERVICEACCOUNT,
    Kind,
    KubeApi,
    load_api_client,
)
from disagg.k8s.crds import install_crds

NAMESPACE = Kind("v1", "Namespace", "namespaces", namespaced=False)
# The renderer emits RBAC, ConfigMaps, Services, Deployments, then PDBs: check in reverse.
_LAST_FIRST = (PDB, DEPLOYMENT, SERVICE, CONFIGMAP, ROLEBINDING, ROLE, SERVICEACCOUNT)
CHECK_ORDER = (*_LAST_FIRST, *(k for k in CHILD_KINDS if k not in _LAST_FIRST))


@dataclass(frozen=True)
class BenchSettings:
    applies: int = 50
    runs: int = 5
    baseline_concurrency: int = 1
    measure: str = "watch"  # or "poll"
    settle: bool = True  # wait for each deleted deployment's children and pods to go before the next apply
    poll_interval_s: float = 0.02
    timeout_s: float = 60.0
    operator_start_timeout_s: float = 90.0


def start_operator(
    kubeconfig: Path,
    namespace: str,
    log_path: Path,
    timeout_s: float,
    port: int,
    metrics_port: int,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    command = [
        str(Path(sys.executable).parent / "disagg"),
        "run",
        "--standalone",
        "--namespace",
        namespace,
        "--liveness-endpoint",
        f"http://127.0.0.1:{port}/healthz",
        "--log-level",
        "WARNING",
        "--metrics-host",
        "127.0.0.1",
        "--metrics-port",
        str(metrics_port),
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {}), "KUBECONFIG": str(kubeconfig)},
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the operator exited ({process.returncode}); see {log_path}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
                if response.status == 200:
                    return process
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    process.kill()
    raise SystemExit(f"the operator did not become live within {timeout_s} s; see {log_path}")


def all_present(kube: KubeApi, namespace: str, name: str, want: set[ChildName]) -> bool:
    """Whether every wanted child is listed; kinds the renderer emits last are checked first, so a
    poll while the operator is still applying costs one request (the poll must not load the server)."""
    selector = f"{DEPLOYMENT_LABEL}={name}"
    for kind in CHECK_ORDER:
        wanted = {n for k, n in want if k == kind.kind}
        if not wanted:
            continue
        listed = {obj["metadata"]["name"] for obj in kube.list(kind, namespace, label_selector=selector)}
        if not wanted <= listed:
            return False
    return True


def measure_one(
    kube: KubeApi, namespace: str, name: str, settings: BenchSettings, watch: ChildWatch | None
) -> float:
    manifest = tiny_deployment_manifest(name, namespace)
    if watch is not None:
        elapsed = time_apply(kube, manifest, watch, settings.timeout_s, "disagg-bench")
        if elapsed is None:
            raise SystemExit(f"{name}: children not all announced after {settings.timeout_s} s")
    else:
        want = rendered_children(manifest)
        started = time.perf_counter()
        kube.apply(manifest, field_manager="disagg-bench")
        while not all_present(kube, namespace, name, want):
            if time.perf_counter() - started > settings.timeout_s:
                raise SystemExit(f"{name}: children not all present after {settings.timeout_s} s")
            time.sleep(settings.poll_interval_s)
        elapsed = time.perf_counter() - started
    kube.delete(DISAGG_DEPLOYMENT, namespace, name)
    if settings.settle:
        settle(kube, namespace, settings.timeout_s)
    return elapsed


def reconcile_seconds(metrics_port: int) -> tuple[float, int]:
    """(total seconds, count) of the operator's reconciles, from its own histogram."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("disagg_operator_reconcile_duration_seconds_"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return (
        values.get("disagg_operator_reconcile_duration_seconds_sum", 0.0),
        int(values.get("disagg_operator_reconcile_duration_seconds_count", 0)),
    )


@dataclass(frozen=True)
class Run(LatencyRun):
    reconciles: int = 0
    reconcile_mean_ms: float = float("nan")


def one_run(
    kube: KubeApi,
    kubeconfig: Path,
    namespace: str,
    settings: BenchSettings,
    concurrency: int | None,
    tag: str,
) -> tuple[Run, Path]:
    """A fresh operator (with ``DISAGG_APPLY_CONCURRENCY`` when given), ``settings.applies`` applies."""
    log_path = Path(tempfile.mkdtemp(prefix="disagg-bench-")) / f"operator-{tag}.log"
    port, metrics_port = free_ports(2)  # held together: two distinct ports
    env = {"DISAGG_APPLY_CONCURRENCY": str(concurrency)} if concurrency is not None else None
    operator = start_operator(
        kubeconfig, namespace, log_path, settings.operator_start_timeout_s, port, metrics_port, env
    )
    try:
        with ChildWatch(kube, namespace) if settings.measure == "watch" else nullcontext() as watch:
            samples = [
                measure_one(kube, namespace, f"bench-{tag}-{i}", settings, watch)
                for i in range(settings.applies)
            ]
        total_s, count = reconcile_seconds(metrics_port)
        wait_deleted(kube, namespace, settings.timeout_s)
    finally:
        operator.send_signal(signal.SIGTERM)
        try:
            operator.wait(15)
        except subprocess.TimeoutExpired:
            operator.kill()
    mean_ms = total_s / count * 1000 if count else float("nan")
    return Run([s * 1000 for s in samples], count, mean_ms), log_path


def print_runs(label: str, runs: list[Run]) -> None:
    print(f"{label}")
    print(
        f"{'run':>5} {'p50':>9} {'p90':>9} {'p99':>9} {'max (#apply)':>15} {'first':>9} "
        f"{'p99 rest':>9} {'reconcile':>10}"
    )
    for i, run in enumerate(runs, 1):
        slowest = max(range(len(run.samples_ms)), key=run.samples_ms.__getitem__)
        print(
            f"{i:>5} {run.q(50):>7.0f}ms {run.q(90):>7.0f}ms {run.q(99):>7.0f}ms "
            f"{max(run.samples_ms):>7.0f}ms (#{slowest + 1:>2}) {run.samples_ms[0]:>7.0f}ms "
            f"{run.q_after_first(99):>7.0f}ms {run.reconcile_mean_ms:>8.0f}ms"
        )
    p50s, p99s = [r.q(50) for r in runs], [r.q(99) for r in runs]
    rest = [r.q_after_first(99) for r in runs]
    print(
        f"{'spread':>5} p50 {min(p50s):.0f}-{max(p50s):.0f} ms (median {statistics.median(p50s):.0f}), "
        f"p99 {min(p99s):.0f}-{max(p99s):.0f} ms (median {statistics.median(p99s):.0f}), "
        f"p99 after the first apply {min(rest):.0f}-{max(rest):.0f} ms (median {statistics.median(rest):.0f})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--applies", type=int, default=BenchSettings.applies)
    parser.add_argument("--runs", type=int, default=BenchSettings.runs, help="fresh operators per setting")
    parser.add_argument(
        "--baseline-concurrency",
        type=int,
        default=BenchSettings.baseline_concurrency,
        help="apply concurrency of the side-by-side baseline (0: no baseline)",
    )
    parser.add_argument(
        "--measure",
        choices=("watch", "poll"),
        default=BenchSettings.measure,
        help="how the bench sees the children: a watch per kind (default) or LIST polling",
    )
    parser.add_argument(
        "--no-settle",
        action="store_true",
        help="apply the next deployment while the last one's children and pods are still being deleted",
    )
    parser.add_argument(
        "--state-dir", type=Path, default=None, help="cluster state (default: disagg cluster's)"
    )
    parser.add_argument(
        "--keep-cluster", action="store_true", help="leave a cluster this run started running"
    )
    args = parser.parse_args(argv)
    settings = BenchSettings(
        applies=args.applies,
        runs=args.runs,
        baseline_concurrency=args.baseline_concurrency,
        measure=args.measure,
        settle=not args.no_settle,
    )

    local = LocalCluster(state_dir=args.state_dir or default_state_dir())
    was_running = local.status().running
    info = local.up()
    kube = KubeApi(load_api_client(info.kubeconfig))
    install_crds(kube, timeout_s=60)
    namespace = f"bench-apply-{uuid.uuid4().hex[:6]}"
    kube.create(NAMESPACE, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    default_runs: list[Run] = []
    baseline_runs: list[Run] = []
    logs: list[Path] = []
    try:
        for i in range(settings.runs):  # interleaved, so both settings meet the same machine load
            run, log = one_run(kube, info.kubeconfig, namespace, settings, None, f"d{i}")
            default_runs.append(run)
            logs.append(log)
            if settings.baseline_concurrency > 0:
                run, log = one_run(
                    kube, info.kubeconfig, namespace, settings, settings.baseline_concurrency, f"b{i}"
                )
                baseline_runs.append(run)
                logs.append(log)
    finally:
        kube.delete(NAMESPACE, None, namespace)
        if not was_running and not args.keep_cluster:
            local.down()
    seen = "announced on a watch" if settings.measure == "watch" else "listed (LIST polling)"
    print(
        f"apply -> all children {seen}, {settings.applies} applies a run "
        "(one vLLM+NIXL deployment, 13 children)"
    )
    print_runs("operator defaults", default_runs)
    if baseline_runs:
        print_runs(f"baseline: apply concurrency {settings.baseline_concurrency}", baseline_runs)
        ratio50 = statistics.median(r.q(50) for r in baseline_runs) / statistics.median(
            r.q(50) for r in default_runs
        )
        ratio99 = statistics.median(r.q(99) for r in baseline_runs) / statistics.median(
            r.q(99) for r in default_runs
        )
        print(f"baseline / defaults (median of runs): p50 {ratio50:.2f}x, p99 {ratio99:.2f}x")
    for what, worst in (
        ("every apply", max(r.q(99) for r in default_runs)),
        ("after each operator's first apply", max(r.q_after_first(99) for r in default_runs)),
    ):
        verdict = "met" if worst <= P99_TARGET_MS else "missed"
        print(
            f"target p99 <= {P99_TARGET_MS:.0f} ms, {what}: worst run {worst:.0f} ms "
            f"({worst / P99_TARGET_MS:.2f}x the target): {verdict}"
        )
    print(f"operator logs: {logs[0].parent if logs else '-'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

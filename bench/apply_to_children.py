"""Time from applying a DisaggregatedDeployment to all of its children being present (local control plane).

Brings up the local control plane (or reuses the one `disagg cluster up` started), installs the CRDs,
runs the operator as a real process (`disagg run --standalone --namespace NS`), then applies N small
deployments one after another and, for each, measures the wall time from the apply request to the moment
every rendered child (Deployments, Services, PDBs, ConfigMaps, RBAC) is listed by the API server. Prints
p50/p90/p99/max. Each deployment is deleted after it is measured so every apply meets the same cluster.

    .venv/bin/python bench/apply_to_children.py [--applies 50] [--state-dir DIR] [--keep-cluster]
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
from dataclasses import dataclass
from pathlib import Path

from disagg.api.deployment import DisaggregatedDeployment
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
from disagg.render import render_children

NAMESPACE = Kind("v1", "Namespace", "namespaces", namespaced=False)
# The renderer emits RBAC, ConfigMaps, Services, Deployments, then PDBs: check in reverse.
_LAST_FIRST = (PDB, DEPLOYMENT, SERVICE, CONFIGMAP, ROLEBINDING, ROLE, SERVICEACCOUNT)
CHECK_ORDER = (*_LAST_FIRST, *(k for k in CHILD_KINDS if k not in _LAST_FIRST))


@dataclass(frozen=True)
class BenchSettings:
    applies: int = 50
    poll_interval_s: float = 0.02
    timeout_s: float = 60.0
    operator_start_timeout_s: float = 90.0


def start_operator(
    kubeconfig: Path, namespace: str, log_path: Path, timeout_s: float, port: int, metrics_port: int
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
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "KUBECONFIG": str(kubeconfig)}
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


def all_present(kube: KubeApi, namespace: str, name: str, want: set[tuple[str, str]]) -> bool:
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


def measure_one(kube: KubeApi, namespace: str, name: str, settings: BenchSettings) -> float:
    manifest = tiny_deployment_manifest(name, namespace)
    want = {
        (c["kind"], c["metadata"]["name"])
        for c in render_children(DisaggregatedDeployment.model_validate(manifest))
    }
    started = time.perf_counter()
    kube.apply(manifest, field_manager="disagg-bench")
    while True:
        if all_present(kube, namespace, name, want):
            elapsed = time.perf_counter() - started
            break
        if time.perf_counter() - started > settings.timeout_s:
            raise SystemExit(f"{name}: children not all present after {settings.timeout_s} s")
        time.sleep(settings.poll_interval_s)
    kube.delete(DISAGG_DEPLOYMENT, namespace, name)
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


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def print_table(samples: list[float]) -> None:
    ms = [s * 1000 for s in samples]
    print(f"apply -> all children present, {len(ms)} applies (one vLLM+NIXL deployment, 13 children each)")
    print(f"{'p50':>10} {'p90':>10} {'p99':>10} {'max':>10} {'mean':>10}")
    print(
        f"{percentile(ms, 50):>8.0f}ms {percentile(ms, 90):>8.0f}ms {percentile(ms, 99):>8.0f}ms "
        f"{max(ms):>8.0f}ms {statistics.fmean(ms):>8.0f}ms"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--applies", type=int, default=BenchSettings.applies)
    parser.add_argument(
        "--state-dir", type=Path, default=None, help="cluster state (default: disagg cluster's)"
    )
    parser.add_argument(
        "--keep-cluster", action="store_true", help="leave a cluster this run started running"
    )
    args = parser.parse_args(argv)
    settings = BenchSettings(applies=args.applies)

    local = LocalCluster(state_dir=args.state_dir or default_state_dir())
    was_running = local.status().running
    info = local.up()
    kube = KubeApi(load_api_client(info.kubeconfig))
    install_crds(kube, timeout_s=60)
    namespace = f"bench-apply-{uuid.uuid4().hex[:6]}"
    kube.create(NAMESPACE, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    log_path = Path(tempfile.mkdtemp(prefix="disagg-bench-")) / "operator.log"
    port, metrics_port = free_ports(2)  # held together: two distinct ports
    operator = start_operator(
        info.kubeconfig, namespace, log_path, settings.operator_start_timeout_s, port, metrics_port
    )
    try:
        samples = [measure_one(kube, namespace, f"bench-{i}", settings) for i in range(settings.applies)]
        total_s, count = reconcile_seconds(metrics_port)
    finally:
        operator.send_signal(signal.SIGTERM)
        try:
            operator.wait(15)
        except subprocess.TimeoutExpired:
            operator.kill()
        kube.delete(NAMESPACE, None, namespace)
        if not was_running and not args.keep_cluster:
            local.down()
    print_table(samples)
    if count:
        print(f"operator: {count} full reconciles, mean {total_s / count * 1000:.0f} ms each")
    print(f"operator log: {log_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

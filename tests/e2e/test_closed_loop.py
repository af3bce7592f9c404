"""The closed loop on the local control plane: operator + real Prometheus + live twin + a traffic shift.

Same scenario as ``disagg demo`` (shorter phases): short chat prompts, then long documents. Asserted:
the operator moves the ratio toward prefill, TTFT (from Prometheus) comes back under the SLO, every
move is in status.autoscaling.decisions, Events carry the causes, and the operator's /metrics has
``disagg_decisions_total``.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from disagg.cluster.local import ClusterInfo, NodePool, free_ports, node_manifest
from disagg.demo import (
    ClosedLoop,
    DemoSettings,
    Phase,
    RunSettings,
    drive,
    install_crds,
    summarise,
    wait_until,
    write_report,
)
from disagg.k8s.client import POD, Kind, KubeApi, load_api_client

pytestmark = pytest.mark.timeout(480)

# Shorter than the demo: ~2.5 minutes of traffic; the shift comes early enough to see a recovery. The
# scale-down window outlasts the run, so what is asserted is the move and the recovery, not the shrink.
SCENARIO = DemoSettings(
    phases=(Phase("chat", 30.0, 5.0, 300, 64), Phase("documents", 120.0, 5.0, 12000, 64)),
    scale_down_window_s=300,
)


@contextlib.contextmanager
def running(cluster: ClusterInfo, settings: DemoSettings, tmp_path: Path) -> Iterator[ClosedLoop]:
    """Prometheus, the operator, the scenario's objects and the live twin, stopped afterwards."""
    (port,) = free_ports(1)
    kube = KubeApi(load_api_client(cluster.kubeconfig))
    loop = ClosedLoop(
        cluster, settings, RunSettings(operator_metrics_port=port, log_dir=tmp_path / "logs"), kube
    )
    try:
        install_crds(kube)
        loop.start_prometheus()
        loop.start_operator()
        loop.apply_scenario()
        wait_until(loop.children_ready, 120, "the deployment's children")
        loop.start_twin()
        yield loop
    finally:
        loop.stop()
        for name in ("operator.log", "twin.log"):
            log = tmp_path / "logs" / name
            if log.is_file():
                print(f"--- {name} (tail)\n{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture
def closed_loop(cluster: ClusterInfo, namespace: str, tmp_path: Path) -> Iterator[ClosedLoop]:
    settings = replace(SCENARIO, namespace=namespace, report_dir=tmp_path / "report")
    with running(cluster, settings, tmp_path) as loop:
        yield loop


def test_closed_loop_moves_toward_prefill_and_recovers(closed_loop: ClosedLoop) -> None:
    settings = closed_loop.settings
    samples, reports = drive(closed_loop, io.StringIO())
    decisions = closed_loop.decisions()
    events = closed_loop.events()
    write_report(samples, decisions, events, settings, settings.report_dir)
    outcome = summarise(samples, settings)
    timeline = "\n".join(str(s) for s in samples)

    assert all(r.ok > 0 for r in reports), [r.summary() for r in reports]
    # the operator moved the ratio toward prefill after the shift to long prompts
    assert outcome.moved_toward_prefill, timeline
    # ... and users' TTFT, as Prometheus computes it, came back under the SLO
    assert outcome.breached_after_shift and outcome.recovered, timeline
    measured = [s for s in samples if s.phase == "documents" and s.ttft_s is not None]
    assert measured[-1].ttft_s is not None and measured[-1].ttft_s <= settings.ttft_slo_s, timeline

    # every move is in status: each allocation the children ran (beyond the first) was a recorded decision
    assert decisions, "status.autoscaling.decisions is empty"
    ran = {(s.prefill, s.decode) for s in samples} - {(outcome.start_prefill, outcome.start_decode)}
    recorded = {(d["prefill"], d["decode"]) for d in decisions}
    if len(decisions) < 10:  # status keeps the newest 10
        assert ran <= recorded, (ran, decisions)
    assert any(d["prefill"] > outcome.start_prefill for d in decisions), decisions
    # Events carry the causes of the moves
    reasons = {e["reason"] for e in events}
    moved = {d["cause"] for d in decisions if d["prefill"] != outcome.start_prefill}
    assert moved and moved <= reasons, (moved, reasons)

    # the operator exposes its decisions as metrics
    text = httpx.get(closed_loop.operator_metrics_url, timeout=10).text
    assert f'disagg_decisions_total{{deployment="{settings.deployment}"' in text


NODE = Kind("v1", "Node", "nodes", namespaced=False)


@pytest.fixture
def one_gpu_node(kube: KubeApi, namespace: str) -> Iterator[tuple[str, str]]:
    """A kwok node with a single H100 and a label only this test's prefill pool selects."""
    pool = NodePool(gpu_type="h100", product="NVIDIA-H100-80GB-HBM3", count=1, gpus_per_node=1)
    node = node_manifest(pool, 0)
    name = f"kwok-e2e-{namespace}"[:63].rstrip("-")
    label = ("disagg.dev/e2e-pool", namespace)
    node["metadata"]["name"] = name
    node["metadata"]["labels"].update({"kubernetes.io/hostname": name, label[0]: label[1]})
    kube.create(NODE, None, node)
    try:
        yield label
    finally:
        kube.delete(NODE, None, name)


@pytest.fixture
def kube(cluster: ClusterInfo) -> KubeApi:
    return KubeApi(load_api_client(cluster.kubeconfig))


def test_pending_pods_stop_the_asking_and_set_scaling_limited(
    cluster: ClusterInfo, namespace: str, one_gpu_node: tuple[str, str], kube: KubeApi, tmp_path: Path
) -> None:
    """Long documents need a second prefill replica, but the prefill pool's only node has one GPU."""
    settings = replace(
        SCENARIO,
        namespace=namespace,
        phases=(Phase("documents", 75.0, 5.0, 12000, 64),),
        pending_grace_s=10.0,
        prefill_node_labels=(one_gpu_node,),
    )
    with running(cluster, settings, tmp_path) as loop:
        samples, _ = drive(loop, io.StringIO())
        decisions = loop.decisions()
        events = loop.events()
        status = loop.deployment().get("status") or {}
        prefill_pods = kube.list(
            POD, namespace, f"disagg.dev/deployment={settings.deployment},disagg.dev/role=prefill"
        )
    timeline = "\n".join(str(s) for s in samples)

    assert any(d["prefill"] > 1 for d in decisions), decisions  # the breach asked for more prefill
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    limited = conditions.get("ScalingLimited") or {}
    assert limited.get("status") == "True" and limited.get("reason") == "PendingPods", conditions
    assert any(e["reason"] == "PendingPods" and e["type"] == "Warning" for e in events), events
    # it stopped asking: the target came back to what fits, and no Pending prefill pod is left
    assert (status.get("autoscaling") or {}).get("desiredReplicas", {}).get("prefill") == 1, status
    assert samples[-1].prefill == 1, timeline
    assert all(p["spec"].get("nodeName") for p in prefill_pods if not p["metadata"].get("deletionTimestamp"))

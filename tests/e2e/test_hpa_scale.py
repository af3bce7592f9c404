"""A HorizontalPodAutoscaler scales a DisaggregatedDeployment through its /scale subresource, for real.

On the local control plane: the real HPA controller (kube-controller-manager), the released
prometheus-adapter serving ``disagg_requests_in_flight`` through the aggregation layer from a real
Prometheus, which scrapes the live twin's engines while traffic runs through the released router; the
operator with an active RatioPolicy. The example's HPA (examples/autoscaling/hpa.yaml) is applied as
shipped, in the test's namespace, with a lower per-replica target (1) and maximum (6) so this short run's
load moves it.

Asserted: the HPA raises spec.replicas through the scale subresource; the operator sizes the pools to sum
to it (each at least 1); the pools' replicas are written by the operator only (no second writer in their
managedFields); the HPA reads the metric (ScalingActive) and the /scale subresource reports the
deployment's replicas and selector; a ScaledObject (examples/autoscaling/keda-scaledobject.yaml) on the same
target passes a server-side dry run against KEDA's real CRD.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg.cluster import keda
from disagg.cluster.local import ClusterInfo
from disagg.cluster.lws import established
from disagg.cluster.metrics_adapter import MetricsAdapter, start_metrics_adapter
from disagg.demo import (
    ClosedLoop,
    DemoSettings,
    Phase,
    deployment_manifest,
    wait_until,
)
from disagg.demo.traffic import run_traffic
from disagg.k8s.apply import FIELD_MANAGER
from disagg.k8s.client import DEPLOYMENT, DISAGG_DEPLOYMENT, KubeApi
from disagg.metrics.external import REQUESTS_IN_FLIGHT

pytestmark = pytest.mark.timeout(480)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "autoscaling"
START_TOTAL = 3  # the example's spec.replicas: 1 prefill + 2 decode
# Long prompts at a rate one prefill replica cannot keep up with: requests queue, so the in-flight count
# (the HPA's metric) rises well above the target of 1 per replica.
SCENARIO = DemoSettings(
    deployment="llm",
    phases=(Phase("documents", 100.0, 6.0, 8000, 128),),
    scale_down_window_s=600,
)
HPA_PATH = "/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers"


def example(name: str, kind: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]
    return copy.deepcopy(next(d for d in docs if d["kind"] == kind))


class HpaLoop(ClosedLoop):
    """The demo's closed loop with the example's spec.replicas and prometheus-adapter serving the HPA's
    metric from this loop's Prometheus (started before the scenario, stopped after the loop)."""

    adapter: MetricsAdapter | None = None

    def deployment_object(self) -> dict[str, Any]:
        dd = deployment_manifest(self.settings)
        dd["spec"]["replicas"] = example("hpa.yaml", "DisaggregatedDeployment")["spec"]["replicas"]
        return dd

    def apply_scenario(self) -> None:
        assert self.prometheus is not None
        self.adapter = start_metrics_adapter(self.cluster, self.prometheus.url, self.run.log_dir / "adapter")
        super().apply_scenario()

    def stop(self) -> None:
        super().stop()
        if self.adapter is not None:
            print(f"--- prometheus-adapter.log (tail)\n{self.adapter.log_tail()}")
            self.adapter.stop()


@pytest.fixture
def loop(cluster: ClusterInfo, namespace: str, tmp_path: Path) -> Iterator[HpaLoop]:
    settings = replace(SCENARIO, namespace=namespace, report_dir=tmp_path / "report")
    with HpaLoop.on(cluster, settings, tmp_path / "logs").running(print_logs=True) as running:
        yield running


def pools(kube: KubeApi, namespace: str) -> dict[str, dict[str, Any]]:
    return {role: kube.get(DEPLOYMENT, namespace, f"llm-{role}") or {} for role in ("prefill", "decode")}


def replicas_writers(child: dict[str, Any]) -> set[str]:
    """The field managers that own a child's spec.replicas."""
    owners = set()
    for entry in (child.get("metadata") or {}).get("managedFields") or []:
        spec = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        if "f:replicas" in spec:
            owners.add(str(entry.get("manager")))
    return owners


def test_hpa_scales_the_deployment_through_scale_and_the_operator_splits_it(loop: HpaLoop) -> None:
    closed = loop
    kube, ns = closed.kube, closed.settings.namespace
    hpa = example("hpa.yaml", "HorizontalPodAutoscaler")
    hpa["metadata"]["namespace"] = ns
    hpa["spec"]["maxReplicas"] = 6
    hpa["spec"]["metrics"][0]["external"]["target"]["averageValue"] = "1"
    kube.request("POST", HPA_PATH.format(ns=ns), body=hpa)

    # the /scale subresource reports what the HPA reads
    scale = kube.request("GET", DISAGG_DEPLOYMENT.path(ns, "llm", "scale"))
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == START_TOTAL, scale
    wait_until(
        lambda: (
            kube.request("GET", DISAGG_DEPLOYMENT.path(ns, "llm", "scale")).get("status", {}).get("selector")
        ),
        60,
        "status.selector on /scale",
    )

    router = closed.router
    assert router is not None
    traffic = threading.Thread(target=run_traffic, args=(router.url, closed.settings), daemon=True)
    traffic.start()
    totals: list[int] = []

    def scaled_up() -> bool:
        total = int((closed.deployment().get("spec") or {}).get("replicas") or 0)
        totals.append(total)
        return total > START_TOTAL

    wait_until(scaled_up, 150, "the HPA to raise spec.replicas")
    traffic.join(timeout=180)

    dd = closed.deployment()
    total = int(dd["spec"]["replicas"])
    # the HPA wrote spec.replicas through the scale subresource
    scale_writers = [e for e in dd["metadata"].get("managedFields") or [] if e.get("subresource") == "scale"]
    assert scale_writers, dd["metadata"].get("managedFields")

    def split_applied() -> dict[str, int] | None:
        children = pools(kube, ns)
        counts = {role: int((c.get("spec") or {}).get("replicas") or 0) for role, c in children.items()}
        wanted = int((closed.deployment().get("spec") or {}).get("replicas") or 0)
        return counts if sum(counts.values()) == wanted and min(counts.values()) >= 1 else None

    counts = wait_until(split_applied, 60, "the pools to sum to spec.replicas")
    print(f"spec.replicas over the run: {sorted(set(totals))}; pools now {counts}")

    # one writer of the pools' replicas: the operator
    for role, child in pools(kube, ns).items():
        assert replicas_writers(child) == {FIELD_MANAGER}, (role, child["metadata"].get("managedFields"))

    # the HPA read the adapter's external metric and could scale
    status = kube.request("GET", f"{HPA_PATH.format(ns=ns)}/llm").get("status") or {}
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    assert conditions.get("ScalingActive", {}).get("status") == "True", conditions
    metrics = [m for m in status.get("currentMetrics") or [] if m.get("type") == "External"]
    assert metrics and metrics[0]["external"]["metric"]["name"] == REQUESTS_IN_FLIGHT, status
    assert START_TOTAL < total <= hpa["spec"]["maxReplicas"], (total, status)
    status_replicas = (closed.deployment().get("status") or {}).get("replicas")
    assert isinstance(status_replicas, int) and status_replicas >= 2, closed.deployment().get("status")

    # KEDA's ScaledObject on the same target: accepted by KEDA's own CRD (server-side dry run)
    with closed.cluster.client() as client:
        names = keda.install(client)
        wait_until(lambda: established(client, names), 60, "KEDA's CRDs")
    scaled = example("keda-scaledobject.yaml", "ScaledObject")
    scaled["metadata"]["namespace"] = ns
    code, created = kube.request_with_status(
        "POST", f"/apis/keda.sh/v1alpha1/namespaces/{ns}/scaledobjects", [("dryRun", "All")], scaled
    )
    assert code == 201 and created["spec"]["scaleTargetRef"]["kind"] == "DisaggregatedDeployment", created

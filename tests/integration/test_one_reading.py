"""The same DisaggregatedDeployment and RatioPolicy applied on the local control plane (real
kube-apiserver: the CRD schema's defaults filled in) and given to ``disagg simulate`` from their YAML
files: the operator's autoscaler and the simulator decide with the same algorithm, bounds and profile."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

import disagg.policy
from disagg.api.ratiopolicy import RatioPolicySpec
from disagg.controller import autoscaler
from disagg.controller.metrics import AutoscalingMetrics
from disagg.controller.settings import AutoscalingSettings
from disagg.k8s.client import DEPLOYMENT, DISAGG_DEPLOYMENT, RATIO_POLICY, KubeApi
from disagg.policy.capacity import resolve_profile
from disagg.policy.types import Bounds, Decision, Observation
from disagg.twin.cli_simulate import load_policy, policy_controller
from disagg.twin.sim import SimDeployment

REPO = Path(__file__).resolve().parents[2]
DEPLOYMENT_FILE = REPO / "examples" / "vllm-nixl.yaml"
POLICY_FILE = REPO / "policies" / "rag-long-context.yaml"  # model-based
FIELD_MANAGER = "disagg-tests"

Call = tuple[Observation, RatioPolicySpec, Bounds, Decision]


def _pool(namespace: str, deployment: str, role: str, replicas: int) -> dict[str, Any]:
    """A pool's Deployment as the reconciler names and labels it (no pods are needed to decide)."""
    labels = {"disagg.dev/deployment": deployment, "disagg.dev/role": role}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"{deployment}-{role}", "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"disagg.dev/none": "none"},
                    "containers": [{"name": "e", "image": "x"}],
                },
            },
        },
    }


def test_the_cluster_and_simulate_read_the_same_objects_the_same_way(
    kube: KubeApi, crds: list[str], namespace: str, record_decisions: Callable[[object], list[Call]]
) -> None:
    manifest = yaml.safe_load(DEPLOYMENT_FILE.read_text())
    manifest["metadata"]["namespace"] = namespace
    policy = yaml.safe_load(POLICY_FILE.read_text())
    policy["metadata"] = {
        "name": manifest["spec"]["autoscaling"]["policyRef"]["name"],
        "namespace": namespace,
    }
    kube.apply(policy, FIELD_MANAGER, kind=RATIO_POLICY)
    applied = kube.apply(manifest, FIELD_MANAGER, kind=DISAGG_DEPLOYMENT)  # as served: defaults filled in
    for role in ("prefill", "decode"):
        replicas = applied["spec"][role]["replicas"]
        kube.apply(
            _pool(namespace, applied["metadata"]["name"], role, replicas), FIELD_MANAGER, kind=DEPLOYMENT
        )

    cluster = record_decisions(autoscaler)
    loop = autoscaler.Autoscaler(
        kube, AutoscalingSettings(), None, AutoscalingMetrics.create(CollectorRegistry())
    )
    assert autoscaler.evaluate(loop, applied, {}, time.time()) is not None
    ((observation, cluster_policy, cluster_bounds, cluster_decision),) = cluster

    simulate = record_decisions(disagg.policy)
    policy_controller(load_policy(POLICY_FILE).spec, SimDeployment.load(DEPLOYMENT_FILE))(observation)
    ((_, simulate_policy, simulate_bounds, simulate_decision),) = simulate

    assert simulate_policy == cluster_policy and cluster_policy.algorithm.value == "model-based"
    assert simulate_bounds == cluster_bounds
    profile = resolve_profile(cluster_policy, cluster_bounds)
    assert profile is not None and profile == resolve_profile(simulate_policy, simulate_bounds)
    assert "ModelUnavailable" not in {r.code for r in cluster_decision.reasons}
    assert simulate_decision == cluster_decision
    status = (kube.get(DISAGG_DEPLOYMENT, namespace, applied["metadata"]["name"]) or {}).get("status") or {}
    assert (status.get("autoscaling") or {}).get("lastEvaluation") is not None  # it did record on the cluster

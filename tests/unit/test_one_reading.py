"""The operator's autoscaler and ``disagg simulate`` read the same DisaggregatedDeployment and RatioPolicy
the same way: both decide with the same algorithm, bounds (replica ranges, GPUs, GPU budget, replica
start-up) and serving profile, so a policy replayed through the twin is the policy the cluster runs."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from prometheus_client import CollectorRegistry

from disagg.api.ratiopolicy import Algorithm, RatioPolicySpec
from disagg.controller import autoscaler
from disagg.controller.metrics import AutoscalingMetrics
from disagg.controller.settings import AutoscalingSettings
from disagg.k8s.client import Kind, KubeApi
from disagg.policy.capacity import load_models, resolve_profile
from disagg.policy.types import Bounds, Decision, Observation
from disagg.twin.cli_simulate import load_policy, policy_controller
from disagg.twin.sim import SimDeployment

REPO = Path(__file__).resolve().parents[2]
DEPLOYMENT = REPO / "examples" / "vllm-nixl.yaml"
POLICIES = sorted((REPO / "policies").glob("*.yaml"))
T0 = 1_800_000_000.0


class _Cluster:
    """Just enough of KubeApi for one evaluation: the objects as applied, the child Deployments, no pods."""

    def __init__(self, deployment: Mapping[str, Any], policy: Mapping[str, Any]) -> None:
        self.deployment, self.policy = copy.deepcopy(dict(deployment)), dict(policy)

    def get(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any] | None:
        if kind.kind == "RatioPolicy":
            return copy.deepcopy(self.policy)
        if kind.kind == "Deployment":
            role = name.rsplit("-", 1)[1]
            return {"spec": {"replicas": self.deployment["spec"][role]["replicas"]}}
        return copy.deepcopy(self.deployment)

    def list(self, kind: Kind, namespace: str | None, label_selector: str = "") -> list[dict[str, Any]]:
        return []

    def merge_patch_status(self, *_: Any, **__: Any) -> dict[str, Any]:
        return {}

    def create(self, kind: Kind, namespace: str | None, obj: Mapping[str, Any]) -> dict[str, Any]:
        return dict(obj)


Call = tuple[Observation, RatioPolicySpec, Bounds, Decision]
Record = Callable[[object], list[Call]]


def _on_the_cluster(record_decisions: Record, policy_path: Path) -> Call:
    """One evaluation by the operator's autoscaler of the example deployment under ``policy_path``."""
    deployment = yaml.safe_load(DEPLOYMENT.read_text())
    deployment["metadata"].update(namespace="default", generation=1)
    calls = record_decisions(autoscaler)
    loop = autoscaler.Autoscaler(
        kube=cast(KubeApi, _Cluster(deployment, yaml.safe_load(policy_path.read_text()))),
        settings=AutoscalingSettings(),
        signals=None,
        metrics=AutoscalingMetrics.create(CollectorRegistry()),
    )
    assert autoscaler.evaluate(loop, deployment, {}, T0) is not None
    (call,) = calls
    return call


def _in_simulate(record_decisions: Record, policy_path: Path, observation: Observation) -> Call:
    """The decision ``disagg simulate --deployment D --policy P`` makes on the same observation."""
    import disagg.policy

    calls = record_decisions(disagg.policy)
    control = policy_controller(load_policy(policy_path).spec, SimDeployment.load(DEPLOYMENT))
    control(observation)
    (call,) = calls
    return call


@pytest.mark.parametrize("policy_path", POLICIES, ids=lambda p: p.stem)
def test_the_cluster_and_simulate_decide_with_the_same_algorithm_bounds_and_profile(
    record_decisions: Record, policy_path: Path
) -> None:
    observation, cluster_policy, cluster_bounds, cluster_decision = _on_the_cluster(
        record_decisions, policy_path
    )
    _, simulate_policy, simulate_bounds, simulate_decision = _in_simulate(
        record_decisions, policy_path, observation
    )
    assert simulate_policy == cluster_policy
    assert simulate_bounds == cluster_bounds
    assert cluster_bounds.max_gpus == 32 and cluster_bounds.prefill.max_replicas == 4
    assert cluster_bounds.prefill.startup_seconds is not None  # the spec's estimate: no pod is Ready yet
    profile = resolve_profile(cluster_policy, cluster_bounds)
    assert profile is not None and profile == resolve_profile(simulate_policy, simulate_bounds)
    load_models(profile)  # a profile the latency model knows: model-based runs, it does not fall back
    codes = {r.code for r in cluster_decision.reasons}
    if cluster_policy.algorithm is Algorithm.MODEL_BASED:
        assert "ModelUnavailable" not in codes
    assert simulate_decision == cluster_decision

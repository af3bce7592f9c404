"""Pure helpers of the autoscaling loop: pods to counts, Pending ceilings, deletion costs, status, events."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from disagg.api.common import parse_rfc3339, rfc3339, set_api_condition
from disagg.api.deployment import AutoscalingStatus
from disagg.controller.autoscaler import Autoscaler, autoscaling_enabled, evaluate, is_due, policy_state
from disagg.controller.metrics import AutoscalingMetrics
from disagg.controller.observe import (
    DeploymentReading,
    StartupEstimate,
    cached_reading,
    deployment_bounds,
    read_deployment,
    role_startups,
    startup_message,
)
from disagg.controller.pods import (
    PodInfo,
    deletion_costs,
    measured_startup_s,
    pod_info,
    pod_startup_s,
    pool_observation,
)
from disagg.controller.scaling_status import (
    CONDITION_ACTIVE,
    CONDITION_LIMITED,
    CONDITION_METRICS,
    autoscaling_status,
    change_events,
    limited_condition,
    metrics_condition,
)
from disagg.controller.settings import AutoscalingSettings
from disagg.k8s.client import Kind, KubeApi
from disagg.metrics.prometheus import values_by_pod
from disagg.metrics.queries import running_by_pod_query
from disagg.policy import decide
from disagg.policy.bounds import spec_startup_s
from disagg.policy.memory import to_memory
from disagg.policy.types import (
    Bounds,
    Decision,
    Measured,
    Observation,
    PolicyState,
    Reason,
    RoleBounds,
    RoleObservation,
    ServingProfile,
    SignalState,
)

T0 = 1_800_000_000.0


def _pod(
    name: str,
    *,
    ready: bool = True,
    node: str | None = "gpu-0",
    unschedulable_at: float | None = None,
    deleting: bool = False,
) -> dict[str, object]:
    conditions: list[dict[str, str]] = [{"type": "Ready", "status": "True" if ready else "False"}]
    if unschedulable_at is not None:
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "lastTransitionTime": rfc3339(unschedulable_at),
            }
        )
    metadata: dict[str, object] = {"name": name, "labels": {"disagg.dev/role": "decode"}}
    if deleting:
        metadata["deletionTimestamp"] = rfc3339(T0)
    return {
        "metadata": metadata,
        "spec": {"nodeName": node} if node else {},
        "status": {"conditions": conditions},
    }


def test_rfc3339_round_trips_to_the_second() -> None:
    assert rfc3339(T0) == "2027-01-15T08:00:00Z"
    assert parse_rfc3339(rfc3339(T0)) == T0
    assert parse_rfc3339("not a time") is None
    assert parse_rfc3339(None) is None


def test_evaluation_is_due_on_the_policy_interval() -> None:
    assert is_due(None, 30, T0)
    assert not is_due(T0, 30, T0 + 29)
    assert is_due(T0, 30, T0 + 30)
    assert is_due(T0 + 100, 30, T0)  # clock went backwards: evaluate rather than stall


def test_pending_pods_count_with_how_long_they_were_unschedulable() -> None:
    pods = [
        pod_info(_pod("d-0")),
        pod_info(_pod("d-1", ready=False)),
        pod_info(_pod("d-2", ready=False, node=None, unschedulable_at=T0)),
        pod_info(_pod("d-3", ready=False, node=None, unschedulable_at=T0 + 50)),
        pod_info(_pod("d-4", deleting=True)),
    ]
    assert pods[2].unschedulable_since == T0 and not pods[2].scheduled
    pool = pool_observation(5, pods, now=T0 + 70, gpus_per_replica=2)
    assert (pool.replicas, pool.ready, pool.pending, pool.gpus_per_replica) == (5, 1, 2, 2)
    assert pool.unschedulable_s == (70.0, 20.0)


def test_pods_unschedulable_past_the_grace_period_limit_their_pool_in_the_policy() -> None:
    from disagg.api.ratiopolicy import RatioPolicySpec

    stuck = [pod_info(_pod(f"d-{i}", ready=False, node=None, unschedulable_at=T0)) for i in range(2)]
    ready = [pod_info(_pod(f"d-{i}")) for i in range(2, 6)]
    bounds = Bounds(prefill=RoleBounds(1, 8), decode=RoleBounds(1, 8))
    policy = RatioPolicySpec.model_validate({"algorithm": "slo-feedback"})

    def limited(now: float) -> dict[str, int]:
        decode = pool_observation(6, stuck + ready, now)
        observation = Observation(time=now, prefill=RoleObservation(replicas=1, ready=1), decode=decode)
        _, state = decide(observation, policy, PolicyState(), now, bounds, pending_grace_s=60.0)
        return state.limited

    assert limited(T0 + 30) == {}  # still within the grace period: the scheduler may place them yet
    assert limited(T0 + 60) == {"decode": 4}


def test_least_loaded_decode_pods_get_the_lowest_deletion_cost() -> None:
    costs = deletion_costs({"d-a": 7.0, "d-b": 0.0, "d-c": None, "d-d": 3.0, "d-e": float("nan")})
    assert costs == {"d-b": 0, "d-d": 1, "d-a": 2, "d-c": 3, "d-e": 4}
    assert deletion_costs({}) == {}


def _decision(prefill: int, decode: int, code: str | None = None, changed: bool = True) -> Decision:
    reasons = (Reason(code, f"{code} happened", "prefill"),) if code else ()
    return Decision(time=T0, prefill=prefill, decode=decode, reasons=reasons, changed=changed)


def test_status_keeps_at_most_ten_decisions_newest_first() -> None:
    status: dict[str, object] | None = None
    current = {"prefill": 1, "decode": 1}
    for step in range(12):
        decision = _decision(2 + step, 1, "TTFTBreachPrefillQueue")
        status = autoscaling_status(status, "rp", "active", decision, current, T0 + step, keep=10)
        current = {"prefill": decision.prefill, "decode": 1}
    assert status is not None
    decisions = status["decisions"]
    assert isinstance(decisions, list) and len(decisions) == 10
    assert [d["prefill"] for d in decisions] == list(range(13, 3, -1))
    assert decisions[0]["cause"] == "TTFTBreachPrefillQueue"
    assert decisions[0]["time"] == rfc3339(T0 + 11)
    assert status["desiredReplicas"] == {"prefill": 13, "decode": 1}
    assert status["lastEvaluationTime"] == rfc3339(T0 + 11)


def test_steady_state_does_not_grow_the_history() -> None:
    current = {"prefill": 2, "decode": 2}
    status = autoscaling_status(None, "rp", "active", _decision(2, 2, changed=False), current, T0, keep=10)
    status = autoscaling_status(status, "rp", "active", _decision(2, 2, changed=False), current, T0 + 30, 10)
    assert len(status["decisions"]) == 1
    assert status["decisions"][0]["cause"] == "NoChange"
    assert status["lastEvaluationTime"] == rfc3339(T0 + 30)


def test_last_evaluation_tells_the_latest_cause_while_the_history_keeps_the_moves() -> None:
    """The first decision (no traffic yet) stays the newest move; lastEvaluation says what holds now."""
    current = {"prefill": 1, "decode": 2}
    status = autoscaling_status(
        None, "rp", "active", _decision(1, 2, "MetricsMissing", changed=False), current, T0, keep=10
    )
    status = autoscaling_status(status, "rp", "active", _decision(1, 2, changed=False), current, T0 + 5, 10)
    assert [d["cause"] for d in status["decisions"]] == ["MetricsMissing"]
    last = status["lastEvaluation"]
    assert last["cause"] == "NoChange" and last["time"] == rfc3339(T0 + 5)
    assert (last["prefill"], last["decode"]) == (1, 2)
    assert last["message"] == "no change: SLOs met within the tolerance band"
    # it is a valid part of the DisaggregatedDeployment's status
    assert AutoscalingStatus.model_validate(status).last_evaluation is not None


def test_advisory_mode_records_but_sets_no_desired_replicas() -> None:
    status = autoscaling_status(
        None, "rp", "advisory", _decision(3, 1, "TTFTBreachPrefillQueue"), {"prefill": 1, "decode": 1}, T0, 10
    )
    assert status["desiredReplicas"] is None  # a merge patch removes it: the reconciler keeps spec replicas
    assert status["mode"] == "advisory"
    assert status["decisions"][0]["prefill"] == 3


def test_condition_transition_time_moves_only_when_status_flips() -> None:
    others = [
        {"type": "Ready", "status": "True", "reason": "AllReady", "message": "", "lastTransitionTime": "x"}
    ]
    first = set_api_condition(others, CONDITION_METRICS, False, "MetricsMissing", "TTFT missing", 3, T0)
    assert first[0] == others[0]
    assert first[1]["lastTransitionTime"] == rfc3339(T0) and first[1]["observedGeneration"] == 3
    again = set_api_condition(first, CONDITION_METRICS, False, "MetricsMissing", "ITL missing", 3, T0 + 60)
    assert again[1]["lastTransitionTime"] == rfc3339(T0) and again[1]["message"] == "ITL missing"
    flipped = set_api_condition(again, CONDITION_METRICS, True, "MetricsOK", "ok", 3, T0 + 120)
    assert flipped[1]["lastTransitionTime"] == rfc3339(T0 + 120) and flipped[1]["status"] == "True"
    assert len(flipped) == 2


def _observation(ttft: Measured, itl: Measured) -> Observation:
    pool = RoleObservation(replicas=1, ready=1)
    return Observation(time=T0, prefill=pool, decode=pool, ttft=ttft, itl=itl)


def test_metrics_condition_names_the_missing_signal() -> None:
    ok = metrics_condition(_observation(Measured.of(0.5), Measured.of(0.02)))
    assert ok.status and ok.reason == "MetricsOK"
    missing = metrics_condition(_observation(Measured.missing(), Measured.missing(SignalState.STALE)))
    assert not missing.status and missing.reason == "MetricsMissing"
    assert "TTFT is missing" in missing.message and "ITL is stale" in missing.message
    garbage = metrics_condition(_observation(Measured.missing(SignalState.INVALID), Measured.of(0.02)))
    assert not garbage.status and "TTFT is invalid" in garbage.message
    # Prometheus's queries failed: the reason says so and the message quotes the error
    failed = metrics_condition(
        _observation(Measured.missing(), Measured.missing()),
        "Prometheus at http://p did not answer within 5 s",
    )
    assert not failed.status and failed.reason == "PrometheusQueryFailed"
    assert failed.message.startswith("TTFT is missing; ITL is missing: Prometheus at http://p did not answer")


def test_limited_condition_prefers_pending_ceilings_then_budget() -> None:
    decision = _decision(4, 2, "BudgetClamp")
    pending = limited_condition(decision, {"decode": 3})
    assert (pending.status, pending.reason) == (True, "PendingPods")
    assert limited_condition(decision, {}).reason == "BudgetClamp"
    within = limited_condition(_decision(4, 2, "TTFTBreachPrefillQueue"), {})
    assert (within.status, within.reason) == (False, "DesiredWithinRange")


def test_events_for_a_new_target_and_each_flipped_condition() -> None:
    before = [{"type": CONDITION_LIMITED, "status": "False"}, {"type": CONDITION_ACTIVE, "status": "True"}]
    after = [
        {"type": CONDITION_LIMITED, "status": "True", "reason": "PendingPods", "message": "decode <= 4"},
        {"type": CONDITION_ACTIVE, "status": "True", "reason": "PolicyEvaluated", "message": "ok"},
        {"type": "Ready", "status": "False", "reason": "X", "message": "not ours"},
    ]
    events = change_events(
        _decision(3, 2, "TTFTBreachPrefillQueue"), {"prefill": 2, "decode": 2}, "active", before, after
    )
    assert [(e.type, e.reason) for e in events] == [
        ("Normal", "TTFTBreachPrefillQueue"),
        ("Warning", "PendingPods"),
    ]
    assert "prefill 2 -> 3" in events[0].message
    assert (
        change_events(_decision(2, 2, changed=False), {"prefill": 2, "decode": 2}, "active", after, after)
        == []
    )


def test_settings_from_env_validate_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    monkeypatch.setenv("DISAGG_AUTOSCALING_TICK_S", "0.5")
    monkeypatch.setenv("DISAGG_PROMETHEUS_URL", "http://127.0.0.1:9090")
    settings = AutoscalingSettings()
    assert settings.tick_s == 0.5 and settings.prometheus_url == "http://127.0.0.1:9090"
    monkeypatch.setenv("DISAGG_AUTOSCALING_PENDING_GRACE_S", "soon")
    with pytest.raises(ValidationError, match="pending_grace_s"):
        AutoscalingSettings()


def test_decisions_kept_in_status_cannot_exceed_the_crds_max_items(monkeypatch: pytest.MonkeyPatch) -> None:
    # more decisions than status.autoscaling.decisions' maxItems would make every status write fail
    from pydantic import ValidationError

    from disagg.api.crd import all_crds

    crd = next(c for c in all_crds() if c["spec"]["names"]["kind"] == "DisaggregatedDeployment")
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    max_items = schema["properties"]["status"]["properties"]["autoscaling"]["properties"]["decisions"][
        "maxItems"
    ]
    assert AutoscalingSettings().max_decisions == max_items
    monkeypatch.setenv("DISAGG_AUTOSCALING_MAX_DECISIONS", "4")
    assert AutoscalingSettings().max_decisions == 4
    monkeypatch.setenv("DISAGG_AUTOSCALING_MAX_DECISIONS", str(max_items + 1))
    with pytest.raises(ValidationError, match=f"less than or equal to {max_items}"):
        AutoscalingSettings()


def test_a_target_is_announced_once_until_applied() -> None:
    decision = _decision(3, 2, "TTFTBreachPrefillQueue")
    current = {"prefill": 2, "decode": 2}
    recorded = {"prefill": 3, "decode": 2, "cause": "TTFTBreachPrefillQueue"}
    assert change_events(decision, current, "advisory", [], [], previous_target=recorded) == []
    earlier = {"prefill": 2, "decode": 2, "cause": "Steady"}
    (event,) = change_events(decision, current, "advisory", [], [], previous_target=earlier)
    assert event.message.startswith("recommends prefill 2 -> 3")


def test_conditions_first_set_in_their_good_state_are_not_announced() -> None:
    after = [
        {"type": CONDITION_LIMITED, "status": "False", "reason": "DesiredWithinRange", "message": ""},
        {"type": CONDITION_METRICS, "status": "False", "reason": "MetricsMissing", "message": "TTFT missing"},
    ]
    events = change_events(_decision(2, 2, changed=False), {"prefill": 2, "decode": 2}, "active", [], after)
    assert [(e.type, e.reason) for e in events] == [("Warning", "MetricsMissing")]


def _reading(spec: Mapping[str, Any]) -> DeploymentReading:
    reading = read_deployment({"metadata": {"name": "chat", "namespace": "default"}, "spec": spec})
    assert isinstance(reading, DeploymentReading), reading
    return reading


def test_bounds_come_from_the_deployment_spec() -> None:
    spec = _spec()
    spec["prefill"] = {"replicas": 2, "tensorParallelSize": 2}
    spec["decode"] = {"replicas": 3}
    spec["autoscaling"] = {
        "enabled": True,
        "policyRef": {"name": "slo"},
        "prefill": {"minReplicas": 1, "maxReplicas": 4},
        "maxGPUs": 16,
    }
    bounds = deployment_bounds(_reading(spec), {})
    assert (bounds.prefill.min_replicas, bounds.prefill.max_replicas, bounds.prefill.gpus_per_replica) == (
        1,
        4,
        2,
    )
    assert (bounds.decode.min_replicas, bounds.decode.max_replicas) == (3, 3)  # no bounds: hold the spec's
    assert bounds.max_gpus == 16
    assert autoscaling_enabled(spec) and not autoscaling_enabled({"autoscaling": {"enabled": False}})
    assert not autoscaling_enabled({})


def test_per_pod_load_query_and_result() -> None:
    query = running_by_pod_query("vllm", "ns", "chat", "decode")
    sel = '{namespace="ns",disagg_deployment="chat",disagg_role="decode"}'
    # both spellings: prometheus_client escapes ':' to '_' when Prometheus negotiates OpenMetrics
    assert query == (
        f"(sum by (pod) (vllm:num_requests_running{sel})) or (sum by (pod) (vllm_num_requests_running{sel}))"
    )
    assert "sglang:num_running_reqs" in running_by_pod_query("sglang", "ns", "chat", "decode")
    result = [
        {"metric": {"pod": "d-0"}, "value": [1, "3"]},
        {"metric": {"pod": "d-1"}, "value": [1, "NaN"]},
        {"metric": {}, "value": [1, "2"]},
    ]
    assert values_by_pod(result) == {"d-0": 3.0, "d-1": None}
    assert values_by_pod("garbage") == {}


# ------------------------------------------------------------------------------------------- start-up


def _timed_pod(name: str, created: float, ready_at: float | None, role: str = "prefill") -> PodInfo:
    pod = _pod(name, ready=ready_at is not None)
    metadata = pod["metadata"]
    assert isinstance(metadata, dict)
    metadata["creationTimestamp"] = rfc3339(created)
    metadata["labels"] = {"disagg.dev/role": role}
    if ready_at is not None:
        status = pod["status"]
        assert isinstance(status, dict)
        status["conditions"][0]["lastTransitionTime"] = rfc3339(ready_at)
    return pod_info(pod)


def _spec(model: str = "meta-llama/Llama-3.1-70B-Instruct", cached: bool = True) -> dict[str, Any]:
    model_spec: dict[str, object] = {"name": model, "source": {"huggingFace": {"id": model}}}
    if cached:
        model_spec["cache"] = {"claimName": "weights", "create": {"size": "200Gi"}}
    return {
        "model": model_spec,
        "engine": {"type": "vllm"},
        "kvTransfer": {"connector": "nixl"},
        "prefill": {
            "replicas": 1,
            "tensorParallelSize": 4,
            "nodeSelector": {"disagg.dev/gpu-type": "h100"},
        },
        "decode": {"replicas": 2, "tensorParallelSize": 8},
        "autoscaling": {
            "enabled": True,
            "policyRef": {"name": "slo"},
            "prefill": {"minReplicas": 1, "maxReplicas": 4},
        },
    }


def test_pod_info_reads_creation_and_ready_times() -> None:
    pod = _timed_pod("p-0", T0, T0 + 154)
    assert (pod.created, pod.ready_since) == (T0, T0 + 154)
    assert pod_startup_s(pod) == 154
    waiting = _timed_pod("p-1", T0, None)
    assert waiting.created == T0 and waiting.ready_since is None and pod_startup_s(waiting) is None
    assert pod_info(_pod("bare")).created is None  # no timestamps: nothing to measure


def test_measured_startup_is_the_median_of_the_newest_ready_pods() -> None:
    pods = [
        _timed_pod("old", T0, T0 + 400),  # downloaded, before the cache: left out (not among the newest 3)
        _timed_pod("a", T0 + 1000, T0 + 1150),
        _timed_pod("b", T0 + 2000, T0 + 2160),
        _timed_pod("c", T0 + 3000, T0 + 3900),  # flapped Ready since: the median keeps it from counting
        _timed_pod("loading", T0 + 4000, None),  # not Ready yet: no sample
    ]
    assert measured_startup_s(pods) == (160.0, 3)
    assert measured_startup_s(pods, sample=1) == (900.0, 1)
    assert measured_startup_s(pods[-1:]) is None
    assert measured_startup_s([]) is None
    clock_skew = _timed_pod("skew", T0 + 10, T0)  # Ready before created: not a start-up
    assert measured_startup_s([clock_skew]) is None


def test_bounds_carry_the_serving_profile_simulate_uses() -> None:
    from disagg.twin.sim import SimDeployment

    spec = _spec()
    bounds = deployment_bounds(_reading(spec), {})
    dep = SimDeployment.from_dict(
        {"kind": "DisaggregatedDeployment", "metadata": {"name": "x"}, "spec": spec}
    )
    assert bounds.profile == ServingProfile(dep.model, dep.gpu, dep.prefill.tp, dep.decode.tp, dep.dtype)  # type: ignore[union-attr]
    assert bounds.profile == ServingProfile("meta-llama/Llama-3.1-70B-Instruct", "h100", 4, 8, "bf16")
    assert (bounds.prefill.gpus_per_replica, bounds.decode.gpus_per_replica) == (4, 8)
    # a spec that is not a valid DisaggregatedDeployment is not read at all (no bounds guessed from it)
    assert not isinstance(read_deployment({"spec": {"prefill": {"replicas": 2}}}), DeploymentReading)


def test_startup_comes_from_the_pods_else_from_the_spec_cached_or_downloading() -> None:
    cached, downloading = _reading(_spec(cached=True)), _reading(_spec(cached=False))
    estimate = spec_startup_s(cached.dd.spec)
    assert estimate is not None
    assert deployment_bounds(cached, role_startups(cached, {})).prefill.startup_seconds == pytest.approx(
        estimate  # ~154 s
    )
    slower = deployment_bounds(downloading, role_startups(downloading, {})).decode.startup_seconds
    assert slower is not None and estimate < slower  # ~389 s
    measured = {"prefill": [_timed_pod("p", T0, T0 + 170)], "decode": [_timed_pod("d", T0, None, "decode")]}
    bounds = deployment_bounds(cached, role_startups(cached, measured))
    assert bounds.prefill.startup_seconds == 170.0  # measured on the role's own pods wins
    assert bounds.decode.startup_seconds == pytest.approx(estimate)  # no decode pod Ready yet: the spec's
    # a model the twin has no profile of: the profile still names it, the start-up is unknown
    unknown = _reading(_spec(model="Qwen/Qwen3-0.6B"))
    unknown_bounds = deployment_bounds(unknown, role_startups(unknown, {}))
    assert unknown_bounds.profile is not None and unknown_bounds.profile.model == "Qwen/Qwen3-0.6B"
    assert unknown_bounds.prefill.startup_seconds is None and unknown_bounds.decode.startup_seconds is None


def test_the_startup_the_policy_plans_with_is_said_where_it_comes_from() -> None:
    reading = _reading(_spec(cached=True))
    assert reading.cached and reading.startup_s is not None
    startups = role_startups(reading, {"prefill": [_timed_pod("p", T0, T0 + 5)]})
    assert startups["prefill"] == StartupEstimate(5.0, "measured", "measured: pod, creation to Ready")
    decode = startups["decode"]
    assert decode is not None and decode.source == "spec"
    message = startup_message(startups)
    assert message == (
        "replica start-up: prefill 5 s (measured: pod, creation to Ready), "
        f"decode {reading.startup_s:.0f} s (estimate: weights read from the model cache)"
    )
    downloading = role_startups(_reading(_spec(cached=False)), {})
    assert "every replica downloads the weights" in startup_message(downloading)
    assert startup_message(role_startups(None, {})) == (
        "replica start-up: prefill unknown (no pod Ready yet, no estimate for the model), "
        "decode unknown (no pod Ready yet, no estimate for the model)"
    )


def test_a_fresh_memo_restores_the_policy_state_from_status() -> None:
    remembered = PolicyState(
        correction={"decode": 1.4},
        slo_spend=0.2,
        load_history=((T0 - 30.0, 8.0), (T0 - 15.0, 9.0)),
        last_scale_up={"decode": T0 - 60.0},
    )
    status = {"autoscaling": {"policyMemory": to_memory(remembered, T0 - 15.0)}}
    restored = policy_state({}, status, T0)
    assert restored.correction == {"decode": 1.4} and restored.slo_spend == 0.2
    assert restored.load_history == remembered.load_history
    assert restored.last_scale_up == {"decode": T0 - 60.0}
    live = PolicyState(correction={"decode": 0.7})
    assert policy_state({"policy_state": live}, status, T0) is live  # the memo wins while it has a state
    assert policy_state({}, {}, T0) == PolicyState()
    assert policy_state({}, {"autoscaling": {"policyMemory": "garbled"}}, T0) == PolicyState()


def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """RFC 7386 JSON merge patch, as the API server applies it."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping):
            child = target.get(key)
            if not isinstance(child, dict):
                child = target[key] = {}
            _merge(child, value)
        else:
            target[key] = copy.deepcopy(value)


class _FakeKube:
    """Just enough of KubeApi for one evaluation: the policy, the two child Deployments, no pods."""

    def __init__(self, deployment: dict[str, Any]) -> None:
        self.deployment = deployment
        self.policy = {
            "apiVersion": "disagg.dev/v1alpha1",
            "kind": "RatioPolicy",
            "metadata": {"name": "chat", "namespace": "default"},
            "spec": {"slo": {"ttft": {"targetSeconds": 0.8}, "itl": {"targetSeconds": 0.04}}},
        }
        self.events: list[Mapping[str, Any]] = []

    def get(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any] | None:
        if kind.kind == "RatioPolicy":
            return copy.deepcopy(self.policy)
        if kind.kind == "Deployment":
            return {"spec": {"replicas": 2}}
        return copy.deepcopy(self.deployment)

    def list(self, kind: Kind, namespace: str | None, label_selector: str = "") -> list[dict[str, Any]]:
        return []

    def merge_patch_status(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        _merge(self.deployment.setdefault("status", {}), status)
        return copy.deepcopy(self.deployment)

    def create(self, kind: Kind, namespace: str | None, obj: Mapping[str, Any]) -> dict[str, Any]:
        self.events.append(obj)
        return dict(obj)


def _autoscaler(kube: _FakeKube) -> Autoscaler:
    return Autoscaler(
        kube=cast(KubeApi, kube),
        settings=AutoscalingSettings(),
        signals=None,
        metrics=AutoscalingMetrics.create(CollectorRegistry()),
    )


def test_a_restarted_operator_picks_the_policy_memory_up_from_status() -> None:
    body: dict[str, Any] = {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedDeployment",
        "metadata": {"name": "chat", "namespace": "default", "uid": "u1", "generation": 1},
        "spec": {**_spec(), "autoscaling": {"enabled": True, "policyRef": {"name": "chat"}}},
    }
    kube = _FakeKube(copy.deepcopy(body))
    memo: dict[str, Any] = {}
    learned = PolicyState(correction={"decode": 1.3}, slo_spend=0.3, load_history=((T0 - 20.0, 5.0),))
    memo["policy_state"] = learned
    assert evaluate(_autoscaler(kube), body, memo, T0) is not None
    memory = kube.deployment["status"]["autoscaling"]["policyMemory"]
    assert memory["correction"] == {"decode": 1.3} and memory["sloSpend"] == 0.3
    assert memory["loadHistory"] == [[round(T0 - 20.0), 5.0]]

    restarted: dict[str, Any] = {}  # a new operator process: an empty per-object memo
    later = T0 + 60.0
    assert evaluate(_autoscaler(kube), copy.deepcopy(kube.deployment), restarted, later) is not None
    state = restarted["policy_state"]
    assert state.correction == {"decode": 1.3} and state.slo_spend == 0.3
    assert state.load_history == ((T0 - 20.0, 5.0),)
    assert kube.deployment["status"]["autoscaling"]["policyMemory"]["savedAt"] == round(later)


def test_the_deployment_is_read_once_per_spec_generation() -> None:
    memo: dict[str, Any] = {}
    body = {"metadata": {"name": "chat", "namespace": "default", "generation": 3}, "spec": _spec()}
    first = cached_reading(memo, body)
    assert isinstance(first, DeploymentReading)
    garbage = {"metadata": {"name": "chat", "generation": 3}, "spec": {"garbage": True}}
    assert cached_reading(memo, garbage) is first  # same generation: not read again
    changed = cached_reading(memo, {**garbage, "metadata": {"name": "chat", "generation": 4}})
    assert not isinstance(changed, DeploymentReading) and memo["deployment_reading"][0] == 4


@pytest.mark.parametrize(
    ("policy_mode", "dd_mode", "advisory"),
    [
        ("active", None, False),  # default: the policy's mode
        ("advisory", None, True),
        ("active", "advisory", True),  # trialled on this deployment only
        ("advisory", "active", False),
    ],
)
def test_the_deployment_mode_overrides_the_policy_for_this_deployment_only(
    policy_mode: str, dd_mode: str | None, advisory: bool
) -> None:
    autoscaling: dict[str, Any] = {"enabled": True, "policyRef": {"name": "chat"}}
    if dd_mode is not None:
        autoscaling["mode"] = dd_mode
    body: dict[str, Any] = {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedDeployment",
        "metadata": {"name": "chat", "namespace": "default", "uid": "u1", "generation": 1},
        "spec": {**_spec(), "autoscaling": autoscaling},
    }
    kube = _FakeKube(copy.deepcopy(body))
    kube.policy["spec"]["mode"] = policy_mode
    decision = evaluate(_autoscaler(kube), body, {}, T0)
    assert decision is not None and decision.advisory is advisory
    status = kube.deployment["status"]["autoscaling"]
    assert status["mode"] == ("advisory" if advisory else "active")
    if advisory:
        assert status.get("desiredReplicas") is None  # the reconciler keeps the spec's replicas
    else:
        assert status["desiredReplicas"] == {"prefill": decision.prefill, "decode": decision.decode}
    assert kube.policy["spec"]["mode"] == policy_mode  # the shared policy is left as it is


def test_the_alerted_series_follow_the_evaluation_and_go_with_the_deployment() -> None:
    """What the chart's PrometheusRule alerts on: the conditions as 1/0, the SLO targets, and the latencies
    only while they can be read (a missing reading is absent, never a stale value)."""
    from disagg.api.ratiopolicy import RatioPolicy

    body: dict[str, Any] = {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedDeployment",
        "metadata": {"name": "chat", "namespace": "default", "uid": "u1", "generation": 1},
        "spec": {**_spec(), "autoscaling": {"enabled": True, "policyRef": {"name": "chat"}}},
    }
    kube = _FakeKube(copy.deepcopy(body))
    registry = CollectorRegistry()
    auto = Autoscaler(cast(KubeApi, kube), AutoscalingSettings(), None, AutoscalingMetrics.create(registry))
    decision = evaluate(auto, body, {}, T0)  # no Prometheus: TTFT and ITL missing
    assert decision is not None

    def sample(name: str, **labels: str) -> float | None:
        value: float | None = registry.get_sample_value(name, {"deployment": "chat", **labels})
        return value

    slo = RatioPolicy.model_validate(kube.policy).spec.slo
    assert sample("disagg_condition", condition="MetricsAvailable") == 0.0
    assert sample("disagg_condition", condition="ScalingLimited") in (0.0, 1.0)
    assert sample("disagg_condition", condition="ScalingActive") in (0.0, 1.0)
    assert sample("disagg_slo_target_seconds", slo="ttft") == slo.ttft.target_seconds
    assert sample("disagg_slo_target_seconds", slo="itl") == slo.itl.target_seconds
    assert sample("disagg_slo_latency_seconds", slo="ttft") is None

    auto.metrics.record("chat", decision, {}, 0.01, latencies={"ttft": 1.5, "itl": None})
    assert sample("disagg_slo_latency_seconds", slo="ttft") == 1.5
    auto.metrics.record("chat", decision, {}, 0.01, latencies={"ttft": None})
    assert sample("disagg_slo_latency_seconds", slo="ttft") is None  # gone, not stale

    auto.metrics.forget("chat")
    assert sample("disagg_condition", condition="MetricsAvailable") is None
    assert sample("disagg_slo_target_seconds", slo="ttft") is None

"""The reconciler's pure parts: status from children, condition transitions, the per-object gate."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from disagg.api.common import set_api_condition
from disagg.controller.gate import ReconcileGate
from disagg.controller.reconcile import FULL, REFRESH, SKIP, Applied, Reconciler, validate
from disagg.controller.settings import ControllerSettings
from disagg.controller.status import (
    Problem,
    RoleState,
    build_status,
    role_state,
    status_differs,
)
from disagg.k8s.apply import apply_waves, controller_owner, matches, owner_reference, with_owner

T0, T1 = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 0, 5, tzinfo=UTC)
T0_TEXT, T1_TEXT = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def deployment(
    desired: int, ready: int, generation: int = 2, observed: int = 2, **status: Any
) -> dict[str, Any]:
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": desired},
        "status": {
            "observedGeneration": observed,
            "replicas": status.get("replicas", desired),
            "updatedReplicas": status.get("updated", desired),
            "readyReplicas": ready,
            "conditions": status.get("conditions", []),
        },
    }


def states(prefill: RoleState | None, decode: RoleState | None, router: RoleState | None) -> dict[str, Any]:
    return {"prefill": prefill, "decode": decode, "router": router}


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_role_state_rolled_out_only_when_observed_updated_and_ready() -> None:
    done = role_state(deployment(2, 2))
    assert done is not None and done.rolled_out and (done.desired, done.ready) == (2, 2)
    stale = role_state(deployment(2, 2, generation=3, observed=2))
    assert stale is not None and not stale.rolled_out
    surging = role_state(deployment(2, 2, replicas=3))
    assert surging is not None and not surging.rolled_out
    assert role_state(None) is None


def test_role_state_reports_a_stuck_rollout() -> None:
    stuck = deployment(
        2,
        0,
        conditions=[{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}],
    )
    state = role_state(stuck)
    assert state is not None and state.failure is not None and "ProgressDeadlineExceeded" in state.failure


def test_ready_status_fills_roles_ratio_router_and_conditions() -> None:
    ready = role_state(deployment(2, 2))
    decode = role_state(deployment(3, 3))
    status = build_status({}, 4, states(ready, decode, ready), "http://x-router.ns.svc:8000", None, T0)
    assert status["observedGeneration"] == 4
    assert status["prefill"] == {"replicas": 2, "ready": 2, "desired": 2, "display": "2/2"}
    assert status["decode"]["display"] == "3/3"
    assert status["ratio"] == "2:3"
    assert status["router"]["endpoint"] == "http://x-router.ns.svc:8000"
    assert condition(status, "Ready")["status"] == "True"
    assert condition(status, "Progressing")["status"] == "False"
    assert condition(status, "Degraded")["status"] == "False"
    assert all(c["observedGeneration"] == 4 for c in status["conditions"])


def test_not_ready_while_a_role_is_rolling_out() -> None:
    status = build_status(
        {}, 1, states(role_state(deployment(2, 1)), role_state(deployment(1, 1)), None), None, None, T0
    )
    ready = condition(status, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "ReplicasNotReady"
    assert "prefill 1/2 ready" in ready["message"] and "router missing" in ready["message"]
    assert condition(status, "Progressing")["status"] == "True"


def test_problem_degrades_and_blocks_progress() -> None:
    problem = Problem("InvalidSpec", "spec.prefill.replicas: must be >= 0")
    status = build_status({}, 7, states(None, None, None), None, problem, T0)
    degraded = condition(status, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")
    assert "spec.prefill.replicas" in degraded["message"]
    assert condition(status, "Ready")["reason"] == "InvalidSpec"
    assert condition(status, "Progressing")["reason"] == "Blocked"


def test_last_transition_time_moves_only_when_status_flips() -> None:
    first = set_api_condition([], "Ready", False, "ReplicasNotReady", "0/1", 1, T0)
    same = set_api_condition(first, "Ready", False, "ReplicasNotReady", "still 0/1", 2, T1)
    assert same[0]["lastTransitionTime"] == T0_TEXT and same[0]["message"] == "still 0/1"
    flipped = set_api_condition(same, "Ready", True, "AllReplicasReady", "1/1", 2, T1)
    assert flipped[0]["lastTransitionTime"] == T1_TEXT


def test_other_writers_conditions_and_fields_survive() -> None:
    current = {
        "conditions": [{"type": "MetricsAvailable", "status": "True", "reason": "Ok", "message": ""}],
        "autoscaling": {"desiredReplicas": {"prefill": 1, "decode": 2}},
    }
    status = build_status(current, 1, states(None, None, None), None, None, T0)
    assert status["autoscaling"] == current["autoscaling"]
    assert {c["type"] for c in status["conditions"]} == {
        "MetricsAvailable",
        "Ready",
        "Progressing",
        "Degraded",
    }


def test_unchanged_status_is_not_rewritten() -> None:
    roles = states(role_state(deployment(1, 1)), role_state(deployment(1, 1)), role_state(deployment(1, 1)))
    first = build_status({}, 1, roles, None, None, T0)
    again = build_status(first, 1, roles, None, None, T1)
    assert not status_differs(first, again)
    assert status_differs(first, build_status(first, 2, roles, None, None, T1))


OWNER = {
    "apiVersion": "disagg.dev/v1alpha1",
    "kind": "DisaggregatedDeployment",
    "metadata": {"name": "llama", "namespace": "team", "uid": "u-1"},
}


def test_children_get_a_controller_owner_reference_and_lead_back_to_it() -> None:
    child = with_owner({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "llama-router"}}, OWNER)
    assert child["metadata"]["namespace"] == "team"
    assert child["metadata"]["ownerReferences"] == [owner_reference(OWNER)]
    assert owner_reference(OWNER)["controller"] and owner_reference(OWNER)["blockOwnerDeletion"]
    assert controller_owner(child, "DisaggregatedDeployment", "disagg.dev") == ("team", "llama")
    assert controller_owner(child, "Deployment", "apps") is None
    assert controller_owner({"metadata": {"name": "x"}}, "DisaggregatedDeployment", "disagg.dev") is None


def test_gate_folds_a_burst_into_one_follow_up_run() -> None:
    gate = ReconcileGate()
    started, release = threading.Event(), threading.Event()
    runs: list[str] = []

    def slow() -> str:
        runs.append("first")
        started.set()
        release.wait()  # however long the main thread takes (a loaded machine): set below, or in finally
        return "first"

    first = threading.Thread(target=gate.run, args=("k", 0, lambda level: slow()))
    results: list[tuple[bool, object]] = []
    follow_up = threading.Thread(
        target=lambda: results.append(gate.run("k", 0, lambda level: runs.append(f"second at {level}")))
    )
    first.start()
    try:
        assert started.wait(60), "the first run never started"
        follow_up.start()
        # A third trigger while the follow-up is queued is folded into it, raising its level.
        while not gate._slots["k"].waiting:
            threading.Event().wait(0.001)
        assert gate.run("k", 1, lambda level: runs.append("third")) == (False, None)
    finally:
        release.set()
        first.join(60)
        if follow_up.ident is not None:  # started
            follow_up.join(60)
    assert not first.is_alive() and not follow_up.is_alive()
    assert runs == ["first", "second at 1"]
    assert results and results[0][0] is True


def test_trigger_queue_keeps_one_pending_run_per_key_at_the_highest_level() -> None:
    from disagg.controller.gate import TriggerQueue

    queued: list[Callable[[], None]] = []
    runs: list[tuple[object, int]] = []
    queue = TriggerQueue(queued.append, lambda key, level: runs.append((key, level)))
    assert queue.trigger("a", 1) is True
    assert queue.trigger("a", 2) is False and queue.trigger("a", 1) is False  # folded, level raised
    assert queue.trigger("b", 1) is True
    assert len(queued) == 2 and queue.pending() == 2
    queued.pop(0)()
    assert runs == [("a", 2)] and queue.pending() == 1
    assert queue.trigger("a", 1) is True  # the run started: the next trigger queues the next run
    for work in queued:
        work()
    assert runs == [("a", 2), ("b", 1), ("a", 1)] and queue.pending() == 0


def test_trigger_queue_drops_a_trigger_the_stopped_pool_refuses() -> None:
    from disagg.controller.gate import TriggerQueue

    def refuse(work: Callable[[], None]) -> None:
        raise RuntimeError("cannot schedule new futures after shutdown")

    queue = TriggerQueue(refuse, lambda key, level: None)
    assert queue.trigger("a", 1) is False and queue.pending() == 0


def test_watch_handlers_return_before_the_reconcile_runs() -> None:
    """The child-event handler is a coroutine: it decides the level, hands the run to the pool and
    returns (kopf can free the event's body); triggers for one owner fold while its run waits."""
    import asyncio

    import kopf

    from disagg.controller.handlers import ReconcileContext, register
    from disagg.controller.reconcile import Reconciler
    from disagg.controller.settings import ControllerSettings

    submitted: list[Callable[[], None]] = []

    class Pool:
        def submit(self, work: Callable[[], None]) -> None:
            submitted.append(work)

    reconciled: list[tuple[str, str]] = []

    class Recorder(Reconciler):
        def reconcile(self, namespace: str, name: str) -> None:  # type: ignore[override]
            reconciled.append((namespace, name))

    settings = ControllerSettings()
    context = ReconcileContext(Recorder(None, settings), ReconcileGate(), settings, Pool())  # type: ignore[arg-type]
    registry = kopf.OperatorRegistry()
    register(registry, context)
    (handler,) = [h for h in registry._watching.get_all_handlers() if h.id == "child-deployments"]
    child = {
        "kind": "Deployment",
        "metadata": {
            "name": "llama-decode",
            "namespace": "team",
            "ownerReferences": [
                {
                    "apiVersion": "disagg.dev/v1alpha1",
                    "kind": "DisaggregatedDeployment",
                    "name": "llama",
                    "uid": "u1",
                    "controller": True,
                }
            ],
        },
    }
    for kind in ("MODIFIED", "DELETED"):
        assert asyncio.run(handler.fn(event={"type": kind}, body=child)) is None
    assert reconciled == [] and len(submitted) == 1  # nothing applied yet: FULL, and the two folded
    assert context.triggers.pending() == 1
    submitted[0]()
    assert reconciled == [("team", "llama")] and context.triggers.pending() == 0
    (resync,) = [h for h in registry._spawning.get_all_handlers() if h.id == "resync"]
    assert asyncio.run(resync.fn(namespace="team", name="llama")) is None
    assert len(submitted) == 2 and reconciled == [("team", "llama")]  # queued, not run by the timer
    submitted[1]()
    assert reconciled == [("team", "llama")] * 2


def test_a_new_deployment_is_applied_from_its_first_watch_event_and_once() -> None:
    """The deployment's own watch event starts the first reconcile of a new object (ahead of kopf's
    finalizer round trip); kopf's creation handler then finds that generation applied and skips it. An
    object with status from an earlier run, or being deleted, is left to the resume/update handlers."""
    import asyncio

    import kopf

    from disagg.controller.handlers import ReconcileContext, register

    submitted: list[Callable[[], None]] = []

    class Pool:
        def submit(self, work: Callable[[], None]) -> None:
            submitted.append(work)

    reconciled: list[tuple[str, str]] = []
    settings = ControllerSettings()

    class Recorder(Reconciler):
        def reconcile(self, namespace: str, name: str) -> None:  # type: ignore[override]
            reconciled.append((namespace, name))
            self._remember((namespace, name), Applied(3, {"prefill": 1}, {}, None))

    reconciler = Recorder(None, settings)  # type: ignore[arg-type]
    context = ReconcileContext(reconciler, ReconcileGate(), settings, Pool())  # type: ignore[arg-type]
    registry = kopf.OperatorRegistry()
    register(registry, context)
    (watch,) = [h for h in registry._watching.get_all_handlers() if h.id == "replicas-watch"]
    (create,) = [h for h in registry._changing.get_all_handlers() if h.reason == kopf.Reason.CREATE]
    new = {"metadata": {"name": "llama", "namespace": "team", "generation": 3}, "spec": {}}
    deleting = {"metadata": {**new["metadata"], "name": "old", "deletionTimestamp": T0_TEXT}}
    seen = {**new, "metadata": {**new["metadata"], "name": "seen"}, "status": {"observedGeneration": 3}}
    for body in (deleting, seen):
        asyncio.run(watch.fn(event={"type": "ADDED"}, body=body))
    assert submitted == []
    for kind in ("ADDED", "MODIFIED"):  # the second (kopf's finalizer) folds into the pending run
        asyncio.run(watch.fn(event={"type": kind}, body=new))
    assert len(submitted) == 1 and reconciled == []
    submitted[0]()
    assert reconciled == [("team", "llama")]
    asyncio.run(watch.fn(event={"type": "MODIFIED"}, body=new))
    assert len(submitted) == 1  # applied now: no longer new
    create.fn(namespace="team", name="llama", reason=kopf.Reason.CREATE, body=new)
    assert reconciled == [("team", "llama")]  # that generation is applied: skipped
    moved = {**new, "metadata": {**new["metadata"], "generation": 4}}
    create.fn(namespace="team", name="llama", reason=kopf.Reason.CREATE, body=moved)
    update = kopf.Reason.UPDATE
    create.fn(namespace="team", name="llama", reason=update, body=new)  # an update always runs
    assert reconciled == [("team", "llama")] * 3


def test_matches_allows_server_additions_but_not_changes() -> None:
    desired = {
        "spec": {"replicas": 2, "ports": [{"port": 8000, "name": "http"}]},
        "metadata": {"labels": {"a": "1"}},
    }
    live = copy.deepcopy(desired)
    live["spec"]["ports"][0]["protocol"] = "TCP"
    live["metadata"]["labels"]["added-by-someone"] = "x"
    live["status"] = {"readyReplicas": 1}
    assert matches(desired, live)
    assert matches({"limits": {"nvidia.com/gpu": 1}}, {"limits": {"nvidia.com/gpu": "1"}})
    assert matches(desired, MappingProxyType(live))  # kopf hands bodies over as read-only mappings
    scaled = copy.deepcopy(live)
    scaled["spec"]["replicas"] = 5
    assert not matches(desired, scaled)
    unlabeled = copy.deepcopy(live)
    del unlabeled["metadata"]["labels"]["a"]
    assert not matches(desired, unlabeled)
    extra_port = copy.deepcopy(live)
    extra_port["spec"]["ports"].append({"port": 1})
    assert not matches(desired, extra_port)


def test_child_events_escalate_only_for_drift_or_loss() -> None:
    reconciler = Reconciler(api=None, settings=ControllerSettings())  # type: ignore[arg-type]
    key = ("team", "llama")
    deployment = with_owner(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "llama-decode"},
            "spec": {"replicas": 2},
        },
        OWNER,
    )
    service = with_owner({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "llama-router"}}, OWNER)
    assert reconciler.child_event_level(key, deployment, deleted=False) == FULL  # nothing applied yet
    manifests = {("Deployment", "llama-decode"): deployment, ("Service", "llama-router"): service}
    reconciler._remember(key, Applied(1, {"prefill": 1, "decode": 2}, manifests, None))
    with_status = {**copy.deepcopy(deployment), "status": {"readyReplicas": 1}}
    assert reconciler.child_event_level(key, with_status, deleted=False) == REFRESH
    assert reconciler.child_event_level(key, service, deleted=False) == SKIP
    assert reconciler.child_event_level(key, service, deleted=True) == FULL
    edited = copy.deepcopy(deployment)
    edited["spec"]["replicas"] = 7
    assert reconciler.child_event_level(key, edited, deleted=False) == FULL


def test_a_spec_the_model_rejects_becomes_a_problem_naming_the_field() -> None:
    obj = {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedDeployment",
        "metadata": {"name": "llama", "namespace": "team"},
        "spec": {
            "model": {"name": "m", "source": {"huggingFace": {"id": "m"}}},
            "engine": {"type": "vllm"},
            "kvTransfer": {"connector": "nixl"},
            "prefill": {"replicas": -1},
        },
    }
    dd, problem = validate(obj)
    assert dd is None and problem is not None
    assert problem.reason == "InvalidSpec" and "spec.prefill.replicas" in problem.message
    obj["spec"]["prefill"]["replicas"] = 1
    dd, problem = validate(obj)
    assert dd is not None and problem is None


def test_children_are_applied_in_waves_that_keep_references_resolvable() -> None:
    kinds = [
        "ServiceAccount",
        "ConfigMap",
        "Service",
        "Deployment",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
    ]
    manifests = [{"kind": kind, "metadata": {"name": f"c{i}"}} for i, kind in enumerate(kinds)]
    waves = [[m["metadata"]["name"] for m in wave] for wave in apply_waves(manifests)]
    assert waves == [["c0", "c1", "c2", "c6"], ["c3", "c4", "c5"]]
    assert apply_waves([]) == []

"""Multi-node pools (LeaderWorkerSet groups) as the controller reads them: a group is one replica, Ready
when all its pods are and Pending while any of them is unscheduled; the status counts groups from the
LeaderWorkerSet's status; the local cluster installs the LWS release's webhooks by URL."""

from __future__ import annotations

from pathlib import Path

from disagg.api.common import rfc3339
from disagg.cluster.lws import LwsPorts, _json_patch, controller_config
from disagg.controller.pods import group_infos, pod_info, pool_observation
from disagg.controller.reconcile import role_states
from disagg.controller.status import build_status

T0 = 1_800_000_000.0


def _pod(
    name: str,
    group: int,
    leader: bool,
    *,
    ready: bool = True,
    scheduled: bool = True,
    unschedulable_at: float | None = None,
    ready_at: float = T0 + 10,
    deleting: bool = False,
) -> dict[str, object]:
    conditions: list[dict[str, str]] = [
        {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": rfc3339(ready_at)}
    ]
    if unschedulable_at is not None:
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "lastTransitionTime": rfc3339(unschedulable_at),
            }
        )
    labels = {
        "disagg.dev/role": "decode",
        "disagg.dev/group-role": "leader" if leader else "worker",
        "leaderworkerset.sigs.k8s.io/group-index": str(group),
    }
    metadata: dict[str, object] = {"name": name, "labels": labels, "creationTimestamp": rfc3339(T0)}
    if deleting:
        metadata["deletionTimestamp"] = rfc3339(T0 + 20)
    return {
        "metadata": metadata,
        "spec": {"nodeName": "kwok-h200-0"} if scheduled else {},
        "status": {"conditions": conditions},
    }


def test_a_group_counts_once_ready_only_when_every_pod_is() -> None:
    pods = [
        pod_info(_pod("d-lws-0", 0, True, ready_at=T0 + 5)),
        pod_info(_pod("d-lws-0-1", 0, False, ready_at=T0 + 30)),
        pod_info(_pod("d-lws-1", 1, True)),
        pod_info(_pod("d-lws-1-1", 1, False, ready=False)),
        pod_info(_pod("d-lws-2", 2, True)),  # its worker StatefulSet has no pod yet
    ]
    groups = group_infos(pods, size=2)
    assert [g.name for g in groups] == ["d-lws-0", "d-lws-1", "d-lws-2"]
    assert [g.ready for g in groups] == [True, False, False]
    assert groups[0].ready_since == T0 + 30  # Ready when its last pod turned Ready
    pool = pool_observation(3, groups, now=T0 + 60, gpus_per_replica=16)
    assert (pool.replicas, pool.ready, pool.pending) == (3, 1, 0)


def test_a_group_that_cannot_be_placed_is_one_pending_replica() -> None:
    pods = [
        pod_info(_pod("d-lws-0", 0, True)),
        pod_info(_pod("d-lws-0-1", 0, False)),
        # the leader found a node, its worker did not: the group can't run
        pod_info(_pod("d-lws-1", 1, True, ready=False)),
        pod_info(_pod("d-lws-1-1", 1, False, ready=False, scheduled=False, unschedulable_at=T0)),
        pod_info(_pod("d-lws-2", 2, True, ready=False, scheduled=False, unschedulable_at=T0 + 40)),
        pod_info(_pod("d-lws-2-1", 2, False, ready=False, scheduled=False, unschedulable_at=T0 + 30)),
    ]
    groups = group_infos(pods, size=2)
    pool = pool_observation(3, groups, now=T0 + 70, gpus_per_replica=16)
    assert (pool.replicas, pool.ready, pool.pending) == (3, 1, 2)
    assert pool.unschedulable_s == (70.0, 40.0)  # since the group's first pod turned Unschedulable


def test_a_group_with_a_terminating_pod_is_neither_capacity_nor_demand() -> None:
    pods = [
        pod_info(_pod("d-lws-0", 0, True)),
        pod_info(_pod("d-lws-0-1", 0, False)),
        pod_info(_pod("d-lws-1", 1, True, deleting=True)),
        pod_info(_pod("d-lws-1-1", 1, False)),
    ]
    pool = pool_observation(1, group_infos(pods, size=2), now=T0 + 60)
    assert (pool.ready, pool.pending) == (1, 0)


def _lws(role: str, replicas: int, ready: int, generation: int = 1) -> dict[str, object]:
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": f"d-{role}-lws", "labels": {"disagg.dev/role": role}, "generation": generation},
        "spec": {"replicas": replicas, "leaderWorkerTemplate": {"size": 2}},
        "status": {
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": replicas,
            "observedGeneration": generation,
        },
    }


def _deployment(role: str) -> dict[str, object]:
    return {
        "kind": "Deployment",
        "metadata": {"name": f"d-{role}", "labels": {"disagg.dev/role": role}, "generation": 1},
        "spec": {"replicas": 2},
        "status": {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2, "observedGeneration": 1},
    }


def test_the_status_counts_groups_from_the_leaderworkersets() -> None:
    live = {
        ("LeaderWorkerSet", "d-prefill-lws"): _lws("prefill", 1, 1),
        ("LeaderWorkerSet", "d-decode-lws"): _lws("decode", 2, 1),
        ("Deployment", "d-router"): _deployment("router"),
    }
    roles = role_states(live)
    assert roles["decode"] is not None and (roles["decode"].desired, roles["decode"].ready) == (2, 1)
    status = build_status({}, 1, roles, None, None, T0)
    assert status["decode"]["display"] == "1/2"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"  # a group still starting
    live[("LeaderWorkerSet", "d-decode-lws")] = _lws("decode", 2, 2)
    status = build_status(status, 1, role_states(live), None, None, T0)
    assert next(c for c in status["conditions"] if c["type"] == "Ready")["status"] == "True"


def test_the_webhook_patches_and_the_controller_configuration() -> None:
    hooks = {"webhooks": [{"name": "a"}, {"name": "b", "rules": []}]}
    patched = _json_patch(hooks, [{"op": "replace", "path": "/webhooks/1", "value": {"name": "c"}}])
    assert patched == {"webhooks": [{"name": "a"}, {"name": "c"}]} and hooks["webhooks"][1]["name"] == "b"
    config = controller_config(LwsPorts(webhook=9443, health=8081), cert_dir=Path("/x"))
    assert config["internalCertManagement"] == {"enable": False}
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["webhook"] == {"host": "127.0.0.1", "port": 9443, "certDir": "/x"}

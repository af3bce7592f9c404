"""The engine pods of a deployment as the autoscaler sees them: what each pool has, how long its pods
took to start, and which decode pods to remove first.

A pool of multi-node replicas is a LeaderWorkerSet: its replicas are groups (a leader pod and workers), and
everything here counts a group once, as one replica: Ready when every pod of it is, Pending while any pod
of it is unscheduled (a group that can't be placed), started when its last pod turned Ready.

The readers are pure (pod objects as JSON in, dataclasses out); :func:`read_pool` and
:func:`set_deletion_costs` talk to the API server through :mod:`disagg.k8s`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from disagg.api.common import parse_rfc3339
from disagg.k8s.apply import DEPLOYMENT_LABEL
from disagg.k8s.client import DEPLOYMENT, LEADERWORKERSET, MERGE_PATCH, POD, KubeApi
from disagg.policy.types import Role, RoleObservation
from disagg.render.lws import GROUP_INDEX_LABEL
from disagg.render.names import GROUP_ROLE_LABEL, lws_name

ROLE_LABEL = "disagg.dev/role"
# Source: Kubernetes ReplicaSet pod-deletion-cost annotation (beta since v1.22), "Pods with lower
# deletion cost are preferred to be deleted before pods with higher deletion cost".
# https://kubernetes.io/docs/reference/labels-annotations-taints/#pod-deletion-cost
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
STARTUP_SAMPLE_PODS = 3  # a role's start-up is the median over its most recently created Ready pods


@dataclass(frozen=True)
class PodInfo:
    """What the loop needs to know about one engine pod."""

    name: str
    role: str
    ready: bool
    scheduled: bool
    unschedulable_since: float | None = None  # when PodScheduled turned False with reason Unschedulable
    terminating: bool = False
    created: float | None = None  # metadata.creationTimestamp
    ready_since: float | None = None  # lastTransitionTime of the Ready condition, while it is True
    # A LeaderWorkerSet group's pod: its group index (None outside a group), and whether it is the leader
    group: str | None = None
    leader: bool = True


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in status.get("conditions") or ():
        if cond.get("type") == kind:
            return dict(cond)
    return None


def pod_info(pod: Mapping[str, Any]) -> PodInfo:
    """A PodInfo from a pod object as JSON (camelCase keys, as the API server serves it)."""
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    labels = metadata.get("labels") or {}
    ready = _condition(status, "Ready")
    scheduled = _condition(status, "PodScheduled")
    is_scheduled = bool((pod.get("spec") or {}).get("nodeName")) or (
        scheduled is not None and scheduled.get("status") == "True"
    )
    unschedulable_since = None
    if not is_scheduled and scheduled is not None and scheduled.get("reason") == "Unschedulable":
        unschedulable_since = parse_rfc3339(scheduled.get("lastTransitionTime"))
        if unschedulable_since is None:
            unschedulable_since = parse_rfc3339(metadata.get("creationTimestamp"))
    is_ready = ready is not None and ready.get("status") == "True"
    return PodInfo(
        name=str(metadata.get("name", "")),
        role=str(labels.get(ROLE_LABEL, "")),
        ready=is_ready,
        scheduled=is_scheduled,
        unschedulable_since=unschedulable_since,
        terminating=metadata.get("deletionTimestamp") is not None,
        created=parse_rfc3339(metadata.get("creationTimestamp")),
        ready_since=parse_rfc3339(ready.get("lastTransitionTime"))
        if ready is not None and is_ready
        else None,
        # LWS labels every pod of a group with its index (the workers through their StatefulSet's template)
        group=(str(labels.get(GROUP_INDEX_LABEL, "")) or None) if GROUP_ROLE_LABEL in labels else None,
        leader=labels.get(GROUP_ROLE_LABEL, "leader") == "leader",
    )


def group_infos(pods: Sequence[PodInfo], size: int) -> tuple[PodInfo, ...]:
    """The groups of a LeaderWorkerSet pool, each as one PodInfo named after its leader: Ready when all
    ``size`` pods of it are, scheduled when all of them are (Unschedulable since its first pod turned so),
    terminating when any pod of it is (LWS recreates or removes a group whole), created with its leader and
    Ready since its last pod turned Ready."""
    buckets: dict[str, list[PodInfo]] = {}
    for pod in pods:
        buckets.setdefault(pod.group if pod.group is not None else pod.name, []).append(pod)
    groups = []
    for key in sorted(buckets, key=lambda k: (len(k), k)):
        members = buckets[key]
        leader = next((p for p in members if p.leader), None)
        head = leader if leader is not None else min(members, key=lambda p: p.name)
        complete = leader is not None and len(members) >= size
        ready = complete and all(p.ready for p in members)
        waiting = [p.unschedulable_since for p in members if p.unschedulable_since is not None]
        since = [p.ready_since for p in members if p.ready_since is not None]
        groups.append(
            PodInfo(
                name=head.name,
                role=head.role,
                ready=ready,
                scheduled=all(p.scheduled for p in members),
                unschedulable_since=min(waiting) if waiting else None,
                terminating=any(p.terminating for p in members),
                created=head.created,
                ready_since=max(since) if ready and since else None,
                group=head.group,
                leader=True,
            )
        )
    return tuple(groups)


def pool_observation(
    replicas: int, pods: Sequence[PodInfo], now: float, gpus_per_replica: int = 1
) -> RoleObservation:
    """One pool's replica counts for the policy: ``replicas`` of the child Deployment, its Ready and
    unscheduled pods and how long each of those has been Unschedulable. Terminating pods are neither
    ready capacity nor pending demand."""
    live = [p for p in pods if not p.terminating]
    return RoleObservation(
        replicas=replicas,
        ready=sum(1 for p in live if p.ready),
        pending=sum(1 for p in live if not p.scheduled),
        unschedulable_s=tuple(
            max(0.0, now - p.unschedulable_since) for p in live if p.unschedulable_since is not None
        ),
        gpus_per_replica=gpus_per_replica,
    )


@dataclass(frozen=True)
class Pool:
    """One pool as the API server has it: the child Deployment's (or LeaderWorkerSet's) replicas and the
    pods; for a LeaderWorkerSet one PodInfo per group (:func:`group_infos`)."""

    replicas: int
    pods: tuple[PodInfo, ...]
    multi_node: bool = False  # a LeaderWorkerSet: replicas are groups, removed highest index first


def read_pool(kube: KubeApi, namespace: str, name: str, role: Role, multi_node: bool = False) -> Pool | None:
    """Replicas from the child Deployment, or the LeaderWorkerSet of a multi-node pool, and its pods; None
    before that child exists."""
    selector = f"{DEPLOYMENT_LABEL}={name},{ROLE_LABEL}={role}"
    if multi_node:
        lws = kube.get(LEADERWORKERSET, namespace, lws_name(name, role))
        if lws is None:
            return None
        spec = lws.get("spec") or {}
        size = int((spec.get("leaderWorkerTemplate") or {}).get("size", 1))
        pods = [pod_info(p) for p in kube.list(POD, namespace, selector)]
        return Pool(int(spec.get("replicas", 0)), group_infos(pods, size), multi_node=True)
    child = kube.get(DEPLOYMENT, namespace, f"{name}-{role}")
    if child is None:
        return None
    replicas = int((child.get("spec") or {}).get("replicas", 0))
    return Pool(replicas, tuple(pod_info(p) for p in kube.list(POD, namespace, selector)))


def pod_startup_s(pod: PodInfo) -> float | None:
    """Seconds from the pod's creation to its turning Ready; None while it is not Ready (or has no
    timestamps). Both are second-precision API timestamps."""
    if pod.created is None or pod.ready_since is None or pod.ready_since < pod.created:
        return None
    return pod.ready_since - pod.created


def measured_startup_s(
    pods: Sequence[PodInfo], sample: int = STARTUP_SAMPLE_PODS
) -> tuple[float, int] | None:
    """The start-up measured on a role's own pods, and how many pods it is from: the median time from
    creation to Ready of the ``sample`` most recently created pods that are Ready. None: no pod is Ready.

    Creation to Ready is what the policy waits through after asking for a replica: scheduling (and node
    provisioning), image pull, the weights fetched or read, engine start. A pod whose Ready condition
    flipped back and forth since counts from its last flip; the median of the newest pods keeps one such
    pod from setting the value.
    """
    timed = sorted(
        ((p.created or 0.0, seconds) for p in pods if (seconds := pod_startup_s(p)) is not None),
        reverse=True,
    )
    recent = [seconds for _, seconds in timed[:sample]]
    if not recent:
        return None
    return float(statistics.median(recent)), len(recent)


def deletion_costs(loads: Mapping[str, float | None]) -> dict[str, int]:
    """pod -> deletion cost: the least-loaded pod gets the lowest cost (is removed first).

    Pods whose load is unknown get the highest costs: the loop never chooses to remove what it can't
    see. Costs are ranks (0, 1, 2, ...); ties keep name order so the result is deterministic.
    """
    known = sorted(((v, k) for k, v in loads.items() if v is not None and math.isfinite(v)))
    unknown = sorted(k for k, v in loads.items() if v is None or not math.isfinite(v))
    ranked = [name for _, name in known] + unknown
    return {name: rank for rank, name in enumerate(ranked)}


def set_deletion_costs(kube: KubeApi, namespace: str, costs: Mapping[str, int]) -> None:
    """Annotate each pod with its deletion cost (a merge patch: other annotations are kept)."""
    for pod, cost in costs.items():
        body = {"metadata": {"annotations": {POD_DELETION_COST: str(cost)}}}
        try:
            kube.request("PATCH", POD.path(namespace, pod), body=body, content_type=MERGE_PATCH)
        except ApiException as error:
            if error.status != 404:  # a pod that is already gone needs no cost
                raise

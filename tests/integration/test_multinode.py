"""Multi-node replicas on the real LeaderWorkerSet controller (sigs.k8s.io/lws, built and run by the local
control plane with its webhooks), kwok H200 nodes and the operator as a real process.

One deployment, DeepSeek-R1 wide-EP on vLLM with 2-node groups for prefill and decode on the cluster's 8
H200 nodes: its groups become Ready (every pod of a group Ready, the webhook's group labels and leader
address on them); the role Services reach leaders only and the router discovers leaders only; decode
scales by whole groups: up, new groups with all their pods; asked for a group the H200 nodes can't hold,
the autoscaler sees a Pending group, sets ScalingLimited and brings the pool back to what fits; down, the
highest group goes, leader and workers, the workers running on while the leader drains, and the other
groups stay as they were.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from disagg.cluster.kwok_stages import TERMINATE_AFTER_GRACE
from disagg.cluster.wait import wait_for
from disagg.k8s.client import (
    DEPLOYMENT,
    DISAGG_DEPLOYMENT,
    LEADERWORKERSET,
    MERGE_PATCH,
    POD,
    RATIO_POLICY,
    SERVICE,
    JsonDict,
    Kind,
    KubeApi,
)

if TYPE_CHECKING:
    from conftest import OperatorFactory  # tests/integration/conftest.py

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "deepseek-r1-wideep-vllm.yaml"
NODE = Kind("v1", "Node", "nodes", namespaced=False)
NAME = "wide"
GROUP_ROLE = "disagg.dev/group-role"
GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
H200_NODES = 8  # disagg.cluster.layout.DEFAULT_NODE_POOLS
TIMEOUT_S = 120.0


def poll(check: Callable[[], Any], timeout_s: float = TIMEOUT_S, what: str = "") -> Any:
    return wait_for(check, timeout_s, 0.25, what)


def deployment(namespace: str) -> JsonDict:
    """The vLLM wide-EP example with 2-node decode groups too (DP16 x EP16), weights from Hugging Face
    (no model cache: no download Job to play), so prefill and up to 3 decode groups fill the 8 H200 nodes."""
    (doc,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    doc["metadata"] = {"name": NAME, "namespace": namespace}
    spec = doc["spec"]
    del spec["model"]["cache"]
    del spec["model"]["source"]["huggingFace"]["tokenSecretRef"]
    spec["decode"]["parallelism"] = dict(spec["prefill"]["parallelism"])
    # a short drain, which kwok holds each decode pod through (its grace period: 1 + 5 + 10 s margin)
    spec["decode"].update(
        preStopSleepSeconds=1,
        shutdownTimeoutSeconds=5,
        podTemplate={"metadata": {"annotations": {TERMINATE_AFTER_GRACE: "true"}}},
    )
    return dict(doc)


def ratio_policy(namespace: str) -> JsonDict:
    """A policy that evaluates often and, with no Prometheus, holds every pool where it is (its signals
    are missing): what moves decode is the Pending group's ceiling alone."""
    return {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "RatioPolicy",
        "metadata": {"name": "hold", "namespace": namespace},
        "spec": {
            "algorithm": "slo-feedback",
            "mode": "active",
            "evaluationIntervalSeconds": 5,
            "pendingBackoffSeconds": 3600,
        },
    }


def decode_pods(kube: KubeApi, namespace: str) -> list[JsonDict]:
    selector = f"disagg.dev/deployment={NAME},disagg.dev/role=decode"
    return [p for p in kube.list(POD, namespace, selector) if not p["metadata"].get("deletionTimestamp")]


def groups(pods: list[JsonDict]) -> dict[str, dict[str, str]]:
    """group index -> {pod name: group role} of the pods given."""
    found: dict[str, dict[str, str]] = {}
    for pod in pods:
        labels = pod["metadata"]["labels"]
        found.setdefault(labels[GROUP_INDEX], {})[pod["metadata"]["name"]] = labels[GROUP_ROLE]
    return found


def ready(pod: JsonDict) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def lws(kube: KubeApi, namespace: str, role: str) -> JsonDict:
    obj = kube.get(LEADERWORKERSET, namespace, f"{NAME}-{role}-lws")
    assert obj is not None, f"LeaderWorkerSet {NAME}-{role}-lws is missing"
    return obj


def status(kube: KubeApi, namespace: str) -> JsonDict:
    obj = kube.get(DISAGG_DEPLOYMENT, namespace, NAME)
    assert obj is not None
    return dict(obj.get("status") or {})


def wait_decode_groups(kube: KubeApi, namespace: str, count: int) -> dict[str, dict[str, str]]:
    """Wait until decode is ``count`` whole groups of 2 Ready pods, LWS and the deployment's status agree."""

    def settled() -> dict[str, dict[str, str]] | None:
        pods = decode_pods(kube, namespace)
        found = groups(pods)
        lws_status = (kube.get(LEADERWORKERSET, namespace, f"{NAME}-decode-lws") or {}).get("status") or {}
        whole = sorted(found) == [str(i) for i in range(count)] and all(
            sorted(members.values()) == ["leader", "worker"] for members in found.values()
        )
        if not whole or not all(ready(p) for p in pods) or lws_status.get("readyReplicas") != count:
            return None
        decode = status(kube, namespace).get("decode") or {}
        return found if decode.get("display") == f"{count}/{count}" else None

    result: dict[str, dict[str, str]] = poll(settled, what=f"decode as {count} Ready groups of 2 pods")
    return result


def selected_pods(kube: KubeApi, namespace: str, service: str) -> set[str]:
    """The live pods a Service's selector picks, as its EndpointSlice controller would (the slices stay
    empty here: kwok's pod IPs are loopback addresses, which EndpointSlice validation refuses)."""
    svc = kube.get(SERVICE, namespace, service)
    assert svc is not None, f"Service {service} is missing"
    selector = ",".join(f"{k}={v}" for k, v in sorted(svc["spec"]["selector"].items()))
    pods = kube.list(POD, namespace, selector)
    return {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}


def router_selected(kube: KubeApi, namespace: str, role: str) -> set[str]:
    """The live pods the router discovers for a role: its --ROLE-selector labels (vllm-router's service
    discovery lists the pods those labels select)."""
    router = kube.get(DEPLOYMENT, namespace, f"{NAME}-router")
    assert router is not None
    container = router["spec"]["template"]["spec"]["containers"][0]
    args = [*(container.get("command") or []), *(container.get("args") or [])]
    start = args.index(f"--{role}-selector") + 1
    labels = []
    for arg in args[start:]:
        if arg.startswith("--"):
            break
        labels.append(arg)
    assert f"{GROUP_ROLE}=leader" in labels, labels
    pods = kube.list(POD, namespace, ",".join(labels))
    return {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}


def set_decode_replicas(kube: KubeApi, namespace: str, replicas: int) -> None:
    kube.request(
        "PATCH",
        DISAGG_DEPLOYMENT.path(namespace, NAME),
        body={"spec": {"decode": {"replicas": replicas}}},
        content_type=MERGE_PATCH,
    )


def test_multi_node_groups_run_route_to_leaders_scale_whole_and_report_when_they_cannot_be_placed(
    kube: KubeApi, namespace: str, operator_factory: OperatorFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # prefill and 3 decode groups of 2 nodes fill the H200 nodes exactly; a 4th decode group can't be placed
    assert len(kube.list(NODE, None, "disagg.dev/gpu-type=h200")) == H200_NODES == 2 + 3 * 2
    monkeypatch.setenv("DISAGG_AUTOSCALING_PENDING_GRACE_S", "5")
    monkeypatch.setenv("DISAGG_AUTOSCALING_TICK_S", "1")
    operator = operator_factory(["--standalone"])
    kube.apply(deployment(namespace), field_manager="disagg-tests", kind=DISAGG_DEPLOYMENT)

    # groups Ready: one prefill and one decode group of a leader and a worker, labelled by LWS's webhook
    wait_decode_groups(kube, namespace, 1)
    prefill = kube.list(POD, namespace, f"disagg.dev/deployment={NAME},disagg.dev/role=prefill")
    assert groups(prefill) == {"0": {f"{NAME}-prefill-lws-0": "leader", f"{NAME}-prefill-lws-0-1": "worker"}}
    worker = next(p for p in prefill if p["metadata"]["labels"][GROUP_ROLE] == "worker")
    env = {e["name"]: e.get("value") for e in worker["spec"]["containers"][0].get("env") or []}
    assert env["LWS_LEADER_ADDRESS"] == f"{NAME}-prefill-lws-0.{NAME}-prefill-lws.{namespace}", env
    obj = poll(
        lambda: (s := status(kube, namespace)) and s.get("prefill", {}).get("display") == "1/1" and s,
        what="prefill 1/1 in status",
    )
    ready_condition = next(c for c in obj["conditions"] if c["type"] == "Ready")
    assert ready_condition["status"] == "True", ready_condition

    # the role Services and the router reach leaders only (workers serve no HTTP)
    assert selected_pods(kube, namespace, f"{NAME}-prefill") == {f"{NAME}-prefill-lws-0"}
    assert selected_pods(kube, namespace, f"{NAME}-decode") == {f"{NAME}-decode-lws-0"}
    assert router_selected(kube, namespace, "prefill") == {f"{NAME}-prefill-lws-0"}
    assert router_selected(kube, namespace, "decode") == {f"{NAME}-decode-lws-0"}

    # decode scales up by whole groups
    set_decode_replicas(kube, namespace, 3)
    before = wait_decode_groups(kube, namespace, 3)
    assert lws(kube, namespace, "decode")["spec"]["replicas"] == 3
    assert selected_pods(kube, namespace, f"{NAME}-decode") == {f"{NAME}-decode-lws-{i}" for i in range(3)}
    assert router_selected(kube, namespace, "decode") == {f"{NAME}-decode-lws-{i}" for i in range(3)}
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in decode_pods(kube, namespace)}

    # a group beyond the H200 nodes: prefill (2 nodes) + 4 decode groups (8) > 8 nodes. It stays Pending
    # (from 3 groups, so that no node is free for part of it: two new groups at once could each place a
    # leader and deadlock half-placed, as LWS groups do without a gang scheduler, and the ceiling would be
    # the 2 whole ones). The autoscaler, once enabled, sees the Pending group, sets ScalingLimited and
    # holds decode at the 3 groups that fit: the Pending group goes, the placed ones stay as they were.
    set_decode_replicas(kube, namespace, 4)

    def pending_group() -> bool:
        pods = [p for p in decode_pods(kube, namespace) if p["metadata"]["labels"].get(GROUP_INDEX) == "3"]
        return len(pods) == 2 and not any(p["spec"].get("nodeName") for p in pods)

    poll(pending_group, what="decode group 3 (leader and worker) Pending")
    kube.apply(ratio_policy(namespace), field_manager="disagg-tests", kind=RATIO_POLICY)
    bounds = {"minReplicas": 1, "maxReplicas": 4}
    kube.request(
        "PATCH",
        DISAGG_DEPLOYMENT.path(namespace, NAME),
        body={"spec": {"autoscaling": {"enabled": True, "policyRef": {"name": "hold"}, "decode": bounds}}},
        content_type=MERGE_PATCH,
    )

    def limited() -> JsonDict | None:
        current = status(kube, namespace)
        conditions = {c["type"]: c for c in current.get("conditions") or []}
        found = conditions.get("ScalingLimited") or {}
        desired = (current.get("autoscaling") or {}).get("desiredReplicas") or {}
        return current if found.get("status") == "True" and desired.get("decode") == 3 else None

    current = poll(limited, what="ScalingLimited and decode held at 3 groups")
    condition = next(c for c in current["conditions"] if c["type"] == "ScalingLimited")
    assert condition["reason"] == "PendingPods", condition
    assert wait_decode_groups(kube, namespace, 3) == before
    assert lws(kube, namespace, "decode")["spec"]["replicas"] == 3
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in decode_pods(kube, namespace)} == uids

    # ... and down by hand (autoscaling off): the highest group goes whole, the others stay untouched. The
    # leader drains first (preStop, then the engine finishes its streams within its grace period) while
    # its worker, whose ranks serve those streams, runs on: LWS deletes the worker StatefulSet only with
    # the leader pod that owns it.
    kube.request(
        "PATCH",
        DISAGG_DEPLOYMENT.path(namespace, NAME),
        body={"spec": {"autoscaling": {"enabled": False}, "decode": {"replicas": 2}}},
        content_type=MERGE_PATCH,
    )
    leader, worker = f"{NAME}-decode-lws-2", f"{NAME}-decode-lws-2-1"

    def draining() -> JsonDict | None:
        pod = kube.get(POD, namespace, leader)
        return pod if pod is not None and pod["metadata"].get("deletionTimestamp") else None

    assert poll(draining, what=f"{leader} terminating")["metadata"]["deletionGracePeriodSeconds"] == 16
    deadline, samples = time.monotonic() + TIMEOUT_S, 0
    while time.monotonic() < deadline:
        peer = kube.get(POD, namespace, worker)  # read first: the leader, read after, was there before
        if kube.get(POD, namespace, leader) is None:
            break
        assert peer is not None and ready(peer), f"{worker} went while its leader drained"
        assert not peer["metadata"].get("deletionTimestamp"), f"{worker} terminating while its leader drained"
        samples += 1
        time.sleep(0.5)
    else:
        pytest.fail(f"{leader} still there {TIMEOUT_S:.0f} s after its removal began")
    assert samples >= 4, f"{leader} was gone {samples} samples into its 16 s grace period"
    after = wait_decode_groups(kube, namespace, 2)
    assert after == {k: v for k, v in before.items() if k != "2"}
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in decode_pods(kube, namespace)} == {
        name: uid for name, uid in uids.items() if "-decode-lws-2" not in name
    }
    poll(lambda: kube.get(POD, namespace, worker) is None, what=f"{worker} removed after its leader")
    assert operator.alive()

    # leave the H200 nodes free for whatever runs next
    kube.delete(DISAGG_DEPLOYMENT, namespace, NAME)
    poll(
        lambda: not kube.list(POD, namespace, f"disagg.dev/deployment={NAME}"),
        what="the groups' pods removed",
    )

"""The live twin follows multi-node replicas (LeaderWorkerSet groups): only a group's leader gets an
engine, for the whole group's GPUs and layout (read from its command line by the policy's parser, the MoE
latency model for a MoE model), never a worker, and only once every pod of the group is Running.

The pods are built from what the operator renders for the wide-EP examples, plus what the LeaderWorkerSet
controller and webhook add (group index label, LWS_GROUP_SIZE), so the tests follow the real templates.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg.api.deployment import DisaggregatedDeployment
from disagg.perf.moe import MoeLatencyModel, Parallelism
from disagg.policy.bounds import replica_layout
from disagg.render import effective_replicas, render_children
from disagg.render.lws import GROUP_INDEX_LABEL, GROUP_SIZE_ENV
from disagg.twin.live.follower import (
    ENGINE_FINALIZER,
    Defaults,
    Overrides,
    PodFollower,
    defaults_from_deployment,
    group_size,
    pod_spec_for,
    serving_pods,
)
from disagg.twin.live.latency import load_step_latency
from disagg.twin.live.pods import PodPool, PoolSettings

ROOT = Path(__file__).resolve().parents[2]
Obj = dict[str, Any]


def example(engine: str) -> Obj:
    doc: Obj = yaml.safe_load((ROOT / "examples" / f"deepseek-r1-wideep-{engine}.yaml").read_text())
    return doc


def group_pods(doc: Obj, role: str, group: int, phases: list[str], env_size: bool = True) -> list[Obj]:
    """The pods of one group of ``role``'s LeaderWorkerSet: leader first, as the LWS controller makes them."""
    dd = DisaggregatedDeployment.model_validate(doc)
    (lws,) = [
        c
        for c in render_children(dd, effective_replicas(dd))
        if c["kind"] == "LeaderWorkerSet" and c["metadata"]["name"].endswith(f"-{role}-lws")
    ]
    template = lws["spec"]["leaderWorkerTemplate"]
    size = int(template["size"])
    assert len(phases) == size
    pods = []
    for index, phase in enumerate(phases):
        source = template["leaderTemplate"] if index == 0 else template["workerTemplate"]
        spec = copy.deepcopy(source["spec"])
        if env_size:
            for container in spec["containers"]:
                container.setdefault("env", []).append({"name": GROUP_SIZE_ENV, "value": str(size)})
        name = f"{lws['metadata']['name']}-{group}" + ("" if index == 0 else f"-{index}")
        labels = {**source["metadata"]["labels"], GROUP_INDEX_LABEL: str(group)}
        pods.append({"metadata": {"name": name, "labels": labels}, "spec": spec, "status": {"phase": phase}})
    return pods


def by_name(*groups: list[Obj]) -> dict[str, Obj]:
    return {p["metadata"]["name"]: p for group in groups for p in group}


def single_pod(role: str, phase: str = "Running") -> Obj:
    labels = {"disagg.dev/role": role, "disagg.dev/deployment": "dd"}
    return {"metadata": {"name": f"dd-{role}-x", "labels": labels}, "spec": {}, "status": {"phase": phase}}


def names(pods: list[Any]) -> set[str]:
    return {str(p["metadata"]["name"]) for p in pods}


def test_only_leaders_of_whole_running_groups_serve() -> None:
    doc = example("vllm")  # prefill: 2-node groups, decode: 4-node groups
    defaults = defaults_from_deployment(doc)
    ready = group_pods(doc, "decode", 0, ["Running"] * 4)
    partial = group_pods(doc, "decode", 1, ["Running", "Running", "Pending", "Running"])
    prefill = group_pods(doc, "prefill", 0, ["Running", "Running"])
    leader_pending = group_pods(doc, "prefill", 1, ["Pending", "Running"])
    chosen = serving_pods(by_name(ready, partial, prefill, leader_pending), defaults)
    assert names(chosen) == {ready[0]["metadata"]["name"], prefill[0]["metadata"]["name"]}

    # a single pod (a Deployment's) serves alone; a worker never gets an engine of its own
    alone = single_pod("decode")
    assert names(serving_pods({"x": alone}, Defaults())) == {"dd-decode-x"}
    assert pod_spec_for(ready[1], defaults, Overrides()) is None


def test_a_group_stops_serving_when_one_of_its_pods_goes() -> None:
    doc = example("vllm")
    defaults = defaults_from_deployment(doc)
    group = group_pods(doc, "prefill", 0, ["Running", "Running"])
    assert len(serving_pods(by_name(group), defaults)) == 1
    group[1]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert serving_pods(by_name(group), defaults) == []
    del group[1]["metadata"]["deletionTimestamp"]
    assert serving_pods(by_name(group[:1]), defaults) == []  # the worker's pod is gone altogether


def test_group_size_from_the_webhook_env_else_the_spec() -> None:
    doc = example("vllm")
    defaults = defaults_from_deployment(doc)
    with_env = group_pods(doc, "decode", 0, ["Running"] * 4)
    without = group_pods(doc, "decode", 0, ["Running"] * 4, env_size=False)
    assert group_size(with_env[0], Defaults()) == 4  # LWS_GROUP_SIZE alone
    assert group_size(without[0], defaults) == 4  # spec.decode.parallelism.nodesPerReplica
    assert group_size(single_pod("decode"), Defaults()) == 1


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_leader_plays_the_whole_group_with_the_policy_layout(engine: str) -> None:
    doc = example(engine)
    dd = DisaggregatedDeployment.model_validate(doc)
    defaults = defaults_from_deployment(doc)
    for role in ("prefill", "decode"):
        size = dd.spec.role(role).nodes_per_replica
        leader = group_pods(doc, role, 0, ["Running"] * size)[0]
        spec = pod_spec_for(leader, defaults, Overrides())
        assert spec is not None
        par = spec.choice.parallelism
        assert par is not None
        # the leader's command line, read by the policy's parser over the group's GPUs, gives the layout
        # the policy plans with from the spec
        layout = replica_layout(dd.spec, role)
        assert (par.tp, par.dp, par.ep, par.gpus_per_node) == (
            layout.tp,
            layout.dp,
            layout.ep,
            layout.gpus_per_node,
        )
        assert spec.choice.tp == par.gpus == dd.spec.role(role).gpus_per_replica
        assert par.nodes == size


def test_the_group_engine_runs_the_moe_latency_model() -> None:
    doc = example("vllm")
    defaults = defaults_from_deployment(doc)
    leader = group_pods(doc, "decode", 0, ["Running"] * 4)[0]
    spec = pod_spec_for(leader, defaults, Overrides(gpu="h200"))
    assert spec is not None
    model = load_step_latency(spec.choice)
    assert isinstance(model, MoeLatencyModel)
    assert model.parallelism == Parallelism(tp=1, dp=32, ep=32, gpus_per_node=8)
    assert model.tp == 32  # the whole group's GPUs (their NICs carry the KV transfers)


def test_dense_single_pods_keep_tensor_parallelism() -> None:
    pod = single_pod("decode")
    pod["spec"] = {"containers": [{"name": "engine", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}
    spec = pod_spec_for(pod, Defaults(model="llama-3.1-70b"), Overrides())
    assert spec is not None
    assert (spec.choice.tp, spec.choice.parallelism) == (4, None)


class FakeFollower(PodFollower):
    """The follower without an API server: patches are recorded."""

    def __init__(self, pool: PodPool) -> None:
        super().__init__(None, "ns", "wide", pool)
        self.patches: list[tuple[str, Any]] = []

    def _patch(self, name: str, body: Any) -> None:
        self.patches.append((name, body))


def test_follower_starts_one_engine_per_group_once_the_group_runs() -> None:
    doc = example("vllm")
    defaults = defaults_from_deployment(doc)

    async def scenario() -> tuple[set[str], set[str], set[str], set[str]]:
        # a long model load keeps the engines "starting": what the follower asked for, no servers needed
        pool = PodPool(PoolSettings(startup_delay_s=3600.0))
        follower = FakeFollower(pool)
        group = group_pods(doc, "prefill", 0, ["Running", "Pending"])
        follower.pods = by_name(group)
        await follower._apply(defaults)
        before = set(pool.pods)
        group[1]["status"]["phase"] = "Running"
        follower.pods = by_name(group)
        await follower._apply(defaults)
        after = set(pool.pods)
        held = {name for name, body in follower.patches if ENGINE_FINALIZER in str(body)}
        group[1]["status"]["phase"] = "Failed"
        await follower._apply(defaults)
        lost = set(pool.pods)
        await pool.close()
        return before, after, held, lost

    before, after, held, lost = asyncio.run(scenario())
    leader = "deepseek-r1-vllm-prefill-lws-0"  # the example's name, group 0's leader
    assert before == set()  # the worker is not Running yet: the group does not serve
    assert after == {leader}  # the leader only, for the whole group
    assert held == {leader}  # the worker carries no engine finalizer
    assert lost == set()  # a worker failed: the group's engine goes

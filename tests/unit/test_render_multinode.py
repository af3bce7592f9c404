"""spec.<role>.parallelism rendered: engine flags per engine and role, LeaderWorkerSet groups for
multi-node replicas, leaders-only discovery, and single-node pools still Deployments."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg.api.deployment import DisaggregatedDeployment
from disagg.conformance.check import unwrap_shell
from disagg.render import effective_replicas, render_children

ROOT = Path(__file__).resolve().parents[2]
Obj = dict[str, Any]


def example(engine: str) -> Obj:
    doc: Obj = yaml.safe_load((ROOT / "examples" / f"deepseek-r1-wideep-{engine}.yaml").read_text())
    return doc


def children(doc: Obj, replicas: dict[str, int] | None = None) -> list[Obj]:
    dd = DisaggregatedDeployment.model_validate(doc)
    return render_children(dd, replicas or effective_replicas(dd))


def child(items: list[Obj], kind: str, name: str) -> Obj:
    found = [c for c in items if c["kind"] == kind and c["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name} in {[(c['kind'], c['metadata']['name']) for c in items]}"
    return found[0]


def templates(lws: Obj) -> tuple[Obj, Obj]:
    group = lws["spec"]["leaderWorkerTemplate"]
    return group["leaderTemplate"], group["workerTemplate"]


def engine(template: Obj) -> Obj:
    container: Obj = template["spec"]["containers"][0]
    assert container["name"] == "engine"
    return container


def flag(args: list[str], name: str) -> str | None:
    """The value after ``name`` (None when absent; "" for a flag without a value at the end)."""
    if name not in args:
        return None
    at = args.index(name) + 1
    return args[at] if at < len(args) else ""


def test_multi_node_pools_are_leaderworkersets_with_one_group_per_replica() -> None:
    items = children(example("vllm"), {"prefill": 3, "decode": 2})
    kinds = {(c["kind"], c["metadata"]["name"]) for c in items}
    assert ("Deployment", "deepseek-r1-vllm-prefill") not in kinds
    assert ("Deployment", "deepseek-r1-vllm-decode") not in kinds
    assert ("Deployment", "deepseek-r1-vllm-router") in kinds
    prefill = child(items, "LeaderWorkerSet", "deepseek-r1-vllm-prefill-lws")
    decode = child(items, "LeaderWorkerSet", "deepseek-r1-vllm-decode-lws")
    assert prefill["apiVersion"] == decode["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert (prefill["spec"]["replicas"], prefill["spec"]["leaderWorkerTemplate"]["size"]) == (3, 2)
    assert (decode["spec"]["replicas"], decode["spec"]["leaderWorkerTemplate"]["size"]) == (2, 4)
    assert decode["spec"]["startupPolicy"] == "LeaderCreated"  # LeaderReady would wait for itself
    assert decode["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert decode["metadata"]["labels"]["disagg.dev/deployment"] == "deepseek-r1-vllm"


def test_vllm_leader_and_workers_flags_per_role() -> None:
    items = children(example("vllm"))
    for role, backend, data, local in (
        ("prefill", "deepep_high_throughput", 16, 8),
        ("decode", "deepep_low_latency", 32, 8),
    ):
        leader, worker = templates(child(items, "LeaderWorkerSet", f"deepseek-r1-vllm-{role}-lws"))
        lead, work = engine(leader), engine(worker)
        assert lead["command"] == ["vllm"] and lead["args"][:2] == ["serve", "deepseek-ai/DeepSeek-R1"]
        # the worker runs the same argv through a shell that adds its start rank
        assert work["command"] == [
            "/bin/sh",
            "-c",
            f'exec "$0" "$@" --data-parallel-start-rank "$((LWS_WORKER_INDEX * {local}))"',
        ]
        assert work["args"][:3] == ["vllm", "serve", "deepseek-ai/DeepSeek-R1"]
        for args in (lead["args"], work["args"]):
            assert flag(args, "--tensor-parallel-size") == "1"
            assert flag(args, "--data-parallel-size") == str(data)
            assert flag(args, "--data-parallel-size-local") == str(local)
            assert flag(args, "--data-parallel-address") == "$(LWS_LEADER_ADDRESS)"
            assert flag(args, "--data-parallel-rpc-port") == "29550"
            assert "--enable-expert-parallel" in args and flag(args, "--all2all-backend") == backend
        assert "--headless" in work["args"] and "--headless" not in lead["args"]
        assert "--data-parallel-start-rank" not in lead["args"]


def test_sglang_flags_per_role_on_every_pod_of_a_group() -> None:
    items = children(example("sglang"))
    for role, mode, size, nodes in (("prefill", "normal", 16, 2), ("decode", "low_latency", 32, 4)):
        leader, worker = templates(child(items, "LeaderWorkerSet", f"deepseek-r1-sglang-{role}-lws"))
        for pod in (leader, worker):
            args = engine(pod)["args"]
            assert args[:2] == ["-m", "sglang.launch_server"]
            # DP attention lives inside SGLang's tensor-parallel group: tp = tensor x data
            assert (flag(args, "--tp-size"), flag(args, "--attn-dp-size"), flag(args, "--ep-size")) == (
                str(size),
                str(size),
                str(size),
            )
            assert flag(args, "--moe-a2a-backend") == "deepep" and flag(args, "--deepep-mode") == mode
            assert flag(args, "--nnodes") == str(nodes) and flag(args, "--node-rank") == "$(LWS_WORKER_INDEX)"
            assert flag(args, "--dist-init-addr") == "$(LWS_LEADER_ADDRESS):20000"
            assert flag(args, "--disaggregation-mode") == role
            assert "--enable-dp-attention" not in args and "--dp-size" not in args


@pytest.mark.parametrize("engine_type", ["vllm", "sglang"])
def test_every_pod_of_a_group_gets_the_node_and_rdma_but_only_the_leader_serves(engine_type: str) -> None:
    items = children(example(engine_type))
    for role in ("prefill", "decode"):
        leader, worker = templates(child(items, "LeaderWorkerSet", f"deepseek-r1-{engine_type}-{role}-lws"))
        for pod in (leader, worker):
            resources = engine(pod)["resources"]
            assert resources["limits"]["nvidia.com/gpu"] == "8" and resources["limits"]["rdma/ib"] == "1"
            assert engine(pod)["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
            assert pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "default/ib-sriov"
            assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
        assert leader["metadata"]["labels"]["disagg.dev/group-role"] == "leader"
        assert worker["metadata"]["labels"]["disagg.dev/group-role"] == "worker"
        assert {"startupProbe", "readinessProbe", "livenessProbe"} <= engine(leader).keys()
        assert not {"startupProbe", "readinessProbe", "livenessProbe"} & engine(worker).keys()
        assert "prometheus.io/scrape" in leader["metadata"]["annotations"]
        assert "prometheus.io/scrape" not in worker["metadata"]["annotations"]
        bootstrap = [k for k in worker["metadata"]["annotations"] if k.endswith("/bootstrap-port")]
        assert bootstrap == []  # the router reads the leader's


@pytest.mark.parametrize("engine_type", ["vllm", "sglang"])
def test_router_and_role_services_select_leaders_only(engine_type: str) -> None:
    items = children(example(engine_type))
    name = f"deepseek-r1-{engine_type}"
    router = child(items, "Deployment", f"{name}-router")["spec"]["template"]["spec"]["containers"][0]
    command = router["command"]
    for role in ("prefill", "decode"):
        at = command.index(f"--{role}-selector") + 1
        assert command[at : at + 3] == [
            f"disagg.dev/deployment={name}",
            f"disagg.dev/role={role}",
            "disagg.dev/group-role=leader",
        ]
        for service in (f"{name}-{role}", f"{name}-{role}-headless"):
            assert child(items, "Service", service)["spec"]["selector"]["disagg.dev/group-role"] == "leader"
        # the PodDisruptionBudget still covers every pod of the pool
        assert (
            "disagg.dev/group-role"
            not in child(items, "PodDisruptionBudget", f"{name}-{role}")["spec"]["selector"]["matchLabels"]
        )


def test_single_node_parallelism_stays_a_deployment_with_its_flags() -> None:
    doc = example("vllm")
    doc["metadata"]["name"] = "dsr1-one-node"
    doc["spec"]["decode"]["parallelism"] = {"data": 8, "dataParallelAttention": True, "expert": 8}
    items = children(doc)
    decode = child(items, "Deployment", "dsr1-one-node-decode")
    args = engine(decode["spec"]["template"])["args"]
    assert (flag(args, "--data-parallel-size"), flag(args, "--all2all-backend")) == (
        "8",
        "deepep_low_latency",
    )
    assert "--data-parallel-address" not in args and "--headless" not in args
    assert engine(decode["spec"]["template"])["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "disagg.dev/group-role" not in decode["spec"]["template"]["metadata"]["labels"]
    router = child(items, "Deployment", "dsr1-one-node-router")["spec"]["template"]["spec"]["containers"][0]
    assert "disagg.dev/group-role=leader" in router["command"]  # prefill is still multi-node
    at = router["command"].index("--decode-selector") + 1
    assert router["command"][at + 2] == "--prometheus-host"  # decode: the pool's pods, no leader filter


def test_existing_specs_render_without_any_parallelism_flag() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "vllm-nixl.yaml").read_text())
    items = children(copy.deepcopy(doc))
    assert not [c for c in items if c["kind"] == "LeaderWorkerSet"]
    args = engine(child(items, "Deployment", "llama-70b-vllm-nixl-decode")["spec"]["template"])["args"]
    assert flag(args, "--tensor-parallel-size") == "8"
    assert not [
        a for a in args if a.startswith(("--data-parallel", "--enable-expert", "--all2all", "--headless"))
    ]


def test_conformance_unwraps_the_worker_shell() -> None:
    argv = [
        "/bin/sh",
        "-c",
        'exec "$0" "$@" --data-parallel-start-rank "$((LWS_WORKER_INDEX * 8))"',
        "vllm",
        "serve",
        "m",
    ]
    assert unwrap_shell(argv, {"LWS_WORKER_INDEX": "3"}) == (
        ["vllm", "serve", "m", "--data-parallel-start-rank", "24"],
        None,
    )
    assert unwrap_shell(["vllm", "serve"], {}) == (["vllm", "serve"], None)
    odd = ["sh", "-c", "vllm serve m; rm -rf /", "x"]
    unchanged, why = unwrap_shell(odd, {})
    assert unchanged == odd and why is not None and "shell script" in why

"""The closed loop over multi-node MoE replicas (issue 15): the policy scales decode by whole LeaderWorkerSet
groups from the live twin's Prometheus metrics.

DeepSeek-R1 wide-EP on vLLM (examples/deepseek-r1-wideep-vllm.yaml) made to fit the local cluster's 8
kwok H200 nodes of 8 GPUs (disagg.cluster.layout.DEFAULT_NODE_POOLS): prefill one 2-node group, decode
2-node groups (DP16 x EP16), at most two, the real LeaderWorkerSet controller, the operator with an active
slo-feedback RatioPolicy reading a real Prometheus, the live twin (one emulated engine per group, on its
leader, with the group's MoE latency model) and the released router, which discovers the leaders only.

The emulated engines admit 8 sequences at a time (``--max-num-seqs 8``, a knob of the live twin only): the
traffic (5 requests/s of 100 output tokens, ~3 s each at DeepSeek-R1's ~30 ms decode step on DP16 x EP16)
keeps about 15 requests in flight, so one decode group saturates, requests wait at decode and TTFT, as
Prometheus computes it, outgrows its target mostly after prefill: the policy's decode-side signal. Asserted:
the decode LeaderWorkerSet grows by one group, every pod of the new group Running (the leader and its
worker), the live twin serves the new group on its leader only, and status.autoscaling.decisions records
the move with its cause.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg.cluster.local import ClusterInfo
from disagg.demo import ClosedLoop, DemoSettings, Phase
from disagg.demo.harness import wait_until
from disagg.demo.traffic import PhaseReport, run_traffic
from disagg.k8s.client import DEPLOYMENT, LEADERWORKERSET, POD, KubeApi
from disagg.render.lws import GROUP_INDEX_LABEL
from disagg.render.names import GROUP_ROLE_LABEL
from disagg.twin.live.follower import ENDPOINT_ANNOTATION

pytestmark = pytest.mark.timeout(420)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "deepseek-r1-wideep-vllm.yaml"
MAX_NUM_SEQS = 8  # sequences an emulated engine runs at once: one decode group saturates at the traffic below
STARTUP_S = 3.0  # the emulated engines' model loading (engine seconds = wall seconds at time scale 1)

SCENARIO = DemoSettings(
    deployment="moe",
    policy="moe-slo",
    model="deepseek-ai/DeepSeek-R1",
    served_model="deepseek-r1",
    gpu_type="h200",
    # TTFT is what a saturated decode group drives up; ITL stays at the engines' ~30 ms decode step, whose
    # Prometheus p90 sits in vLLM's 25-50 ms bucket, under this target
    ttft_slo_s=1.5,
    itl_slo_s=0.1,
    prefill_replicas=1,
    decode_replicas=1,
    max_replicas=2,  # decode: at most two groups (prefill one and decode two fill 6 of the 8 H200 nodes)
    max_gpus=48,
    model_cache_claim=None,
    ready_when_served=False,  # kwok marks the pods Ready; a worker never gets an engine to be served by
    scale_down_window_s=600,  # longer than the run: only the move up is asserted
    drain_s=15.0,
    phases=(Phase("decode-bound", 60.0, 5.0, 512, 100),),
)


def moe_deployment(settings: DemoSettings) -> dict[str, Any]:
    """The vLLM wide-EP example with 2-node decode groups too, no model cache (no download Job to play),
    one router, and autoscaling under the scenario's RatioPolicy: prefill fixed at one group, decode one
    to two groups."""
    (doc,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    doc["metadata"] = {"name": settings.deployment, "namespace": settings.namespace}
    spec = doc["spec"]
    del spec["model"]["cache"]
    del spec["model"]["source"]["huggingFace"]["tokenSecretRef"]
    spec["decode"]["parallelism"] = dict(spec["prefill"]["parallelism"])
    spec["decode"].update(preStopSleepSeconds=1, shutdownTimeoutSeconds=5)
    # the released routers re-check a discovered pod's /health every --worker-startup-check-interval
    # seconds (default 30) before adding it (see disagg.demo.scenario.deployment_manifest)
    spec["router"] = {"replicas": 1, "args": ["--worker-startup-check-interval", "1"]}
    spec["autoscaling"] = {
        "enabled": True,
        "policyRef": {"name": settings.policy},
        "prefill": {"minReplicas": 1, "maxReplicas": 1},
        "decode": {"minReplicas": 1, "maxReplicas": settings.max_replicas},
        "maxGPUs": settings.max_gpus,
    }
    return dict(doc)


class MultiNodeLoop(ClosedLoop):
    """The demo's closed loop around the multi-node deployment: its own manifests, router and twin flags."""

    def children_ready(self) -> bool:
        name, ns = self.settings.deployment, self.settings.namespace
        return all(
            self.kube.get(LEADERWORKERSET, ns, f"{name}-{role}-lws") is not None
            for role in ("prefill", "decode")
        ) and (self.kube.get(DEPLOYMENT, ns, f"{name}-router") is not None)

    def deployment_object(self) -> dict[str, Any]:
        return moe_deployment(self.settings)


def decode_groups(kube: KubeApi, namespace: str, deployment: str) -> dict[str, list[dict[str, Any]]]:
    """group index -> the live (not deleting) pods of that decode group."""
    selector = f"disagg.dev/deployment={deployment},disagg.dev/role=decode"
    found: dict[str, list[dict[str, Any]]] = {}
    for pod in kube.list(POD, namespace, selector):
        if not pod["metadata"].get("deletionTimestamp"):
            found.setdefault(pod["metadata"]["labels"].get(GROUP_INDEX_LABEL, ""), []).append(pod)
    return found


def served_members(kube: KubeApi, namespace: str, deployment: str) -> dict[str, set[str]]:
    """group index -> the group roles of the decode pods the live twin serves (has annotated)."""
    served: dict[str, set[str]] = {}
    for index, pods in decode_groups(kube, namespace, deployment).items():
        served[index] = {
            str(p["metadata"]["labels"].get(GROUP_ROLE_LABEL))
            for p in pods
            if ENDPOINT_ANNOTATION in (p["metadata"].get("annotations") or {})
        }
    return served


def whole_running(pods: list[dict[str, Any]]) -> bool:
    roles = sorted(p["metadata"]["labels"].get(GROUP_ROLE_LABEL) for p in pods)
    return roles == ["leader", "worker"] and all(
        (p.get("status") or {}).get("phase") == "Running" for p in pods
    )


def test_policy_adds_a_whole_decode_group_from_live_metrics(
    cluster: ClusterInfo, namespace: str, tmp_path: Path
) -> None:
    settings = replace(SCENARIO, namespace=namespace, report_dir=tmp_path / "report")
    loop = MultiNodeLoop.on(cluster, settings, tmp_path / "logs")
    loop.twin_args = ("--startup-delay", str(STARTUP_S), "--max-num-seqs", str(MAX_NUM_SEQS))
    with loop.running("the deployment's LeaderWorkerSets and router", print_logs=True):
        kube, name = loop.kube, settings.deployment
        lws_name = f"{name}-decode-lws"
        start = kube.get(LEADERWORKERSET, namespace, lws_name) or {}
        assert (start.get("spec") or {}).get("replicas") == 1, start.get("spec")
        # before any traffic, the twin serves each group on its leader only: one engine per group
        first = decode_groups(kube, namespace, name)
        assert list(first) == ["0"] and whole_running(first["0"]), first
        wait_until(
            lambda: served_members(kube, namespace, name) == {"0": {"leader"}},
            30,
            "the twin to serve decode group 0 on its leader",
        )

        reports: list[PhaseReport] = []
        assert loop.router is not None
        router_url = loop.router.url
        traffic = threading.Thread(
            target=lambda: reports.extend(run_traffic(router_url, settings)), name="traffic", daemon=True
        )
        traffic.start()

        def grown() -> dict[str, list[dict[str, Any]]] | None:
            lws = kube.get(LEADERWORKERSET, namespace, lws_name) or {}
            groups = decode_groups(kube, namespace, name)
            if (lws.get("spec") or {}).get("replicas") != 2 or sorted(groups) != ["0", "1"]:
                return None
            return groups if all(whole_running(pods) for pods in groups.values()) else None

        groups = wait_until(grown, settings.total_s + 60, "decode to grow by a whole Running group")
        traffic.join(timeout=settings.total_s + settings.drain_s + 30)

        # the decision that added the group is recorded, with the cause the policy gave
        decisions = loop.decisions()
        added = [d for d in decisions if d.get("decode") == 2]
        assert added, decisions
        assert all(d.get("cause") and d.get("message") for d in added), added
        assert all(d.get("prefill") == 1 for d in added), added  # prefill stayed one group

        # each group's engine serves on its leader only (the twin annotates the pods it serves)
        wait_until(
            lambda: served_members(kube, namespace, name) == {"0": {"leader"}, "1": {"leader"}},
            60,
            "the twin to serve each decode group on its leader",
        )
        assert sum(len(pods) for pods in groups.values()) == 4
        # the traffic was served: requests were answered while decode was short of capacity
        assert reports and reports[0].ok > 0, [r.summary() for r in reports]
        print(reports[0].summary(), decisions, sep="\n")

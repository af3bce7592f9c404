"""A new replica's model loading on the local control plane (real kube-apiserver, scheduler, kwok).

The live twin following a DisaggregatedDeployment's pods loads each new pod's model for the start-up its
spec implies (disagg.perf.startup: weights read from spec.model.cache, or downloaded by every replica),
here compressed by ``startup_scale``. kwok holds a pod annotated ``disagg.dev/ready-when-served`` Running
but not Ready until the twin serves it, as the engine's readiness probe would on a cluster, so the pod's
Ready condition times the loading. The autoscaler reads that back through the API server: its measured
start-up (creation to Ready) is what the policy's bounds carry.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from disagg.cluster.kwok_stages import READY_WHEN_SERVED
from disagg.cluster.wait import wait_for_async
from disagg.controller.observe import DeploymentReading, deployment_bounds, read_deployment, role_startups
from disagg.controller.pods import measured_startup_s, pod_info, pool_observation, read_pool
from disagg.k8s.client import DEPLOYMENT, DISAGG_DEPLOYMENT, POD, JsonDict, KubeApi
from disagg.perf.startup import spec_startup_delay_s
from disagg.twin.live.follower import Overrides, PodFollower
from disagg.twin.live.pods import PodPool, PoolSettings

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SCALE = 0.05  # the cached 8B start-up, ~71 s, becomes ~3.5 s


async def _eventually(check: Callable[[], Awaitable[Any]], timeout_s: float, what: str) -> Any:
    return await wait_for_async(check, timeout_s=timeout_s, what=what)


def _deployment(namespace: str) -> JsonDict:
    """A DisaggregatedDeployment (no operator runs: only the twin and the autoscaler's reads use it)."""
    return {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedDeployment",
        "metadata": {"name": "dd", "namespace": namespace},
        "spec": {
            "model": {
                "name": MODEL,
                "source": {"huggingFace": {"id": MODEL}},
                "cache": {"claimName": "weights", "prefilled": True},
            },
            "engine": {"type": "vllm"},
            "kvTransfer": {"connector": "nixl"},
            "prefill": {"replicas": 1, "nodeSelector": {"disagg.dev/gpu-type": "l40s"}},
            "decode": {"replicas": 1, "nodeSelector": {"disagg.dev/gpu-type": "l40s"}},
        },
    }


def _decode_child(namespace: str) -> JsonDict:
    """The decode pool's Deployment as the operator would name and label it, its pods held un-Ready."""
    labels = {"disagg.dev/deployment": "dd", "disagg.dev/role": "decode"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "dd-decode", "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {READY_WHEN_SERVED: "true"}},
                "spec": {
                    "nodeSelector": {"disagg.dev/gpu-type": "l40s"},
                    "containers": [
                        {
                            "name": "engine",
                            "image": "vllm/vllm-openai:v0.33.0",
                            "ports": [{"name": "http", "containerPort": 8000}],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }


def _ready(pod: JsonDict) -> str | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return str(condition.get("status"))
    return None


def test_a_held_pod_turns_ready_when_the_twin_has_loaded_the_model_for_the_specs_startup(
    k8s_api: Any, kube: KubeApi, crds: list[str], namespace: str
) -> None:
    dd = kube.apply(_deployment(namespace), field_manager="disagg-tests", kind=DISAGG_DEPLOYMENT)
    expected = spec_startup_delay_s(dd["spec"], "bf16") * SCALE
    kube.apply(_decode_child(namespace), field_manager="disagg-tests", kind=DEPLOYMENT)

    def pods() -> list[JsonDict]:
        return kube.list(POD, namespace, "disagg.dev/deployment=dd,disagg.dev/role=decode")

    async def scenario() -> None:
        pool = PodPool(PoolSettings())
        follower = PodFollower(
            k8s_api, namespace, "dd", pool, Overrides(), watch_timeout_s=5, startup_scale=SCALE
        )
        follower.start()
        try:

            async def loading() -> bool:
                found = await asyncio.to_thread(pods)
                running = [p for p in found if (p.get("status") or {}).get("phase") == "Running"]
                starting = [p for p in pool.pods.values() if p.state == "starting"]
                return len(running) == 1 and _ready(running[0]) == "False" and len(starting) == 1

            await _eventually(loading, 60, "the pod Running but not Ready while the twin loads the model")
            (twin_pod,) = pool.pods.values()
            assert twin_pod.spec.startup_delay_s == expected  # from the spec: cached, times the scale

            async def ready() -> JsonDict | None:
                found = await asyncio.to_thread(pods)
                return found[0] if len(found) == 1 and _ready(found[0]) == "True" else None

            pod = await _eventually(ready, 60, "the pod Ready once the twin serves it")
            assert twin_pod.state == "serving"
            startup = pod_info(pod)
            assert startup.created is not None and startup.ready_since is not None
            print(
                f"start-up: {startup.ready_since - startup.created:.0f} s measured, {expected:.2f} s expected"
            )
            # not Ready before the model loaded (less a second: second-precision timestamps); no upper bound,
            # which would time the watch and patch round trips on a loaded machine (speed: bench/)
            assert startup.ready_since - startup.created >= expected - 1.0
        finally:
            await follower.stop()
            await pool.close()

    asyncio.run(scenario())

    # the autoscaler's own read path: the measured start-up goes into the policy's bounds
    pool = read_pool(kube, namespace, "dd", "decode")
    assert pool is not None
    assert pool_observation(pool.replicas, pool.pods, time.time()).ready == 1
    measured = measured_startup_s(pool.pods)
    assert measured is not None and measured[1] == 1
    reading = read_deployment(dd)
    assert isinstance(reading, DeploymentReading)
    bounds = deployment_bounds(reading, role_startups(reading, {"decode": pool.pods}))
    assert bounds.decode.startup_seconds == measured[0]
    # no prefill pod Ready: the spec's estimate (cached, at full scale)
    assert bounds.prefill.startup_seconds == spec_startup_delay_s(dd["spec"], "bf16")
    assert bounds.profile is not None and bounds.profile.model == MODEL

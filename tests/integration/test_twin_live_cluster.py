"""The live twin following pods on the local control plane (real kube-apiserver, scheduler, kwok).

Each Running pod of a Deployment with the contract labels gets an emulated engine, on the pod's own IP
(kwok hands them out of 127.0.0.0/8) at the engine port, after its start-up delay, and the endpoint
annotation; a real Prometheus finds the engines through kubernetes_sd (role pod) at the pod IP and
scrapes them; a scaled-down pod is drained and its endpoint closed; a replaced pod's IP is not reused
while its engine still serves.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from disagg.cluster.wait import wait_for_async
from disagg.twin.live.engine import EngineSettings
from disagg.twin.live.follower import ENDPOINT_ANNOTATION, Defaults, Overrides, PodFollower
from disagg.twin.live.load import LoadRequest, LoadSettings, run_load
from disagg.twin.live.pods import PodPool, PoolSettings


async def _eventually(check: Callable[[], Awaitable[Any]], timeout_s: float, what: str) -> Any:
    return await wait_for_async(check, timeout_s=timeout_s, what=what)


def _decode_deployment(name: str, replicas: int, role: str = "decode") -> dict[str, Any]:
    """A Deployment shaped like the operator's child for ``role`` of DisaggregatedDeployment ``dd``."""
    labels = {
        "app.kubernetes.io/name": "disagg",
        "app.kubernetes.io/instance": "dd",
        "app.kubernetes.io/component": role,
        "app.kubernetes.io/managed-by": "disagg-operator",
        "app.kubernetes.io/part-of": "disagg",
        "disagg.dev/role": role,
        "disagg.dev/deployment": "dd",
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"disagg.dev/deployment": "dd", "disagg.dev/role": role}},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": "8000",
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    "nodeSelector": {"disagg.dev/gpu-type": "l40s"},
                    "containers": [
                        {
                            "name": "engine",
                            "image": "vllm/vllm-openai:v0.11.0",
                            "ports": [{"name": "http", "containerPort": 8000}],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }


def test_follows_the_pods_of_a_deployment_and_drains_removed_ones(k8s_api: Any, namespace: str) -> None:
    from kubernetes import client

    apps: Any = client.AppsV1Api(k8s_api)
    core: Any = client.CoreV1Api(k8s_api)
    apps.create_namespaced_deployment(namespace, _decode_deployment("dd-decode", 2))

    def annotated_pods() -> dict[str, str]:
        pods = core.list_namespaced_pod(namespace, label_selector="disagg.dev/deployment=dd").items
        return {
            p.metadata.name: (p.metadata.annotations or {}).get(ENDPOINT_ANNOTATION, "")
            for p in pods
            if p.status.phase == "Running" and p.metadata.deletion_timestamp is None
        }

    async def scenario() -> None:
        pool = PodPool(PoolSettings(engine=EngineSettings(time_scale=0.5), startup_delay_s=1.0))
        follower = PodFollower(
            k8s_api, namespace, "dd", pool, Overrides(), Defaults(model="llama-3.1-8b"), watch_timeout_s=5
        )
        follower.start()
        try:

            async def two_serving() -> dict[str, str] | None:
                pods = await asyncio.to_thread(annotated_pods)
                serving = {
                    n: p.server.endpoint for n, p in pool.pods.items() if p.server and p.state == "serving"
                }
                return pods if len(pods) == 2 and pods == serving else None

            pods = await _eventually(two_serving, 90, "two Running pods, each served and annotated")
            assert {p.spec.choice.gpu for p in pool.pods.values()} == {"l40s"}  # from the pod's nodeSelector
            async with aiohttp.ClientSession() as http:
                for endpoint in pods.values():
                    async with http.get(f"http://{endpoint}/health") as r:
                        assert r.status == 200

            await asyncio.to_thread(
                apps.patch_namespaced_deployment_scale, "dd-decode", namespace, {"spec": {"replicas": 1}}
            )

            async def one_left() -> bool:
                return len(pool.endpoints("decode")) == 1 and len(pool.pods) == 1

            await _eventually(one_left, 60, "the scaled-down pod to leave the pool")
            await pool.wait_drained()
            (kept,) = pool.endpoints("decode")
            (removed,) = [e for e in pods.values() if e != kept]
            async with aiohttp.ClientSession() as http:
                with pytest.raises(aiohttp.ClientConnectionError):
                    async with http.get(f"http://{removed}/health"):
                        pass
                async with http.get(f"http://{kept}/health") as r:
                    assert r.status == 200
        finally:
            await follower.stop()
            await pool.close()

    asyncio.run(scenario())


def test_prometheus_finds_the_followed_engines_through_kubernetes_sd(
    k8s_api: Any, namespace: str, cluster: Any, prometheus_factory: Callable[[dict[str, Any]], Any]
) -> None:
    """Pod discovery (role pod) and the endpoint annotation lead a real Prometheus to each engine."""
    from kubernetes import client

    from disagg.cluster.prometheus import kubernetes_pod_sd_config

    apps: Any = client.AppsV1Api(k8s_api)
    apps.create_namespaced_deployment(namespace, _decode_deployment("dd-decode", 2))

    async def scenario() -> None:
        pool = PodPool(PoolSettings(engine=EngineSettings(time_scale=0.5)))
        follower = PodFollower(
            k8s_api, namespace, "dd", pool, Overrides(), Defaults(model="llama-3.1-8b"), watch_timeout_s=5
        )
        follower.start()
        try:

            async def annotated() -> set[str]:
                return set(follower.annotated) if len(follower.annotated) == 2 else set()

            pods = await _eventually(annotated, 90, "two served and annotated pods")
            scrape = kubernetes_pod_sd_config(cluster, namespace, job_name="engines", scrape_interval="1s")
            prom = await asyncio.to_thread(prometheus_factory, {"scrape_configs": [scrape]})

            async def both_scraped() -> bool:
                query = 'vllm:num_requests_running{job="engines"}'
                result = await asyncio.to_thread(prom.query, query)
                return {r["metric"].get("pod") for r in result} == pods

            await _eventually(both_scraped, 60, "Prometheus to scrape both engines through kubernetes_sd")
        finally:
            await follower.stop()
            await pool.close()

    asyncio.run(scenario())


def test_twin_serve_follows_a_deployment_and_proxies_through_its_pods(
    k8s_api: Any, namespace: str, kubeconfig: Path, tmp_path: Path
) -> None:
    """The command the demo runs: ``disagg twin serve --kubeconfig K --namespace NS --deployment dd``."""
    from kubernetes import client

    apps: Any = client.AppsV1Api(k8s_api)
    apps.create_namespaced_deployment(namespace, _decode_deployment("dd-prefill", 1, role="prefill"))
    apps.create_namespaced_deployment(namespace, _decode_deployment("dd-decode", 1))
    endpoints = tmp_path / "endpoints.json"
    command = [sys.executable, "-m", "disagg", "twin", "serve", "--kubeconfig", str(kubeconfig)]
    command += ["--namespace", namespace, "--deployment", "dd", "--model", "llama-3.1-8b"]
    command += ["--time-scale", "0.5", "--startup-delay", "1", "--proxy-port", "0"]
    command += ["--endpoints-file", str(endpoints), "--duration", "120"]
    log = (tmp_path / "twin.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    async def scenario() -> None:
        async def ready() -> dict[str, Any] | None:
            if process.poll() is not None:
                pytest.fail(f"disagg twin serve exited: {(tmp_path / 'twin.log').read_text()[-2000:]}")
            if not endpoints.exists():
                return None
            doc: dict[str, Any] = json.loads(endpoints.read_text())
            roles = sorted(p["role"] for p in doc["pods"].values() if p["state"] == "serving")
            return doc if doc["proxy"] and roles == ["decode", "prefill"] else None

        doc = await _eventually(ready, 90, "the twin to serve one prefill and one decode pod")
        report = await run_load([LoadRequest(0.0, 2000, 6)], LoadSettings(doc["proxy"], 1, 60, 0.5))
        assert report.ok == 1 and report.results[0].tokens == 6

    try:
        asyncio.run(scenario())
    finally:
        process.terminate()
        code = process.wait(timeout=30)
        log.close()
    assert code == 0


def test_a_replaced_pods_ip_stays_its_own_until_its_engine_has_closed(k8s_api: Any, namespace: str) -> None:
    """kwok recycles a deleted pod's IP at once; the twin's finalizer keeps the Terminating pod (and its
    IP) while the engine serves out its preStop sleep and drains, so no two pods ever share an address."""
    from kubernetes import client

    from disagg.twin.live.follower import ENGINE_FINALIZER

    apps: Any = client.AppsV1Api(k8s_api)
    core: Any = client.CoreV1Api(k8s_api)
    deployment = _decode_deployment("dd-decode", 1)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["lifecycle"] = {"preStop": {"exec": {"command": ["sleep", "2"]}}}
    apps.create_namespaced_deployment(namespace, deployment)

    def pods() -> dict[str, Any]:
        return {p.metadata.name: p for p in core.list_namespaced_pod(namespace).items}

    async def scenario() -> None:
        pool = PodPool(PoolSettings(engine=EngineSettings(time_scale=0.5)))
        follower = PodFollower(
            k8s_api, namespace, "dd", pool, Overrides(), Defaults(model="llama-3.1-8b"), watch_timeout_s=5
        )
        follower.start()
        try:

            async def serving() -> list[str]:
                return [n for n, p in pool.pods.items() if p.state == "serving"]

            (old,) = await _eventually(serving, 90, "the pod served")
            first = (await asyncio.to_thread(pods))[old]
            old_ip = first.status.pod_ip
            assert old_ip.startswith("127.") and old_ip != "127.0.0.1"
            assert ENGINE_FINALIZER in (first.metadata.finalizers or [])
            assert pool.pods[old].server is not None and pool.pods[old].server.endpoint == f"{old_ip}:8000"
            await asyncio.to_thread(core.delete_namespaced_pod, old, namespace)  # the ReplicaSet replaces it

            async def replaced() -> tuple[str, str] | None:
                now = await asyncio.to_thread(pods)
                new = [n for n, p in now.items() if n != old and p.status.pod_ip]
                return (new[0], now[new[0]].status.pod_ip) if new and old in now else None

            new, new_ip = await _eventually(replaced, 60, "a replacement while the old pod terminates")
            assert new_ip != old_ip  # the old pod, Terminating, still holds its IP

            async def old_gone() -> bool:
                return old not in await asyncio.to_thread(pods)

            await _eventually(old_gone, 60, "the old pod to go once its engine closed")
            with pytest.raises(aiohttp.ClientConnectionError):
                async with aiohttp.ClientSession() as http, http.get(f"http://{old_ip}:8000/health"):
                    pass

            async def new_serving() -> bool:
                pod = pool.pods.get(new)
                return pod is not None and pod.state == "serving"

            await _eventually(new_serving, 60, "the replacement served on its own IP")
            assert pool.pods[new].server is not None and pool.pods[new].server.endpoint == f"{new_ip}:8000"
        finally:
            await follower.stop()
            await pool.close()
        assert all(ENGINE_FINALIZER not in (p.metadata.finalizers or []) for p in pods().values())

    asyncio.run(scenario())

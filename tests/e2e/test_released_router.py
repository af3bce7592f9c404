"""The released vllm-router in the loop: K8s service discovery, the NIXL handshake, scaling, RBAC.

On the local control plane: the operator (a ``disagg run`` process) reconciles a small vLLM + NIXL
DisaggregatedDeployment (the model of examples/vllm-nixl.yaml, fewer GPUs); the live twin plays an engine
for each prefill and decode pod on the pod's own IP (kwok hands pod IPs out of 127.0.0.0/8) at vLLM's
ports; the released vllm-router (the PyPI wheel the default image pins) runs locally with the command
line the operator renders for it and a kubeconfig of the router's own ServiceAccount. Asserted: every
request through the router is answered; each went prefill -> decode with the kv_transfer_params vLLM's
NixlConnector exchanges; the router finds pods by label (a new prefill pod gets traffic); a decode
scale-down during traffic loses no request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from disagg.api.deployment import DisaggregatedDeployment
from disagg.cluster.local import ClusterInfo, free_ports
from disagg.cluster.routers import RouterProcess, RouterSettings, service_account_kubeconfig, start_router
from disagg.cluster.wait import wait_for, wait_for_async
from disagg.demo import apply_object
from disagg.k8s.client import DISAGG_DEPLOYMENT, POD, SERVICEACCOUNT, KubeApi, load_api_client
from disagg.k8s.crds import install_crds
from disagg.render.builders import router_command
from disagg.twin.live.engine import EngineSettings, TransferRecord
from disagg.twin.live.follower import Overrides, PodFollower
from disagg.twin.live.pods import PodPool, PoolSettings

pytestmark = pytest.mark.timeout(420)

NAME = "llama-nixl"
SERVED = "llama-3.1-70b"
SIDE_CHANNEL_PORT = 5600  # the DD's kvTransfer.sideChannelPort default (vLLM's VLLM_NIXL_SIDE_CHANNEL_PORT)
# The router adds a pod once its /health answers, re-checking every --worker-startup-check-interval
# seconds (vllm-router 0.1.17 default 30). On a real cluster the readiness probe holds the pod unready
# until the engine serves; kwok marks pods Ready at once, so the check runs sooner here.
ROUTER_ARGS = ["--worker-startup-check-interval", "1"]
# No model loading in the twin (following the DD it would take the spec's start-up estimate for the 70B
# model, minutes): these tests are about routing, not start-up.
NO_LOADING = Overrides(startup_delay_s=0.0)


def deployment(namespace: str) -> dict[str, Any]:
    """examples/vllm-nixl.yaml's model and connector, with 1 prefill and 2 decode replicas at TP4."""
    pool = {
        "tensorParallelSize": 4,
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "preStopSleepSeconds": 3,
        "shutdownTimeoutSeconds": 30,
    }
    return {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedDeployment",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "model": {
                "name": "meta-llama/Llama-3.1-70B-Instruct",
                "servedName": SERVED,
                "source": {"huggingFace": {"id": "meta-llama/Llama-3.1-70B-Instruct"}},
                "maxModelLen": 32768,
            },
            "engine": {"type": "vllm"},
            "kvTransfer": {"connector": "nixl", "loadFailurePolicy": "recompute"},
            "prefill": {"replicas": 1, **pool},
            "decode": {"replicas": 2, **pool},
            "router": {"replicas": 1, "args": ROUTER_ARGS},
        },
    }


@contextlib.contextmanager
def operator(cluster: ClusterInfo, namespace: str, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    (port,) = free_ports(1)
    command = [sys.executable, "-m", "disagg", "run", "--namespace", namespace, "--standalone"]
    command += ["--liveness-endpoint", f"http://127.0.0.1:{port}/healthz"]
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
            start_new_session=True,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


async def eventually(check: Callable[[], Awaitable[Any]], timeout_s: float, what: str) -> Any:
    return await wait_for_async(check, timeout_s=timeout_s, what=what)


class Loop:
    """The twin (pool and follower) plus the router, and what the test reads from them."""

    def __init__(
        self, kube: KubeApi, namespace: str, pool: PodPool, router: RouterProcess, name: str = NAME
    ) -> None:
        self.kube, self.namespace, self.pool, self.router, self.name = kube, namespace, pool, router, name

    def pods(self, role: str) -> dict[str, dict[str, Any]]:
        """Running, not terminating pods of ``role``: name -> pod."""
        selector = f"disagg.dev/deployment={self.name},disagg.dev/role={role}"
        return {
            p["metadata"]["name"]: p
            for p in self.kube.list(POD, self.namespace, selector)
            if (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        }

    def transfers(self, role: str) -> dict[str, tuple[str, TransferRecord]]:
        """Every exchange the engines of ``role`` saw (removed pods' too): request id -> (pod, record)."""
        seen: dict[str, tuple[str, TransferRecord]] = {}
        for name, pod in [*self.pool.pods.items(), *self.pool.retired.items()]:
            if pod.spec.role == role and pod.server is not None:
                seen.update({t.request_id: (name, t) for t in pod.server.engine.transfers})
        return seen

    async def readiness(self) -> dict[str, Any]:
        response = await asyncio.to_thread(self.router.get, "/readiness")
        body: dict[str, Any] = response.json() if response.status_code in (200, 503) else {}
        return body

    async def healthy(self, prefill: int, decode: int) -> bool:
        body = await self.readiness()
        counts = {role: (body.get(role) or {}).get("healthy") for role in ("prefill", "decode")}
        return counts == {"prefill": prefill, "decode": decode}


async def completion(http: aiohttp.ClientSession, url: str, i: int, max_tokens: int = 8) -> dict[str, Any]:
    """A /v1/completions request through the router; the JSON answer (fails on any other status)."""
    body = {
        "model": SERVED,
        "prompt": f"request {i}: " + "the quick brown fox " * 60,
        "max_tokens": max_tokens,
    }
    async with http.post(f"{url}/v1/completions", json=body) as r:
        text = await r.text()
        assert r.status == 200, (i, r.status, text)
    answer: dict[str, Any] = await r.json(content_type=None)
    assert answer["choices"][0]["finish_reason"] == "length", answer
    assert answer["usage"]["completion_tokens"] == max_tokens, answer
    return answer


async def streamed_chat(http: aiohttp.ClientSession, url: str, i: int, max_tokens: int = 6) -> list[str]:
    """A streaming /v1/chat/completions request through the router; the content deltas."""
    body = {
        "model": SERVED,
        "messages": [{"role": "user", "content": f"chat {i}: " + "tell me about disaggregation " * 30}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    async with http.post(f"{url}/v1/chat/completions", json=body) as r:
        text = await r.text()
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream"), (r.status, text)
    events = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", text
    chunks = [json.loads(e) for e in events[:-1]]
    deltas = [c["choices"][0]["delta"].get("content") for c in chunks if c.get("choices")]
    contents = [d for d in deltas if d]
    assert len(contents) == max_tokens, text
    return contents


def assert_prefill_then_decode(loop: Loop, before: set[str]) -> set[str]:
    """Every request the decode engines saw since ``before`` came with the kv_transfer_params the
    prefill engine it names answered with; returns the request ids checked."""
    prefill_seen, decode_seen = loop.transfers("prefill"), loop.transfers("decode")
    new = set(decode_seen) - before
    ips = {name: pod.spec.host for name, pod in [*loop.pool.pods.items(), *loop.pool.retired.items()]}
    for request_id in new:
        _, decoded = decode_seen[request_id]
        assert request_id in prefill_seen, (request_id, sorted(prefill_seen))
        prefill_pod, prefilled = prefill_seen[request_id]
        # the router asked the prefill engine for a remote decode (vllm-router vllm_pd_router.rs
        # build_prefill_kv_transfer_params, NIXL) ...
        assert prefilled.received is not None and prefilled.received.get("do_remote_decode") is True
        assert prefilled.outcome == "remote-decode" and prefilled.returned is not None
        # ... and handed the decode engine what the prefill answered (build_decode_kv_transfer_params)
        received = decoded.received or {}
        assert received == prefilled.returned, (received, prefilled.returned)
        assert received["do_remote_prefill"] is True and received["remote_engine_id"] == prefill_pod
        assert received["remote_host"] == ips[prefill_pod] and ips[prefill_pod].startswith("127.")
        assert received["remote_port"] == SIDE_CHANNEL_PORT
        assert decoded.outcome == "kv-loaded", decoded  # the decode engine read the blocks it names
        # the router's request id names both pods' addresses (generate_vllm_request_id)
        assert f"___prefill_addr_{ips[prefill_pod]}:8000" in request_id, request_id
    return new


@contextlib.contextmanager
def deployed(
    cluster: ClusterInfo, namespace: str, manifest: dict[str, Any], tmp_path: Path
) -> Iterator[tuple[KubeApi, Path]]:
    """The operator (``disagg run``) reconciling ``manifest``; yields the API and a kubeconfig of the
    router's own ServiceAccount once the operator has created it. The DD is deleted afterwards while
    the operator still runs (so kopf releases its finalizer)."""
    kube = KubeApi(load_api_client(cluster.kubeconfig))
    install_crds(kube)
    name = manifest["metadata"]["name"]
    with operator(cluster, namespace, tmp_path / "operator.log") as op:
        try:
            apply_object(kube, manifest, field_manager="disagg-e2e")
            sa = f"{name}-router"
            wait_for(lambda: kube.get(SERVICEACCOUNT, namespace, sa), timeout_s=90, what="the router's SA")
            yield kube, service_account_kubeconfig(cluster, namespace, sa, tmp_path / "router.kubeconfig")
        finally:
            print(
                "--- operator log (tail)\n" + (tmp_path / "operator.log").read_text(errors="replace")[-3000:]
            )
            if op.poll() is None:
                kube.delete(DISAGG_DEPLOYMENT, namespace, name)
                wait_for(lambda: kube.get(DISAGG_DEPLOYMENT, namespace, name) is None, what="the DD deleted")


def test_released_vllm_router_drives_the_nixl_handshake_and_follows_the_pods(
    cluster: ClusterInfo, namespace: str, tmp_path: Path
) -> None:
    manifest = deployment(namespace)
    dd = DisaggregatedDeployment.model_validate(manifest)
    with deployed(cluster, namespace, manifest, tmp_path) as (kube, kubeconfig):
        # the router authenticates as its own ServiceAccount: the Role the operator rendered is what
        # lets it list and watch the pods, and nothing beyond its namespace
        # (the operator creates the ServiceAccount before its RoleBinding, and the API server's RBAC
        # authorizer serves from an informer cache: the grant arrives within moments, not at once)
        wait_for(
            lambda: _can_list_pods(cluster, kubeconfig, namespace) == 200,
            timeout_s=60,
            what="the router's ServiceAccount allowed to list pods in its namespace",
        )
        assert _can_list_pods(cluster, kubeconfig, "default") == 403
        asyncio.run(scenario(kube, namespace, dd, kubeconfig, tmp_path))


def _can_list_pods(cluster: ClusterInfo, kubeconfig: Path, namespace: str) -> int:
    import yaml

    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    response = httpx.get(
        f"{cluster.server}/api/v1/namespaces/{namespace}/pods",
        headers={"Authorization": f"Bearer {token}"},
        verify=ssl.create_default_context(cafile=str(cluster.ca_cert)),
        timeout=10,
    )
    return response.status_code


async def scenario(
    kube: KubeApi, namespace: str, dd: DisaggregatedDeployment, kubeconfig: Path, tmp: Path
) -> None:
    pool = PodPool(PoolSettings(engine=EngineSettings(time_scale=0.5)))
    follower = PodFollower(kube.api_client, namespace, NAME, pool, NO_LOADING, watch_timeout_s=5)
    follower.start()
    router: RouterProcess | None = None
    try:
        argv = router_command(dd)
        router = await asyncio.to_thread(
            start_router,
            "vllm",
            argv,
            kubeconfig,
            tmp / "router",
            {"POD_NAMESPACE": namespace},
            RouterSettings(tie_to_parent=True),
        )
        loop = Loop(kube, namespace, pool, router)
        try:
            await run_checks(loop, namespace)
        except BaseException:
            print("--- router log (tail)\n" + router.log_tail(6000))
            print_exchanges(pool)
            raise
    finally:
        if router is not None:
            router.stop()
        await follower.stop()
        await pool.close()


def print_exchanges(pool: PodPool, last: int = 5) -> None:
    """The last exchanges each engine saw (for a failing test's output)."""
    for name, pod in [*pool.pods.items(), *pool.retired.items()]:
        if pod.server is not None:
            print(f"--- {name} ({pod.spec.role}, {pod.spec.host}): {pod.state}")
            for record in list(pod.server.engine.transfers)[-last:]:
                print(f"    {record}")


async def scale(kube: KubeApi, namespace: str, role: str, replicas: int, name: str = NAME) -> None:
    body = {"spec": {role: {"replicas": replicas}}}
    await asyncio.to_thread(
        kube.request,
        "PATCH",
        DISAGG_DEPLOYMENT.path(namespace, name),
        body=body,
        content_type="application/merge-patch+json",
    )


async def run_checks(loop: Loop, namespace: str) -> None:
    url = loop.router.url
    await eventually(lambda: loop.healthy(1, 2), 120, "the router to discover 1 prefill and 2 decode pods")
    prefill_pods = loop.pods("prefill")
    decode_pods = loop.pods("decode")
    # discovered at the pods' own IPs (distinct, in 127.0.0.0/8), vLLM's port
    ips = [p["status"]["podIP"] for p in [*prefill_pods.values(), *decode_pods.values()]]
    assert len(set(ips)) == 3 and all(ip.startswith("127.") and ip != "127.0.0.1" for ip in ips), ips
    workers = (await asyncio.to_thread(loop.router.get, "/list_workers")).json()["urls"]
    assert sorted(workers) == sorted(f"http://{ip}:8000" for ip in ips), workers

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        # completions and streaming chat: every one answered, each prefill -> decode
        await asyncio.gather(*(completion(http, url, i) for i in range(6)))
        await asyncio.gather(*(streamed_chat(http, url, i) for i in range(6)))
        checked = assert_prefill_then_decode(loop, set())
        assert len(checked) == 12, checked
        assert {loop.transfers("decode")[r][0] for r in checked} == set(decode_pods)  # both decode pods used

        # the router discovers pods by label: a second prefill pod appears and gets traffic
        await scale(loop.kube, namespace, "prefill", 2)
        await eventually(lambda: loop.healthy(2, 2), 120, "the router to discover the second prefill pod")
        (new_pod,) = set(loop.pods("prefill")) - set(prefill_pods)

        async def new_pod_served() -> bool:
            await asyncio.gather(*(completion(http, url, 100 + i) for i in range(4)))
            return any(pod == new_pod for pod, _ in loop.transfers("prefill").values())

        await eventually(new_pod_served, 60, f"a request prefilled on the new pod {new_pod}")
        checked |= assert_prefill_then_decode(loop, checked)

        # decode 2 -> 1 while a bounded loop of 60 requests runs: none is lost
        results = await traffic_with_scale_down(loop, http, namespace, checked)
        assert all(r == "ok" for r in results), results
        await eventually(lambda: loop.healthy(2, 1), 60, "the router to drop the removed decode pod")
        assert len(loop.pods("decode")) == 1
    assert_prefill_then_decode(loop, checked)


async def traffic_with_scale_down(
    loop: Loop, http: aiohttp.ClientSession, namespace: str, before: set[str]
) -> list[str]:
    url = loop.router.url
    total, concurrency = 60, 4
    results: list[str] = []
    next_index = iter(range(total))
    scaled = asyncio.Event()

    async def worker() -> None:
        for i in next_index:
            try:
                await completion(http, url, 1000 + i, max_tokens=48)
                results.append("ok")
            except (AssertionError, aiohttp.ClientError, TimeoutError) as err:
                results.append(f"request {i}: {err!r}")
            if len(results) == 10 and not scaled.is_set():
                scaled.set()
                await scale(loop.kube, namespace, "decode", 1, loop.name)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    ended = time.monotonic()
    assert scaled.is_set() and len(results) == total
    # the decode pod was removed while the loop still ran (its engine kept serving what it had through
    # preStop and the drain)
    removed = [pod for pod in loop.pool.retired.values() if pod.spec.role == "decode"]
    assert len(removed) == 1, [pod.spec.name for pod in removed]
    assert removed[0].removed_at is not None and removed[0].removed_at < ended
    print(f"decode pod {removed[0].spec.name} removed with {removed[0].in_flight_at_removal} in flight")
    return results


SGLANG_NAME = "llama-sglang"
BOOTSTRAP_PORT = 8998  # the DD's kvTransfer.bootstrapPort default (SGLang's --disaggregation-bootstrap-port)


def sglang_deployment(namespace: str, connector: str) -> dict[str, Any]:
    """examples/sglang-mooncake.yaml's (and sglang-nixl.yaml's) model with ``connector``, one prefill and
    two decode replicas at TP4."""
    pool = {
        "tensorParallelSize": 4,
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "preStopSleepSeconds": 1,
    }
    return {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedDeployment",
        "metadata": {"name": SGLANG_NAME, "namespace": namespace},
        "spec": {
            "model": {
                "name": "meta-llama/Llama-3.1-70B-Instruct",
                "servedName": SERVED,
                "source": {"huggingFace": {"id": "meta-llama/Llama-3.1-70B-Instruct"}},
                "maxModelLen": 32768,
            },
            "engine": {"type": "sglang"},
            "kvTransfer": {"connector": connector},
            "prefill": {"replicas": 1, **pool},
            "decode": {"replicas": 2, **pool},
            "router": {"replicas": 1, "args": ROUTER_ARGS},
        },
    }


@pytest.mark.parametrize("connector", ["mooncake", "nixl"])  # every connector the API accepts with SGLang
def test_released_sglang_router_pairs_prefill_and_decode_through_the_bootstrap_room(
    cluster: ClusterInfo, namespace: str, tmp_path: Path, connector: str
) -> None:
    manifest = sglang_deployment(namespace, connector)
    dd = DisaggregatedDeployment.model_validate(manifest)
    with deployed(cluster, namespace, manifest, tmp_path) as (kube, kubeconfig):
        asyncio.run(sglang_scenario(kube, namespace, dd, kubeconfig, tmp_path))


async def sglang_scenario(
    kube: KubeApi, namespace: str, dd: DisaggregatedDeployment, kubeconfig: Path, tmp: Path
) -> None:
    pool = PodPool(PoolSettings(engine=EngineSettings(time_scale=0.5)))
    follower = PodFollower(kube.api_client, namespace, SGLANG_NAME, pool, NO_LOADING, watch_timeout_s=5)
    follower.start()
    router: RouterProcess | None = None
    try:
        router = await asyncio.to_thread(
            start_router,
            "sglang",
            router_command(dd),
            kubeconfig,
            tmp / "router",
            {"POD_NAMESPACE": namespace},
            RouterSettings(tie_to_parent=True),
        )
        try:
            await sglang_checks(Loop(kube, namespace, pool, router, SGLANG_NAME), namespace)
        except BaseException:
            print("--- router log (tail)\n" + router.log_tail(6000))
            print_exchanges(pool)
            raise
    finally:
        if router is not None:
            router.stop()
        await follower.stop()
        await pool.close()


async def sglang_checks(loop: Loop, namespace: str) -> None:
    pool, router = loop.pool, loop.router

    async def healthy(workers: int) -> bool:
        response = await asyncio.to_thread(router.get, "/readiness")
        body = response.json() if response.status_code in (200, 503) else {}
        return bool(body.get("healthy_workers") == workers)

    await eventually(lambda: healthy(3), 120, "the SGLang router to discover the prefill and decode pods")
    (prefill,) = [p for p in pool.pods.values() if p.spec.role == "prefill"]
    assert prefill.server is not None
    assert prefill.spec.engine == "sglang" and prefill.spec.host.startswith("127.")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        await asyncio.gather(*(completion(http, router.url, i) for i in range(4)))
        await asyncio.gather(*(streamed_chat(http, router.url, i) for i in range(4)))
        # the router sent each request to both pods with the same bootstrap room, naming the prefill pod's
        # IP and the port of its sglang.ai/bootstrap-port annotation (sglang-router pd_router.rs
        # inject_bootstrap_into_value); the decode engine reached that bootstrap server and paired
        prefilled = {t.bootstrap.room: t for t in prefill.server.engine.transfers if t.bootstrap is not None}
        decoded = {
            t.bootstrap.room: t
            for pod in pool.pods.values()
            if pod.spec.role == "decode" and pod.server is not None
            for t in pod.server.engine.transfers
            if t.bootstrap is not None
        }
        assert len(decoded) == 8 and set(decoded) == set(prefilled), (sorted(prefilled), sorted(decoded))
        for room, record in decoded.items():
            assert record.bootstrap is not None and record.bootstrap == prefilled[room].bootstrap
            assert (record.bootstrap.host, record.bootstrap.port) == (prefill.spec.host, BOOTSTRAP_PORT)
            assert record.outcome == "bootstrap-decode" and record.finish_reason == "length", record
            assert prefilled[room].outcome == "bootstrap-prefill"
        # decode 2 -> 1 while a bounded loop of 60 requests runs: none is lost
        results = await traffic_with_scale_down(loop, http, namespace, set())
        assert all(r == "ok" for r in results), results
        await eventually(lambda: healthy(2), 60, "the SGLang router to drop the removed decode pod")
    # the router's own exposition, which Prometheus scrapes from router pods: in HTTP PD mode 0.3.2
    # exports request durations but no TTFT histogram (smg_router_ttft_seconds stays unregistered), so
    # the policy's user TTFT falls back to the engine sides' sum (disagg.metrics.queries.ROUTER_METRICS)
    assert router.metrics_url is not None
    exposition = (await asyncio.to_thread(httpx.get, router.metrics_url, timeout=5.0)).text
    assert "smg_router_request_duration_seconds_count" in exposition
    assert "smg_router_ttft_seconds_count" not in exposition, (
        "the router now exports TTFT: check the policy reads it"
    )

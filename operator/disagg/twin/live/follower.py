"""Following a DisaggregatedDeployment's pods on a cluster: one simulated engine per Running pod.

The follower lists and watches the pods labelled ``disagg.dev/deployment=<name>`` (role from
``disagg.dev/role``) and tells the pod pool which ones should serve (Running, not being deleted). A pod
whose IP is a loopback address (the local cluster's kwok hands pod IPs out of 127.0.0.0/8) is served on
that IP at its engine container's own ports (``http``, and the NIXL side channel ``nixl`` /
VLLM_NIXL_SIDE_CHANNEL_PORT or SGLang's ``bootstrap`` server), so routers and Prometheus reach it exactly
as on a real cluster; any other pod gets 127.0.0.1 and free ports. Each serving pod is annotated
``disagg.dev/twin-endpoint: HOST:PORT``.

While the twin serves a pod, the pod carries the finalizer ``disagg.dev/twin-engine``: kwok deletes a
pod at once and recycles its IP, but the twin's engine keeps serving through the preStop sleep and its
drain, as a kubelet would; the finalizer keeps the (Terminating) pod, and so its IP, until the engine has
closed. ``stop()`` removes it from every pod.

A replica spanning several nodes is a LeaderWorkerSet group (:mod:`disagg.render.lws`): its pods carry
``disagg.dev/group-role`` (leader or worker) and the group's index. Only the leader gets an engine, serving
for the whole group (the workers run ``--headless`` ranks that serve no HTTP), and only once every pod of
the group (``LWS_GROUP_SIZE``, else the spec's nodesPerReplica) is Running: a group is a unit. The group's
engine runs the layout its leader's command line gives (:func:`disagg.policy.bounds.layout_from_args`,
the policy's parser, over the group's GPUs), and a MoE model's latency model under that parallelism.

Which latency model a pod runs comes from the DisaggregatedDeployment (model name, quantization,
engine) and the pod itself (GPU type from its nodeSelector, tensor-parallel size from its
``nvidia.com/gpu`` limit, kv_load_failure_policy from its ``--kv-transfer-config``), with CLI overrides
first. So does how long a new pod loads its model before it serves: the start-up estimate of
:func:`disagg.perf.startup.spec_startup_delay_s` for the spec (weights read from ``spec.model.cache``, or
downloaded by every replica), times ``startup_scale`` (a demo compresses it), unless the CLI gives a
fixed delay. The Kubernetes client is synchronous, so its calls run in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from disagg.api import deployment as deployment_api
from disagg.api.common import API_GROUP, API_VERSION
from disagg.perf.moe import Parallelism, Speculation, resolve_moe_model
from disagg.policy.bounds import layout_from_args, mtp_tokens
from disagg.render.lws import GROUP_INDEX_LABEL, GROUP_SIZE_ENV
from disagg.render.names import GROUP_ROLE_LABEL
from disagg.twin.live.engine import KV_LOAD_FAILURE_POLICIES, KvLoadFailurePolicy, Role
from disagg.twin.live.exposition import ENGINE_KINDS, EngineKind
from disagg.twin.live.latency import LatencyChoice
from disagg.twin.live.pods import PodPool, PodSpec
from disagg.twin.live.server import is_loopback_host

log = logging.getLogger(__name__)

ENDPOINT_ANNOTATION = "disagg.dev/twin-endpoint"
ENGINE_FINALIZER = "disagg.dev/twin-engine"
ENGINE_CONTAINER = "engine"  # disagg.render.builders.ENGINE_CONTAINER
# vllm 0.33.0 wheel, vllm/envs.py: the NIXL side channel's port (default 5600)
SIDE_CHANNEL_PORT_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"
ROLE_LABEL = "disagg.dev/role"
DEPLOYMENT_LABEL = "disagg.dev/deployment"
GPU_TYPE_LABEL = "disagg.dev/gpu-type"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
FOLLOWED_ROLES: tuple[Role, ...] = ("prefill", "decode")
DD_GROUP, DD_VERSION, DD_PLURAL = API_GROUP, API_VERSION, deployment_api.PLURAL


@dataclass(frozen=True)
class Overrides:
    """CLI choices that win over what the cluster says (None: take the cluster's)."""

    model: str | None = None
    gpu: str | None = None
    tp: int | None = None
    dtype: str | None = None
    engine: EngineKind | None = None
    startup_delay_s: float | None = None  # engine seconds of model loading for every pod


@dataclass(frozen=True)
class Defaults:
    """What a pod runs when neither the pod nor an override says otherwise."""

    model: str = "llama-3.1-8b"
    served_model: str = ""
    gpu: str = "h100"
    dtype: str = "bf16"
    engine: EngineKind = "vllm"
    max_model_len: int | None = None  # the DD's spec.model.maxModelLen (None: the engine default)
    tp: Mapping[str, int] | None = None  # role -> TP from the DD spec
    node_selector: Mapping[str, Mapping[str, str]] | None = None  # role -> nodeSelector from the DD spec
    startup_delay_s: float | None = None  # engine seconds a new pod loads its model (None: the pool's)
    nodes: Mapping[str, int] | None = (
        None  # role -> pods per replica (spec.<role>.parallelism.nodesPerReplica)
    )


def spec_startup_delay(spec: Mapping[str, Any], dtype: str, scale: float = 1.0) -> float | None:
    """Engine seconds a new pod of a DisaggregatedDeployment spec (dict) loads its model: the twin's
    start-up estimate (cached or downloading) times ``scale``; None without a twin profile of the model."""
    from disagg.perf.startup import spec_startup_delay_s

    if scale < 0:
        raise ValueError(f"startup scale must be >= 0, got {scale}")
    try:
        return spec_startup_delay_s(spec, dtype) * scale
    except (ValueError, KeyError):
        return None


def defaults_from_deployment(
    obj: Mapping[str, Any] | None, fallback: Defaults | None = None, startup_scale: float = 1.0
) -> Defaults:
    """Model, engine, TP, node selectors and model-loading time from a DisaggregatedDeployment object
    (dict), if there is one. The loading time is the spec's start-up estimate times ``startup_scale``."""
    base = fallback or Defaults()
    if obj is None:
        return base
    from disagg.api.deployment import DisaggregatedDeployment

    dd = DisaggregatedDeployment.model_validate(dict(obj))
    spec = dd.spec
    engine = spec.engine.type
    dtype = "fp8" if (spec.model.quantization or "").startswith("fp8") else base.dtype
    delay = spec_startup_delay(obj.get("spec") or {}, dtype, startup_scale)
    return Defaults(
        model=spec.model.name,
        served_model=spec.model.served,
        gpu=base.gpu,
        dtype=dtype,
        engine=engine if engine in ENGINE_KINDS else base.engine,
        max_model_len=spec.model.max_model_len,
        tp={"prefill": spec.prefill.tensor_parallel_size, "decode": spec.decode.tensor_parallel_size},
        node_selector={
            "prefill": spec.role("prefill").node_selector or {},
            "decode": spec.role("decode").node_selector or {},
        },
        startup_delay_s=delay if delay is not None else base.startup_delay_s,
        nodes={"prefill": spec.prefill.nodes_per_replica, "decode": spec.decode.nodes_per_replica},
    )


def _gpu_from_selector(selector: Mapping[str, str] | None) -> str | None:
    if not selector:
        return None
    return selector.get(GPU_TYPE_LABEL) or selector.get(GPU_PRODUCT_LABEL)


def _gpu_limit(pod: Mapping[str, Any]) -> int | None:
    for container in pod.get("spec", {}).get("containers", []) or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        if GPU_RESOURCE in limits:
            try:
                return int(str(limits[GPU_RESOURCE]))
            except ValueError:
                return None
    return None


def _engine_container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = pod.get("spec", {}).get("containers", []) or []
    for container in containers:
        if container.get("name") == ENGINE_CONTAINER:
            return cast(Mapping[str, Any], container)
    return cast(Mapping[str, Any], containers[0]) if containers else {}


def _container_port(container: Mapping[str, Any], name: str) -> int | None:
    for port in container.get("ports") or []:
        if port.get("name") == name and isinstance(port.get("containerPort"), int):
            return int(port["containerPort"])
    return None


def _env_int(container: Mapping[str, Any], name: str) -> int | None:
    for item in container.get("env") or []:
        if item.get("name") == name and item.get("value") is not None:
            with contextlib.suppress(ValueError):
                return int(str(item["value"]))
    return None


def pre_stop_seconds(container: Mapping[str, Any]) -> float:
    """The preStop hook's sleep: ``exec: [sleep, N]`` (as disagg renders it) or the ``sleep`` action."""
    pre_stop = ((container.get("lifecycle") or {}).get("preStop")) or {}
    seconds = (pre_stop.get("sleep") or {}).get("seconds")
    command = (pre_stop.get("exec") or {}).get("command") or []
    if seconds is None and len(command) == 2 and command[0] == "sleep":
        seconds = command[1]
    try:
        return max(0.0, float(seconds)) if seconds is not None else 0.0
    except ValueError:
        return 0.0


def kv_load_failure_policy(container: Mapping[str, Any]) -> KvLoadFailurePolicy | None:
    """``kv_load_failure_policy`` of the engine's ``--kv-transfer-config`` JSON, if it sets one."""
    words = [str(w) for w in [*(container.get("command") or []), *(container.get("args") or [])]]
    for i, word in enumerate(words):
        value = None
        if word == "--kv-transfer-config" and i + 1 < len(words):
            value = words[i + 1]
        elif word.startswith("--kv-transfer-config="):
            value = word.partition("=")[2]
        if value is None:
            continue
        try:
            policy = json.loads(value).get("kv_load_failure_policy")
        except (ValueError, AttributeError):
            return None
        return cast(KvLoadFailurePolicy, policy) if policy in KV_LOAD_FAILURE_POLICIES else None
    return None


def pod_address(pod: Mapping[str, Any]) -> tuple[str, int, int]:
    """(host, API port, side-channel port) the pod's emulated engine listens on: the pod's own IP and its
    engine's ports when the IP is a loopback address other than 127.0.0.1 (a kwok pod IP from a loopback
    pod CIDR), else 127.0.0.1 and free ports."""
    ip = str(pod.get("status", {}).get("podIP") or "")
    if not ip or ip == "127.0.0.1" or not is_loopback_host(ip):
        return "127.0.0.1", 0, 0
    container = _engine_container(pod)
    http = _container_port(container, "http") or 0
    side = (
        _container_port(container, "nixl")
        or _env_int(container, SIDE_CHANNEL_PORT_ENV)
        or _container_port(container, "bootstrap")  # SGLang's bootstrap server (prefill pods)
        or 0
    )
    return ip, http, side


def is_serving_pod(pod: Mapping[str, Any]) -> bool:
    """Running and not being deleted (kwok marks its pods Running)."""
    meta = pod.get("metadata", {})
    return pod.get("status", {}).get("phase") == "Running" and not meta.get("deletionTimestamp")


def group_member(pod: Mapping[str, Any]) -> str:
    """``single`` (a pod of its own), ``leader`` or ``worker`` of a LeaderWorkerSet group."""
    labels = pod.get("metadata", {}).get("labels") or {}
    member = labels.get(GROUP_ROLE_LABEL)
    return str(member) if member in ("leader", "worker") else "single"


def group_key(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(role, group index) of a group's pod; None for a single pod."""
    if group_member(pod) == "single":
        return None
    labels = pod.get("metadata", {}).get("labels") or {}
    return str(labels.get(ROLE_LABEL, "")), str(labels.get(GROUP_INDEX_LABEL, ""))


def group_size(pod: Mapping[str, Any], defaults: Defaults) -> int:
    """Pods in the pod's group: the LeaderWorkerSet webhook's ``LWS_GROUP_SIZE`` on its engine container,
    else the spec's nodesPerReplica of its role, else 1."""
    size = _env_int(_engine_container(pod), GROUP_SIZE_ENV)
    if size is None:
        role = str((pod.get("metadata", {}).get("labels") or {}).get(ROLE_LABEL, ""))
        size = (defaults.nodes or {}).get(role)
    return max(1, size or 1)


def serving_pods(pods: Mapping[str, Mapping[str, Any]], defaults: Defaults) -> list[Mapping[str, Any]]:
    """The pods that get an engine: every serving single pod, and the leader of each group whose pods are
    all serving (as many as its group size); never a worker."""
    running: dict[tuple[str, str], int] = {}
    for pod in pods.values():
        key = group_key(pod)
        if key is not None and is_serving_pod(pod):
            running[key] = running.get(key, 0) + 1
    chosen: list[Mapping[str, Any]] = []
    for pod in pods.values():
        member = group_member(pod)
        if not is_serving_pod(pod) or member == "worker":
            continue
        key = group_key(pod)
        if key is not None and running.get(key, 0) < group_size(pod, defaults):
            continue
        chosen.append(pod)
    return chosen


def _engine_words(container: Mapping[str, Any]) -> list[str]:
    return [str(w) for w in [*(container.get("command") or []), *(container.get("args") or [])]]


def pod_parallelism(pod: Mapping[str, Any], model: str, pod_gpus: int, size: int) -> Parallelism | None:
    """The MoE latency model's parallelism of the replica a pod serves (a group's leader: the whole group's
    ``pod_gpus * size`` GPUs) from its engine command line, read by the policy's own parser; None for a
    dense model or plain tensor parallelism within one node."""
    if resolve_moe_model(model) is None:
        return None
    gpus = pod_gpus * size
    layout = layout_from_args(_engine_words(_engine_container(pod)), gpus, model, gpus_per_node=pod_gpus)
    if layout.tensor_only:
        return None
    return Parallelism(layout.tp, layout.dp, layout.ep, layout.gpus_per_node, layout.overlap)


def pod_speculation(pod: Mapping[str, Any], model: str) -> Speculation | None:
    """The MTP speculative decoding a pod's engine flags ask for (the twin's reading of them,
    :func:`disagg.policy.bounds.speculation_from_args`), where the model publishes an MTP module; None
    otherwise (the pod is then emulated without speculation)."""
    tokens = mtp_tokens(_engine_words(_engine_container(pod)), model)
    return Speculation(tokens) if tokens else None


def pod_spec_for(pod: Mapping[str, Any], defaults: Defaults, overrides: Overrides) -> PodSpec | None:
    """The simulated pod for a pod object (dict), or None when it should not serve (not serving, or a
    group's worker). A group's leader plays the whole group: its GPUs and its layout. Whether the rest of
    its group is Running is :func:`serving_pods`'s to say."""
    meta = pod.get("metadata", {})
    role = (meta.get("labels") or {}).get(ROLE_LABEL)
    if role not in FOLLOWED_ROLES or not is_serving_pod(pod) or group_member(pod) == "worker":
        return None
    role = cast(Role, role)
    selector = pod.get("spec", {}).get("nodeSelector")
    gpu = (
        overrides.gpu
        or _gpu_from_selector(selector)
        or _gpu_from_selector((defaults.node_selector or {}).get(role))
        or defaults.gpu
    )
    model = overrides.model or defaults.model
    size = group_size(pod, defaults) if group_member(pod) == "leader" else 1
    pod_gpus = _gpu_limit(pod) or (defaults.tp or {}).get(role) or 1
    parallelism = None if overrides.tp else pod_parallelism(pod, model, pod_gpus, size)
    tp = overrides.tp or (parallelism.gpus if parallelism is not None else pod_gpus * size)
    host, http_port, side_port = pod_address(pod)
    container = _engine_container(pod)
    choice = LatencyChoice(
        model=model,
        gpu=gpu,
        tp=tp,
        dtype=overrides.dtype or defaults.dtype,
        parallelism=parallelism,
        speculation=pod_speculation(pod, model),
    )
    return PodSpec(
        name=str(meta["name"]),
        role=role,
        choice=choice,
        engine=overrides.engine or defaults.engine,
        served_model=defaults.served_model or (overrides.model or defaults.model),
        max_model_len=defaults.max_model_len,
        host=host,
        http_port=http_port,
        side_channel_port=side_port,
        pre_stop_s=pre_stop_seconds(container),
        kv_load_failure_policy=kv_load_failure_policy(container),
        startup_delay_s=(
            overrides.startup_delay_s if overrides.startup_delay_s is not None else defaults.startup_delay_s
        ),
    )


class PodFollower:
    """Mirrors the pods of one DisaggregatedDeployment into a PodPool until ``stop()``."""

    def __init__(
        self,
        api_client: Any,
        namespace: str,
        deployment: str,
        pool: PodPool,
        overrides: Overrides | None = None,
        fallback: Defaults | None = None,
        watch_timeout_s: int = 10,
        startup_scale: float = 1.0,
    ) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.api_client = api_client
        self.namespace = namespace
        self.deployment = deployment
        self.pool = pool
        self.overrides = overrides or Overrides()
        self.fallback = fallback or Defaults()
        self.watch_timeout_s = watch_timeout_s
        if startup_scale < 0:
            raise ValueError(f"startup_scale must be >= 0, got {startup_scale}")
        self.startup_scale = startup_scale
        self.pods: dict[str, dict[str, Any]] = {}
        self.annotated: dict[str, str] = {}
        self.finalized: set[str] = set()  # pods carrying ENGINE_FINALIZER (put there by this follower)
        self._stop = threading.Event()
        self._task: asyncio.Task[None] | None = None
        pool.on_ready = self.annotate
        pool.on_released = self.release

    @property
    def selector(self) -> str:
        return f"{DEPLOYMENT_LABEL}={self.deployment}"

    def _read_deployment(self) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            obj = self.custom.get_namespaced_custom_object(
                DD_GROUP, DD_VERSION, self.namespace, DD_PLURAL, self.deployment
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return cast(dict[str, Any], obj)

    def _defaults(self) -> Defaults:
        """The DisaggregatedDeployment's choices; the fallback when it is absent, unreadable or invalid."""
        from pydantic import ValidationError

        try:
            obj = self._read_deployment()
        except Exception:  # no CRD installed yet, or forbidden: run with the fallback
            log.warning("cannot read DisaggregatedDeployment %s/%s", self.namespace, self.deployment)
            return self.fallback
        try:
            return defaults_from_deployment(obj, self.fallback, self.startup_scale)
        except ValidationError as err:
            log.error("DisaggregatedDeployment %s/%s is invalid: %s", self.namespace, self.deployment, err)
            return self.fallback

    async def run(self) -> None:
        """List, then watch; on every change hand the wanted pods to the pool. Restarts the watch."""
        loop = asyncio.get_running_loop()
        changes: asyncio.Queue[None] = asyncio.Queue()
        while not self._stop.is_set():
            defaults = await asyncio.to_thread(self._defaults)
            version = await asyncio.to_thread(self._list)
            await self._apply(defaults)
            watcher = loop.run_in_executor(None, self._watch, version, loop, changes)
            while not watcher.done():
                getter = asyncio.ensure_future(changes.get())
                await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
                getter.cancel()
                await self._apply(defaults)
            try:
                await watcher
            except Exception:
                log.exception("pod watch failed; listing again")
                await asyncio.sleep(1.0)

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.get_running_loop().create_task(self.run(), name=f"follow-{self.deployment}")
        return self._task

    async def stop(self) -> None:
        """Stop following and take the finalizer off every pod (serving or not: the twin lets go)."""
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self.release_all()

    async def release_all(self) -> None:
        """Remove ENGINE_FINALIZER from every pod of the deployment that carries it."""
        listing = await asyncio.to_thread(
            self.core.list_namespaced_pod, self.namespace, label_selector=self.selector
        )
        for pod in listing.items:
            meta = pod.metadata
            if meta is not None and meta.name and ENGINE_FINALIZER in (meta.finalizers or []):
                await self.release(str(meta.name))

    async def release(self, name: str) -> None:
        """The pod's engine has closed: take the finalizer off (a Terminating pod then goes)."""
        from kubernetes.client.exceptions import ApiException

        body = {"metadata": {"$deleteFromPrimitiveList/finalizers": [ENGINE_FINALIZER]}}
        try:
            await asyncio.to_thread(self._patch, name, body)
        except ApiException as err:
            if err.status != 404:
                log.error("pod %s: removing finalizer %s failed: %s", name, ENGINE_FINALIZER, err)
                return
        self.finalized.discard(name)

    async def _hold(self, name: str) -> bool:
        """Put ENGINE_FINALIZER on a pod about to be served; False when the pod is gone."""
        from kubernetes.client.exceptions import ApiException

        if name in self.finalized:
            return True
        body = {"metadata": {"finalizers": [ENGINE_FINALIZER]}}  # strategic merge: added to the list
        try:
            await asyncio.to_thread(self._patch, name, body)
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        self.finalized.add(name)
        return True

    def _patch(self, name: str, body: Mapping[str, Any]) -> None:
        """A strategic merge patch of a pod (finalizers merge into the list, annotations into the map)."""
        self.core.patch_namespaced_pod(
            name, self.namespace, dict(body), _content_type="application/strategic-merge-patch+json"
        )

    def _list(self) -> str:
        listing = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector)
        raw: dict[str, Any] = self.api_client.sanitize_for_serialization(listing)
        self.pods = {p["metadata"]["name"]: p for p in raw.get("items") or []}
        return str(raw["metadata"]["resourceVersion"])

    def _watch(self, version: str, loop: asyncio.AbstractEventLoop, changes: asyncio.Queue[None]) -> None:
        from kubernetes import watch

        stream: Any = watch.Watch()  # type: ignore[no-untyped-call]
        for event in stream.stream(
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=self.selector,
            resource_version=version,
            timeout_seconds=self.watch_timeout_s,
        ):
            if self._stop.is_set():
                stream.stop()
                break
            kind = event.get("type")
            obj = event.get("raw_object") or self.api_client.sanitize_for_serialization(event["object"])
            name = obj.get("metadata", {}).get("name")
            if kind == "ERROR" or not name:
                break
            if kind == "DELETED":
                self.pods.pop(name, None)
            else:
                self.pods[name] = obj
            loop.call_soon_threadsafe(changes.put_nowait, None)

    async def _apply(self, defaults: Defaults) -> None:
        wanted: dict[str, PodSpec] = {}
        for obj in serving_pods(dict(self.pods), defaults):
            try:
                spec = pod_spec_for(obj, defaults, self.overrides)
            except ValueError as err:
                log.error("pod %s: %s", obj.get("metadata", {}).get("name"), err)
                continue
            if spec is None:
                continue
            if spec.name not in self.pool.pods and not await self._hold(spec.name):
                continue
            wanted[spec.name] = spec
        await self.pool.reconcile(wanted)
        for name in [n for n in self.annotated if n not in wanted]:
            del self.annotated[name]
        await self._annotate_missing()

    async def _annotate_missing(self) -> None:
        """Annotate serving pods whose annotation is absent or stale (e.g. after a failed patch)."""
        for name, pod in list(self.pool.pods.items()):
            if pod.state != "serving" or pod.server is None:
                continue
            endpoint = pod.server.endpoint
            if self.annotated.get(name) != endpoint:
                await self.annotate(name, endpoint)

    async def annotate(self, name: str, endpoint: str) -> None:
        """Set the endpoint annotation on a pod (the pool's ready hook calls this too)."""
        from kubernetes.client.exceptions import ApiException

        body = {"metadata": {"annotations": {ENDPOINT_ANNOTATION: endpoint}}}
        try:
            await asyncio.to_thread(self._patch, name, body)
        except ApiException as err:
            if err.status == 404:
                return
            raise
        self.annotated[name] = endpoint

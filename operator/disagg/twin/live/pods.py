"""A pool of simulated pods: each one an engine plus its endpoint, started after a model-loading delay
and drained on removal. The follower (or a static layout) tells the pool which pods should exist.

A pod may name its own address (its pod IP in 127.0.0.0/8 and the engine's real ports); otherwise it gets
127.0.0.1 and free ports. A removed pod first keeps serving for its preStop sleep (wall seconds, as the
kubelet runs the hook before SIGTERM, so routers stop sending first), then drains; ``on_released`` is told
once its engine has closed. A pod whose address is still held by a removed pod's engine starts once that
engine has closed (a recycled pod IP is never served twice at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from disagg.perf.latency import LatencyModel
from disagg.twin.live.engine import EngineSettings, KvLoadFailurePolicy, LiveEngine, Role
from disagg.twin.live.exposition import EngineKind, make_metrics
from disagg.twin.live.kv_exchange import Rendezvous
from disagg.twin.live.latency import LatencyChoice, load_step_latency
from disagg.twin.live.server import EngineServer, PodIdentity, ServerSettings

log = logging.getLogger(__name__)

PodState = Literal["starting", "serving", "draining"]
LatencyLoader = Callable[[LatencyChoice], LatencyModel]
ReadyHook = Callable[[str, str], Awaitable[None]]  # (pod name, "HOST:PORT")
ReleasedHook = Callable[[str], Awaitable[None]]  # (pod name): its engine has closed


@dataclass(frozen=True)
class PodSpec:
    """What one simulated pod plays."""

    name: str
    role: Role
    choice: LatencyChoice
    engine: EngineKind = "vllm"
    served_model: str = ""
    max_model_len: int | None = None  # None: the pool's engine settings decide
    host: str = "127.0.0.1"  # the pod's own IP when it is a loopback address
    http_port: int = 0  # 0: the pool's server setting (any free port)
    side_channel_port: int = 0  # NIXL side channel (0: any free port)
    pre_stop_s: float = 0.0  # wall seconds a removed pod keeps serving before it drains
    kv_load_failure_policy: KvLoadFailurePolicy | None = None  # None: the pool's engine settings decide
    startup_delay_s: float | None = None  # engine seconds of model loading (None: the pool's setting)

    @property
    def model_name(self) -> str:
        return self.served_model or self.choice.model


@dataclass(frozen=True)
class PoolSettings:
    engine: EngineSettings = field(default_factory=EngineSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    startup_delay_s: float = 0.0  # engine seconds of model loading before a new pod serves

    def __post_init__(self) -> None:
        if self.startup_delay_s < 0:
            raise ValueError(f"startup_delay_s must be >= 0, got {self.startup_delay_s}")


@dataclass(eq=False)
class TwinPod:
    spec: PodSpec
    state: PodState = "starting"
    server: EngineServer | None = None
    task: asyncio.Task[None] | None = None
    removed_at: float | None = None  # monotonic clock when the pool was told the pod is gone
    in_flight_at_removal: int = 0


class PodPool:
    """Simulated pods by name. ``reconcile`` starts the missing ones and drains the extra ones."""

    def __init__(
        self,
        settings: PoolSettings,
        latency_loader: LatencyLoader = load_step_latency,
        on_ready: ReadyHook | None = None,
        on_released: ReleasedHook | None = None,
    ) -> None:
        self.settings = settings
        self._load = latency_loader
        self.on_ready = on_ready
        self.on_released = on_released
        self._models: dict[LatencyChoice, LatencyModel] = {}
        self.pods: dict[str, TwinPod] = {}
        self.rendezvous = Rendezvous()  # SGLang's bootstrap pairing, shared by this process's pods
        self._draining: dict[asyncio.Task[None], TwinPod] = {}  # removed pods until their engine closed
        self._holders: dict[str, asyncio.Task[None]] = {}  # host -> the removed pod's engine still there
        self.retired: dict[str, TwinPod] = {}  # removed pods, newest last (for inspection)
        self.retired_limit = 100

    def endpoints(self, role: Role) -> list[str]:
        """host:port of the serving pods of a role."""
        return sorted(
            p.server.endpoint
            for p in self.pods.values()
            if p.state == "serving" and p.server is not None and p.spec.role == role
        )

    def side_channel_port(self, endpoint: str) -> int | None:
        """The side-channel (NIXL) or bootstrap (SGLang) port of the serving pod at ``endpoint``."""
        for pod in self.pods.values():
            if pod.state == "serving" and pod.server is not None and pod.server.endpoint == endpoint:
                return pod.server.side_channel_port
        return None

    def servers(self) -> list[EngineServer]:
        return [p.server for p in self.pods.values() if p.state == "serving" and p.server is not None]

    async def reconcile(self, wanted: Mapping[str, PodSpec]) -> None:
        for name in [n for n in self.pods if n not in wanted]:
            self._remove(name)
        for name, spec in wanted.items():
            if name not in self.pods:
                pod = TwinPod(spec)
                self.pods[name] = pod
                pod.task = asyncio.get_running_loop().create_task(self._start(pod), name=f"start-{name}")

    def _latency(self, choice: LatencyChoice) -> LatencyModel:
        if choice not in self._models:
            self._models[choice] = self._load(choice)
        return self._models[choice]

    def startup_delay_s(self, spec: PodSpec) -> float:
        """Wall seconds a new pod loads its model before it serves: its own delay, else the pool's."""
        engine_s = spec.startup_delay_s if spec.startup_delay_s is not None else self.settings.startup_delay_s
        return max(0.0, engine_s) * self.settings.engine.time_scale

    async def _start(self, pod: TwinPod) -> None:
        delay = self.startup_delay_s(pod.spec)
        if delay:
            log.info("pod %s loads its model for %.1f s", pod.spec.name, delay)
            await asyncio.sleep(delay)
        holder = self._holders.get(pod.spec.host) if pod.spec.host != "127.0.0.1" else None
        if holder is not None and not holder.done():
            log.info("pod %s waits for the engine still closing at %s", pod.spec.name, pod.spec.host)
            await asyncio.shield(holder)
        try:
            await self._serve(pod)
        except Exception:
            log.exception("pod %s could not start its emulated engine", pod.spec.name)
            raise

    async def _serve(self, pod: TwinPod) -> None:
        spec = pod.spec
        model = self._latency(spec.choice)
        engine_settings = self.settings.engine
        if spec.max_model_len is not None:
            engine_settings = replace(engine_settings, max_model_len=spec.max_model_len)
        if spec.kv_load_failure_policy is not None:
            engine_settings = replace(engine_settings, kv_load_failure_policy=spec.kv_load_failure_policy)
        metrics = make_metrics(spec.engine, spec.model_name, engine_settings.max_model_len)
        engine = LiveEngine(
            model,
            metrics,
            engine_settings,
            engine_id=spec.name,
            role=spec.role,
            tp_size=spec.choice.tp,
            rendezvous=self.rendezvous,
        )
        server_settings = replace(
            self.settings.server,
            host=spec.host,
            port=spec.http_port or self.settings.server.port,
            side_channel_port=spec.side_channel_port,
        )
        server = EngineServer(
            engine, PodIdentity(spec.name, spec.role, spec.engine, spec.model_name), server_settings
        )
        await server.start()
        pod.server = server
        pod.state = "serving"
        log.info("pod %s (%s) serving at %s", spec.name, spec.role, server.endpoint)
        if self.on_ready is not None:
            try:
                await self.on_ready(spec.name, server.endpoint)
            except Exception:  # the endpoint serves either way; the hook (an annotation) is retried later
                log.exception("ready hook failed for pod %s", spec.name)

    def _remove(self, name: str) -> None:
        pod = self.pods.pop(name)
        if pod.state == "starting" and pod.task is not None:
            pod.task.cancel()
        pod.state = "draining"
        pod.removed_at = time.monotonic()
        pod.in_flight_at_removal = pod.server.engine.in_flight if pod.server is not None else 0
        self.retired[name] = pod
        while len(self.retired) > self.retired_limit:
            del self.retired[next(iter(self.retired))]
        task = asyncio.get_running_loop().create_task(self._retire(pod), name=f"drain-{name}")
        self._draining[task] = pod
        task.add_done_callback(lambda done: self._draining.pop(done, None))
        if pod.spec.host != "127.0.0.1":
            self._holders[pod.spec.host] = task
            task.add_done_callback(lambda done: self._forget_holder(pod.spec.host, done))

    def _forget_holder(self, host: str, task: asyncio.Task[None]) -> None:
        if self._holders.get(host) is task:
            del self._holders[host]

    async def _retire(self, pod: TwinPod) -> None:
        """preStop (keep serving), then drain and close; tell ``on_released``."""
        name = pod.spec.name
        try:
            if pod.server is not None:
                if pod.spec.pre_stop_s > 0:
                    log.info("pod %s: preStop, serving %.1f s more", name, pod.spec.pre_stop_s)
                    await asyncio.sleep(pod.spec.pre_stop_s)
                log.info("pod %s draining", name)
                await pod.server.drain()
            elif pod.task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pod.task
        finally:
            if self.on_released is not None:
                try:
                    await self.on_released(name)
                except Exception:
                    log.exception("released hook failed for pod %s", name)

    async def wait_drained(self) -> None:
        if self._draining:
            await asyncio.gather(*self._draining, return_exceptions=True)

    async def close(self) -> None:
        """Stop every pod now (in-flight requests are aborted)."""
        for pod in list(self.pods.values()):
            if pod.task is not None and not pod.task.done():
                pod.task.cancel()
            if pod.server is not None:
                await pod.server.stop()
        self.pods.clear()
        for task, pod in list(self._draining.items()):
            task.cancel()
            if pod.server is not None:
                await pod.server.stop()
        await self.wait_drained()

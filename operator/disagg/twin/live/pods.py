"""A pool of simulated pods: each one an engine plus its endpoint, started after a model-loading delay
and drained on removal. The follower (or a static layout) tells the pool which pods should exist."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from disagg.twin.latency import LatencyModel
from disagg.twin.live.engine import EngineSettings, LiveEngine, Rendezvous, Role
from disagg.twin.live.exposition import EngineKind, make_metrics
from disagg.twin.live.latency import LatencyChoice, load_step_latency
from disagg.twin.live.server import EngineServer, PodIdentity, ServerSettings

log = logging.getLogger(__name__)

PodState = Literal["starting", "serving", "draining"]
LatencyLoader = Callable[[LatencyChoice], LatencyModel]
ReadyHook = Callable[[str, str], Awaitable[None]]  # (pod name, "127.0.0.1:PORT")


@dataclass(frozen=True)
class PodSpec:
    """What one simulated pod plays."""

    name: str
    role: Role
    choice: LatencyChoice
    engine: EngineKind = "vllm"
    served_model: str = ""
    max_model_len: int | None = None  # None: the pool's engine settings decide

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


class PodPool:
    """Simulated pods by name. ``reconcile`` starts the missing ones and drains the extra ones."""

    def __init__(
        self,
        settings: PoolSettings,
        latency_loader: LatencyLoader = load_step_latency,
        on_ready: ReadyHook | None = None,
    ) -> None:
        self.settings = settings
        self._load = latency_loader
        self.on_ready = on_ready
        self._models: dict[LatencyChoice, LatencyModel] = {}
        self.pods: dict[str, TwinPod] = {}
        self.rendezvous = Rendezvous()  # SGLang's bootstrap pairing, shared by this process's pods
        self._draining: set[asyncio.Task[int]] = set()

    def endpoints(self, role: Role) -> list[str]:
        """host:port of the serving pods of a role."""
        return sorted(
            p.server.endpoint
            for p in self.pods.values()
            if p.state == "serving" and p.server is not None and p.spec.role == role
        )

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

    async def _start(self, pod: TwinPod) -> None:
        delay = self.settings.startup_delay_s * self.settings.engine.time_scale
        if delay:
            await asyncio.sleep(delay)
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
        server = EngineServer(
            engine, PodIdentity(spec.name, spec.role, spec.engine, spec.model_name), self.settings.server
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
            return
        pod.state = "draining"
        if pod.server is not None:
            task = asyncio.get_running_loop().create_task(pod.server.drain(), name=f"drain-{name}")
            self._draining.add(task)
            task.add_done_callback(self._draining.discard)
            log.info("pod %s draining", name)

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
        await self.wait_drained()

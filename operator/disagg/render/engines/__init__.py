"""Engines, one module each, registered by the API's enum value (spec.engine.type). Pure.

Each module (:class:`EngineModule`) knows its image, port, probes, /dev/shm and command line; the KV
connector's part comes from disagg.render.connectors, the router from disagg.render.routers. Adding an
engine (e.g. TensorRT-LLM): a module with an ``ENGINE``, its rows in disagg.api.support.SUPPORT_MATRIX
and an entry here.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from disagg.api.deployment import DisaggregatedDeployment, RoleName
from disagg.api.support import Engine
from disagg.render.engines import sglang, vllm
from disagg.render.engines.base import (
    HF_CACHE_DIR,
    HF_CACHE_VOLUME,
    HF_HUB_CACHE_DIR,
    EngineContainer,
    EngineModule,
    hf_hub_cache_env,
    hf_token_env,
    model_env,
    model_location,
    model_volumes,
    quantity_bytes,
)
from disagg.render.lws import Member
from disagg.render.routers import router_module
from disagg.render.settings import RenderSettings

ENGINES: Mapping[Engine, EngineModule] = MappingProxyType({"vllm": vllm.ENGINE, "sglang": sglang.ENGINE})


def engine_module(dd: DisaggregatedDeployment) -> EngineModule:
    return ENGINES[dd.spec.engine.type]


def engine_container(
    dd: DisaggregatedDeployment, role: RoleName, settings: RenderSettings, member: Member = "single"
) -> EngineContainer:
    """The engine-specific parts of one pool's pod (``member``: the pod of a single-node replica, or the
    leader or a worker of a multi-node one), user args and env appended last (so they win)."""
    container = engine_module(dd).container(dd, role, settings, member)
    if container.bootstrap_port is not None and container.serves_http:
        # Each router reads the prefill bootstrap port from its own annotation.
        container.annotations[router_module(dd).bootstrap_annotation] = str(container.bootstrap_port)
    container.env = model_env(dd) + container.env
    container.args += list(dd.spec.engine.args) + list(dd.spec.role(role).args)
    volumes, mounts = model_volumes(dd, settings)
    container.volumes += volumes
    container.volume_mounts += mounts
    return container


def engine_image(dd: DisaggregatedDeployment, settings: RenderSettings) -> str:
    return dd.spec.engine.image or engine_module(dd).image(settings)


def engine_port(dd: DisaggregatedDeployment, settings: RenderSettings) -> int:
    return engine_module(dd).http_port(settings)


__all__ = [
    "ENGINES",
    "HF_CACHE_DIR",
    "HF_CACHE_VOLUME",
    "HF_HUB_CACHE_DIR",
    "EngineContainer",
    "EngineModule",
    "engine_container",
    "engine_image",
    "engine_module",
    "engine_port",
    "hf_hub_cache_env",
    "hf_token_env",
    "model_env",
    "model_location",
    "model_volumes",
    "quantity_bytes",
]

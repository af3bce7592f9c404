"""vLLM (``vllm serve``), one pool's engine container. Pure.

``--kv-transfer-config`` is a KVTransferConfig JSON with ``kv_connector`` (from the connector module),
``kv_role`` (kv_producer on prefill, kv_consumer on decode), ``kv_load_failure_policy``
(Literal["recompute", "fail"], set explicitly) and ``kv_connector_extra_config`` (vllm 0.33.0 wheel,
vllm/config/kv_transfer.py). ``--shutdown-timeout S`` makes vLLM drain in-flight requests on SIGTERM.
Served by vllm-router (disagg.render.routers).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from disagg.api.deployment import DisaggregatedDeployment, RoleName
from disagg.api.support import Engine
from disagg.render.connectors import connector_module
from disagg.render.engines.base import EngineContainer, Obj, model_location, port
from disagg.render.settings import EngineProbes, RenderSettings

KV_ROLES: Mapping[RoleName, str] = MappingProxyType({"prefill": "kv_producer", "decode": "kv_consumer"})


def kv_transfer_config(
    dd: DisaggregatedDeployment, role: RoleName, settings: RenderSettings, kv_connector: str, extra: Obj
) -> Obj:
    """The KVTransferConfig JSON of one pool."""
    kv = dd.spec.kv_transfer
    config: Obj = {
        "kv_connector": kv_connector,
        "kv_role": KV_ROLES[role],
        "kv_load_failure_policy": kv.load_failure_policy,
    }
    merged = {**extra, **(kv.extra_config or {})}
    if merged:
        config["kv_connector_extra_config"] = merged
    return config


def model_args(dd: DisaggregatedDeployment) -> list[str]:
    model = dd.spec.model
    args: list[str] = []
    hf = model.source.hugging_face
    if hf is not None and hf.revision:
        args += ["--revision", hf.revision]
    if model.max_model_len is not None:
        args += ["--max-model-len", str(model.max_model_len)]
    if model.dtype is not None:
        args += ["--dtype", model.dtype]
    if model.quantization is not None:
        args += ["--quantization", model.quantization]
    return args


@dataclass(frozen=True)
class Vllm:
    engine: Engine = "vllm"

    def image(self, settings: RenderSettings) -> str:
        return settings.vllm_image

    def http_port(self, settings: RenderSettings) -> int:
        return settings.vllm_port

    def probes(self, settings: RenderSettings) -> EngineProbes:
        return settings.vllm_probes

    def shm_size(self, settings: RenderSettings) -> str:
        return settings.vllm_shm_size

    def container(
        self, dd: DisaggregatedDeployment, role: RoleName, settings: RenderSettings
    ) -> EngineContainer:
        spec = dd.spec
        role_spec = spec.role(role)
        wiring = connector_module(spec.kv_transfer.connector).wiring(self.engine, dd, role, settings)
        assert wiring.kv_connector is not None  # every connector vLLM accepts names its kv_connector
        config = kv_transfer_config(dd, role, settings, wiring.kv_connector, wiring.extra_config)
        args = [
            "serve",
            model_location(dd, settings),
            "--host",
            "0.0.0.0",
            "--port",
            str(settings.vllm_port),
            "--served-model-name",
            spec.model.served,
            "--tensor-parallel-size",
            str(role_spec.tensor_parallel_size),
            "--kv-transfer-config",
            json.dumps(config, separators=(",", ":"), sort_keys=True),
            "--shutdown-timeout",
            str(role_spec.shutdown_timeout_seconds),
            *model_args(dd),
            *wiring.args,
        ]
        return EngineContainer(
            command=["vllm"],
            args=args,
            env=list(wiring.env),
            ports=[port("http", settings.vllm_port), *wiring.ports],
        )


ENGINE = Vllm()

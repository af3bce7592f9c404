"""SGLang (``python3 -m sglang.launch_server``), one pool's engine container. Pure.

``--disaggregation-mode prefill|decode``, the transfer backend from the connector module,
``--disaggregation-bootstrap-port`` (SGLang's own bootstrap server on prefill, for either backend),
``[--disaggregation-ib-device DEV]`` and ``--enable-metrics`` (sglang 0.5.23 wheel,
sglang/srt/server_args.py). Served by the SGLang router, which reads each prefill pod's bootstrap port
from an annotation (disagg.render.routers).
"""

from __future__ import annotations

from dataclasses import dataclass

from disagg.api.deployment import DisaggregatedDeployment, RoleName
from disagg.api.support import Engine
from disagg.render.connectors import connector_module
from disagg.render.engines.base import EngineContainer, model_location, port
from disagg.render.settings import EngineProbes, RenderSettings


@dataclass(frozen=True)
class Sglang:
    engine: Engine = "sglang"

    def image(self, settings: RenderSettings) -> str:
        return settings.sglang_image

    def http_port(self, settings: RenderSettings) -> int:
        return settings.sglang_port

    def probes(self, settings: RenderSettings) -> EngineProbes:
        return settings.sglang_probes

    def shm_size(self, settings: RenderSettings) -> str:
        return settings.sglang_shm_size

    def container(
        self, dd: DisaggregatedDeployment, role: RoleName, settings: RenderSettings
    ) -> EngineContainer:
        spec = dd.spec
        role_spec = spec.role(role)
        kv = spec.kv_transfer
        model = spec.model
        wiring = connector_module(kv.connector).wiring(self.engine, dd, role, settings)
        args = [
            "-m",
            "sglang.launch_server",
            "--model-path",
            model_location(dd, settings),
            "--served-model-name",
            model.served,
            "--host",
            "0.0.0.0",
            "--port",
            str(settings.sglang_port),
            "--tp-size",
            str(role_spec.tensor_parallel_size),
            "--disaggregation-mode",
            role,
            *wiring.args,
            "--disaggregation-bootstrap-port",
            str(kv.bootstrap_port),
        ]
        if kv.rdma_device:
            args += ["--disaggregation-ib-device", kv.rdma_device]
        args.append("--enable-metrics")
        hf = model.source.hugging_face
        if hf is not None and hf.revision:
            args += ["--revision", hf.revision]
        if model.max_model_len is not None:
            args += ["--context-length", str(model.max_model_len)]
        if model.dtype is not None:
            args += ["--dtype", model.dtype]
        if model.quantization is not None:
            args += ["--quantization", model.quantization]
        container = EngineContainer(
            command=["python3"],
            args=args,
            env=list(wiring.env),
            ports=[port("http", settings.sglang_port), *wiring.ports],
        )
        if role == "prefill":
            container.ports.append(port("bootstrap", kv.bootstrap_port))
            container.bootstrap_port = kv.bootstrap_port
        return container


ENGINE = Sglang()

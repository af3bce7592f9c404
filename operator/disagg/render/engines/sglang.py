"""SGLang (``python3 -m sglang.launch_server``), one pool's engine container. Pure.

``--disaggregation-mode prefill|decode``, the transfer backend from the connector module,
``--disaggregation-bootstrap-port`` (SGLang's own bootstrap server on prefill, for either backend),
``[--disaggregation-ib-device DEV]`` and ``--enable-metrics`` (sglang 0.5.23 wheel,
sglang/srt/server_args.py). Served by the SGLang router, which reads each prefill pod's bootstrap port
from an annotation (disagg.render.routers).

spec.<role>.parallelism (sglang 0.5.23 wheel, sglang/srt/arg_groups/fields/parallel.py and exec_.py):
SGLang's tensor-parallel group holds the attention data-parallel ranks, so with dataParallelAttention
``--tp-size`` is tensor x data and ``--attn-dp-size`` data (the replacement of the deprecated
``--dp-size N --enable-dp-attention``, server_args.py); without it ``--dp-size`` data. ``--pp-size``;
with expert ``--ep-size`` and DeepEP: ``--moe-a2a-backend deepep`` with ``--deepep-mode normal`` on
prefill and ``low_latency`` on decode. A replica on several nodes is a LeaderWorkerSet group:
``--nnodes`` nodes, ``--node-rank`` the pod's worker index, ``--dist-init-addr`` the group's leader
address; nodes of rank >= 1 run schedulers only, no HTTP server (sglang/srt/entrypoints/http_server.py
launch_server returns for node_rank >= 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from disagg.api.deployment import DisaggregatedDeployment, RoleName
from disagg.api.support import Engine
from disagg.render.connectors import connector_module
from disagg.render.engines.base import EngineContainer, model_location, port
from disagg.render.lws import LEADER_ADDRESS, WORKER_INDEX, Member
from disagg.render.settings import EngineProbes, RenderSettings

# --deepep-mode per role (choices auto, normal, low_latency: sglang/srt/arg_groups/fields/exec_.py):
# normal dispatch for prefill's large batches, low-latency for decode (SGLang's large-scale EP deployment
# of DeepSeek, lmsys.org/blog/2025-05-05-large-scale-ep).
DEEPEP_MODES: Mapping[RoleName, str] = MappingProxyType({"prefill": "normal", "decode": "low_latency"})


def tp_size(dd: DisaggregatedDeployment, role: RoleName) -> int:
    """SGLang's --tp-size: the tensor size, times the data size when attention is data-parallel (the
    attention data-parallel ranks live inside SGLang's tensor-parallel group)."""
    role_spec = dd.spec.role(role)
    if role_spec.data_parallel_attention:
        return role_spec.tensor_size * role_spec.data_size
    return role_spec.tensor_size


def parallel_args(dd: DisaggregatedDeployment, role: RoleName, settings: RenderSettings) -> list[str]:
    """The flags of spec.<role>.parallelism after --tp-size; none without it."""
    role_spec = dd.spec.role(role)
    par = role_spec.parallelism
    if par is None:
        return []
    args: list[str] = []
    if par.pipeline > 1:
        args += ["--pp-size", str(par.pipeline)]
    if par.data > 1:
        args += ["--attn-dp-size" if par.data_parallel_attention else "--dp-size", str(par.data)]
    if par.expert is not None:
        args += [
            "--ep-size",
            str(par.expert),
            "--moe-a2a-backend",
            "deepep",
            "--deepep-mode",
            DEEPEP_MODES[role],
        ]
    if role_spec.multi_node:
        args += [
            "--nnodes",
            str(par.nodes_per_replica),
            "--node-rank",
            WORKER_INDEX,
            "--dist-init-addr",
            f"{LEADER_ADDRESS}:{settings.sglang_dist_init_port}",
        ]
    return args


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
        self, dd: DisaggregatedDeployment, role: RoleName, settings: RenderSettings, member: Member = "single"
    ) -> EngineContainer:
        spec = dd.spec
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
            str(tp_size(dd, role)),
            *parallel_args(dd, role, settings),
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
            serves_http=member != "worker",
        )
        if role == "prefill":
            container.ports.append(port("bootstrap", kv.bootstrap_port))
            container.bootstrap_port = kv.bootstrap_port
        return container


ENGINE = Sglang()

"""vLLM (``vllm serve``), one pool's engine container. Pure.

``--kv-transfer-config`` is a KVTransferConfig JSON with ``kv_connector`` (from the connector module),
``kv_role`` (kv_producer on prefill, kv_consumer on decode), ``kv_load_failure_policy``
(Literal["recompute", "fail"], set explicitly) and ``kv_connector_extra_config`` (vllm 0.33.0 wheel,
vllm/config/kv_transfer.py). ``--shutdown-timeout S`` makes vLLM drain in-flight requests on SIGTERM.
Served by vllm-router (disagg.render.routers).

spec.<role>.parallelism (vllm 0.33.0 wheel, vllm/engine/arg_utils.py and vllm/config/parallel.py):
``--pipeline-parallel-size``, ``--data-parallel-size``, and with expert: ``--enable-expert-parallel`` (the
expert-parallel group is every tensor and data rank) and ``--all2all-backend`` per role,
``deepep_high_throughput`` on prefill (long batches of tokens) and ``deepep_low_latency`` on decode (its
choices; the VLLM_ALL2ALL_BACKEND variable is gone from vllm/envs.py). A replica on several nodes is a
LeaderWorkerSet group of vLLM's data-parallel deployment: each pod runs ``--data-parallel-size-local``
data / nodes ranks; the leader serves the API and the DP coordinator at ``--data-parallel-address``
(the group's leader address) ``--data-parallel-rpc-port``, each worker runs ``--headless`` with
``--data-parallel-start-rank`` worker index x local size, computed by a shell (the kubelet's $(VAR)
expansion has no arithmetic): ``sh -c 'exec "$0" "$@" --data-parallel-start-rank "$((...))"' vllm serve ...``
keeps every other argument a separate argv item, exactly as on the leader.
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
from disagg.render.lws import LEADER_ADDRESS, WORKER_INDEX_ENV, Member
from disagg.render.settings import EngineProbes, RenderSettings

KV_ROLES: Mapping[RoleName, str] = MappingProxyType({"prefill": "kv_producer", "decode": "kv_consumer"})
# --all2all-backend per role (vllm 0.33.0 wheel, vllm/engine/arg_utils.py: choices of all2all_backend):
# DeepEP's high-throughput kernels for prefill's large token batches, low-latency ones for decode.
ALL2ALL_BACKENDS: Mapping[RoleName, str] = MappingProxyType(
    {"prefill": "deepep_high_throughput", "decode": "deepep_low_latency"}
)
SHELL = "/bin/sh"


def worker_script(local_size: int) -> str:
    """The ``sh -c`` script of a LeaderWorkerSet worker: the argv that follows it, plus its start rank."""
    return f'exec "$0" "$@" --data-parallel-start-rank "$(({WORKER_INDEX_ENV} * {local_size}))"'


def parallel_args(
    dd: DisaggregatedDeployment, role: RoleName, member: Member, settings: RenderSettings
) -> list[str]:
    """The flags of spec.<role>.parallelism after --tensor-parallel-size; none without it."""
    role_spec = dd.spec.role(role)
    par = role_spec.parallelism
    if par is None:
        return []
    args: list[str] = []
    if par.pipeline > 1:
        args += ["--pipeline-parallel-size", str(par.pipeline)]
    if par.data > 1:
        args += ["--data-parallel-size", str(par.data)]
    if role_spec.multi_node:
        args += [
            "--data-parallel-size-local",
            str(par.data // par.nodes_per_replica),
            "--data-parallel-address",
            LEADER_ADDRESS,
            "--data-parallel-rpc-port",
            str(settings.vllm_data_parallel_rpc_port),
        ]
    if par.expert is not None:
        args += ["--enable-expert-parallel", "--all2all-backend", ALL2ALL_BACKENDS[role]]
    if member == "worker":
        args.append("--headless")
    return args


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
        self, dd: DisaggregatedDeployment, role: RoleName, settings: RenderSettings, member: Member = "single"
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
            str(role_spec.tensor_size),
            *parallel_args(dd, role, member, settings),
            "--kv-transfer-config",
            json.dumps(config, separators=(",", ":"), sort_keys=True),
            "--shutdown-timeout",
            str(role_spec.shutdown_timeout_seconds),
            *model_args(dd),
            *wiring.args,
        ]
        command = ["vllm"]
        if member == "worker":
            local_size = role_spec.data_size // role_spec.nodes_per_replica
            command, args = [SHELL, "-c", worker_script(local_size)], ["vllm", *args]
        return EngineContainer(
            command=command,
            args=args,
            env=list(wiring.env),
            ports=[port("http", settings.vllm_port), *wiring.ports],
            serves_http=member != "worker",
        )


ENGINE = Vllm()

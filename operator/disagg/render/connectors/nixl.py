"""NIXL: vLLM's NixlConnector and SGLang's nixl transfer backend. Pure.

vLLM: ``--kv-transfer-config {"kv_connector":"NixlConnector",...}`` (registered in vllm 0.33.0's
vllm/distributed/kv_transfer/kv_connector/factory.py); each pod advertises its side channel through
``VLLM_NIXL_SIDE_CHANNEL_HOST`` (the pod IP, from the downward API) and ``VLLM_NIXL_SIDE_CHANNEL_PORT``
(default 5600), exposed as a container port (vllm/envs.py); ``UCX_NET_DEVICES`` picks the NIC.
SGLang: ``--disaggregation-transfer-backend nixl`` (sglang 0.5.23 sglang/srt/arg_groups/choices.py
DISAGG_TRANSFER_BACKEND_CHOICES); the bootstrap server is SGLang's own (see disagg.render.engines.sglang).
"""

from __future__ import annotations

from dataclasses import dataclass

from disagg.api.deployment import DisaggregatedDeployment, RoleName
from disagg.api.support import Connector, Engine
from disagg.render.connectors.base import Wiring, refuse
from disagg.render.podparts import pod_ip_env, port
from disagg.render.settings import RenderSettings

VLLM_CONNECTOR = "NixlConnector"
SGLANG_BACKEND = "nixl"


@dataclass(frozen=True)
class Nixl:
    connector: Connector = "nixl"

    def wiring(
        self, engine: Engine, dd: DisaggregatedDeployment, role: RoleName, settings: RenderSettings
    ) -> Wiring:
        kv = dd.spec.kv_transfer
        if engine == "sglang":
            return Wiring(args=["--disaggregation-transfer-backend", SGLANG_BACKEND])
        if engine != "vllm":
            refuse(engine, self.connector)
        wiring = Wiring(
            kv_connector=VLLM_CONNECTOR,
            env=[
                pod_ip_env("VLLM_NIXL_SIDE_CHANNEL_HOST"),
                {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(kv.side_channel_port)},
            ],
            ports=[port("nixl", kv.side_channel_port)],
        )
        if kv.rdma_device:
            wiring.env.append({"name": "UCX_NET_DEVICES", "value": kv.rdma_device})
        return wiring


CONNECTOR = Nixl()

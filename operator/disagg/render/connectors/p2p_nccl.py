"""P2P NCCL: refused with every engine. Pure.

vLLM 0.33.0 no longer registers a P2pNcclConnector (vllm/distributed/kv_transfer/kv_connector/
factory.py), and vllm-router learns the engines' NCCL addresses only from ZMQ registrations on
--vllm-discovery-address (one router replica each, behind a Service); SGLang has no such backend. The
API refuses both combinations (disagg.api.support), so this module renders nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from disagg.api.deployment import DisaggregatedDeployment, RoleName
from disagg.api.support import Connector, Engine
from disagg.render.connectors.base import Wiring, refuse
from disagg.render.settings import RenderSettings


@dataclass(frozen=True)
class P2pNccl:
    connector: Connector = "p2p-nccl"

    def wiring(
        self, engine: Engine, dd: DisaggregatedDeployment, role: RoleName, settings: RenderSettings
    ) -> Wiring:
        refuse(engine, self.connector)


CONNECTOR = P2pNccl()

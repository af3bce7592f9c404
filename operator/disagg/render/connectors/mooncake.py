"""Mooncake: SGLang's mooncake transfer backend; vLLM's MooncakeConnector is refused. Pure.

SGLang: ``--disaggregation-transfer-backend mooncake`` (sglang 0.5.23 sglang/srt/arg_groups/choices.py
DISAGG_TRANSFER_BACKEND_CHOICES); the bootstrap server is SGLang's own (disagg.render.engines.sglang).
vLLM 0.33.0 ships MooncakeConnector, but vllm-router 0.1.17 fetches the Mooncake engine ids only for
static --prefill URLs, never for pods found by Kubernetes discovery (disagg.api.support), so the API
refuses vllm x mooncake and nothing here renders it.
"""

from __future__ import annotations

from dataclasses import dataclass

from disagg.api.deployment import DisaggregatedDeployment, RoleName
from disagg.api.support import Connector, Engine
from disagg.render.connectors.base import Wiring, refuse
from disagg.render.settings import RenderSettings

VLLM_CONNECTOR = "MooncakeConnector"  # vllm 0.33.0 kv_connector/factory.py (refused: see above)
SGLANG_BACKEND = "mooncake"


@dataclass(frozen=True)
class Mooncake:
    connector: Connector = "mooncake"

    def wiring(
        self, engine: Engine, dd: DisaggregatedDeployment, role: RoleName, settings: RenderSettings
    ) -> Wiring:
        if engine != "sglang":
            refuse(engine, self.connector)
        return Wiring(args=["--disaggregation-transfer-backend", SGLANG_BACKEND])


CONNECTOR = Mooncake()

"""The routers, one entry each, chosen per engine x connector by disagg.api.support. Pure.

Both run in PD mode with Kubernetes service discovery of both pools in the object's namespace and
export Prometheus metrics; each reads a prefill pod's bootstrap port from its own annotation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from disagg.api.deployment import DisaggregatedDeployment
from disagg.api.support import RouterName, router_for
from disagg.render.settings import RenderSettings


@dataclass(frozen=True)
class RouterModule:
    name: RouterName
    command_head: tuple[str, ...]  # the program and its PD-mode flag
    bootstrap_annotation: str  # pod annotation the router's discovery reads the bootstrap port from
    kv_connector_values: tuple[str, ...]  # connectors it is told about with --kv-connector

    def image(self, settings: RenderSettings) -> str:
        return settings.vllm_router_image if self.name == "vllm-router" else settings.sglang_router_image


VLLM_ROUTER = RouterModule(
    name="vllm-router",
    command_head=("vllm-router", "--vllm-pd-disaggregation"),
    # vllm_router 0.1.17 wheel, vllm_router/router_args.py: bootstrap_port_annotation default.
    bootstrap_annotation="vllm.ai/bootstrap-port",
    # vllm_router_rs.abi3.so 0.1.17: "--kv-connector ... expected 'nixl', 'mooncake', or 'moriio'".
    kv_connector_values=("nixl", "mooncake"),
)
SGLANG_ROUTER = RouterModule(
    name="sglang-router",
    # sglang_router 0.3.2 wheel, sglang_router/launch_router.py and router_args.py (--pd-disaggregation).
    command_head=("python3", "-m", "sglang_router.launch_router", "--pd-disaggregation"),
    # sglang_router 0.3.2 wheel, sglang_router/router_args.py: bootstrap_port_annotation default.
    bootstrap_annotation="sglang.ai/bootstrap-port",
    kv_connector_values=(),
)
ROUTERS: Mapping[RouterName, RouterModule] = MappingProxyType(
    {"vllm-router": VLLM_ROUTER, "sglang-router": SGLANG_ROUTER}
)


def router_module(dd: DisaggregatedDeployment) -> RouterModule:
    """The router that serves the object's engine and connector (refused combinations raise)."""
    return ROUTERS[router_for(dd.spec.engine.type, dd.spec.kv_transfer.connector)]

"""What every KV connector module shares: the wiring it adds to a pool, and its protocol. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

from disagg.api.deployment import DisaggregatedDeployment, RoleName
from disagg.api.support import Connector, Engine, combination
from disagg.render.settings import RenderSettings

Obj = dict[str, Any]


@dataclass
class Wiring:
    """What one connector adds to one pool's engine container."""

    kv_connector: str | None = None  # vLLM: the kv_connector of --kv-transfer-config
    extra_config: Obj = field(default_factory=dict)  # vLLM: kv_connector_extra_config
    args: list[str] = field(default_factory=list)  # engine arguments
    env: list[Obj] = field(default_factory=list)
    ports: list[Obj] = field(default_factory=list)


class ConnectorModule(Protocol):
    """One KV connector: how it is wired into each engine it works with."""

    @property
    def connector(self) -> Connector: ...

    def wiring(
        self, engine: Engine, dd: DisaggregatedDeployment, role: RoleName, settings: RenderSettings
    ) -> Wiring: ...


def refuse(engine: Engine, connector: Connector) -> NoReturn:
    """Rendering a combination the API refuses (only reachable by skipping validation)."""
    raise ValueError(combination(engine, connector).refusal)


@dataclass(frozen=True)
class Refused:
    """A connector the API refuses with every engine: renders nothing, names the refusal if reached."""

    connector: Connector

    def wiring(
        self, engine: Engine, dd: DisaggregatedDeployment, role: RoleName, settings: RenderSettings
    ) -> Wiring:
        refuse(engine, self.connector)

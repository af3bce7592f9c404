"""KV connectors, one module each, registered by the API's enum value (spec.kvTransfer.connector). Pure.

Adding a connector: a module with a ``CONNECTOR`` satisfying :class:`ConnectorModule`, its row(s) in
disagg.api.support.SUPPORT_MATRIX, and an entry here.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from disagg.api.support import Connector
from disagg.render.connectors import lmcache, mooncake, nixl, p2p_nccl
from disagg.render.connectors.base import ConnectorModule, Wiring

CONNECTORS: Mapping[Connector, ConnectorModule] = MappingProxyType(
    {
        "nixl": nixl.CONNECTOR,
        "mooncake": mooncake.CONNECTOR,
        "lmcache": lmcache.CONNECTOR,
        "p2p-nccl": p2p_nccl.CONNECTOR,
    }
)


def connector_module(connector: Connector) -> ConnectorModule:
    return CONNECTORS[connector]


__all__ = ["CONNECTORS", "ConnectorModule", "Wiring", "connector_module"]

"""P2P NCCL: refused with every engine. Pure.

vLLM 0.33.0 no longer registers a P2pNcclConnector (vllm/distributed/kv_transfer/kv_connector/
factory.py), and vllm-router learns the engines' NCCL addresses only from ZMQ registrations on
--vllm-discovery-address (one router replica each, behind a Service); SGLang has no such backend. The
API refuses both combinations (disagg.api.support), so this module renders nothing.
"""

from __future__ import annotations

from disagg.render.connectors.base import Refused

CONNECTOR = Refused("p2p-nccl")

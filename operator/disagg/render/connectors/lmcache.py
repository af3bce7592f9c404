"""LMCache: refused with every engine. Pure.

vLLM 0.33.0 ships LMCacheConnectorV1, but LMCache's prefill side sends KV only for requests the proxy
tagged with ``disagg_spec`` (lmcache 0.5.6 lmcache/integration/vllm/vllm_v1_adapter.py), and no
released router injects it (disagg.api.support); SGLang has no lmcache transfer backend. The API
refuses both combinations, so this module renders nothing.
"""

from __future__ import annotations

from disagg.render.connectors.base import Refused

CONNECTOR = Refused("lmcache")

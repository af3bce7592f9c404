"""Facts about the released engines, read from their wheels' source with ``ast`` (never installed).

A wheel is a zip archive; the argument definitions, environment variables, KV connector registry and
HTTP routes of vLLM and SGLang are plain Python source inside it, so reading them needs neither torch
nor a GPU. Every extractor mirrors how the wheel itself turns declarations into ``argparse`` options
(the functions it mirrors are named in each docstring) and raises :class:`ExtractionError` when the
source no longer has that shape, so an upstream refactor fails conformance instead of emptying it.

vLLM's extractor is :mod:`disagg.conformance.engines.vllm`, SGLang's :mod:`disagg.conformance.engines.sglang`
(each names the source files and functions it mirrors); both read the wheel through
:mod:`disagg.conformance.engines.wheel` (the zip archive, type annotations, ``argparse`` calls, HTTP routes,
environment reads). :func:`engine_facts` downloads, extracts and caches.
"""

from __future__ import annotations

from disagg.conformance.engines.sglang import extract_sglang
from disagg.conformance.engines.vllm import extract_vllm
from disagg.conformance.engines.wheel import WheelSource
from disagg.conformance.facts import EngineFacts, cached

__all__ = ["WheelSource", "engine_facts", "extract_sglang", "extract_vllm"]


def engine_facts(package: str, version: str) -> EngineFacts:
    """The facts of ``package==version`` (``vllm`` or ``sglang``), the wheel downloaded when missing,
    extracted once and cached under ``<cache>/conformance/``."""
    extractors = {"vllm": extract_vllm, "sglang": extract_sglang}
    if package not in extractors:
        raise ValueError(f"no engine extractor for {package!r}")
    from disagg.cluster.released import ensure_wheel  # imports disagg.render.settings: not at import time

    wheel = ensure_wheel(package, version)
    data = cached(package, version, wheel, lambda: extractors[package](wheel).to_json())
    return EngineFacts.from_json(data)

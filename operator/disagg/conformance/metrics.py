"""The Prometheus metric names the released engines declare, read from their wheels' source with ``ast``.

The operator queries engine metrics by name (:data:`disagg.metrics.queries.ENGINE_METRICS`) and the
live twin exports them under the same names (:mod:`disagg.twin.live.exposition`); a metric renamed
upstream would leave a signal MISSING for good, silently. This module reads which names the released
wheels declare, so ``tests/conformance`` fails instead.

A metric is declared by a call whose ``name=`` keyword, or else first argument, is a string literal with
the engine's prefix, in the engine's metrics modules:

- vLLM 0.33.0: ``vllm/v1/metrics/*.py`` (``PrometheusStatLogger`` in ``loggers.py`` declares
  ``self._counter_cls(name="vllm:prefix_cache_queries", ...)``, ``self._gauge_cls(...)``,
  ``self._histogram_cls(...)``).
- SGLang 0.5.23: ``sglang/srt/observability/*.py`` (``SchedulerMetricsCollector`` and
  ``TokenizerMetricsCollector`` in ``metrics_collector.py`` declare ``Gauge(name="sglang:cache_hit_rate",
  ...)`` and the rest).

Names compare without a trailing ``_total``: prometheus_client exposes a counter declared as ``x`` or
``x_total`` as the series ``x_total`` (``vllm:prefix_cache_hits`` -> ``vllm:prefix_cache_hits_total``),
and the queries name the series. Only the preferred spelling of each queried signal is checked: the
alternatives after it are older engine versions' names, absent from the pinned release by design.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from disagg.conformance.engines import WheelSource
from disagg.conformance.facts import ExtractionError

METRIC_MODULES: dict[str, str] = {
    "vllm": "vllm/v1/metrics/",
    "sglang": "sglang/srt/observability/",
}


def base_name(name: str) -> str:
    """A metric's name as compared here: without the ``_total`` prometheus_client adds to counters."""
    return name[: -len("_total")] if name.endswith("_total") else name


@dataclass(frozen=True)
class DeclaredMetrics:
    """The metric names one released engine declares: base name -> ``path/in/wheel.py:LINE``."""

    engine: str
    wheel: str
    names: Mapping[str, str]

    def declares(self, name: str) -> bool:
        return base_name(name) in self.names

    def source(self, name: str) -> str | None:
        return self.names.get(base_name(name))


def _declared_name(call: ast.Call, prefix: str) -> str | None:
    candidates = [kw.value for kw in call.keywords if kw.arg == "name"] or call.args[:1]
    for node in candidates:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(prefix):
            return node.value
    return None


def declared_metrics(engine: str, wheel: Path) -> DeclaredMetrics:
    """The metrics ``engine`` ("vllm" or "sglang") declares in ``wheel``; ExtractionError when its
    metrics modules are gone or declare nothing (a refactor this reader must follow)."""
    if engine not in METRIC_MODULES:
        raise ValueError(f"engine must be one of {sorted(METRIC_MODULES)}, got {engine!r}")
    prefix = f"{engine}:"
    names: dict[str, str] = {}
    with WheelSource(wheel) as src:
        paths = src.files(METRIC_MODULES[engine])
        if not paths:
            raise ExtractionError(f"{wheel.name} has no {METRIC_MODULES[engine]}*.py")
        for path in paths:
            for node in ast.walk(src.tree(path)):
                if isinstance(node, ast.Call):
                    name = _declared_name(node, prefix)
                    if name is not None:
                        names.setdefault(base_name(name), f"{path}:{node.lineno}")
    if not names:
        raise ExtractionError(f"{wheel.name}: no {prefix}* metric declared under {METRIC_MODULES[engine]}")
    return DeclaredMetrics(engine, wheel.name, names)


def released_metrics(engine: str, version: str) -> DeclaredMetrics:
    """The metrics of the released ``engine==version``, its wheel downloaded when missing."""
    from disagg.cluster.released import ensure_wheel  # imports disagg.render.settings: not at import time

    return declared_metrics(engine, ensure_wheel(engine, version))


def queried_metrics(engine: str) -> dict[str, str]:
    """Signal -> the preferred metric name the operator's queries read for it on ``engine``."""
    from disagg.metrics.queries import ENGINE_METRICS, Engine

    m = ENGINE_METRICS[Engine(engine)]
    return {f.name: names[0] for f in fields(m) if (names := getattr(m, f.name))}


def exported_metrics(engine: str) -> list[str]:
    """The metric families the live twin's emulated ``engine`` exports (prometheus_client names)."""
    from disagg.twin.live.exposition import ENGINE_KINDS, make_metrics

    for kind in ENGINE_KINDS:
        if kind == engine:
            return sorted(family.name for family in make_metrics(kind, "m", 4096).registry.collect())
    raise ValueError(f"engine must be one of {ENGINE_KINDS}, got {engine!r}")


def undeclared(declared: DeclaredMetrics, names: Mapping[str, str]) -> list[str]:
    """One finding per ``what -> name`` the release does not declare."""
    return [
        f"{declared.engine} ({declared.wheel}) declares no metric {name!r} (used for {what})"
        for what, name in names.items()
        if not declared.declares(name)
    ]

"""Prometheus signals: PromQL per deployment and role, read into an Observation.

:mod:`disagg.metrics.queries` (pure PromQL), :mod:`disagg.metrics.relabel` (the scrape configuration
the queries rely on) and :mod:`disagg.metrics.prometheus` (the I/O, on prometheus-api-client).
"""

from disagg.metrics.queries import TARGET_LABELS, Engine, TargetLabels, build_queries
from disagg.metrics.relabel import engine_scrape_config, scrape_relabel_configs

__all__ = [
    "TARGET_LABELS",
    "Engine",
    "TargetLabels",
    "build_queries",
    "engine_scrape_config",
    "scrape_relabel_configs",
]

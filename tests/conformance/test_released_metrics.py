"""The metric names the operator queries and the live twin exports, against the RELEASED engines' wheels
at the pinned versions (disagg.conformance.metrics): a metric renamed upstream fails here instead of
leaving a policy signal MISSING in production."""

from __future__ import annotations

import textwrap
import zipfile
from collections.abc import Mapping
from pathlib import Path

import pytest

from disagg.cluster.released import Release
from disagg.conformance.facts import ExtractionError
from disagg.conformance.metrics import (
    DeclaredMetrics,
    declared_metrics,
    exported_metrics,
    queried_metrics,
    released_metrics,
    undeclared,
)

pytestmark = pytest.mark.conformance

ENGINES = ("vllm", "sglang")


@pytest.fixture(scope="module")
def declared(releases: Mapping[str, Release]) -> dict[str, DeclaredMetrics]:
    return {engine: released_metrics(engine, releases[engine].version) for engine in ENGINES}


@pytest.mark.parametrize("engine", ENGINES)
def test_every_queried_metric_is_declared_by_the_release(
    declared: dict[str, DeclaredMetrics], engine: str
) -> None:
    assert undeclared(declared[engine], queried_metrics(engine)) == []


@pytest.mark.parametrize("engine", ENGINES)
def test_every_metric_the_twin_exports_is_declared_by_the_release(
    declared: dict[str, DeclaredMetrics], engine: str
) -> None:
    exported = {name: name for name in exported_metrics(engine)}
    assert undeclared(declared[engine], exported) == []


def test_the_prefix_cache_metrics_are_where_the_sources_say(declared: dict[str, DeclaredMetrics]) -> None:
    vllm, sglang = declared["vllm"], declared["sglang"]
    for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
        source = vllm.source(name)
        assert source is not None and source.startswith("vllm/v1/metrics/loggers.py:"), (name, source)
    source = sglang.source("sglang:cache_hit_rate")
    assert source is not None and source.startswith("sglang/srt/observability/metrics_collector.py:")
    assert queried_metrics("vllm")["prefix_cache_hits"] == "vllm:prefix_cache_hits_total"
    assert queried_metrics("sglang")["prefix_cache_hit_rate"] == "sglang:cache_hit_rate"


def _wheel(tmp_path: Path, files: Mapping[str, str]) -> Path:
    path = tmp_path / "vllm-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, textwrap.dedent(text))
    return path


def test_the_reader_bites(tmp_path: Path) -> None:
    wheel = _wheel(
        tmp_path,
        {
            "vllm/v1/metrics/loggers.py": """
                class PrometheusStatLogger:
                    def __init__(self):
                        self.q = self._counter_cls(name="vllm:prefix_cache_queries", documentation="")
                        self.g = Gauge("vllm:num_requests_running", "doc")
                        self.x = Counter(name="other:thing")
            """,
        },
    )
    found = declared_metrics("vllm", wheel)
    assert found.declares("vllm:prefix_cache_queries_total")  # the counter's series, _total added
    assert found.declares("vllm:num_requests_running")
    assert not found.declares("other:thing") and not found.declares("vllm:prefix_cache_hits_total")
    assert undeclared(found, {"prefix_cache_hits": "vllm:prefix_cache_hits_total"}) == [
        f"vllm ({wheel.name}) declares no metric 'vllm:prefix_cache_hits_total' (used for prefix_cache_hits)"
    ]
    with pytest.raises(ExtractionError, match="no vllm/v1/metrics/"):
        declared_metrics("vllm", _wheel(tmp_path, {"vllm/other.py": "x = 1\n"}))

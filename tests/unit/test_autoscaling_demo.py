"""The closed-loop scenario's pure parts: manifests, Prometheus config, live table, summary and report."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest

from disagg.api.deployment import DisaggregatedDeployment
from disagg.api.ratiopolicy import RatioPolicy
from disagg.demo import (
    DemoSettings,
    Phase,
    PhaseReport,
    PodStartup,
    Sample,
    cache_volume_manifests,
    deployment_manifest,
    format_row,
    operator_startup,
    phase_requests,
    prometheus_config,
    ratio_policy_manifest,
    scale_up_startups,
    startup_estimates,
    startup_report,
    summarise,
    write_report,
)
from disagg.twin import html_report
from disagg.twin.live.load import ClientResult, LoadReport

SETTINGS = DemoSettings(
    phases=(Phase("chat", 30.0, 5.0, 300, 64), Phase("documents", 60.0, 5.0, 12000, 64)),
)


def test_scenario_manifests_are_valid_api_objects() -> None:
    dd = DisaggregatedDeployment.model_validate(deployment_manifest(SETTINGS))
    assert dd.spec.autoscaling is not None and dd.spec.autoscaling.enabled
    assert dd.spec.autoscaling.policy_ref is not None
    assert dd.spec.autoscaling.policy_ref.name == SETTINGS.policy
    policy = RatioPolicy.model_validate(ratio_policy_manifest(SETTINGS))
    assert policy.spec.evaluation_interval_seconds == SETTINGS.evaluation_interval_s
    assert policy.spec.slo.ttft.target_seconds == SETTINGS.ttft_slo_s
    assert (
        policy.spec.scale_down.stabilization_window_seconds
        > policy.spec.scale_up.stabilization_window_seconds
    )


def test_phases_are_found_by_elapsed_time() -> None:
    assert SETTINGS.total_s == 90.0
    assert SETTINGS.phase_at(0).name == "chat"
    assert SETTINGS.phase_at(29.9).name == "chat"
    assert SETTINGS.phase_at(30).name == "documents"
    assert SETTINGS.phase_at(500).name == "documents"


def test_prometheus_scrapes_the_engine_pods_as_discovered_and_the_operator() -> None:
    pods = {
        "job_name": "engines",
        "kubernetes_sd_configs": [{"role": "pod"}],
        "relabel_configs": [
            {"source_labels": ["a"], "target_label": "__address__"},
            {"source_labels": ["b"], "target_label": "__metrics_path__"},
        ],
    }
    config = prometheus_config(pods, "127.0.0.1:9300", 2.0)
    engines, operator = config["scrape_configs"]
    # pods are scraped at their own IPs (kwok's 127.0.0.0/8 CIDR): no twin-specific address rule
    assert engines == pods and engines is not pods
    assert operator["static_configs"] == [{"targets": ["127.0.0.1:9300"]}]
    assert config["global"]["scrape_interval"] == "2s"


def _sample(t: float, prefill: int, decode: int, ttft: float | None, itl: float | None = 0.02) -> Sample:
    return Sample(
        elapsed_s=t,
        phase=SETTINGS.phase_at(t).name,
        prefill=prefill,
        decode=decode,
        prefill_ready=prefill,
        decode_ready=decode,
        ttft_s=ttft,
        itl_s=itl,
        cause="TTFTBreachPrefillQueue" if prefill > 1 else "",
        decisions=prefill,
    )


RUN = [
    _sample(0, 1, 2, None, None),
    _sample(10, 1, 2, 0.2),
    _sample(35, 1, 2, 3.5),
    _sample(45, 3, 2, 2.0),
    _sample(60, 3, 2, 0.6),
    _sample(80, 3, 2, 0.5),
]


def test_live_row_shows_the_latest_evaluation_and_cuts_its_message() -> None:
    sample = Sample(50, "chat", 1, 2, 1, 2, 0.04, 0.01, "NoChange", 1, "no change: " + "x" * 200)
    row = format_row(sample, SETTINGS)
    assert "NoChange: no change: x" in row and row.endswith("...")
    assert len(row) < 200


def test_a_phase_sends_only_what_arrives_within_it() -> None:
    phase = Phase("chat", 10.0, 5.0, 300, 64)
    requests = phase_requests(phase, seed=0)
    assert requests and all(r.arrival_s < phase.duration_s for r in requests)
    assert 20 < len(requests) < 100  # Poisson at 5/s over 10 s


def test_phase_report_tells_failed_from_cut_off() -> None:
    results = [ClientResult(True, 0.03, (0.01,), 2)] * 7 + [
        ClientResult(False, error="HTTP 503: no ready prefill endpoint")
    ] * 2
    report = PhaseReport("chat", sent=10, load=LoadReport(results=list(results), wall_s=10.5))
    assert (report.ok, report.failed, report.cut_off) == (7, 2, 1)
    assert report.errors() == {"HTTP 503: no ready prefill endpoint": 2}
    text = report.summary()
    assert text.startswith("chat: sent 10, ok 7, failed 2, cut off 1")
    assert "TTFT p50 30.0 ms" in text and "2 x HTTP 503: no ready prefill endpoint" in text


def test_live_row_marks_latencies_over_the_slo() -> None:
    row = format_row(RUN[2], SETTINGS)
    assert "documents" in row and "1:2" in row
    assert "3500! / 1000ms" in row
    assert "20  / 50ms" in row
    assert "- / 1000ms" in format_row(RUN[0], SETTINGS)


def test_summary_sees_the_move_toward_prefill_and_the_recovery() -> None:
    outcome = summarise(RUN, SETTINGS)
    assert (outcome.start_prefill, outcome.start_decode) == (1, 2)
    assert outcome.peak_prefill == 3 and outcome.moved_toward_prefill
    assert outcome.breached_after_shift and outcome.recovered
    assert outcome.attainment == pytest.approx(3 / 5)


def test_summary_without_recovery() -> None:
    stuck = [*RUN[:3], _sample(60, 1, 2, 4.0)]
    outcome = summarise(stuck, SETTINGS)
    assert outcome.breached_after_shift and not outcome.recovered
    assert not outcome.moved_toward_prefill
    with pytest.raises(ValueError, match="samples"):
        summarise([], SETTINGS)


def test_report_has_page_plot_and_data(tmp_path: Path) -> None:
    decisions = [{"time": "t", "prefill": 3, "decode": 2, "cause": "TTFTBreachPrefillQueue", "message": "m"}]
    events = [{"time": "t", "type": "Normal", "reason": "TTFTBreachPrefillQueue", "message": "<x>"}]
    page, data = write_report(RUN, decisions, events, SETTINGS, tmp_path / "r")
    text = page.read_text()
    assert "TTFTBreachPrefillQueue" in text and "&lt;x&gt;" in text
    # one interactive figure, plotly.js inline once (the page works offline): TTFT, ITL, replicas per role
    timeline = html_report.figures(text)["timeline"]
    traces = {t["name"]: t for t in timeline["data"]}
    assert {"prefill desired", "decode desired", "prefill ready", "decode ready"} <= set(traces)
    assert len(traces["prefill desired"]["x"]) == len(RUN)
    slo = [t for t in timeline["data"] if t["meta"]["kind"] == "slo"]
    assert sorted(t["meta"]["value"] for t in slo) == sorted([SETTINGS.ttft_slo_s, SETTINGS.itl_slo_s])
    changes = sum((a.prefill, a.decode) != (b.prefill, b.decode) for a, b in itertools.pairwise(RUN))
    (marks,) = [t for t in timeline["data"] if t["meta"]["kind"] == "decisions"]
    assert len(marks["x"]) == changes > 0
    assert sum("plotly.js v" in s[:200] for s in html_report.scripts(text)) == 1
    assert not list(page.parent.glob("*.png"))
    assert '"recovered": true' in data.read_text()


# -------------------------------------------------------------------------------- scale-up start-up


def test_the_demo_deployment_reads_its_weights_from_a_prefilled_cache_and_waits_for_the_twin() -> None:
    from disagg.cluster.kwok_stages import READY_WHEN_SERVED

    dd = DisaggregatedDeployment.model_validate(deployment_manifest(SETTINGS))
    cache = dd.spec.model.cache
    assert cache is not None and cache.claim_name == SETTINGS.model_cache_claim and cache.prefilled
    for role in (dd.spec.prefill, dd.spec.decode):
        assert role.pod_template == {"metadata": {"annotations": {READY_WHEN_SERVED: "true"}}}
    volume, claim = cache_volume_manifests(SETTINGS)
    assert claim["metadata"] == {"name": "weights", "namespace": SETTINGS.namespace}
    assert claim["spec"]["volumeName"] == volume["metadata"]["name"]
    assert volume["spec"]["claimRef"] == {"namespace": SETTINGS.namespace, "name": "weights"}
    uncached = replace(SETTINGS, model_cache_claim=None)
    assert cache_volume_manifests(uncached) == []
    assert "cache" not in deployment_manifest(uncached)["spec"]["model"]


def test_the_startup_estimates_are_the_twins_for_the_spec_cached_and_downloading() -> None:
    from disagg.perf.startup import spec_startup_delay_s

    estimates = startup_estimates(SETTINGS)
    assert estimates is not None and estimates.cached
    spec = deployment_manifest(SETTINGS)["spec"]
    assert estimates.cached_s == pytest.approx(spec_startup_delay_s(spec, "bf16"))  # ~71 s for 8B
    assert estimates.cached_s < estimates.downloading_s  # ~97 s
    assert estimates.weight_gb == pytest.approx(16.06, abs=0.1)
    # the demo's pods load for ~5 s: the old demo's fixed delay, now the cached estimate compressed
    assert estimates.expected_s == pytest.approx(estimates.cached_s * SETTINGS.startup_scale)
    assert 4.0 < estimates.expected_s < 6.0
    uncached = startup_estimates(replace(SETTINGS, model_cache_claim=None))
    assert uncached is not None and uncached.expected_s == pytest.approx(
        estimates.downloading_s * SETTINGS.startup_scale
    )
    assert startup_estimates(replace(SETTINGS, model="Qwen/Qwen3-0.6B")) is None


def test_the_scale_up_report_times_the_added_pods_and_says_why() -> None:
    from disagg.controller.pods import PodInfo

    since = 1_800_000_000.0
    pods = [
        PodInfo("chat-prefill-a", "prefill", True, True, created=since - 60, ready_since=since - 55),
        PodInfo("chat-prefill-b", "prefill", True, True, created=since + 52, ready_since=since + 57),
        PodInfo("chat-decode-c", "decode", True, True, created=since + 40, ready_since=since + 46),
        PodInfo("chat-prefill-d", "prefill", False, True, created=since + 80),  # still loading
    ]
    startups = scale_up_startups(pods, since)
    assert startups == [
        PodStartup("chat-decode-c", "decode", 40.0, 6.0),
        PodStartup("chat-prefill-b", "prefill", 52.0, 5.0),
    ]
    estimates = startup_estimates(SETTINGS)
    lines = startup_report(startups, estimates, "weights")
    assert lines[0] == "decode pod chat-decode-c, added at 40s: Ready 6 s after its creation"
    assert lines[2].startswith("why: spec.model.cache (claim weights): a new replica reads the model's 16 GB")
    assert "estimated 71 s (4.9 s at this demo's x0.07)" in lines[2]
    assert "downloads it first: 97 s (6.8 s here), 27 s more per scale-up" in lines[2]
    assert "engine start 60 s" in lines[3]
    uncached = startup_estimates(replace(SETTINGS, model_cache_claim=None))
    assert startup_report([], uncached, None)[0] == "no pod was added during the traffic (no scale-up)"
    assert startup_report([], uncached, None)[1].startswith("why: no spec.model.cache")
    assert startup_report([], None, None)[-1].startswith("no start-up estimate")


def test_the_operators_planned_startup_is_read_from_its_condition() -> None:
    message = "RatioPolicy demo-slo (slo-feedback) decides replicas; replica start-up: prefill 5 s (x)"
    obj = {"status": {"conditions": [{"type": "ScalingActive", "status": "True", "message": message}]}}
    assert operator_startup(obj) == "prefill 5 s (x)"
    assert operator_startup({}) is None


def test_the_report_shows_the_startup(tmp_path: Path) -> None:
    page, data = write_report(RUN, [], [], SETTINGS, tmp_path / "r", ["prefill pod p: Ready 5 s <x>"])
    assert "Ready 5 s &lt;x&gt;" in page.read_text()
    assert "prefill pod p: Ready 5 s" in data.read_text()

"""The chaos suite's pure parts (disagg.chaos): the traceback count of an operator log, the API server's
write counter read from its /metrics, the streams in flight across a scale-down, a case's printed line, and
the table bench/chaos_report.py prints."""

from __future__ import annotations

import importlib.util
import itertools
import json
import random
from pathlib import Path

import pytest

from disagg.api.status import AutoscalingStatus
from disagg.chaos import CaseResult
from disagg.chaos.cases import (
    AutoscalingKillSettings,
    AutoscalingSnapshot,
    Decision,
    Moment,
    autoscaling_problems,
    autoscaling_snapshot,
    changed_status_fields,
    changed_summary,
    history_problems,
    kill_moments,
    operator_writes,
    streams_across,
    writes_between,
)
from disagg.chaos.harness import tracebacks
from disagg.demo.traffic import PhaseReport
from disagg.twin.live.load import ClientResult, LoadReport

ROOT = Path(__file__).resolve().parents[2]

LOG = """\
[2026-12-02 14:00:00,000] kopf.objects [INFO    ] reconciled
[2026-12-02 14:00:01,000] kopf.objects [ERROR   ] Timer 'resync' failed with an exception. Will retry.
Traceback (most recent call last):
  File "/x/kopf/_core/actions/execution.py", line 276, in execute_handler_once
    result = await invoke_handler(
urllib3.exceptions.MaxRetryError: HTTPSConnectionPool(host='127.0.0.1', port=6443): Max retries exceeded
[2026-12-02 14:00:02,000] disagg [WARNING ] API server unreachable: ConnectionRefusedError, retried
Traceback (most recent call last):
  File "a.py", line 1, in f
ConnectionRefusedError: [Errno 111] Connection refused

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "b.py", line 2, in g
kubernetes.client.exceptions.ApiException: (503)
"""


def test_every_traceback_is_counted_by_its_exception() -> None:
    assert tracebacks(LOG) == [
        "urllib3.exceptions.MaxRetryError: HTTPSConnectionPool(host='127.0.0.1', port=6443): Max retries "
        "exceeded",
        "ConnectionRefusedError: [Errno 111] Connection refused",
        "kubernetes.client.exceptions.ApiException: (503)",
    ]
    assert tracebacks("[INFO] all well\n") == []


METRICS = """\
# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="disagg.dev",resource="disaggregateddeployments",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 7
apiserver_request_total{code="200",component="apiserver",dry_run="",group="apps",resource="deployments",scope="resource",subresource="",verb="APPLY",version="v1"} 5
apiserver_request_total{code="200",component="apiserver",dry_run="",group="apps",resource="deployments",scope="resource",subresource="status",verb="PUT",version="v1"} 40
apiserver_request_total{code="200",component="apiserver",dry_run="",group="apps",resource="deployments",scope="resource",subresource="",verb="GET",version="v1"} 900
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="events",scope="resource",subresource="",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 100
"""  # noqa: E501


def test_writes_count_the_operators_objects_its_childrens_specs_and_events_only() -> None:
    # a controller's status writes of the children, reads and the nodes' leases are not the operator's
    assert operator_writes(METRICS) == {
        "disaggregateddeployments/status": 7.0,
        "deployments": 5.0,
        "events": 3.0,
    }


def test_a_case_prints_its_figures_and_the_table_has_its_row() -> None:
    ok = CaseResult("apiserver-outage", "killed it", {"recover_s": 4.25, "tracebacks": 0}, "0 tracebacks")
    bad = CaseResult("operator-killed", "killed it 3x", {"duplicates": 2}, "0 duplicates", ("2 duplicates",))
    assert ok.line() == "chaos apiserver-outage: recover_s=4.2 tracebacks=0 (target 0 tracebacks) pass"
    assert bad.line().endswith("FAIL: 2 duplicates") and not bad.passed
    assert json.loads(ok.json_line())["figures"] == {"recover_s": 4.25, "tracebacks": 0}
    spec = importlib.util.spec_from_file_location("chaos_report", ROOT / "bench" / "chaos_report.py")
    assert spec is not None and spec.loader is not None
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    lines = report.table([ok, bad]).splitlines()
    assert lines[0].split(" | ")[0].strip() == "case"
    assert any(line.startswith("apiserver-outage") and "pass" in line for line in lines)
    assert any(line.startswith("operator-killed") and "FAIL" in line for line in lines)


def test_a_stream_counts_across_the_first_scale_down_it_was_in_flight_at() -> None:
    cuts = [Moment("decode", 15.0), Moment("prefill", 30.0)]
    results = [
        ClientResult(True, sent_at=10.0, done_at=14.0),  # ended before the first cut
        ClientResult(True, sent_at=12.0, done_at=40.0),  # across both: counted at the first
        ClientResult(False, error="HTTP 503", sent_at=29.0, done_at=33.0),  # across the second
        ClientResult(True, sent_at=31.0, done_at=35.0),  # after both
        ClientResult(True),  # no times (another load generator): not counted
    ]
    found = streams_across(PhaseReport("steady", 5, LoadReport(results)), cuts)
    assert [(m.what, duration, after) for m, duration, after in found] == [
        ("decode", 28.0, 25.0),
        ("prefill", 4.0, 3.0),
    ]


def _decision(second: int, prefill: int, decode: int, cause: str = "TTFTBreachPrefillQueue") -> Decision:
    return (f"2026-12-06T01:00:{second:02d}Z", prefill, decode, cause)


HISTORY = (_decision(20, 3, 1), _decision(10, 2, 1))


def test_a_history_that_grows_at_its_head_and_drops_its_oldest_is_kept() -> None:
    assert history_problems(HISTORY, HISTORY) == []
    assert history_problems(HISTORY, (_decision(30, 4, 1), *HISTORY)) == []
    # bounded: the oldest entry falls off as a new one comes in
    assert history_problems(HISTORY, (_decision(30, 4, 1), HISTORY[0])) == []
    assert history_problems((), (_decision(30, 4, 1),)) == []


def test_a_rewritten_lost_or_repeated_decision_is_a_problem() -> None:
    rewritten = history_problems(HISTORY, (_decision(20, 3, 2), HISTORY[1]))
    assert len(rewritten) == 1 and rewritten[0].startswith("history rewritten")
    lost = history_problems(HISTORY, (HISTORY[1],))
    assert len(lost) == 1 and lost[0].startswith("history rewritten")
    twice = history_problems(HISTORY, (_decision(30, 3, 1), *HISTORY))
    assert twice == ["the move to 3:1 recorded twice (2026-12-06T01:00:20Z, 2026-12-06T01:00:30Z)"]
    same_time = history_problems((), (_decision(30, 4, 1), _decision(30, 3, 1)))
    assert len(same_time) == 1 and same_time[0].startswith("two decisions at one time")


def test_kills_fall_inside_the_run_at_least_the_gap_apart() -> None:
    settings = AutoscalingKillSettings()
    for seed in range(50):
        moments = kill_moments(random.Random(seed), settings)
        assert len(moments) == settings.kills
        assert moments[0] >= settings.min_gap_s
        assert moments[-1] <= settings.run_s - settings.min_gap_s
        assert all(b - a >= settings.min_gap_s - 1e-9 for a, b in itertools.pairwise(moments))
    crowded = AutoscalingKillSettings(kills=30, run_s=60.0, min_gap_s=6.0)
    with pytest.raises(ValueError, match="do not fit"):
        kill_moments(random.Random(0), crowded)


def _snapshot(
    operator: int,
    history: tuple[Decision, ...],
    children: tuple[int | None, int | None],
    evaluation: str | None,
    memory: bool = True,
) -> AutoscalingSnapshot:
    desired = history[0][1:3] if history else None
    return AutoscalingSnapshot(
        at=0.0,
        operator=operator,
        history=history,
        desired=desired,
        last_evaluation=evaluation,
        memory=memory,
        cause=history[0][3] if history else None,
        children=children,
    )


def test_autoscaling_across_restarts_that_keeps_its_record_has_no_problem() -> None:
    snapshots = [
        _snapshot(0, (), (1, 1), "2026-12-06T01:00:00Z"),
        _snapshot(0, HISTORY[1:], (2, 1), "2026-12-06T01:00:10Z"),
        _snapshot(1, HISTORY[1:], (2, 1), "2026-12-06T01:00:10Z"),
        _snapshot(1, HISTORY, (3, 1), "2026-12-06T01:00:20Z"),
    ]
    assert autoscaling_problems(snapshots, interval_s=10.0, initial=(1, 1)) == []


def test_an_unrecorded_pool_size_an_early_evaluation_and_lost_memory_are_problems() -> None:
    snapshots = [
        _snapshot(0, HISTORY[1:], (2, 1), "2026-12-06T01:00:10Z"),
        _snapshot(1, HISTORY[1:], (2, 5), "2026-12-06T01:00:12Z", memory=False),
    ]
    problems = autoscaling_problems(snapshots, interval_s=10.0, initial=(1, 1))
    assert problems == [
        "operator run 1: policyMemory lost",
        "evaluated 2 s after the one before (2026-12-06T01:00:12Z): decided twice",
        "decode pool at 5, which no recorded decision asked for",
    ]


def test_writes_after_an_outage_are_counted_by_resource_and_set_against_what_status_changed() -> None:
    before = {"disaggregateddeployments/status": 10.0, "deployments": 4.0}
    after = {"disaggregateddeployments/status": 15.0, "deployments": 4.0, "services": 1.0}
    assert writes_between(before, after) == {"disaggregateddeployments/status": 5, "services": 1}
    old = {"small-0": {"replicas": {"ready": 1}, "router": "x"}, "small-1": {"replicas": {"ready": 2}}}
    new = {"small-0": {"replicas": {"ready": 2}, "router": "x"}, "small-1": {"replicas": {"ready": 1}}}
    changed = changed_status_fields(old, new)
    assert changed == ["small-0.replicas", "small-1.replicas"]
    assert changed_summary(changed) == "replicas in 2"
    assert changed_status_fields(old, old) == [] and changed_summary([]) == "-"


def test_a_poll_reads_status_autoscaling_as_the_operator_writes_it() -> None:
    status = {
        "policy": "chat-slo",
        "desiredReplicas": {"prefill": 3, "decode": 1},
        "lastEvaluationTime": "2026-12-06T01:00:20Z",
        "lastEvaluation": {"time": "2026-12-06T01:00:20Z", "prefill": 3, "decode": 1, "cause": "Steady"},
        "decisions": [
            {"time": "2026-12-06T01:00:20Z", "prefill": 3, "decode": 1, "cause": "TTFTBreachPrefillQueue"},
            {"time": "2026-12-06T01:00:10Z", "prefill": 2, "decode": 1, "cause": "TTFTBreachPrefillQueue"},
        ],
        "policyMemory": {"flaps": {}},
    }
    snap = autoscaling_snapshot(1.5, 2, AutoscalingStatus.model_validate(status), (3, None))
    assert snap.history == HISTORY
    assert (snap.desired, snap.last_evaluation, snap.memory, snap.cause) == (
        (3, 1),
        "2026-12-06T01:00:20Z",
        True,
        "Steady",
    )
    assert (snap.at, snap.operator, snap.children) == (1.5, 2, (3, None))
    empty = autoscaling_snapshot(0.0, 0, AutoscalingStatus.model_validate({}), (1, 1))
    assert (empty.history, empty.desired, empty.memory, empty.cause) == ((), None, False, None)

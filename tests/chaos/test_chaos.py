"""Chaos on the local control plane, the operator as its own process (disagg.chaos.cases): the operator
SIGKILLed mid-rollout, the API server down, etcd down, Prometheus down or answering errors, slowly or
garbage (through a fault-injecting proxy, disagg.chaos.promproxy), an idle operator's writes,
scale-downs under streaming traffic through the released router.

Each case prints its figures (``chaos <case>: ...``, shown with ``pytest -s`` and in a failing test's
report) and a JSON line; bench/chaos_report.py runs the same cases and prints them as a table. What is
asserted is correctness (convergence, no duplicates or orphans, changes applied after an outage,
fail-static, no request lost across a scale-down); speeds are printed against their targets, never asserted.
"""

from __future__ import annotations

import pytest

from disagg.chaos import CaseResult, ChaosCluster
from disagg.chaos.cases import (
    ApplyLatencySettings,
    HostileSettings,
    IdleWritesSettings,
    LoadSettings,
    OperatorKillSettings,
    apiserver_outage,
    apply_latency,
    etcd_outage,
    ha_failover,
    hostile_input,
    idle_writes,
    load,
    operator_killed,
    operator_killed_autoscaling,
    prometheus_garbage,
    prometheus_outage,
    scale_down_drain,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def report(result: CaseResult, record_property: pytest.RecordProperty) -> None:
    print(result.line())
    print(result.json_line())
    for name, value in result.figures.items():
        record_property(f"{result.case}.{name}", value)


def test_a_killed_operator_converges_every_deployment_without_duplicates_or_orphans(
    chaos_cluster: ChaosCluster, record_property: pytest.RecordProperty
) -> None:
    # the bench (bench/chaos_report.py --case operator-killed): 100 deployments
    result = operator_killed(chaos_cluster, OperatorKillSettings(deployments=30))
    report(result, record_property)
    assert result.figures["kills"] == 3
    assert result.figures["converged"] == result.figures["dds"] - result.figures["deleted"]
    assert result.passed, result.line()


def test_a_killed_operator_resumes_autoscaling_without_losing_or_repeating_decisions(
    chaos_cluster: ChaosCluster, record_property: pytest.RecordProperty
) -> None:
    result = operator_killed_autoscaling(chaos_cluster)
    report(result, record_property)
    assert result.figures["kills"] == 5, result.line()
    moves, after_restart = result.figures["moves"], result.figures["moves_after_restart"]
    # the policy must have acted, and acted again after a restart, or the case proves nothing
    assert isinstance(moves, int) and moves >= 3, result.line()
    assert isinstance(after_restart, int) and after_restart >= 1, result.line()
    assert result.passed, result.line()


def test_the_operator_applies_changes_after_the_api_server_comes_back(
    chaos_cluster: ChaosCluster, record_property: pytest.RecordProperty
) -> None:
    result = apiserver_outage(chaos_cluster)
    report(result, record_property)
    assert result.passed, result.line()


def test_the_operator_applies_changes_after_etcd_comes_back(
    chaos_cluster: ChaosCluster, record_property: pytest.RecordProperty
) -> None:
    result = etcd_outage(chaos_cluster)
    report(result, record_property)
    assert result.figures["tracebacks"] == 0, result.line()
    assert result.passed, result.line()


def test_a_standby_operator_takes_over_and_steps_back_without_double_writes(
    chaos_cluster: ChaosCluster, record_property: pytest.RecordProperty
) -> None:
    result = ha_failover(chaos_cluster)
    report(result, record_property)
    assert isinstance(result.figures["spec_changes"], int) and result.figures["spec_changes"] > 0
    assert result.figures["standby_writes_while_leading"] == 0, result.line()
    # the counters it is judged by do count its writes once it acts
    assert isinstance(result.figures["standby_writes_while_leader_down"], int)
    assert result.figures["standby_writes_while_leader_down"] > 0, result.line()
    assert result.figures["standby_writes_after_return"] == 0, result.line()
    assert result.passed, result.line()


def test_without_prometheus_metrics_are_unavailable_and_nothing_scales_down(
    chaos_cluster: ChaosCluster, record_property: pytest.RecordProperty
) -> None:
    result = prometheus_outage(chaos_cluster)
    report(result, record_property)
    assert result.figures["scale_downs_while_missing"] == 0
    assert result.passed, result.line()


def test_prometheus_errors_timeouts_and_garbage_leave_metrics_unavailable_and_nothing_scaled_down(
    chaos_cluster: ChaosCluster, record_property: pytest.RecordProperty
) -> None:
    result = prometheus_garbage(chaos_cluster)
    report(result, record_property)
    assert result.figures["scale_downs_under_faults"] == 0, result.line()
    assert result.figures["tracebacks"] == 0, result.line()
    for fault in ("http-500", "slow", "nan", "inf", "empty", "stale", "negative"):
        assert str(result.figures[f"{fault}_says"]).startswith("False"), result.line()
    assert result.figures["huge_says"] == "True", result.line()
    assert result.passed, result.line()


def test_an_idle_operator_writes_are_counted(
    chaos_cluster: ChaosCluster, record_property: pytest.RecordProperty
) -> None:
    # at least one resync of every deployment (the operators here resync every 20 s); the bench: 60 s
    result = idle_writes(chaos_cluster, IdleWritesSettings(window_s=30.0))
    report(result, record_property)
    assert result.figures["dds"] == IdleWritesSettings().deployments
    assert result.passed, result.line()


def test_each_apply_is_timed_until_all_children_are_announced(
    chaos_cluster: ChaosCluster, record_property: pytest.RecordProperty
) -> None:
    # the bench (bench/chaos_report.py --case apply-latency): 5 operators x 30 applies, judged on p99;
    # the p99 is a printed figure here, never asserted (speed is the bench's business)
    result = apply_latency(chaos_cluster, ApplyLatencySettings(runs=2, applies=10))
    report(result, record_property)
    assert result.passed, result.line()
    low, high = (float(v) for v in str(result.figures["p50_ms"]).split("-"))
    assert 0 < low <= high <= float(result.figures["max_ms"]), result.line()


def test_hostile_deployments_are_refused_degraded_or_applied_and_all_deleted(
    chaos_cluster: ChaosCluster, record_property: pytest.RecordProperty
) -> None:
    # the bench (bench/chaos_report.py --case hostile-input): 60 objects, 30 s quiet window
    settings = HostileSettings(deployments=24, quiet_window_s=15.0)
    result = hostile_input(chaos_cluster, settings)
    report(result, record_property)
    assert result.passed, result.line()
    figures = result.figures
    assert figures["refused"] + figures["accepted"] == settings.deployments, result.line()
    assert figures["unreported"] == 0 and figures["undeletable"] == 0, result.line()


def test_many_deployments_in_many_namespaces_converge_and_idle_quietly(
    chaos_cluster: ChaosCluster, record_property: pytest.RecordProperty
) -> None:
    # the bench (bench/chaos_report.py --case load): 500 deployments in 20 namespaces, 60 s idle
    settings = LoadSettings(
        deployments=40, namespaces=4, idle_window_s=20.0, resync_s=10.0, settle_timeout_s=60.0
    )
    result = load(chaos_cluster, settings)
    report(result, record_property)
    assert result.figures["converged"] == 40, result.line()
    assert result.figures["idle_writes_per_min"] == 0, result.line()
    assert result.passed, result.line()


def test_scale_downs_under_streaming_traffic_lose_no_request(
    chaos_cluster: ChaosCluster, record_property: pytest.RecordProperty
) -> None:
    result = scale_down_drain(chaos_cluster)
    report(result, record_property)
    sent = result.figures["sent"]
    assert isinstance(sent, int) and sent > 0
    assert result.figures["ok"] == sent, result.line()
    assert result.figures["failed"] == 0 and result.figures["cut_off"] == 0, result.line()
    assert result.figures["pods_at_end"] == "1/1", result.line()
    assert result.passed, result.line()

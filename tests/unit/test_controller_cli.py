"""`disagg run` argument handling (no operator is started: only the parser and the kopf settings)."""

from __future__ import annotations

import argparse
import logging

import pytest

from disagg.controller.cli import configure, operator_settings
from disagg.controller.operator import RunOptions, kopf_settings
from disagg.controller.settings import ControllerSettings


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="disagg run")
    configure(parser)
    return parser.parse_args(list(argv))


def test_namespaces_repeat_and_exclude_all_namespaces() -> None:
    args = parse("--namespace", "a", "-n", "b", "--standalone")
    assert args.namespaces == ["a", "b"] and not args.all_namespaces and args.peering is None
    assert parse("--all-namespaces", "--peering", "disagg").peering == "disagg"
    with pytest.raises(SystemExit):
        parse("--namespace", "a", "--all-namespaces")
    with pytest.raises(SystemExit):
        parse()  # a scope is required
    with pytest.raises(SystemExit):
        parse("-n", "a", "--standalone", "--peering", "x")


def test_peering_priority_is_an_integer_or_random() -> None:
    assert parse("-n", "a", "--peering-priority", "7").peering_priority == 7
    assert parse("-n", "a", "--peering-priority", "random").peering_priority >= 1
    with pytest.raises(SystemExit):
        parse("-n", "a", "--peering-priority", "high")


def test_kopf_keeps_its_state_in_annotations_so_status_stays_ours() -> None:
    settings = kopf_settings(RunOptions(peering_lifetime_s=30, settings=ControllerSettings(max_workers=3)))
    assert type(settings.persistence.progress_storage).__name__ == "AnnotationsProgressStorage"
    assert type(settings.persistence.diffbase_storage).__name__ == "AnnotationsDiffBaseStorage"
    assert settings.persistence.finalizer == "disagg.dev/finalizer"
    assert settings.posting.level == logging.WARNING
    assert settings.peering.lifetime == 30
    assert settings.execution.max_workers == 3
    assert settings.queueing.idle_timeout == ControllerSettings().watch_worker_idle_s


def test_children_are_watched_through_the_deployment_label() -> None:
    """The API server filters child watches by the label every rendered child carries (and nothing else)."""
    from kopf._cogs.structs.references import Resource

    from disagg.controller.handlers import CHILD_RESOURCES
    from disagg.render.names import DEPLOYMENT_LABEL

    settings = kopf_settings(RunOptions())
    for group, version, plural in CHILD_RESOURCES:
        resource = Resource(group, version, plural, preferred=True)
        assert list(settings.watching.label_selectors.collect(resource)) == [DEPLOYMENT_LABEL], plural
    own = Resource("disagg.dev", "v1alpha1", "disaggregateddeployments", preferred=True)
    assert list(settings.watching.label_selectors.collect(own)) == []


def test_settings_come_from_the_environment_and_the_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    monkeypatch.setenv("DISAGG_RESYNC_INTERVAL_S", "30")
    monkeypatch.setenv("DISAGG_AUTOSCALING_TICK_S", "0.5")
    monkeypatch.setenv("DISAGG_PROMETHEUS_URL", "http://from-env:9090")
    from_env = operator_settings(parse("-n", "a"))
    assert from_env.resync_interval_s == 30.0 and from_env.autoscaling.tick_s == 0.5
    assert from_env.autoscaling.prometheus_url == "http://from-env:9090"
    flagged = operator_settings(
        parse("-n", "a", "--resync-interval", "12", "--prometheus-url", "http://p:9090")
    )
    assert flagged.resync_interval_s == 12.0 and flagged.autoscaling.prometheus_url == "http://p:9090"
    assert flagged.autoscaling.tick_s == 0.5  # what no flag names still comes from the environment
    with pytest.raises(ValidationError, match="resync_interval_s"):
        operator_settings(parse("-n", "a", "--resync-interval", "0"))

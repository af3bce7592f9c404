"""`disagg run` argument handling (no operator is started: only the parser and the kopf settings)."""

from __future__ import annotations

import argparse
import logging

import pytest

from disagg.controller.cli import configure
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

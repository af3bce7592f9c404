"""Fixtures of the conformance tests: the facts of the released software at the pinned versions.

The wheels are downloaded from PyPI when missing (``disagg.cluster.released.ensure_wheel``) and the
routers installed into their own venvs (``ensure_venv``); the facts are cached under
``<cache>/conformance/``, so only the first run on a machine takes long.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from disagg.cluster.released import Release, pinned_releases
from disagg.conformance.check import ParseRouter, ReleasedFacts
from disagg.conformance.engines import engine_facts
from disagg.conformance.routers import RouterParse, parse_router_command, router_facts


@pytest.fixture(scope="session")
def releases() -> Mapping[str, Release]:
    return pinned_releases()


@pytest.fixture(scope="session")
def released_facts(releases: Mapping[str, Release]) -> ReleasedFacts:
    return ReleasedFacts(
        engines={name: engine_facts(name, releases[name].version) for name in ("vllm", "sglang")},
        routers={
            name: router_facts(name, releases[name].version) for name in ("vllm-router", "sglang-router")
        },
    )


@pytest.fixture(scope="session")
def parse_router(releases: Mapping[str, Release]) -> ParseRouter:
    """The released router's own parser on an argv, each distinct argv run once per session."""
    results: dict[tuple[str, tuple[str, ...]], RouterParse] = {}

    def parse(package: str, argv: list[str]) -> RouterParse:
        key = (package, tuple(argv))
        if key not in results:
            results[key] = parse_router_command(package, releases[package].version, argv)
        return results[key]

    return parse

"""The operator caps glibc's malloc arenas at start-up unless the environment already says how many."""

from __future__ import annotations

import platform
import sys

import pytest

from disagg.controller.operator import limit_malloc_arenas
from disagg.controller.settings import ControllerSettings


def test_the_default_is_two_arenas() -> None:
    assert ControllerSettings().malloc_arenas == 2


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_glibc_takes_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert limit_malloc_arenas(2) is True


def test_an_explicit_environment_or_zero_leaves_malloc_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    assert limit_malloc_arenas(0) is False
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas(2) is False

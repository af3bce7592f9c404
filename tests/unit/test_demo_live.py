"""The demo's live table in a terminal and elsewhere: a CI log gets plain appended lines, never redraws."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from rich.console import Console

from disagg.demo import live
from disagg.demo.samples import Sample
from disagg.demo.scenario import DemoSettings, Phase
from disagg.demo.traffic import PhaseReport
from disagg.twin.live.load import LoadReport

SETTINGS = DemoSettings(
    phases=(Phase("chat", 0.2, 5.0, 300, 64), Phase("documents", 0.2, 5.0, 12000, 64)),
    refresh_s=0.05,
)
LONG_MESSAGE = "prefill 1 -> 2: TTFT p90 3.5 s over the 1 s target, prefill queue " + "x" * 60


def _sample(elapsed_s: float, phase: str, prefill: int, ttft_s: float | None) -> Sample:
    return Sample(
        elapsed_s, phase, prefill, 2, prefill, 2, ttft_s, 0.02, "TTFTBreachPrefillQueue", 1, LONG_MESSAGE
    )


@dataclass
class _Router:
    url: str = "http://127.0.0.1:1"


@dataclass
class _Loop:
    """What drive() uses of a ClosedLoop: the settings, the router, and a sample of the moment."""

    settings: DemoSettings
    router: _Router = field(default_factory=_Router)
    traffic_started: float | None = None

    def sample(self, elapsed_s: float, phase: str) -> Sample:
        return _sample(elapsed_s, phase, 1 if phase == "chat" else 2, 3.5 if phase == "documents" else 0.2)


def _fake_traffic(
    router_url: str, settings: DemoSettings, on_phase: Callable[[str], None] | None = None
) -> list[PhaseReport]:
    reports = []
    for phase in settings.phases:
        if on_phase is not None:
            on_phase(phase.name)
        time.sleep(phase.duration_s)
        reports.append(PhaseReport(phase.name, 0, LoadReport(results=[], wall_s=phase.duration_s)))
    return reports


def test_off_a_terminal_the_table_is_plain_appended_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "run_traffic", _fake_traffic)
    out = io.StringIO()
    loop: Any = _Loop(SETTINGS)
    samples, reports = live.drive(loop, out)
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text  # no redraws, no colours or cursor moves
    lines = text.splitlines()
    assert lines[0] == live.TABLE_HEADER
    assert lines[1:] == [live.format_row(s, SETTINGS) for s in samples]  # one unwrapped line per sample
    assert max(len(line) for line in lines) > 80  # longer than a non-terminal console's width
    assert {s.phase for s in samples} == {"chat", "documents"}
    assert [r.phase for r in reports] == ["chat", "documents"]
    assert loop.traffic_started is not None


def test_the_progress_bar_shows_only_in_a_terminal() -> None:
    assert live.traffic_progress(live.demo_console(io.StringIO())).disable
    terminal = Console(file=io.StringIO(), force_terminal=True)
    assert not live.traffic_progress(terminal).disable


def test_rows_are_red_over_an_slo_and_bold_when_the_ratio_moved() -> None:
    calm, breach = _sample(5, "chat", 1, 0.2), _sample(40, "documents", 2, 3.5)
    assert str(live.styled_row(calm, None, SETTINGS).style) == ""
    assert str(live.styled_row(breach, calm, SETTINGS).style) == "red bold"
    assert str(live.styled_row(breach, breach, SETTINGS).style) == "red"
    out = io.StringIO()
    live.demo_console(out).print(live.styled_row(breach, calm, SETTINGS))
    assert out.getvalue() == live.format_row(breach, SETTINGS) + "\n"  # styles are dropped off a terminal


def test_text_with_brackets_is_printed_as_given() -> None:
    out = io.StringIO()
    live.demo_console(out).print("==> RatioPolicy [demo-slo] :smile: 1:2")
    assert out.getvalue() == "==> RatioPolicy [demo-slo] :smile: 1:2\n"

"""The live table: while the traffic runs, one row per sample (P:D, ready replicas, TTFT and ITL p90
against the SLO, the latest evaluation), every ``refresh_s``.

Printed through rich (:func:`demo_console`). In a terminal a row over an SLO is red, a row whose ratio
changed is bold, and a progress bar of the traffic stays under the rows. Anywhere else (a CI log, a
file, a pipe) each row is one plain line, appended and never redrawn: no progress bar, no carriage
returns, no escape codes, no wrapping.
"""

from __future__ import annotations

import threading
import time
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from disagg.cluster.wait import wait_for
from disagg.demo.harness import ClosedLoop
from disagg.demo.samples import Sample
from disagg.demo.scenario import DemoSettings
from disagg.demo.traffic import PhaseReport, run_traffic

TABLE_HEADER = (
    f"{'time':>6}  {'phase':<10} {'P:D':<5} {'ready':<6}  {'TTFT p90 / SLO':>17}  {'ITL p90 / SLO':>16}"
    "  latest evaluation"
)
MESSAGE_WIDTH = 70  # the live table's message column is cut here (the report has the whole text)
# how long the traffic may run past its phases' durations and drains before the demo gives up on it
TRAFFIC_MARGIN_S = 60.0


def demo_console(out: TextIO) -> Console:
    """A console on ``out`` that prints text as given: no markup, highlighting or wrapping (a terminal
    is told apart by ``out.isatty()``)."""
    return Console(file=out, soft_wrap=True, markup=False, highlight=False, emoji=False)


def ratio_cell(prefill: int, decode: int) -> str:
    return f"{prefill}:{decode}"


def _latency(value: float | None, slo: float, unit_scale: float, unit: str) -> str:
    if value is None:
        return f"{'-':>7} / {slo * unit_scale:.0f}{unit}"
    mark = "!" if value > slo else " "
    return f"{value * unit_scale:>6.0f}{mark} / {slo * unit_scale:.0f}{unit}"


def _short(text: str, width: int = MESSAGE_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def format_row(sample: Sample, settings: DemoSettings) -> str:
    """One line of the live table, e.g. ``  42s  documents   2:2   2/2 ...``."""
    return (
        f"{sample.elapsed_s:>5.0f}s  {sample.phase:<10} {ratio_cell(sample.prefill, sample.decode):<5}"
        f" {ratio_cell(sample.prefill_ready, sample.decode_ready):<6}"
        f"  {_latency(sample.ttft_s, settings.ttft_slo_s, 1000, 'ms'):>17}"
        f"  {_latency(sample.itl_s, settings.itl_slo_s, 1000, 'ms'):>16}  {sample.cause}"
        + (f": {_short(sample.message)}" if sample.message else "")
    )


def styled_row(sample: Sample, previous: Sample | None, settings: DemoSettings) -> Text:
    """The row, red when a latency is over its SLO, bold when the ratio changed since ``previous``."""
    over = (sample.ttft_s is not None and sample.ttft_s > settings.ttft_slo_s) or (
        sample.itl_s is not None and sample.itl_s > settings.itl_slo_s
    )
    moved = previous is not None and (previous.prefill, previous.decode) != (sample.prefill, sample.decode)
    style = " ".join(s for s, on in (("red", over), ("bold", moved)) if on)
    return Text(format_row(sample, settings), style=style)


def traffic_progress(console: Console) -> Progress:
    """The traffic's progress under the rows; disabled (prints nothing) where the console is no terminal."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f} s"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


def drive(loop: ClosedLoop, out: TextIO) -> tuple[list[Sample], list[PhaseReport]]:
    """Run the traffic phases in a thread and sample/print the loop every ``refresh_s`` meanwhile."""
    router = loop.router
    if router is None:
        raise RuntimeError("the router is not up")
    settings = loop.settings
    reports: list[PhaseReport] = []
    failure: list[BaseException] = []
    current = [settings.phases[0].name]  # the phase the traffic thread is in (drains shift the edges)

    def traffic() -> None:
        try:
            reports.extend(run_traffic(router.url, settings, on_phase=current.append))
        except BaseException as error:  # reported by the main thread
            failure.append(error)

    console = demo_console(out)
    thread = threading.Thread(target=traffic, name="demo-traffic", daemon=True)
    samples: list[Sample] = []
    console.print(TABLE_HEADER)
    with traffic_progress(console) as progress:
        task = progress.add_task("traffic", total=settings.total_s)

        def traffic_done() -> bool:
            elapsed = time.monotonic() - started
            sample = loop.sample(elapsed, current[-1])
            progress.console.print(styled_row(sample, samples[-1] if samples else None, settings))
            progress.update(task, completed=min(elapsed, settings.total_s), description=current[-1])
            samples.append(sample)
            return not thread.is_alive()

        started = time.monotonic()
        loop.traffic_started = time.time()
        thread.start()
        limit = settings.total_s + settings.drain_s * len(settings.phases) + TRAFFIC_MARGIN_S
        wait_for(traffic_done, timeout_s=limit, interval_s=settings.refresh_s, what="the traffic phases")
    thread.join()
    if failure:
        raise RuntimeError(f"traffic failed: {failure[0]}") from failure[0]
    return samples, reports

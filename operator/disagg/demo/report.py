"""The demo's report: reports/demo/report.html (summary, interactive timeline, scale-up start-up,
decisions, Events) through the writer and the plot style ``disagg simulate`` uses too
(:mod:`disagg.twin.html_report`, :mod:`disagg.twin.plots`), and samples.json with everything the page
shows."""

from __future__ import annotations

import html
import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from disagg.demo.samples import Sample, summarise
from disagg.demo.scenario import DemoSettings, phase_edges
from disagg.twin import html_report


def _series(
    samples: Sequence[Sample], pick: Callable[[Sample], float | None]
) -> tuple[list[float], list[float]]:
    xs: list[float] = []
    ys: list[float] = []
    for sample in samples:
        value = pick(sample)
        xs.append(sample.elapsed_s)
        ys.append(math.nan if value is None else value)
    return xs, ys


def timeline_figure(samples: Sequence[Sample], settings: DemoSettings) -> Any:
    """TTFT and ITL against their SLOs, and replicas per role, over time (phases shaded and named, each
    change of P:D marked with its cause): one interactive plotly figure, shared time axis."""
    from plotly.subplots import make_subplots

    from disagg.twin.plots import PALETTE, SLO_COLOR, layout

    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06)
    for i, (name, start, end) in enumerate(phase_edges(settings)):
        fig.add_vrect(
            x0=start,
            x1=end,
            fillcolor="rgba(127,127,127,0.08)" if i == 0 else "rgba(127,127,127,0.16)",
            line_width=0,
            layer="below",
            row="all",
            col=1,
            exclude_empty_subplots=False,
        )
        fig.add_annotation(x=start, y=1.0, xref="x", yref="paper", text=name, showarrow=False, xanchor="left")
    percentile = f"p{settings.percentile:.0f}"
    for row, what, unit, scale, pick, slo, color in (
        (1, "TTFT", "s", 1.0, lambda s: s.ttft_s, settings.ttft_slo_s, PALETTE[0]),
        (2, "ITL", "ms", 1000.0, lambda s: s.itl_s, settings.itl_slo_s, PALETTE[2]),
    ):
        xs, ys = _series(samples, pick)
        fig.add_scatter(
            x=xs,
            y=[None if math.isnan(y) else y * scale for y in ys],
            name=f"{what} {percentile}",
            mode="lines+markers",
            marker={"size": 4},
            line={"color": color},
            hovertemplate=f"{what} {percentile} %{{y:.3g}} {unit} at %{{x:.0f}} s<extra></extra>",
            meta={"kind": "latency", "metric": what.lower()},
            row=row,
            col=1,
        )
        fig.add_scatter(
            x=[0.0, xs[-1] if xs else 0.0],
            y=[slo * scale, slo * scale],
            name=f"{what} SLO {slo * scale:g} {unit}",
            mode="lines",
            line={"color": SLO_COLOR, "dash": "dashdot", "width": 1.5},
            meta={"kind": "slo", "metric": what.lower(), "value": slo},
            row=row,
            col=1,
        )
        fig.update_yaxes(title_text=f"{what} ({unit})", rangemode="tozero", row=row, col=1)
    for role, color in (("prefill", PALETTE[0]), ("decode", PALETTE[1])):
        xs, ys = _series(samples, lambda s, r=role: float(getattr(s, r)))  # type: ignore[misc]
        fig.add_scatter(
            x=xs,
            y=ys,
            name=f"{role} desired",
            mode="lines",
            line={"shape": "hv", "color": color, "width": 2},
            meta={"kind": "replicas", "role": role, "state": "desired"},
            row=3,
            col=1,
        )
        xs, ys = _series(samples, lambda s, r=role: float(getattr(s, f"{r}_ready")))  # type: ignore[misc]
        fig.add_scatter(
            x=xs,
            y=ys,
            name=f"{role} ready",
            mode="lines",
            line={"color": color, "dash": "dot", "width": 1},
            meta={"kind": "replicas", "role": role, "state": "ready"},
            row=3,
            col=1,
        )
    changes = [b for a, b in itertools.pairwise(samples) if (a.prefill, a.decode) != (b.prefill, b.decode)]
    fig.add_scatter(
        x=[s.elapsed_s for s in changes],
        y=[max(s.prefill, s.decode) + 0.3 for s in changes],
        text=[
            f"<b>{html.escape(s.cause)}</b> at {s.elapsed_s:.0f} s<br>P:D {s.prefill}:{s.decode}"
            + (f"<br>{html.escape(s.message)}" if s.message else "")
            for s in changes
        ],
        hovertemplate="%{text}<extra></extra>",
        name="P:D changed (hover: cause)",
        mode="markers",
        marker={"symbol": "triangle-down", "size": 10, "color": PALETTE[4]},
        meta={"kind": "decisions"},
        row=3,
        col=1,
    )
    fig.update_yaxes(title_text="replicas", rangemode="tozero", row=3, col=1)
    fig.update_xaxes(title_text="time since start (s)", row=3, col=1)
    layout(fig, 800)
    fig.update_layout(hovermode="closest")
    return fig


def write_report(
    samples: Sequence[Sample],
    decisions: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    settings: DemoSettings,
    out_dir: Path,
    startup: Sequence[str] = (),
) -> list[Path]:
    """report.html (summary, interactive timeline, scale-up start-up, decisions, events; one file, plotly.js
    inline) and samples.json under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    outcome = summarise(samples, settings)
    data = out_dir / "samples.json"
    data.write_text(
        json.dumps(
            {
                "settings": {k: str(v) for k, v in asdict(settings).items()},
                "outcome": asdict(outcome),
                "samples": [asdict(s) for s in samples],
                "decisions": list(decisions),
                "events": list(events),
                "startup": list(startup),
            },
            indent=2,
        )
    )
    attainment = "n/a" if outcome.attainment is None else f"{outcome.attainment:.0%}"
    summary: list[dict[str, Any]] = [
        {"what": "P:D at start", "value": f"{outcome.start_prefill}:{outcome.start_decode}"},
        {"what": "P:D at end", "value": f"{outcome.final_prefill}:{outcome.final_decode}"},
        {"what": "most prefill replicas", "value": outcome.peak_prefill},
        {"what": "moved toward prefill", "value": outcome.moved_toward_prefill},
        {"what": "TTFT breached after the shift", "value": outcome.breached_after_shift},
        {"what": "TTFT recovered under the SLO", "value": outcome.recovered},
        {"what": "samples meeting both SLOs", "value": attainment},
    ]
    phases = ", ".join(
        f"{p.name} {p.duration_s:.0f}s at {p.rate_rps} req/s, "
        f"{p.prompt_tokens} prompt / {p.output_tokens} output tokens"
        for p in settings.phases
    )
    percentile = f"{settings.percentile:.0f}"
    page = html_report.write_page(
        out_dir / "report.html",
        f"disagg closed loop: {settings.deployment}",
        [
            html_report.paragraph(
                f"Phases: {html.escape(phases)}. SLOs: TTFT p{percentile} &le; "
                f"{settings.ttft_slo_s * 1000:.0f} ms, "
                f"ITL p{percentile} &le; {settings.itl_slo_s * 1000:.0f} ms."
            ),
            html_report.table(summary, ["what", "value"]),
            html_report.heading("Timeline"),
            html_report.figure(timeline_figure(samples, settings), "timeline"),
            html_report.heading("Scale-up start-up (pod creation to Ready)"),
            html_report.bullets(startup),
            html_report.heading("Decisions (status.autoscaling.decisions, newest first)"),
            html_report.table(decisions, ["time", "prefill", "decode", "cause", "message"]),
            html_report.heading("Events"),
            html_report.table(events, ["time", "type", "reason", "message"]),
        ],
    )
    return [page, data]

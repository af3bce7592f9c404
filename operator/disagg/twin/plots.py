"""The interactive figures of ``disagg simulate``'s report (plotly; :func:`disagg.twin.report.write_html`).

* :func:`load_and_replicas` - what arrived per window (requests, prompt and output tokens per second)
  above the replicas per role (step lines), above every decision of each policy run (one marker per
  evaluation, by cause; hover: targets, reasons, the bound it ran into), with the spans a bound held
  shaded over all three (grey: held, red: held while the SLO was missed; hover the band on the replica
  row for the bound and the attainment in it);
* :func:`latency` - TTFT and ITL percentiles per window against the SLO lines;
* :func:`attainment` - the share of each window's arrivals that met both targets, against the target.

Every trace carries ``meta`` ({"kind": ..., "run": label, ...}) so a reader of the page's figure JSON
(:func:`disagg.twin.html_report.figures`) can tell a decision marker from an SLO line without parsing
names. Legends sit above the plots, horizontal, so they never cover data.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from disagg.twin.decisions import BoundSpan, PolicyTrace
from disagg.twin.report import Windows
from disagg.twin.sim import SimResult

# one colour per run (latency, attainment) or per run and role (replicas)
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
SLO_COLOR = "#d62728"
HELD_FILL = "rgba(127,127,127,0.15)"
MISSED_FILL = "rgba(214,39,40,0.18)"
ROLE_DASH = {"prefill": "solid", "decode": "dash", "colocated": "dashdot"}
QUANTILE_DASH = {"p50": "dot", "p90": "solid", "p99": "dash"}


def layout(fig: Any, height: int) -> Any:
    """The look every figure shares: legend above the plot, horizontal (it wraps, never covers data),
    a white background and a readable hover label."""
    fig.update_layout(
        template="plotly_white",
        height=height,
        margin={"l": 60, "r": 60, "t": 30, "b": 50},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "left", "x": 0},
        hoverlabel={"namelength": -1},
    )
    return fig


def _values(ys: Sequence[float | None] | np.ndarray) -> list[float | None]:
    """Plain numbers for the JSON, NaN as a gap (None)."""
    return [None if y is None or (isinstance(y, float) and math.isnan(y)) else float(y) for y in ys]


def _window_hover(win: Windows) -> list[list[float]]:
    return [[float(a), float(b), float(n)] for a, b, n in zip(win.start, win.end, win.arrivals, strict=True)]


def _same_load(a: SimResult, b: SimResult) -> bool:
    return bool(
        a.arrival.size == b.arrival.size
        and np.array_equal(a.arrival, b.arrival)
        and np.array_equal(a.prompt, b.prompt)
        and np.array_equal(a.output, b.output)
    )


def _decision_text(trace: PolicyTrace, index: int) -> str:
    d = trace.decisions[index]
    lines = [
        f"<b>{html.escape(d.cause)}</b> at {d.time:.0f} s",
        f"P:D {d.prefill}:{d.decode}" + (" (changed)" if d.changed else ""),
    ]
    lines += [html.escape(f"{code}: {message}" if message else code) for code, message, _ in d.reasons]
    held = [s.bound for s in trace.held if s.start <= d.time < s.end]
    missed = [s.bound for s in trace.missed if s.start <= d.time < s.end]
    if held:
        lines.append("bound: " + ", ".join(held) + (" (SLO missed)" if missed else ""))
    if d.advisory:
        lines.append("advisory: not applied")
    return "<br>".join(lines)


def _band(span: BoundSpan, top: float, label: str, missed: bool, first: bool) -> dict[str, Any]:
    """A span a bound held as a filled band on the replica row (hover: the bound and what was met)."""
    met = (
        f"{span.attainment:.1%} of {span.requests} arriving requests met the SLO"
        if span.requests
        else "no arrivals"
    )
    what = "held while the SLO was missed" if missed else "held"
    return {
        "type": "scatter",
        "x": [span.start, span.start, span.end, span.end, span.start],
        "y": [0, top, top, 0, 0],
        "fill": "toself",
        "fillcolor": MISSED_FILL if missed else HELD_FILL,
        "line": {"width": 0},
        "mode": "lines",
        "hoveron": "fills",
        "name": f"{label}: bound {what}",
        "text": f"{span.bound} {what}, {span.start:.0f}-{span.end:.0f} s: {met}",
        "hoverinfo": "text",
        "legendgroup": f"{label} bound {'missed' if missed else 'held'}",
        "showlegend": first,
        "meta": {"kind": "bound", "run": label, "missed": missed, "bound": span.bound},
    }


def load_and_replicas(
    results: Sequence[tuple[str, SimResult]], wins: Sequence[Windows], traces: Mapping[str, PolicyTrace]
) -> Any:
    """Load per window (requests/s on the left axis, tokens/s on the right) over the replicas per role,
    over every decision, with the bound spans shaded; one shared, zoomable time axis."""
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.05,
        row_heights=[0.38, 0.40, 0.22],
        specs=[[{"secondary_y": True}], [{}], [{}]],
    )
    drawn: list[SimResult] = []
    for (label, res), win in zip(results, wins, strict=True):
        if any(_same_load(res, other) for other in drawn):
            continue
        prefix = "" if not drawn else f"{label}: "
        drawn.append(res)
        custom = _window_hover(win)
        for name, rate, secondary, hue, dash in (
            ("arrivals/s", win.per_second(win.arrivals), False, "#444444", "solid"),
            ("prompt tokens/s", win.per_second(win.prompt_tokens), True, "#1f77b4", "dot"),
            ("output tokens/s", win.per_second(win.output_tokens), True, "#ff7f0e", "dot"),
        ):
            fig.add_scatter(
                x=_values(win.mid),
                y=_values(rate),
                customdata=custom,
                name=prefix + name,
                mode="lines+markers",
                marker={"size": 4},
                line={"color": hue, "dash": dash, "width": 1.5},
                hovertemplate=f"%{{y:,.2f}} {name}<br>window %{{customdata[0]:.0f}}-"
                "%{customdata[1]:.0f} s, %{customdata[2]:.0f} arrivals<extra>" + prefix + name + "</extra>",
                meta={"kind": "load", "run": label, "series": name},
                row=1,
                col=1,
                secondary_y=secondary,
            )
    top = 1.0
    color = 0
    for label, res in results:
        end = max(res.duration_s, res.replicas[-1][0] if res.replicas else 0.0)
        for role in sorted({r for _, pools in res.replicas for r in pools}, key=list(ROLE_DASH).index):
            points = [(t, pools[role]) for t, pools in res.replicas if role in pools]
            xs = [t for t, _ in points] + [end]
            for state, idx, dash, visible in (
                ("allocated", 0, ROLE_DASH[role], True),
                ("ready", 1, "dot", "legendonly"),
            ):
                counts = [float(v[idx]) for _, v in points]
                top = max(top, *counts)
                fig.add_scatter(
                    x=xs,
                    y=[*counts, counts[-1]],
                    name=f"{label} {role} {state}",
                    mode="lines",
                    line={
                        "shape": "hv",
                        "color": PALETTE[color % len(PALETTE)],
                        "dash": dash,
                        "width": 2 if idx == 0 else 1,
                    },
                    visible=visible,
                    hovertemplate=f"{role} {state}: %{{y:.0f}} at %{{x:.0f}} s<extra>{label}</extra>",
                    meta={"kind": "replicas", "run": label, "role": role, "state": state},
                    row=2,
                    col=1,
                )
            color += 1
    for label, trace in traces.items():
        for missed, spans in ((False, trace.held), (True, trace.missed)):
            for i, span in enumerate(spans):
                fig.add_trace(_band(span, top + 0.5, label, missed, i == 0), row=2, col=1)
                for row in (1, 3):  # the band itself shades the replica row
                    fig.add_vrect(
                        x0=span.start,
                        x1=span.end,
                        fillcolor=MISSED_FILL if missed else HELD_FILL,
                        line_width=0,
                        layer="below",
                        row=row,
                        col=1,
                        exclude_empty_subplots=False,
                    )
    for i, (label, trace) in enumerate(traces.items()):
        ds = trace.decisions
        fig.add_scatter(
            x=[d.time for d in ds],
            y=[d.cause for d in ds],
            text=[_decision_text(trace, k) for k in range(len(ds))],
            hovertemplate="%{text}<extra>" + label + "</extra>",
            name=f"{label} decisions",
            mode="markers",
            marker={
                "size": 9,
                "color": PALETTE[i % len(PALETTE)],
                "symbol": ["circle" if d.changed else "circle-open" for d in ds],
                "line": {"width": 1.5, "color": PALETTE[i % len(PALETTE)]},
            },
            meta={"kind": "decisions", "run": label},
            row=3,
            col=1,
        )
    fig.update_yaxes(title_text="requests/s", rangemode="tozero", row=1, col=1, secondary_y=False)
    fig.update_yaxes(
        title_text="tokens/s", rangemode="tozero", showgrid=False, row=1, col=1, secondary_y=True
    )
    fig.update_yaxes(title_text="replicas", range=[0, top + 0.6], row=2, col=1)
    fig.update_yaxes(title_text="decision", type="category", row=3, col=1)
    fig.update_xaxes(title_text="time (s)", row=3, col=1)
    layout(fig, 760)
    fig.update_layout(hovermode="closest")
    return fig


def latency(
    results: Sequence[tuple[str, SimResult]], wins: Sequence[Windows], ttft_slo_s: float, itl_slo_s: float
) -> Any:
    """TTFT and ITL (inter-token gaps) p50/p90/p99 per window of each run, log scale, against the SLO
    lines."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    end = 0.0
    for i, ((label, res), win) in enumerate(zip(results, wins, strict=True)):
        end = max(end, float(win.end[-1]) if len(win) else res.duration_s)
        for row, metric in ((1, "ttft"), (2, "itl")):
            for q, dash in QUANTILE_DASH.items():
                fig.add_scatter(
                    x=_values(win.mid),
                    y=_values([p[f"{metric}_{q}"] for p in res.timeline]),
                    customdata=_window_hover(win),
                    name=f"{label} {q}",
                    legendgroup=f"{label} {q}",
                    showlegend=row == 1,
                    mode="lines",
                    line={"color": PALETTE[i % len(PALETTE)], "dash": dash},
                    hovertemplate=f"{metric.upper()} {q} %{{y:.3f}} s<br>window %{{customdata[0]:.0f}}-"
                    "%{customdata[1]:.0f} s<extra>" + label + "</extra>",
                    meta={"kind": "latency", "run": label, "metric": metric, "quantile": q},
                    row=row,
                    col=1,
                )
    for row, metric, slo in ((1, "ttft", ttft_slo_s), (2, "itl", itl_slo_s)):
        _target_line(fig, end, slo, f"{metric.upper()} SLO {slo:g} s", metric, row=row, col=1)
    fig.update_yaxes(title_text="TTFT (s)", type="log", row=1, col=1)
    fig.update_yaxes(title_text="ITL (s)", type="log", row=2, col=1)
    fig.update_xaxes(title_text="time (s)", row=2, col=1)
    layout(fig, 560)
    fig.update_layout(hovermode="x unified")
    return fig


def _target_line(fig: Any, end: float, value: float, name: str, metric: str, **where: int) -> None:
    """A horizontal target line (an SLO or the attainment target) from 0 to ``end`` s, in the SLO colour."""
    fig.add_scatter(
        x=[0.0, end],
        y=[value, value],
        name=name,
        mode="lines",
        line={"color": SLO_COLOR, "dash": "dashdot", "width": 1.5},
        hovertemplate=f"{name}<extra></extra>",
        meta={"kind": "slo", "metric": metric, "value": value},
        **where,
    )


def attainment(results: Sequence[tuple[str, SimResult]], wins: Sequence[Windows], target: float) -> Any:
    """Per window of each run: the share of the arriving requests that met both targets (TTFT-only and
    ITL-only shares one click away in the legend), against the attainment target."""
    import plotly.graph_objects as go

    fig = go.Figure()
    end = 0.0
    for i, ((label, _), win) in enumerate(zip(results, wins, strict=True)):
        end = max(end, float(win.end[-1]) if len(win) else 0.0)
        custom = [[a, b, n, g] for (a, b, n), g in zip(_window_hover(win), win.good, strict=True)]
        for what, ys, dash, visible in (
            ("both targets", win.attainment, "solid", True),
            ("TTFT met", win.share(win.ttft_met), "dot", "legendonly"),
            ("ITL met", win.share(win.itl_met), "dash", "legendonly"),
        ):
            fig.add_scatter(
                x=_values(win.mid),
                y=_values(ys),
                customdata=custom,
                name=f"{label} {what}",
                mode="lines+markers",
                marker={"size": 5},
                visible=visible,
                line={"color": PALETTE[i % len(PALETTE)], "dash": dash},
                hovertemplate=f"{what} %{{y:.1%}}<br>window %{{customdata[0]:.0f}}-%{{customdata[1]:.0f}} s: "
                "%{customdata[3]:.0f} of %{customdata[2]:.0f} good<extra>" + label + "</extra>",
                meta={"kind": "attainment", "run": label, "series": what},
            )
    _target_line(fig, end, target, f"target {target:.0%}", "attainment")
    fig.update_yaxes(title_text="met both targets", tickformat=".0%", range=[0, 1.05])
    fig.update_xaxes(title_text="time (s)")
    layout(fig, 340)
    fig.update_layout(hovermode="x unified")
    return fig

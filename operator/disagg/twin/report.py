"""Reports of a simulation: goodput, SLO attainment, latency percentiles, GPU-hours, plots.

Definitions (stated here once, used everywhere):

* A request is *good* when it finished, its TTFT is within the TTFT target and its ITL is within the ITL
  target. A request's ITL for the SLO is its **mean** inter-token gap (``(last token - first token) /
  (output tokens - 1)``, i.e. its TPOT, as vLLM's benchmark and DistServe define per-request decode speed);
  single-token requests meet the ITL target vacuously.
* Goodput = good requests per second of simulated time (first arrival to last completion) and per GPU-hour
  (every allocated replica's GPUs, starting and draining ones included).
* SLO attainment = good / all requests (unfinished and rejected ones count as misses).
* ITL percentiles are over all inter-token gaps (token-weighted, from the simulator's log histogram);
  TPOT percentiles are over requests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from disagg.twin import html_report
from disagg.twin.sim import SimResult


@dataclass(frozen=True)
class Report:
    label: str
    mode: str
    gpus: int  # the most GPUs allocated at once (starting, ready and draining replicas), not the start
    gpus_start: int  # the deployment's configured replicas x TP per pool
    requests: int
    finished: int
    rejected: int
    duration_s: float
    gpu_hours: float
    ttft_slo_s: float
    itl_slo_s: float
    good: int
    goodput_rps: float
    goodput_per_gpu_hour: float
    slo_attainment: float
    ttft_attainment: float
    itl_attainment: float
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    itl_p50: float
    itl_p90: float
    itl_p99: float
    tpot_p50: float
    tpot_p90: float
    tpot_p99: float
    preempted_requests: int

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def _pct(a: np.ndarray, q: float) -> float:
    a = a[~np.isnan(a)]
    return float(np.quantile(a, q)) if a.size else math.nan


def peak_gpus(result: SimResult) -> int:
    """The most GPUs allocated at once over the run: each pool's allocated replicas (starting, ready,
    draining) times its TP, summed over the pools at each logged moment."""
    dep = result.deployment
    tp = {
        role: pool.gpus_per_replica
        for role, pool in (("prefill", dep.prefill), ("decode", dep.decode), ("colocated", dep.colocated))
        if pool is not None
    }
    peak = max(
        (sum(alloc * tp.get(role, 1) for role, (alloc, _) in pools.items()) for _, pools in result.replicas),
        default=0,
    )
    return peak if result.replicas else dep.gpus


def build_report(
    result: SimResult, ttft_slo_s: float, itl_slo_s: float, percentile: float = 0.9, label: str = ""
) -> Report:
    if ttft_slo_s <= 0 or itl_slo_s <= 0:
        raise ValueError("ttft_slo_s/itl_slo_s: SLO targets must be > 0")
    n = int(result.arrival.size)
    ttft_ok, itl_ok = result.met_ttft(ttft_slo_s), result.met_itl(itl_slo_s)
    good = int(np.sum(ttft_ok & itl_ok))
    span = result.duration_s - (float(result.arrival.min()) if n else 0.0)
    dep = result.deployment
    return Report(
        label=label or f"{dep.name} ({dep.mode})",
        mode=dep.mode,
        gpus=peak_gpus(result),
        gpus_start=dep.gpus,
        requests=n,
        finished=result.finished,
        rejected=result.rejected,
        duration_s=result.duration_s,
        gpu_hours=result.gpu_hours,
        ttft_slo_s=ttft_slo_s,
        itl_slo_s=itl_slo_s,
        good=good,
        goodput_rps=good / span if span > 0 else math.nan,
        goodput_per_gpu_hour=good / result.gpu_hours if result.gpu_hours > 0 else math.nan,
        slo_attainment=good / n if n else math.nan,
        ttft_attainment=float(ttft_ok.sum() / n) if n else math.nan,
        itl_attainment=float(itl_ok.sum() / n) if n else math.nan,
        ttft_p50=_pct(result.ttft, 0.5),
        ttft_p90=_pct(result.ttft, 0.9),
        ttft_p99=_pct(result.ttft, 0.99),
        itl_p50=result.itl_hist.quantile(0.5) or math.nan,
        itl_p90=result.itl_hist.quantile(0.9) or math.nan,
        itl_p99=result.itl_hist.quantile(0.99) or math.nan,
        tpot_p50=_pct(result.itl_mean, 0.5),
        tpot_p90=_pct(result.itl_mean, 0.9),
        tpot_p99=_pct(result.itl_mean, 0.99),
        preempted_requests=int(np.sum(result.preemptions > 0)),
    )


_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("label", "deployment", "{}"),
    ("gpus_start", "GPUs start", "{}"),
    ("gpus", "GPUs peak", "{}"),
    ("requests", "reqs", "{}"),
    ("finished", "done", "{}"),
    ("slo_attainment", "SLO ok", "{:.1%}"),
    ("goodput_rps", "goodput/s", "{:.2f}"),
    ("goodput_per_gpu_hour", "good/GPU-h", "{:.0f}"),
    ("gpu_hours", "GPU-h", "{:.2f}"),
    ("ttft_p50", "TTFT p50", "{:.3f}"),
    ("ttft_p90", "TTFT p90", "{:.3f}"),
    ("ttft_p99", "TTFT p99", "{:.3f}"),
    ("itl_p50", "ITL p50", "{:.4f}"),
    ("itl_p90", "ITL p90", "{:.4f}"),
    ("itl_p99", "ITL p99", "{:.4f}"),
)


def format_table(reports: Sequence[Report]) -> str:
    """A fixed-width text table, one row per report (latencies in seconds)."""
    rows = [[h for _, h, _ in _COLUMNS]]
    for r in reports:
        d = r.as_dict()
        rows.append([fmt.format(d[k]) for k, _, fmt in _COLUMNS])
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in rows
    ]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def plot_latency(results: Sequence[tuple[str, SimResult]], ttft_slo_s: float, itl_slo_s: float) -> Any:
    """TTFT and ITL percentiles per interval of each result, against the SLO targets."""
    fig, axes = html_report.pyplot().subplots(2, 1, figsize=(10, 6), sharex=True)
    for label, res in results:
        t = [p["time"] for p in res.timeline]
        for ax, metric in zip(axes, ("ttft", "itl"), strict=True):
            for q, style in (("p50", ":"), ("p90", "-"), ("p99", "--")):
                ys = [p[f"{metric}_{q}"] for p in res.timeline]
                ax.plot(t, [math.nan if y is None else y for y in ys], style, label=f"{label} {q}")
    axes[0].axhline(ttft_slo_s, color="red", lw=0.8)
    axes[1].axhline(itl_slo_s, color="red", lw=0.8)
    axes[0].set_ylabel("TTFT (s)")
    axes[1].set_ylabel("ITL (s)")
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    axes[1].set_xlabel("time (s)")
    axes[0].legend(fontsize=7, ncol=2)
    return fig


def plot_replicas(results: Sequence[tuple[str, SimResult]]) -> Any:
    """Allocated and ready replicas per role of each result over time."""
    fig, ax = html_report.pyplot().subplots(figsize=(10, 3))
    for label, res in results:
        roles = sorted({r for _, d in res.replicas for r in d})
        for role in roles:
            t = [x for x, d in res.replicas if role in d]
            alloc = [d[role][0] for _, d in res.replicas if role in d]
            ready = [d[role][1] for _, d in res.replicas if role in d]
            ax.step(t, alloc, where="post", label=f"{label} {role} allocated")
            ax.step(t, ready, where="post", ls=":", label=f"{label} {role} ready")
    ax.set_ylabel("replicas")
    ax.set_xlabel("time (s)")
    ax.legend(fontsize=7, ncol=2)
    return fig


def write_html(
    path: Path,
    results: Sequence[tuple[str, SimResult]],
    reports: Sequence[Report],
    title: str = "disagg twin simulation",
    findings: Sequence[str] = (),
) -> Path:
    """One self-contained HTML file: the table, the notes, decision causes and bound warnings
    (``findings``, as printed) and PNG plots embedded as data URIs."""
    ttft, itl = reports[0].ttft_slo_s, reports[0].itl_slo_s
    return html_report.write_page(
        path,
        title,
        [
            html_report.paragraph(
                f"SLO: TTFT &le; {ttft:g} s and mean ITL (TPOT) &le; {itl:g} s per request. "
                "Goodput counts requests meeting both."
            ),
            html_report.preformatted(format_table(reports)),
            *(
                [html_report.heading("Notes, decisions and bounds"), html_report.bullets(findings)]
                if findings
                else []
            ),
            html_report.heading("Latency percentiles per interval"),
            html_report.embedded_figure(plot_latency(results, ttft, itl), "latency"),
            html_report.heading("Replicas over time"),
            html_report.embedded_figure(plot_replicas(results), "replicas"),
        ],
    )

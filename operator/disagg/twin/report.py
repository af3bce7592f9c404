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
* Per window (:func:`windows`, the simulator's controller intervals): the load is what *arrived* in the
  window (requests, prompt tokens and the output tokens they asked for, per second) and the window's
  attainment is the share of the requests arriving in it that were good.

:func:`write_html` writes the report an SRE decides from: the table, a paragraph per run saying why its
attainment is what it is (:func:`explain`), and interactive plotly figures (:mod:`disagg.twin.plots`).
"""

from __future__ import annotations

import html
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from disagg.twin import html_report
from disagg.twin.decisions import BoundSpan, PolicyTrace, cause_counts
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
    slo_percentile: float = 0.9  # the policy's SLO percentile: the attainment a run should reach

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
        slo_percentile=percentile,
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


@dataclass(frozen=True)
class Windows:
    """One run's controller intervals (the simulator's timeline): window i is [start[i], end[i]); what
    arrived in it and how much of that met the targets. Requests arriving after the last tick are in no
    window."""

    start: np.ndarray
    end: np.ndarray
    arrivals: np.ndarray  # requests arriving in the window
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray  # the output tokens the arriving requests asked for
    good: np.ndarray  # arriving requests that met both targets
    ttft_met: np.ndarray
    itl_met: np.ndarray

    def __len__(self) -> int:
        return int(self.start.size)

    @property
    def mid(self) -> np.ndarray:
        mid: np.ndarray = (self.start + self.end) / 2
        return mid

    def per_second(self, counts: np.ndarray) -> np.ndarray:
        rate: np.ndarray = counts / np.maximum(self.end - self.start, 1e-9)
        return rate

    def share(self, counts: np.ndarray) -> np.ndarray:
        """``counts`` over the window's arrivals (NaN where nothing arrived)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            out: np.ndarray = np.where(self.arrivals > 0, counts / np.maximum(self.arrivals, 1), math.nan)
        return out

    @property
    def attainment(self) -> np.ndarray:
        return self.share(self.good)


def windows(result: SimResult, ttft_s: float, itl_s: float) -> Windows:
    """Per controller interval: the load that arrived and the share of it that met the targets."""
    end = np.array([float(p["time"] or 0.0) for p in result.timeline])
    start = np.concatenate([[0.0], end[:-1]]) if end.size else end
    index = np.searchsorted(end, result.arrival, side="right")
    inside = index < end.size
    at = index[inside]

    def count(weights: np.ndarray | None = None) -> np.ndarray:
        w = None if weights is None else np.asarray(weights, dtype=float)[inside]
        counts: np.ndarray = np.bincount(at, weights=w, minlength=end.size).astype(float)
        return counts

    return Windows(
        start=start,
        end=end,
        arrivals=count(),
        prompt_tokens=count(result.prompt),
        output_tokens=count(result.output),
        good=count(result.met_slo(ttft_s, itl_s)),
        ttft_met=count(result.met_ttft(ttft_s)),
        itl_met=count(result.met_itl(itl_s)),
    )


def _ranges(spans: Sequence[tuple[float, float]], most: int = 3) -> str:
    """Time ranges merged where they touch, the first ``most`` of them: "120-210 s, 450-480 s"."""
    merged: list[list[float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1] + 1e-9:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    text = ", ".join(f"{a:.0f}-{b:.0f} s" for a, b in merged[:most])
    return text + (f" and {len(merged) - most} more" if len(merged) > most else "")


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def changing_size(result: SimResult) -> np.ndarray:
    """Per request: whether a pool had replicas starting up or draining when it arrived."""
    if not result.replicas:
        return np.zeros(result.arrival.size, dtype=bool)
    times = np.array([t for t, _ in result.replicas])
    moving = np.array([any(a != r for a, r in pools.values()) for _, pools in result.replicas])
    index = np.searchsorted(times, result.arrival, side="right") - 1
    changing: np.ndarray = np.where(index >= 0, moving[np.maximum(index, 0)], False)
    return changing


def explain(
    result: SimResult, report: Report, trace: PolicyTrace | None = None, win: Windows | None = None
) -> list[str]:
    """Sentences saying why a run's attainment is what it is: which target the misses missed, where
    they cluster and under what load, whether they came while the pools changed size, and whether a
    bound (maxReplicas, GPU budget, Pending ceiling) held the policy back while the SLO was missed."""
    ttft_s, itl_s, target = report.ttft_slo_s, report.itl_slo_s, report.slo_percentile
    win = win if win is not None else windows(result, ttft_s, itl_s)
    n = report.requests
    if not n:
        return [f"{report.label}: no request arrived."]
    verdict = "meets" if report.slo_attainment >= target else "is below"
    out = [
        f"{report.label}: {report.slo_attainment:.1%} of {n} requests met both targets, which {verdict} "
        f"the {target:.0%} target."
    ]
    missed = ~result.met_slo(ttft_s, itl_s)
    misses = int(missed.sum())
    if misses:
        out += _misses(result, report, win, missed)
    return out + _control(result, trace)


def _misses(result: SimResult, report: Report, win: Windows, missed: np.ndarray) -> list[str]:
    """Which targets the misses missed, where they cluster and under what load, and how many came while
    a pool changed size."""
    ttft_s, itl_s, target = report.ttft_slo_s, report.itl_slo_s, report.slo_percentile
    done = ~np.isnan(result.e2e)
    ttft_ok, itl_ok = result.met_ttft(ttft_s), result.met_itl(itl_s)
    misses = int(missed.sum())
    out: list[str] = []
    kinds = [
        (
            int((done & ~ttft_ok & itl_ok).sum()),
            f"missed only the TTFT target (p90 {report.ttft_p90:.2f} s against {ttft_s:g} s)",
        ),
        (
            int((done & ttft_ok & ~itl_ok).sum()),
            f"missed only the ITL target (TPOT p90 {report.tpot_p90:.3f} s against {itl_s:g} s)",
        ),
        (int((done & ~ttft_ok & ~itl_ok).sum()), "missed both"),
        (
            int((~done).sum()),
            "never finished" + (f" ({report.rejected} rejected)" if report.rejected else ""),
        ),
    ]
    kinds.sort(key=lambda k: -k[0])
    out.append(
        f"Of the {misses} misses, " + "; ".join(f"{count} {what}" for count, what in kinds if count) + "."
    )
    if len(win):
        per_window = win.arrivals - win.good
        order = np.argsort(-per_window, kind="stable")
        covered = np.cumsum(per_window[order])
        in_windows = float(covered[-1]) if covered.size else 0.0
        if in_windows > 0:
            k = int(np.searchsorted(covered, in_windows / 2)) + 1
            worst = order[:k]
            rate_all = float(win.arrivals.sum() / max(win.end[-1] - win.start[0], 1e-9))
            width = float((win.end[worst] - win.start[worst]).sum())
            rate_worst = float(win.arrivals[worst].sum()) / max(width, 1e-9)
            prompt_all = float(win.prompt_tokens.sum() / max(win.arrivals.sum(), 1))
            prompt_worst = float(win.prompt_tokens[worst].sum() / max(win.arrivals[worst].sum(), 1))
            where = _ranges([(float(win.start[i]), float(win.end[i])) for i in worst])
            load = (
                f"requests arrived at {rate_worst:.2f}/s (run: {rate_all:.2f}/s) with "
                f"{prompt_worst:.0f}-token prompts on average (run: {prompt_all:.0f})"
            )
            if k <= max(1, len(win) // 4):
                out.append(
                    f"The misses cluster: half of them arrived in {k} of {len(win)} windows ({where}), "
                    f"where {load}."
                )
            else:
                arrived = win.arrivals > 0
                short = int((win.attainment[arrived] < target).sum())
                out.append(
                    f"The misses are spread over the run: half of them take {k} of {len(win)} windows, and "
                    f"{short} of the {int(arrived.sum())} windows with arrivals fell short of the target."
                )
    moving = changing_size(result)
    if result.replicas and moving.any():
        share = float((missed & moving).sum() / misses)
        out.append(
            f"{share:.0%} of the misses arrived while a pool was changing size (replicas starting, "
            f"{result.deployment.startup_delay_s:.0f} s each, or draining)."
        )
    return out


def _control(result: SimResult, trace: PolicyTrace | None) -> list[str]:
    """Whether a bound held the policy back while the SLO was missed, and what the policy decided."""
    out: list[str] = []
    if trace is None:
        sizes = [tuple(sorted((r, a) for r, (a, _) in pools.items())) for _, pools in result.replicas]
        changes = sum(a != b for a, b in itertools.pairwise(sizes))
        out.append(
            f"A controller without a decision log resized the pools {_times(changes)}."
            if changes
            else "No policy ran: the replicas stayed as configured."
        )
        return out
    if trace.missed:
        held = sum(s.end - s.start for s in trace.missed)
        bounds = sorted({s.bound for s in trace.missed})
        out.append(
            f"The policy was held back: {', '.join(bounds)} bound for {held:.0f} s while the SLO was missed "
            f"({_ranges([(s.start, s.end) for s in trace.missed])}); it could not add the capacity those "
            "windows needed."
        )
    elif trace.held:
        out.append(
            f"A bound held for {sum(s.end - s.start for s in trace.held):.0f} s "
            f"({', '.join(sorted({s.bound for s in trace.held}))}), but the SLO was met then: no bound cost "
            "attainment."
        )
    else:
        out.append("No bound held the policy back.")
    changed = sum(d.changed for d in trace.decisions)
    causes = ", ".join(f"{c} {k}" for c, k in cause_counts(trace.decisions)[:4])
    out.append(
        f"It decided {len(trace.decisions)} times and changed replicas {_times(changed)} (causes: {causes})."
    )
    return out


def compare(reports: Sequence[Report]) -> str:
    """One sentence ranking the runs by attainment (empty for one run)."""
    if len(reports) < 2:
        return ""
    ranked = sorted(reports, key=lambda r: -(r.slo_attainment if not math.isnan(r.slo_attainment) else -1))
    return (
        "By attainment: "
        + ", then ".join(
            f"{r.label} {r.slo_attainment:.1%} ({r.goodput_per_gpu_hour:.0f} good requests per GPU-hour)"
            for r in ranked
        )
        + "."
    )


def _decision_rows(trace: PolicyTrace) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for d in trace.decisions:
        bound = [s.bound for s in trace.held if s.start <= d.time < s.end]
        rows.append(
            {
                "time (s)": f"{d.time:.0f}",
                "P:D": f"{d.prefill}:{d.decode}",
                "changed": "yes" if d.changed else "",
                "cause": d.cause,
                "reasons": "; ".join(f"{c}: {m}" if m else c for c, m, _ in d.reasons),
                "bound": ", ".join(bound),
            }
        )
    return rows


def _span_rows(spans: Sequence[BoundSpan], missed: Sequence[BoundSpan]) -> list[dict[str, object]]:
    return [
        {
            "bound": s.bound,
            "from (s)": f"{s.start:.0f}",
            "to (s)": f"{s.end:.0f}",
            "evaluations": s.evaluations,
            "requests": s.requests,
            "met SLO": f"{s.attainment:.1%}" if s.requests else "-",
            "SLO missed": "yes"
            if any(m.bound == s.bound and s.start <= m.start < s.end for m in missed)
            else "",
        }
        for s in spans
    ]


def write_html(
    path: Path,
    results: Sequence[tuple[str, SimResult]],
    reports: Sequence[Report],
    title: str = "disagg twin simulation",
    findings: Sequence[str] = (),
    traces: Mapping[str, PolicyTrace] | None = None,
) -> Path:
    """One self-contained HTML file (plotly.js inline, no network needed) for any number of runs: the
    table; why each run's attainment is what it is; the notes, decision causes and bound warnings
    (``findings``, as printed); load over time above the replicas per role, every decision (hover: its
    cause and reasons) and every span a bound held; TTFT and ITL percentiles against the SLO lines;
    attainment per window; and each policy run's decisions and bound spans as tables. ``traces``: the
    policy runs' decisions and bound spans by run label."""
    from disagg.twin import plots

    traces = traces or {}
    if len(results) != len(reports):
        raise ValueError(f"write_html: {len(results)} results but {len(reports)} reports")
    ttft, itl, target = reports[0].ttft_slo_s, reports[0].itl_slo_s, reports[0].slo_percentile
    wins = [windows(res, ttft, itl) for _, res in results]
    why = [
        html_report.paragraph(html.escape(" ".join(explain(res, rep, traces.get(label), w))))
        for (label, res), rep, w in zip(results, reports, wins, strict=True)
    ]
    ranking = compare(reports)
    tables: list[str] = []
    for label, trace in traces.items():
        tables.append(
            html_report.details(
                f"{label}: {len(trace.decisions)} decisions",
                html_report.table(
                    _decision_rows(trace), ["time (s)", "P:D", "changed", "cause", "reasons", "bound"]
                ),
            )
        )
        if trace.held:
            tables.append(
                html_report.details(
                    f"{label}: {len(trace.held)} spans a bound held "
                    f"({len(trace.missed)} while the SLO was missed)",
                    html_report.table(
                        _span_rows(trace.held, trace.missed),
                        ["bound", "from (s)", "to (s)", "evaluations", "requests", "met SLO", "SLO missed"],
                    ),
                )
            )
    return html_report.write_page(
        path,
        title,
        [
            html_report.paragraph(
                f"SLO: TTFT &le; {ttft:g} s and mean ITL (TPOT) &le; {itl:g} s per request, met by at least "
                f"{target:.0%} of requests. Goodput counts requests meeting both. Drag to zoom, double-click "
                "to reset, hover for values; click a legend entry to hide it."
            ),
            html_report.preformatted(format_table(reports)),
            html_report.heading("Why attainment is what it is"),
            *why,
            *([html_report.paragraph(html.escape(ranking))] if ranking else []),
            *(
                [html_report.heading("Notes, decisions and bounds"), html_report.bullets(findings)]
                if findings
                else []
            ),
            html_report.heading("Load, replicas and decisions"),
            html_report.figure(plots.load_and_replicas(results, wins, traces), "load"),
            html_report.heading("Latency percentiles per window"),
            html_report.paragraph(
                "ITL here is every inter-token gap; the ITL target applies to each request's mean gap "
                "(TPOT), so a p99 gap above the line need not be a miss."
            ),
            html_report.figure(plots.latency(results, wins, ttft, itl), "latency"),
            html_report.heading("SLO attainment per window"),
            html_report.figure(plots.attainment(results, wins, target), "attainment"),
            *([html_report.heading("Every decision"), *tables] if tables else []),
        ],
    )

"""The demo's report: reports/demo/report.html (summary, timeline plot, scale-up start-up, decisions,
Events) through the writer ``disagg simulate`` uses too (:mod:`disagg.twin.html_report`), timeline.png
beside it, and samples.json with everything the page shows."""

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


def plot_report(samples: Sequence[Sample], settings: DemoSettings, path: Path) -> Path:
    """TTFT and ITL vs their SLOs, and replicas per role, over time (phase changes shaded)."""
    plt = html_report.pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    ttft_ax, itl_ax, rep_ax = axes
    for name, start, end in phase_edges(settings):
        for ax in axes:
            ax.axvspan(start, end, alpha=0.08 if name == settings.phases[0].name else 0.16, color="tab:gray")
        ttft_ax.text(start + 1, 0.02, name, transform=ttft_ax.get_xaxis_transform(), va="bottom", fontsize=9)
    xs, ys = _series(samples, lambda s: s.ttft_s)
    ttft_ax.plot(xs, ys, marker=".", label=f"TTFT p{settings.percentile:.0f}")
    ttft_ax.axhline(settings.ttft_slo_s, color="tab:red", linestyle="--", label="SLO")
    ttft_ax.set_ylabel("TTFT (s)")
    ttft_ax.legend(loc="upper right", fontsize=8)
    xs, ys = _series(samples, lambda s: s.itl_s)
    itl_ax.plot(
        xs, [y * 1000 for y in ys], marker=".", color="tab:green", label=f"ITL p{settings.percentile:.0f}"
    )
    itl_ax.axhline(settings.itl_slo_s * 1000, color="tab:red", linestyle="--", label="SLO")
    itl_ax.set_ylabel("ITL (ms)")
    itl_ax.legend(loc="upper right", fontsize=8)
    for role, color in (("prefill", "tab:blue"), ("decode", "tab:orange")):
        xs, ys = _series(samples, lambda s, r=role: float(getattr(s, r)))  # type: ignore[misc]
        rep_ax.step(xs, ys, where="post", color=color, label=f"{role} desired")
        xs, ys = _series(samples, lambda s, r=role: float(getattr(s, f"{r}_ready")))  # type: ignore[misc]
        rep_ax.plot(xs, ys, linestyle=":", color=color, label=f"{role} ready")
    changes = [b for a, b in itertools.pairwise(samples) if (a.prefill, a.decode) != (b.prefill, b.decode)]
    for sample in changes:
        rep_ax.axvline(sample.elapsed_s, color="tab:purple", alpha=0.3)
        rep_ax.text(
            sample.elapsed_s,
            0.02,
            sample.cause,
            rotation=90,
            fontsize=7,
            transform=rep_ax.get_xaxis_transform(),
            va="bottom",
        )
    rep_ax.set_ylabel("replicas")
    rep_ax.set_xlabel("time since start (s)")
    rep_ax.legend(loc="upper right", fontsize=8)
    fig.suptitle(f"disagg closed loop: {settings.deployment} ({settings.engine}, {settings.connector})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(
    samples: Sequence[Sample],
    decisions: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    settings: DemoSettings,
    out_dir: Path,
    startup: Sequence[str] = (),
) -> list[Path]:
    """report.html (summary, plot, scale-up start-up, decisions, events), timeline.png and samples.json
    under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    png = plot_report(samples, settings, out_dir / "timeline.png")
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
            html_report.image(png.name, "TTFT, ITL and replicas over time", width="100%"),
            html_report.heading("Scale-up start-up (pod creation to Ready)"),
            html_report.bullets(startup),
            html_report.heading("Decisions (status.autoscaling.decisions, newest first)"),
            html_report.table(decisions, ["time", "prefill", "decode", "cause", "message"]),
            html_report.heading("Events"),
            html_report.table(events, ["time", "type", "reason", "message"]),
        ],
    )
    return [page, png, data]

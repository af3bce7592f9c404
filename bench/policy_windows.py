"""Where a ratio policy spends and loses, per 5-minute window: its mean prefill and decode replicas next to
the hindsight allocation for that window, and the attainment of the requests arriving in it.

A diagnostic for tuning on the training set (docs/policy-bench.md): the policy bench says *that* a run
costs 1.4x the best static split; this says in which windows and which pool. Per case and start it prints
one line per window and a total of replica-hours per pool against the hindsight schedule's.

    .venv/bin/python bench/policy_windows.py --trace diurnal/train-0 [--start cold|warm] [--only model-based]
        [--reference-cache ~/.cache/disagg/bench-ref]

Numbers are printed, never asserted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import policy_goodput as pg
from disagg.twin.sim import SimResult


def mean_replicas(result: SimResult, role: str, start: float, end: float) -> float:
    """Time-averaged allocated replicas of ``role`` over [start, end)."""
    points = [(t, alloc[role][0]) for t, alloc in result.replicas]
    if not points:
        return float("nan")
    total, current = 0.0, points[0][1]
    last = start
    for t, n in points:
        if t <= start:
            current = n
            continue
        if t >= end:
            break
        total += current * (t - last)
        last, current = t, n
    total += current * (end - last)
    return total / (end - start)


def window_lines(
    result: SimResult,
    schedule: Sequence[tuple[float, float, tuple[int, int] | None]],
    case: pg.TraceCase,
) -> tuple[list[str], tuple[float, float, float, float]]:
    good = result.met_slo(case.ttft_slo_s, case.itl_slo_s)
    lines = []
    used_p = used_d = need_p = need_d = 0.0
    for start, span, alloc in schedule:
        end = start + span
        mask = (result.arrival >= start) & (result.arrival < end)
        n = int(np.sum(mask))
        att = float(np.mean(good[mask])) if n else float("nan")
        p, d = mean_replicas(result, "prefill", start, end), mean_replicas(result, "decode", start, end)
        hp, hd = alloc if alloc else (16, 16)
        used_p, used_d = used_p + p * span, used_d + d * span
        need_p, need_d = need_p + hp * span, need_d + hd * span
        mark = " <" if n and att < 0.9 else ""
        lines.append(
            f"  t={start:6.0f} n={n:5d} att={att:6.1%}  "
            f"P {p:5.1f} (hind {hp:2d})  D {d:5.1f} (hind {hd:2d}){mark}"
        )
    return lines, (used_p, used_d, need_p, need_d)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--trace", action="append", help="case, e.g. diurnal/train-0 (repeatable; default heavy-tail/train-0)"
    )
    parser.add_argument("--start", choices=("cold", "warm"), default="cold")
    parser.add_argument("--only", default="model-based", help="contender (default model-based)")
    parser.add_argument("--reference-cache", type=Path)
    args = parser.parse_args(argv)
    setup = pg.Setup()
    cases = {c.name: c for cs in pg.case_sets(list(pg.SETS)).values() for c in cs}
    for name in args.trace or ["heavy-tail/train-0"]:
        case = cases[name]
        reqs = case.requests()
        schedule, static = pg.references(reqs, case, setup, args.reference_cache)
        run_setup = setup
        if args.start == "warm" and schedule and schedule[0][2]:
            first = schedule[0][2]
            run_setup = replace(setup, start_prefill=first[0], start_decode=first[1])
        controller = pg.controllers(case, run_setup)[args.only]()
        result = run_setup.run(run_setup.deployment(), reqs, controller)
        lines, (up, ud, hp, hd) = window_lines(result, schedule, case)
        good = result.met_slo(case.ttft_slo_s, case.itl_slo_s)
        print(
            f"== {name} ({args.start}, {args.only}): attainment {float(np.mean(good)):.1%}, "
            f"{result.gpu_hours:.2f} GPU-h; best static {static}"
        )
        print("\n".join(lines))
        print(
            f"  replica-hours: prefill {up / 3600:.2f} vs hindsight {hp / 3600:.2f} "
            f"(x{up / max(hp, 1e-9):.2f}), decode {ud / 3600:.2f} vs {hd / 3600:.2f} "
            f"(x{ud / max(hd, 1e-9):.2f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Tune the ``model-based`` ratio policy on the training families only (issue 11's protocol).

Each candidate is a set of RatioPolicy spec overrides (JSON, camelCase as in the object); every candidate
runs every training case from both starts, and is compared against the references ``policy_goodput.py``
computed for the same cases (its ``--json`` output: the best static split and the schedule known ahead).
The test families and the shared traces are never read here: report them with ``policy_goodput.py``
after choosing.

    python bench/tune_policy.py --references /tmp/train.json \\
        --candidate '{}' --candidate '{"modelBased": {"targetUtilization": 0.92}}'
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from disagg.policy.types import ROLES
from policy_goodput import (
    RatioController,
    Row,
    Setup,
    TraceCase,
    Verdict,
    case_sets,
    evaluate,
    excess_gpu_hours,
    ratio_policy,
    references,
    verdict,
)

# where policy_goodput.py --reference-cache keeps the hindsight schedules (the warm start is its first window)
REFERENCE_CACHE = Path.home() / ".cache" / "disagg" / "bench-ref"


@dataclass(frozen=True)
class Outcome:
    case: str
    start: str
    attainment: float
    verdict: Verdict  # against the targets, as policy_goodput.py judges a run
    # pool -> reason code -> GPU-hours above the hindsight schedule while that code had the last word
    above: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


def _row(stored: Mapping[str, Any] | None) -> Row | None:
    """A reference row as policy_goodput.py --json wrote it."""
    return None if stored is None else Row(**{f.name: stored[f.name] for f in fields(Row)})


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def set_constants(assignments: str) -> None:
    """``module.NAME=value;...`` (value a Python literal): a policy constant set for this process, so a
    module-level constant is tuned like a spec field."""
    for item in filter(None, (a.strip() for a in assignments.split(";"))):
        target, value = item.split("=", 1)
        module, name = target.rsplit(".", 1)
        mod = importlib.import_module(f"disagg.policy.{module}")
        if not hasattr(mod, name):
            raise SystemExit(f"no constant {name} in disagg.policy.{module}")
        setattr(mod, name, ast.literal_eval(value))


def run_one(args: tuple[TraceCase, str, str, dict[str, Any]]) -> Outcome:
    case, start, candidate, ref = args
    overrides, _, constants = candidate.partition(" | ")
    set_constants(constants)
    setup = Setup()
    reqs = case.requests()
    schedule, _ = references(reqs, case, setup, REFERENCE_CACHE)
    first = schedule[0][2] if schedule else None
    if start == "warm" and first:
        setup = replace(setup, start_prefill=first[0], start_decode=first[1])
    spec = ratio_policy(case, **_merge({"algorithm": "model-based"}, json.loads(overrides)))
    controller = RatioController(spec, setup.bounds())
    result = setup.run(setup.deployment(), reqs, controller)
    row = evaluate("model-based", result, case, setup, None)
    static, sched = _row(ref["best_static"]), _row((ref["schedule_known_ahead"] or {}).get(start))
    excess = excess_gpu_hours(controller.log, schedule, setup.tp, setup.interval_s)
    above = {role: by_code for role, (_, _, by_code) in excess.items()}
    return Outcome(case.name, start, row.attainment, verdict(row, static, sched), above)


def where_above(outcomes: Sequence[Outcome]) -> str:
    """GPU-hours above the hindsight schedule over all runs, per pool, by the reason that held them
    (policy_goodput.py's why lines, summed): which mechanism a candidate's GPU-hours went to."""
    parts = []
    for role in ROLES:
        total: Counter[str] = Counter()
        for o in outcomes:
            total.update(o.above.get(role, {}))
        ranked = [f"{code} {gpu_h:.1f}" for code, gpu_h in total.most_common()]
        parts.append(f"{role} {sum(total.values()):.1f}" + (f" ({', '.join(ranked)})" if ranked else ""))
    return "GPU-h above the schedule: " + "; ".join(parts)


def summary(outcomes: Sequence[Outcome]) -> str:
    verdicts = [o.verdict for o in outcomes]
    att = min((o.attainment for o in outcomes if o.verdict.attainment_ok is not None), default=float("nan"))
    st = [v.static_ratio for v in verdicts if v.static_ratio]
    sc = [v.schedule_ratio for v in verdicts if v.schedule_ratio]
    misses = sum(len(v.misses()) for v in verdicts)
    below = sum(v.attainment_ok is False for v in verdicts)
    return (
        f"worst SLO {att:6.1%}  /static worst {max(st):.2f} mean {sum(st) / len(st):.2f}  "
        f"/sched worst {max(sc):.2f} mean {sum(sc) / len(sc):.2f}  rev/h worst "
        f"{max(v.reversals_max_h for v in verdicts)}  misses {misses} ({below} attainment)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--references", type=Path, required=True, help="policy_goodput.py --set train --json output"
    )
    ap.add_argument(
        "--candidate",
        action="append",
        default=[],
        help="RatioPolicy spec overrides (JSON), optionally followed by ' | module.CONSTANT=value;...'",
    )
    ap.add_argument(
        "--set",
        dest="case_set",
        choices=("train", "validation"),
        default="train",
        help="the cases to tune on (never test or shared); the references must hold them",
    )
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--detail", action="store_true", help="print every case")
    args = ap.parse_args(argv)
    refs_json = json.loads(args.references.read_text())
    refs = {c["case"]: c for c in refs_json["cases"] if c["set"] == args.case_set}
    cases = [c for c in case_sets([args.case_set])[args.case_set] if c.name in refs]
    candidates = args.candidate or ["{}"]
    for cand in candidates:
        jobs = [(c, s, cand, refs[c.name]) for c in cases for s in ("cold", "warm")]
        with ProcessPoolExecutor(args.jobs) as pool:
            outcomes = list(pool.map(run_one, jobs))
        print(f"{cand}\n  {summary(outcomes)}\n  {where_above(outcomes)}", flush=True)
        if args.detail:
            for o in outcomes:
                v = o.verdict
                print(
                    f"    {o.case:<24} {o.start:<5} {o.attainment:6.1%} /static {v.static_ratio or 0:.2f} "
                    f"/sched {v.schedule_ratio or 0:.2f} rev/h {v.reversals_max_h}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

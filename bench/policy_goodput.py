"""Replay traces through the twin with every ratio policy and baseline, and report the worst case.

Traces come in sets (``--set``): ``shared`` (the three real traces in ../shared/traces), ``train`` and
``test`` (generated traffic families, :mod:`disagg.twin.families`: diurnal days compressed into 1-2 h, flash
bursts shorter than an evaluation interval, chat/code/document mix shifts, heavy-tailed correlated
lengths, prefix reuse, multi-turn long-context sessions). Policies are tuned on ``train``; results are
judged on ``test`` (other seeds, other parameter draws, half of them outside the training ranges) and on
``shared``, each reported in its own section. See docs/policy-bench.md.

Same deployment (Llama-3.1-70B FP8, TP2 per replica on H100, both pools), same start, same bounds and
same SLOs for every policy on a trace. Two starts, each printed as its own table: ``cold`` (2 prefill + 2
decode whatever the traffic: shows how fast a policy finds its size) and ``warm`` (the first 5-minute
window's hindsight allocation for every contender: a service already running and sized for the traffic it
had been seeing, which is how a trace cut from a live service begins). Prints, side by side: SLO
attainment, goodput per GPU-hour, GPU-hours, scaling actions, oscillations (direction reversals of a pool
within 10 minutes), direction reversals (of the pool that reverses most: in all, and most within any
hour), time to recover after the largest traffic shift; plus the best static split in hindsight, a
hindsight lower bound on GPU-hours (per 5-minute window, the smallest allocation that meets the SLO for
that window's traffic, ignoring start-up delay) and the "schedule known ahead" reference (that hindsight
schedule, each allocation asked for one start-up delay ahead). Every ratio policy runs with the
RatioPolicy defaults and only the trace's SLO set (one policy for all traces, no per-trace tuning). Every
run stops 30 minutes after the last arrival; requests not finished by then are counted (``unfinished``)
and missed.

Targets, per case, start and contender: SLO attainment >= 90% wherever the best static split reaches it;
GPU-hours no more than the best static split's and within 10% of the schedule known ahead; never more than
2 direction reversals of a pool within an hour. A summary per set gives, per contender and case, the
measures behind each target, and the worst case over all cases and both starts; the contender with the
best worst case is named.

    .venv/bin/python bench/policy_goodput.py [--set shared|train|test|all] [--trace NAME] [--quick]
        [--start cold|warm|both] [--jobs N] [--json PATH] [--log DIR]

Numbers are printed, never asserted (benchmarks are not tests).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from disagg.api.ratiopolicy import RatioPolicySpec
from disagg.policy import Bounds, PolicyState, ServingProfile, decide
from disagg.policy.baselines import (
    SOURCES,
    ApaSettings,
    ApaState,
    DynamoLoadSettings,
    DynamoLoadState,
    DynamoSettings,
    DynamoSlaLoadSettings,
    DynamoSlaLoadState,
    DynamoState,
    apa_step,
    dynamo_load_step,
    dynamo_sla_load_step,
    dynamo_throughput_step,
)
from disagg.policy.capacity import load_models
from disagg.policy.types import ROLES, Observation
from disagg.twin import families
from disagg.twin.sim import PoolSpec, SimDeployment, SimResult, simulate
from disagg.twin.traffic import Request, load_trace

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"


@dataclass(frozen=True)
class TraceCase:
    """A trace file (``path``) or a generated family case (``synthetic``), with its SLO."""

    name: str
    path: Path | None
    ttft_slo_s: float
    itl_slo_s: float
    section: str = "shared"  # shared, train or test
    synthetic: families.Case | None = None

    @property
    def family(self) -> str:
        return self.synthetic.family if self.synthetic is not None else self.name

    def available(self) -> bool:
        return self.synthetic is not None or (self.path is not None and self.path.is_file())

    def requests(self) -> list[Request]:
        if self.synthetic is not None:
            return self.synthetic.requests()
        assert self.path is not None
        return load_trace(self.path)


# TTFT targets differ by workload: the long-context Mooncake trace (mean prompt 15k tokens, p99 66k) cannot
# meet a chat TTFT even on an idle replica (a 32k prefill alone takes 3.7 s on this profile).
CASES = (
    TraceCase("azure-conv", TRACES / "azure2023" / "AzureLLMInferenceTrace_conv.csv", 2.0, 0.05),
    TraceCase("azure-code", TRACES / "azure2023" / "AzureLLMInferenceTrace_code.csv", 2.0, 0.05),
    TraceCase("mooncake", TRACES / "mooncake" / "synthetic_trace.jsonl", 10.0, 0.05),
)


def family_cases(section: str) -> list[TraceCase]:
    """The generated cases of ``train``, ``validation`` or ``test`` (:mod:`disagg.twin.families`)."""
    pick = {"train": families.training_set, "validation": families.validation_set}
    cases = pick.get(section, families.test_set)()
    return [TraceCase(c.name, None, c.ttft_slo_s, c.itl_slo_s, section, c) for c in cases]


def case_sets(names: Sequence[str]) -> dict[str, list[TraceCase]]:
    out: dict[str, list[TraceCase]] = {}
    for name in names:
        out[name] = list(CASES) if name == "shared" else family_cases(name)
    return out


@dataclass(frozen=True)
class Setup:
    model: str = "llama-3.1-70b"
    gpu: str = "h100"
    dtype: str = "fp8"
    tp: int = 2
    start_prefill: int = 2
    start_decode: int = 2
    max_replicas: int = 16
    interval_s: float = 30.0
    startup_delay_s: float = 120.0
    window_s: float = 300.0  # hindsight-bound windows
    oscillation_s: float = 600.0
    # every run stops this long after the last arrival (the twin's default is 4 h): a contender whose
    # engines stall is charged for its requests (unfinished = missed), not for hours of stalled GPUs
    drain_s: float = 1800.0
    # the span every observation covers, as the live adapter queries Prometheus over the RatioPolicy's
    # metricWindowSeconds (default 120 s); None: one evaluation interval
    metric_window_s: float | None = 120.0

    def run(
        self, deployment: SimDeployment, reqs: Sequence[Request], controller: Controller | None = None
    ) -> SimResult:
        last = max((r.arrival_s for r in reqs), default=0.0)
        return simulate(
            deployment,
            reqs,
            controller=controller,
            interval_s=self.interval_s,
            max_time_s=last + self.drain_s,
            window_s=self.metric_window_s,
        )

    def deployment(
        self, prefill: int | None = None, decode: int | None = None, startup: float | None = None
    ) -> SimDeployment:
        def pool(n: int) -> PoolSpec:
            return PoolSpec(n, tp=self.tp, min_replicas=1, max_replicas=self.max_replicas)

        return SimDeployment(
            model=self.model,
            gpu=self.gpu,
            dtype=self.dtype,
            prefill=pool(self.start_prefill if prefill is None else prefill),
            decode=pool(self.start_decode if decode is None else decode),
            startup_delay_s=self.startup_delay_s if startup is None else startup,
            name="bench",
            # the deployment's start-up is known to the operator (measured on its pods, else its spec's
            # estimate): the ratio policies plan over it
            planned_startup_s=self.startup_delay_s,
        )

    def bounds(self) -> Bounds:
        """The bounds the ratio policies decide within, read from the deployment as ``disagg simulate``
        reads them (:meth:`SimDeployment.policy_bounds`: replica ranges, TP, GPU budget, profile,
        planned start-up)."""
        return self.deployment().policy_bounds()


Controller = Callable[[Observation], Mapping[str, int] | None]


class RatioController:
    """disagg's decide() as the twin's controller; ``log`` keeps every decision with its reasons."""

    def __init__(self, policy: RatioPolicySpec, bounds: Bounds) -> None:
        self.policy, self.bounds, self.state = policy, bounds, PolicyState()
        self.log: list[dict[str, object]] = []

    def __call__(self, obs: Observation) -> Mapping[str, int] | None:
        decision, self.state = decide(obs, self.policy, self.state, obs.time, self.bounds)
        self.log.append(
            {
                "time": obs.time,
                "current": {"prefill": obs.prefill.replicas, "decode": obs.decode.replicas},
                "targets": {"prefill": decision.prefill, "decode": decision.decode},
                "changed": decision.changed,
                "cause": decision.cause,
                "reasons": [{"code": r.code, "role": r.role, "message": r.message} for r in decision.reasons],
            }
        )
        return {"prefill": decision.prefill, "decode": decision.decode} if decision.changed else None


class BaselineController:
    """A baseline's pure step function ``(obs, state, now, settings[, models]) -> (targets, state)`` as the
    twin's controller; ``models``: the deployment's latency models, for the baselines that read a profile
    (Dynamo's planners read their pre-deployment profile; here the twin's own model, a perfect one)."""

    def __init__(
        self,
        step: Callable[..., tuple[Mapping[str, int] | None, Any]],
        settings: Any,
        state: Any,
        setup: Setup | None,
    ) -> None:
        self.step, self.settings, self.state = step, settings, state
        self.extra = (
            ()
            if setup is None
            else (load_models(ServingProfile(setup.model, setup.gpu, setup.tp, setup.tp, setup.dtype)),)
        )

    def __call__(self, obs: Observation) -> Mapping[str, int] | None:
        targets, self.state = self.step(obs, self.state, obs.time, self.settings, *self.extra)
        return targets


def ratio_policy(case: TraceCase, **kw: object) -> RatioPolicySpec:
    spec: dict[str, object] = {
        "slo": {
            "ttft": {"percentile": 90, "targetSeconds": case.ttft_slo_s},
            "itl": {"percentile": 90, "targetSeconds": case.itl_slo_s},
        },
        "evaluationIntervalSeconds": 30,
    }
    spec.update(kw)
    return RatioPolicySpec.model_validate(spec)


def controllers(case: TraceCase, setup: Setup) -> dict[str, Callable[[], Controller]]:
    """The single registry of contenders: name -> a factory of a fresh controller for one run."""
    bounds = setup.bounds()
    gpus = setup.tp
    return {
        "slo-feedback": lambda: RatioController(ratio_policy(case, algorithm="slo-feedback"), bounds),
        "model-based": lambda: RatioController(ratio_policy(case, algorithm="model-based"), bounds),
        "fixed-ratio 1:1": lambda: RatioController(
            ratio_policy(case, algorithm="fixed-ratio", fixedRatio={"prefill": 1, "decode": 1}), bounds
        ),
        "dynamo-throughput": lambda: BaselineController(
            dynamo_throughput_step,
            DynamoSettings(
                case.ttft_slo_s, case.itl_slo_s, prefill_gpus_per_engine=gpus, decode_gpus_per_engine=gpus
            ),
            DynamoState(),
            setup,
        ),
        "dynamo-load": lambda: BaselineController(
            dynamo_load_step,
            DynamoLoadSettings(prefill_gpus_per_engine=gpus, decode_gpus_per_engine=gpus),
            DynamoLoadState(),
            setup,
        ),
        "dynamo-sla-load": lambda: BaselineController(
            dynamo_sla_load_step,
            DynamoSlaLoadSettings(
                case.ttft_slo_s, case.itl_slo_s, prefill_gpus_per_engine=gpus, decode_gpus_per_engine=gpus
            ),
            DynamoSlaLoadState(),
            setup,
        ),
        "aibrix-apa": lambda: BaselineController(
            apa_step, ApaSettings(max_replicas=setup.max_replicas), ApaState(), None
        ),
    }


def contender_sources() -> list[str]:
    """What each baseline row reproduces, and from which source and version (disagg.policy.baselines)."""
    return [f"  {name}: {text}" for name, text in SOURCES.items()]


# --- measures -------------------------------------------------------------------------------------------


def _changes(result: SimResult) -> Iterator[tuple[float, str, int]]:
    """(time, role, direction +1/-1) of every change of a pool's target."""
    current: dict[str, int] = {}
    for t, targets in result.decisions:
        for role, n in targets.items():
            before = current.get(role)
            current[role] = n
            if before is None:
                before = getattr(result.deployment, role).replicas
            if n != before:
                yield t, role, 1 if n > before else -1


def actions_and_oscillations(result: SimResult, oscillation_s: float) -> tuple[int, int]:
    """Scaling actions (changes of a pool's target) and reversals of direction within ``oscillation_s``."""
    actions = 0
    reversals = 0
    last: dict[str, tuple[float, int]] = {}  # role -> (time, direction) of the last change
    for t, role, direction in _changes(result):
        actions += 1
        if role in last and last[role][1] != direction and t - last[role][0] <= oscillation_s:
            reversals += 1
        last[role] = (t, direction)
    return actions, reversals


def reversal_moves(result: SimResult) -> dict[str, list[tuple[float, int]]]:
    """Per pool, its direction reversals (a change against that pool's previous change, however long
    ago): (time, new direction)."""
    found: dict[str, list[tuple[float, int]]] = {}
    last: dict[str, int] = {}
    for t, role, direction in _changes(result):
        if role in last and last[role] != direction:
            found.setdefault(role, []).append((t, direction))
        last[role] = direction
    return found


def busiest_reversals(
    result: SimResult, span_s: float = 3600.0
) -> tuple[str, list[tuple[float, int]]] | None:
    """The pool and its reversals (time, new direction) within the ``span_s`` that holds most of them."""
    best: tuple[str, list[tuple[float, int]]] | None = None
    for role, moves in reversal_moves(result).items():
        for i, (t0, _) in enumerate(moves):
            inside = [m for m in moves[i:] if m[0] - t0 < span_s]
            if best is None or len(inside) > len(best[1]):
                best = (role, inside)
    return best


def reversals(result: SimResult, span_s: float = 3600.0) -> tuple[int, int]:
    """Direction reversals of the pool that reverses most: in the whole run, and the most within any
    ``span_s`` window."""
    total = max((len(m) for m in reversal_moves(result).values()), default=0)
    busiest = busiest_reversals(result, span_s)
    return total, len(busiest[1]) if busiest is not None else 0


def largest_shift(result: SimResult, span_s: float = 300.0) -> float | None:
    """Time of the largest jump in arrival rate between consecutive ``span_s`` windows."""
    arrivals = result.arrival
    if arrivals.size == 0:
        return None
    end = float(arrivals.max())
    best, best_t = 0.0, None
    t = span_s
    while t + span_s <= end:
        before = float(((arrivals >= t - span_s) & (arrivals < t)).sum()) / span_s
        after = float(((arrivals >= t) & (arrivals < t + span_s)).sum()) / span_s
        jump = (after + 1e-9) / (before + 1e-9) if after > before else 0.0
        if jump > best:
            best, best_t = jump, t
        t += span_s / 2
    return best_t


def recovery_time(result: SimResult, shift_t: float | None, case: TraceCase) -> float | None:
    """Seconds from the shift until per-window TTFT and ITL p90 are back under the SLO (two windows)."""
    if shift_t is None:
        return None
    ok_run = 0
    first_ok: float | None = None
    for point in result.timeline:
        t = point["time"]
        if t is None or t < shift_t:
            continue
        ttft, itl = point.get("ttft_p90"), point.get("itl_p90")
        good = ttft is not None and itl is not None and ttft <= case.ttft_slo_s and itl <= case.itl_slo_s
        if good:
            ok_run += 1
            first_ok = t if first_ok is None else first_ok
            if ok_run >= 2:
                return max(first_ok - shift_t - 30.0, 0.0)
        else:
            ok_run, first_ok = 0, None
    return math.inf


def meets(result: SimResult, case: TraceCase, attainment: float = 0.9) -> bool:
    return result.report(case.ttft_slo_s, case.itl_slo_s).slo_attainment >= attainment


def _lowest(test: Callable[[int], bool], lo: int, hi: int, hint: int | None = None) -> int:
    """The smallest x in [lo, hi] with ``test(x)``, ``test`` monotone and ``test(hi)`` known to hold;
    ``hint``: a guess tried first (and its neighbour), which settles it in two runs when it is right."""
    if hint is not None and lo <= hint < hi:
        if test(hint):
            if hint == lo or not test(hint - 1):
                return hint
            hi = hint - 1
        else:
            lo = hint + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if test(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def smallest_static(
    reqs: Sequence[Request],
    case: TraceCase,
    setup: Setup,
    startup: float | None = None,
    max_n: int = 16,
    hint: tuple[int, int] | None = None,
) -> tuple[int, int] | None:
    """The (prefill, decode) with the fewest GPUs whose static run meets 90% attainment (of equal ones,
    the fewest prefill replicas); None if even max_n:max_n does not. Assumes that adding a replica never
    lowers attainment: the fewest decode replicas that suffice with max_n prefill ones and the fewest
    prefill replicas that suffice with max_n decode ones bound the answer from below; splits are then
    tried by increasing size from that corner. ``hint`` (e.g. the previous window's answer) is tried first."""
    memo: dict[tuple[int, int], bool] = {}

    def ok(p: int, d: int) -> bool:
        if (p, d) not in memo:
            memo[(p, d)] = meets(setup.run(setup.deployment(p, d, startup), reqs), case)
        return memo[(p, d)]

    if ok(1, 1):
        return (1, 1)
    if not ok(max_n, max_n):
        return None
    d_floor = _lowest(lambda d: ok(max_n, d), 1, max_n, hint[1] if hint else None)
    p_floor = _lowest(lambda p: ok(p, max_n), 1, max_n, hint[0] if hint else None)
    for total in range(p_floor + d_floor, 2 * max_n + 1):
        for p in range(p_floor, min(max_n, total - d_floor) + 1):
            d = total - p
            if d <= max_n and ok(p, d):
                return (p, d)
    return (max_n, max_n)


best_static_split = smallest_static  # the name disagg.policy.baselines refers to


def hindsight_schedule(
    reqs: Sequence[Request], case: TraceCase, setup: Setup
) -> list[tuple[float, float, tuple[int, int] | None]]:
    """Per window (start, span, allocation): the smallest allocation meeting the SLO for that window's
    traffic alone, started empty and with no start-up delay (None: nothing up to 16:16 does)."""
    if not reqs:
        return []
    end = max(r.arrival_s for r in reqs)
    out: list[tuple[float, float, tuple[int, int] | None]] = []
    start = 0.0
    while start <= end:
        chunk = [
            replace(r, arrival_s=r.arrival_s - start)
            for r in reqs
            if start <= r.arrival_s < start + setup.window_s
        ]
        if chunk:
            span = max(min(setup.window_s, end - start), 1.0)
            hint = next((a for _, _, a in reversed(out) if a is not None), None)
            out.append((start, span, smallest_static(chunk, case, setup, startup=0.0, hint=hint)))
        start += setup.window_s
    return out


def hindsight_lower_bound(
    schedule: Sequence[tuple[float, float, tuple[int, int] | None]], setup: Setup
) -> float:
    """GPU-hours if every window ran the smallest allocation meeting the SLO for its traffic."""
    total = 0.0
    for _, span, alloc in schedule:
        gpus = setup.tp * (sum(alloc) if alloc else 2 * setup.max_replicas)
        total += gpus * span / 3600.0
    return total


class ScheduleController:
    """The hindsight schedule, followed with foresight: each window's allocation is asked for
    ``lead_s`` (the start-up delay) before the window begins, and held until that window ends, so its
    replicas are ready in time. A reference for what the hindsight bound is worth once start-up costs
    time: no policy can know the schedule, so it is neither a contender nor a bound."""

    def __init__(
        self, schedule: Sequence[tuple[float, float, tuple[int, int] | None]], lead_s: float
    ) -> None:
        self.schedule = [(start, alloc) for start, _, alloc in schedule if alloc is not None]
        self.lead_s = lead_s

    def at(self, t: float) -> tuple[int, int] | None:
        current = None
        for start, alloc in self.schedule:
            if start <= t:
                current = alloc
        return current

    def __call__(self, obs: Observation) -> Mapping[str, int] | None:
        now, ahead = self.at(obs.time), self.at(obs.time + self.lead_s)
        if now is None or ahead is None:
            return None
        return {"prefill": max(now[0], ahead[0]), "decode": max(now[1], ahead[1])}


@dataclass(frozen=True)
class Row:
    name: str
    attainment: float
    goodput_per_gpu_h: float
    gpu_hours: float
    actions: int
    oscillations: int
    recovery_s: float | None
    unfinished: int
    reversals: int = 0  # of the pool that reverses most, in the whole run
    reversals_max_h: int = 0  # of one pool within any hour


def evaluate(name: str, result: SimResult, case: TraceCase, setup: Setup, shift_t: float | None) -> Row:
    rep = result.report(case.ttft_slo_s, case.itl_slo_s)
    actions, osc = actions_and_oscillations(result, setup.oscillation_s)
    rev, rev_h = reversals(result)
    return Row(
        name,
        rep.slo_attainment,
        rep.goodput_per_gpu_hour,
        rep.gpu_hours,
        actions,
        osc,
        recovery_time(result, shift_t, case),
        int(result.arrival.size - result.finished),
        rev,
        rev_h,
    )


HEADER = (
    f"  {'policy':<22} {'SLO ok':>7} {'good/GPU-h':>11} {'GPU-h':>8} {'actions':>7} {'osc':>5} "
    f"{'rev':>4} {'rev/h':>5} {'recovery':>9} {'unfinished':>10}"
)


def fmt_row(r: Row) -> str:
    rec = "-" if r.recovery_s is None else ("never" if math.isinf(r.recovery_s) else f"{r.recovery_s:.0f}s")
    return (
        f"  {r.name:<22} {r.attainment:>7.1%} {r.goodput_per_gpu_h:>11.0f} {r.gpu_hours:>8.2f} "
        f"{r.actions:>7} {r.oscillations:>5} {r.reversals:>4} {r.reversals_max_h:>5} {rec:>9} "
        f"{r.unfinished:>10}"
    )


# --- targets --------------------------------------------------------------------------------------------

ATTAINMENT = 0.9
SCHEDULE_SLACK = 1.10  # GPU-hours within 10% of the schedule known ahead
MAX_REVERSALS_PER_H = 2


@dataclass(frozen=True)
class Verdict:
    """One contender on one case and start, against the targets (None: the target does not apply)."""

    attainment_ok: bool | None  # None: the best static split does not reach 90% (or none does)
    static_ratio: float | None  # GPU-hours / the best static split's
    schedule_ratio: float | None  # GPU-hours / the schedule known ahead's
    reversals_max_h: int

    def misses(self) -> list[str]:
        out = []
        if self.attainment_ok is False:
            out.append("attainment")
        if self.static_ratio is not None and self.static_ratio > 1.0 + 1e-9:
            out.append("GPU-h>static")
        if self.schedule_ratio is not None and self.schedule_ratio > SCHEDULE_SLACK + 1e-9:
            out.append("GPU-h>schedule+10%")
        if self.reversals_max_h > MAX_REVERSALS_PER_H:
            out.append("reversals")
        return out


def verdict(row: Row, static: Row | None, schedule: Row | None) -> Verdict:
    reaches = static is not None and static.attainment >= ATTAINMENT
    return Verdict(
        (row.attainment >= ATTAINMENT) if reaches else None,
        row.gpu_hours / static.gpu_hours if static is not None and static.gpu_hours > 0 else None,
        row.gpu_hours / schedule.gpu_hours if schedule is not None and schedule.gpu_hours > 0 else None,
        row.reversals_max_h,
    )


def target_check(rows: Sequence[Row], static: Row | None, schedule: Row | None) -> list[str]:
    """The targets, per ratio policy: attainment >= 90% where the best static split reaches it; GPU-hours
    no more than the best static split's and within 10% of the schedule known ahead; at most 2 direction
    reversals of a pool within any hour."""
    out = []
    for r in rows:
        if r.name not in RATIO_POLICIES:
            continue
        v = verdict(r, static, schedule)
        checks = []
        if v.attainment_ok is None:
            checks.append("attainment: n/a (no static split reaches 90%)")
        else:
            checks.append(f"attainment>=90% {'yes' if v.attainment_ok else 'NO'}")
        if v.static_ratio is not None:
            ok = v.static_ratio <= 1.0 + 1e-9
            checks.append(f"vs best static {v.static_ratio - 1:+.0%} GPU-h ({'yes' if ok else 'NO'})")
        if v.schedule_ratio is not None:
            ok = v.schedule_ratio <= SCHEDULE_SLACK + 1e-9
            checks.append(
                f"vs schedule known ahead {v.schedule_ratio - 1:+.0%} GPU-h ({'yes' if ok else 'NO'})"
            )
        ok = v.reversals_max_h <= MAX_REVERSALS_PER_H
        checks.append(f"reversals {v.reversals_max_h}/h ({'yes' if ok else 'NO'})")
        out.append(f"  targets {r.name}: " + "; ".join(checks))
    return out


RATIO_POLICIES = ("slo-feedback", "model-based", "fixed-ratio 1:1")


# --- why a target was missed, from the decision log ---------------------------------------------------

Schedule = Sequence[tuple[float, float, "tuple[int, int] | None"]]
WHY_WINDOWS = 2  # the lowest-attainment windows a missed attainment names


def last_word(entry: Mapping[str, Any], role: str) -> str:
    """The code of the last reason a decision gives for ``role``: the one that settled the pool's target
    (a hold such as Stabilizing or ReversalBudget comes after the sizing it overrules)."""
    codes = [r["code"] for r in entry.get("reasons", ()) if r.get("role") in (role, None)]
    return codes[-1] if codes else "no reason"


def scheduled(schedule: Schedule, t: float) -> tuple[int, int] | None:
    """The hindsight schedule's allocation for the window holding ``t``."""
    for start, span, alloc in schedule:
        if start <= t < start + span:
            return alloc
    return None


def excess_gpu_hours(
    log: Sequence[Mapping[str, Any]], schedule: Schedule, tp: int, interval_s: float
) -> dict[str, tuple[float, float, dict[str, float]]]:
    """Per pool: GPU-hours its targets ran above and below the hindsight schedule's allocation for the
    same window, the excess split by the reason code that had the last word at each evaluation. Each
    decision's targets count until the next decision (the twin allocates a target at once and frees a
    replica once it drains)."""
    out: dict[str, tuple[float, float, dict[str, float]]] = {}
    for idx, role in enumerate(ROLES):
        above = below = 0.0
        by_code: dict[str, float] = {}
        for i, entry in enumerate(log):
            t = float(entry["time"])
            alloc = scheduled(schedule, t)
            if alloc is None:
                continue
            end = float(log[i + 1]["time"]) if i + 1 < len(log) else t + interval_s
            hours = tp * (end - t) / 3600.0
            diff = int(entry["targets"][role]) - alloc[idx]
            if diff > 0:
                code = last_word(entry, role)
                by_code[code] = by_code.get(code, 0.0) + diff * hours
                above += diff * hours
            else:
                below -= diff * hours
        out[role] = (above, below, by_code)
    return out


def window_attainment(
    result: SimResult, case: TraceCase, schedule: Schedule
) -> list[tuple[float, float, float]]:
    """Per hindsight window: (start, span, share of its arrivals that met both targets)."""
    met = result.met_ttft(case.ttft_slo_s) & result.met_itl(case.itl_slo_s)
    out = []
    for start, span, _ in schedule:
        mask = (result.arrival >= start) & (result.arrival < start + span)
        n = int(mask.sum())
        if n:
            out.append((start, span, float(met[mask].sum()) / n))
    return out


def _codes(entries: Sequence[Mapping[str, Any]], role: str) -> str:
    """The last-word codes of these evaluations, most frequent first."""
    return "/".join(code for code, _ in Counter(last_word(e, role) for e in entries).most_common())


def explain_misses(
    name: str,
    verdict_: Verdict,
    log: Sequence[Mapping[str, Any]],
    result: SimResult,
    case: TraceCase,
    setup: Setup,
    schedule: Schedule,
) -> list[str]:
    """Why a ratio policy missed its targets, read from its decision log against the hindsight schedule:
    for a GPU-hour miss, where its pools ran above the schedule and which reason held them there; for an
    attainment miss, its worst windows with what each pool had, what the schedule gave it, and which
    reason had the last word."""
    misses = verdict_.misses()
    if not misses or not log:
        return []
    lines = []
    if any(m.startswith("GPU-h") for m in misses):
        parts = []
        for role, (above, below, by_code) in excess_gpu_hours(
            log, schedule, setup.tp, setup.interval_s
        ).items():
            top = [kv for kv in sorted(by_code.items(), key=lambda kv: -kv[1]) if kv[1] >= 0.05]
            held = ", ".join(f"{code} {gpu_h:.1f}" for code, gpu_h in top)
            parts.append(f"{role} +{above:.1f}/-{below:.1f}" + (f" ({held})" if held else ""))
        lines.append(
            f"  why {name}: GPU-h above/below the hindsight schedule, by last word: " + "; ".join(parts)
        )
    if "attainment" in misses:
        worst = sorted(window_attainment(result, case, schedule), key=lambda w: w[2])[:WHY_WINDOWS]
        for start, span, share in sorted(worst):
            inside = [e for e in log if start <= float(e["time"]) < start + span]
            alloc = scheduled(schedule, start)
            pools = []
            for idx, role in enumerate(ROLES):
                had = [int(e["current"][role]) for e in inside]
                sizes = (
                    f"{min(had)}-{max(had)}"
                    if had and min(had) != max(had)
                    else (str(had[0]) if had else "?")
                )
                sched = f" (schedule {alloc[idx]})" if alloc is not None else ""
                pools.append(f"{role} {sizes}{sched}, {_codes(inside, role) or 'no decision'}")
            lines.append(
                f"  why {name}: {start:.0f}-{start + span:.0f}s met {share:.0%}: " + "; ".join(pools)
            )
    busiest = busiest_reversals(result) if "reversals" in misses else None
    if busiest is not None:
        role, revs = busiest
        at = {float(e["time"]): e for e in log}
        moves = ", ".join(
            f"{'up' if d > 0 else 'down'} at {t:.0f}s "
            f"({last_word(at[t], role) if t in at else 'no decision'})"
            for t, d in revs
        )
        lines.append(f"  why {name}: {role} reversed {len(revs)} times within an hour: {moves}")
    return lines


# --- one case -------------------------------------------------------------------------------------------


@dataclass
class CaseResult:
    case: TraceCase
    requests: int
    static: Row | None  # the best static split (does not depend on the start)
    bound: float  # hindsight lower bound, GPU-hours
    rows: dict[str, list[Row]] = field(default_factory=dict)  # start -> contender rows
    schedule: dict[str, Row] = field(default_factory=dict)  # start -> schedule known ahead
    lines: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    # start -> ratio policy -> why it missed its targets (explain_misses)
    why: dict[str, dict[str, list[str]]] = field(default_factory=dict)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "_" for c in text)


def write_log(
    log_dir: Path, case: TraceCase, start: str, name: str, log: Sequence[Mapping[str, object]]
) -> None:
    path = log_dir / case.section / f"{_slug(case.name)}.{start}.{_slug(name)}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for entry in log:
            f.write(json.dumps(entry) + "\n")


def references(
    reqs: Sequence[Request], case: TraceCase, setup: Setup, cache_dir: Path | None
) -> tuple[list[tuple[float, float, tuple[int, int] | None]], tuple[int, int] | None]:
    """The hindsight schedule and the best static split (the slow part of a case), kept in ``cache_dir``
    when given, keyed by everything they depend on: the requests, the SLO and the deployment."""
    key = ""
    if cache_dir is not None:
        digest = hashlib.sha256(repr((case.ttft_slo_s, case.itl_slo_s, setup)).encode())
        for r in reqs:
            digest.update(f"{r.arrival_s:.6f},{r.prompt_tokens},{r.output_tokens};".encode())
        key = digest.hexdigest()[:24]
        path = cache_dir / f"{key}.json"
        if path.is_file():
            data = json.loads(path.read_text())
            sched = [(a, b, tuple(c) if c else None) for a, b, c in data["schedule"]]
            static = tuple(data["static"]) if data["static"] else None
            return sched, static
    schedule = hindsight_schedule(reqs, case, setup)
    allocs = [a for _, _, a in schedule if a is not None]
    peak = (max(a[0] for a in allocs), max(a[1] for a in allocs)) if allocs else None
    static = smallest_static(reqs, case, setup, hint=peak)
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        (cache_dir / f"{key}.json").write_text(json.dumps({"schedule": schedule, "static": static}))
    return schedule, static


def run_case(
    case: TraceCase,
    setup: Setup,
    quick: bool,
    starts: Sequence[str],
    log_dir: Path | None = None,
    only: Sequence[str] = (),
    cache_dir: Path | None = None,
) -> CaseResult:
    """Every contender from each start: ``cold`` (the Setup's 2P:2D, whatever the traffic) and ``warm``
    (the allocation the hindsight schedule gives the first window: a service that was already running
    and sized for the traffic it had been seeing, which is how a trace taken from a live service
    begins). The best static split and the hindsight bound do not depend on the start; the schedule
    known ahead runs from each start."""
    t_case = time.perf_counter()
    lines: list[str] = []
    reqs = case.requests()
    if quick:
        reqs = [r for r in reqs if r.arrival_s < 900.0]
    lines.append(
        f"\n== {case.name}: {len(reqs)} requests, SLO TTFT p90 <= {case.ttft_slo_s}s, "
        f"ITL <= {case.itl_slo_s * 1000:.0f}ms"
    )
    schedule, static = references(reqs, case, setup, cache_dir)
    bound = hindsight_lower_bound(schedule, setup)
    out = CaseResult(case, len(reqs), None, bound, lines=lines)
    shift_t: float | None = None
    first = schedule[0][2] if schedule and schedule[0][2] else (setup.start_prefill, setup.start_decode)
    for start in starts:
        run_setup = setup
        if start == "warm":
            run_setup = replace(setup, start_prefill=first[0], start_decode=first[1])
        lines.append(f"  -- start {start}: {run_setup.start_prefill}P:{run_setup.start_decode}D")
        rows: list[Row] = []
        runs: list[tuple[str, SimResult, list[Mapping[str, Any]]]] = []
        for name, make in controllers(case, run_setup).items():
            if only and name not in only:
                continue
            t0 = time.perf_counter()
            controller = make()
            result = run_setup.run(run_setup.deployment(), reqs, controller)
            if shift_t is None:
                shift_t = largest_shift(result)
            rows.append(evaluate(name, result, case, run_setup, shift_t))
            lines.append(f"{fmt_row(rows[-1])}   ({time.perf_counter() - t0:.1f}s)")
            log = getattr(controller, "log", None)
            if isinstance(log, list):
                runs.append((name, result, log))
                if log_dir is not None:
                    write_log(log_dir, case, start, name, log)
        if static is not None and out.static is None:
            result = setup.run(setup.deployment(*static), reqs)
            out.static = evaluate(f"best static {static[0]}P:{static[1]}D", result, case, setup, shift_t)
        if out.static is not None:
            lines.append(fmt_row(out.static))
        else:
            lines.append("  best static: no split up to 16:16 reaches 90%")
        lines.append(f"  {'hindsight lower bound':<22} {'':>7} {'':>11} {bound:>8.2f}")
        ref: Row | None = None
        if schedule and any(a for _, _, a in schedule):
            result = run_setup.run(
                run_setup.deployment(), reqs, ScheduleController(schedule, setup.startup_delay_s)
            )
            ref = evaluate("schedule known ahead", result, case, run_setup, shift_t)
            out.schedule[start] = ref
            lines.append(f"{fmt_row(ref)}   (reference: the hindsight schedule, asked for start-up ahead)")
        lines.extend(target_check(rows, out.static, ref))
        by_name = {r.name: r for r in rows}
        for name, result, log in runs:  # the ratio policies: the controllers that keep a decision log
            why = explain_misses(
                name, verdict(by_name[name], out.static, ref), log, result, case, run_setup, schedule
            )
            out.why.setdefault(start, {})[name] = why
            lines.extend(why)
        out.rows[start] = rows
    plan = ", ".join(f"{a[0]}P:{a[1]}D" if a else "none" for _, _, a in schedule)
    lines.append(
        f"  (largest traffic shift at t={shift_t}s; hindsight per {setup.window_s:.0f}s window: {plan})"
    )
    out.elapsed_s = time.perf_counter() - t_case
    lines.append(f"  ({case.name}: {out.elapsed_s:.0f}s)")
    return out


def _run_case_job(
    args: tuple[TraceCase, Setup, bool, tuple[str, ...], Path | None, tuple[str, ...], Path | None],
) -> CaseResult:
    return run_case(*args)


# --- summary --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Worst:
    """A contender's worst case over some (case, start) pairs."""

    attainment: float | None  # lowest attainment among cases whose best static split reaches 90%
    static_ratio: float | None  # highest GPU-hours / best static
    schedule_ratio: float | None  # highest GPU-hours / schedule known ahead
    reversals_max_h: int
    misses: int  # target misses, all targets and pairs together
    attainment_misses: int  # pairs missing the attainment target
    pairs: int  # (case, start) pairs counted


def worst(entries: Sequence[tuple[Row, Verdict]]) -> Worst:
    def top(xs: Sequence[float | None], pick: Callable[[Sequence[float]], float]) -> float | None:
        vals = [x for x in xs if x is not None]
        return pick(vals) if vals else None

    return Worst(
        top([r.attainment for r, v in entries if v.attainment_ok is not None], min),
        top([v.static_ratio for _, v in entries], max),
        top([v.schedule_ratio for _, v in entries], max),
        max((v.reversals_max_h for _, v in entries), default=0),
        sum(len(v.misses()) for _, v in entries),
        sum(v.attainment_ok is False for _, v in entries),
        len(entries),
    )


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


SUMMARY_HEADER = (
    f"    {'case':<24} {'start':<5} {'SLO ok':>7} {'static':>7} {'GPU-h':>8} {'/static':>8} {'/sched':>7} "
    f"{'rev/h':>5}  misses"
)


def _worst_line(label: str, w: Worst) -> str:
    return (
        f"    {label:<30} {_pct(w.attainment):>7} {'':>7} {'':>8} {_ratio(w.static_ratio):>8} "
        f"{_ratio(w.schedule_ratio):>7} {w.reversals_max_h:>5}  "
        f"{w.misses} in {w.pairs} runs ({w.attainment_misses} attainment)"
    )


def rank_key(w: Worst) -> tuple[float, ...]:
    """Best worst case first: the SLO before the GPUs. Fewest runs missing the attainment target, then
    fewest target misses of any kind, then highest worst attainment, then lowest worst GPU-hour ratio to
    the best static split, then to the schedule known ahead, then fewest reversals."""
    return (
        w.attainment_misses,
        w.misses,
        -(w.attainment if w.attainment is not None else 1.0),
        w.static_ratio if w.static_ratio is not None else 0.0,
        w.schedule_ratio if w.schedule_ratio is not None else 0.0,
        w.reversals_max_h,
    )


def summarize(section: str, results: Sequence[CaseResult]) -> tuple[list[str], dict[str, Worst]]:
    """Per contender: one line per case and start with the measures behind each target, and the worst
    case over all of them; then one worst-case line per contender, best first."""
    lines = [
        f"\n#### summary, set {section}: {len(results)} cases (targets: attainment >= 90% where the best "
        f"static split reaches it; GPU-h <= best static; GPU-h <= 1.1 x schedule known ahead; "
        f"<= {MAX_REVERSALS_PER_H} reversals of a pool within any hour)"
    ]
    names: list[str] = []
    for res in results:
        for rows in res.rows.values():
            names.extend(r.name for r in rows if r.name not in names)
    worsts: dict[str, Worst] = {}
    for name in names:
        lines.append(f"\n  {name}")
        lines.append(SUMMARY_HEADER)
        entries: list[tuple[Row, Verdict]] = []
        for res in results:
            for start, rows in res.rows.items():
                for r in rows:
                    if r.name != name:
                        continue
                    v = verdict(r, res.static, res.schedule.get(start))
                    entries.append((r, v))
                    static = "none" if res.static is None else f"{res.static.attainment:.1%}"
                    lines.append(
                        f"    {res.case.name:<24} {start:<5} {r.attainment:>7.1%} {static:>7} "
                        f"{r.gpu_hours:>8.2f} "
                        f"{_ratio(v.static_ratio):>8} {_ratio(v.schedule_ratio):>7} {r.reversals_max_h:>5}  "
                        f"{', '.join(v.misses()) or '-'}"
                    )
        worsts[name] = worst(entries)
        lines.append(_worst_line("worst case", worsts[name]))
    lines.append(f"\n  worst case per contender, set {section} (best worst case first)")
    lines.append(
        f"    {'contender':<30} {'SLO ok':>7} {'':>7} {'':>8} {'/static':>8} {'/sched':>7} "
        f"{'rev/h':>5}  misses"
    )
    for name, w in sorted(worsts.items(), key=lambda kv: rank_key(kv[1])):
        lines.append(_worst_line(name, w))
    if worsts:
        best = min(worsts, key=lambda n: rank_key(worsts[n]))
        lines.append(f"  best worst case on set {section}: {best}")
    return lines, worsts


def _jsonable(x: object) -> object:
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    return x


def as_json(
    setup: Setup, results: Mapping[str, Sequence[CaseResult]], worsts: Mapping[str, Mapping[str, Worst]]
) -> object:
    cases = []
    for section, rs in results.items():
        for res in rs:
            c = res.case
            syn = c.synthetic
            entry: dict[str, object] = {
                "set": section,
                "case": c.name,
                "family": c.family,
                "split": syn.split if syn is not None else "shared",
                "seed": syn.seed if syn is not None else None,
                "params": families.params_dict(syn.params) if syn is not None else None,
                "trace": str(c.path) if c.path is not None else None,
                "ttft_slo_s": c.ttft_slo_s,
                "itl_slo_s": c.itl_slo_s,
                "requests": res.requests,
                "best_static": asdict(res.static) if res.static is not None else None,
                "hindsight_lower_bound_gpu_h": res.bound,
                "schedule_known_ahead": {s: asdict(r) for s, r in res.schedule.items()},
                "rows": [],
            }
            rows = entry["rows"]
            assert isinstance(rows, list)
            for start, rs_ in res.rows.items():
                for r in rs_:
                    v = verdict(r, res.static, res.schedule.get(start))
                    why = res.why.get(start, {}).get(r.name, [])
                    rows.append(
                        {
                            "start": start,
                            **asdict(r),
                            "verdict": {**asdict(v), "misses": v.misses()},
                            "why": [line.strip() for line in why],
                        }
                    )
            cases.append(entry)
    return _jsonable(
        {
            "setup": asdict(setup),
            "cases": cases,
            "worst": {s: {n: asdict(w) for n, w in ws.items()} for s, ws in worsts.items()},
        }
    )


SETS = ("train", "validation", "test", "shared")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--set",
        dest="sets",
        choices=(*SETS, "all"),
        action="append",
        help="which cases: the shared traces, the training, validation or test families, or all (default: "
        "test and shared, each in its own section); repeatable",
    )
    parser.add_argument("--trace", action="append", help="only this case (repeatable), e.g. azure-conv")
    parser.add_argument("--quick", action="store_true", help="first 15 minutes of each trace only")
    parser.add_argument(
        "--metric-window",
        type=float,
        default=Setup.metric_window_s,
        help="seconds each observation covers (0: one evaluation interval)",
    )
    parser.add_argument(
        "--start",
        choices=("cold", "warm", "both"),
        default="both",
        help="cold: every contender starts at 2P:2D; warm: at the first window's hindsight allocation",
    )
    parser.add_argument("--jobs", type=int, default=2, help="cases run in parallel (processes)")
    parser.add_argument("--json", type=Path, help="write every row, reference and summary here as JSON")
    parser.add_argument(
        "--log", type=Path, help="write each ratio policy's decisions (time, targets, cause, reasons) here"
    )
    parser.add_argument("--only", action="append", default=[], help="only this contender (repeatable)")
    parser.add_argument(
        "--reference-cache",
        type=Path,
        help="keep each case's best static split and hindsight schedule here (they do not depend on "
        "the policies; computing them is most of a run)",
    )
    args = parser.parse_args(argv)
    chosen = args.sets or ["test", "shared"]
    sections = [s for s in SETS if s in chosen or ("all" in chosen and s != "validation")]
    if "test" in sections and "shared" in sections:  # the held-out sets, test first
        sections = [s for s in ("train", "validation", "test", "shared") if s in sections]
    starts = ("cold", "warm") if args.start == "both" else (args.start,)
    setup = Setup(metric_window_s=args.metric_window or None)
    sets = case_sets(sections)
    known = {c.name for cs in sets.values() for c in cs}
    for name in args.trace or ():
        if name not in known:
            parser.error(
                f"--trace: no case {name!r} in sets {', '.join(sections)} (known: {', '.join(sorted(known))})"
            )
    todo: list[tuple[str, TraceCase]] = []
    for section, cases in sets.items():
        for case in cases:
            if args.trace and case.name not in args.trace:
                continue
            if not case.available():
                print(f"\n== {case.name}: {case.path} not found; skipped", file=sys.stderr)
                continue
            todo.append((section, case))
    print(
        f"deployment: {setup.model} {setup.dtype} TP{setup.tp} on {setup.gpu}, cold start "
        f"{setup.start_prefill}P:{setup.start_decode}D, startup {setup.startup_delay_s:.0f}s, "
        f"evaluation every {setup.interval_s:.0f}s, metrics over "
        f"{setup.metric_window_s or setup.interval_s:.0f}s; sets: {', '.join(sections)}; "
        f"{len(todo)} cases, {args.jobs} jobs"
    )
    print("baselines:", *contender_sources(), sep="\n")
    print(HEADER)
    t0 = time.perf_counter()
    only = tuple(args.only)
    jobs = [(case, setup, args.quick, starts, args.log, only, args.reference_cache) for _, case in todo]
    results: dict[str, list[CaseResult]] = {s: [] for s in sections}
    printed: set[str] = set()

    def take(section: str, res: CaseResult) -> None:
        if section not in printed:
            printed.add(section)
            print(f"\n### set {section}")
        print("\n".join(res.lines), flush=True)
        results[section].append(res)

    if args.jobs > 1 and len(jobs) > 1:
        with multiprocessing.get_context("fork").Pool(min(args.jobs, len(jobs))) as pool:
            for (section, _), res in zip(todo, pool.imap(_run_case_job, jobs), strict=True):
                take(section, res)
    else:
        for (section, _), job in zip(todo, jobs, strict=True):
            take(section, _run_case_job(job))
    worsts: dict[str, dict[str, Worst]] = {}
    for section in sections:
        if results[section]:
            lines, worsts[section] = summarize(section, results[section])
            print("\n".join(lines))
    print(f"\n(all cases: {time.perf_counter() - t0:.0f}s)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(as_json(setup, results, worsts), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Replay each trace in ../shared/traces through the twin with every ratio policy and baseline.

Same deployment (Llama-3.1-70B FP8, TP2 per replica on H100, both pools), same start, same bounds and
same SLOs for every policy on a trace. Two starts, each printed as its own table: ``cold`` (2 prefill + 2
decode whatever the traffic: shows how fast a policy finds its size) and ``warm`` (the first 5-minute
window's hindsight allocation for every contender: a service already running and sized for the traffic it
had been seeing, which is how a trace cut from a live service begins). Prints, side by side: SLO
attainment, goodput per GPU-hour, GPU-hours, scaling actions, oscillations (direction reversals of a pool
within 10 minutes), time to recover after the largest traffic shift; plus the best static split in
hindsight and a hindsight lower bound on GPU-hours (per 5-minute window, the smallest allocation that
meets the SLO for that window's traffic, ignoring start-up delay). Every ratio policy runs with the
RatioPolicy defaults and only the trace's SLO set (one policy for all traces, no per-trace tuning). Every
run stops 30 minutes after the last arrival; requests not finished by then are counted (``unfinished``)
and missed.

    .venv/bin/python bench/policy_goodput.py [--trace NAME] [--quick] [--start cold|warm|both]

Numbers are printed, never asserted (benchmarks are not tests).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from disagg.api.ratiopolicy import RatioPolicySpec
from disagg.policy import Bounds, PolicyState, RoleBounds, ServingProfile, decide
from disagg.policy.baselines import (
    ApaSettings,
    ApaState,
    DynamoSettings,
    DynamoState,
    apa_step,
    dynamo_throughput_step,
)
from disagg.policy.model_based import load_models
from disagg.policy.types import Observation
from disagg.twin.sim import PoolSpec, SimDeployment, SimResult, simulate
from disagg.twin.traffic import Request, load_trace

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"


@dataclass(frozen=True)
class TraceCase:
    name: str
    path: Path
    ttft_slo_s: float
    itl_slo_s: float


# TTFT targets differ by workload: the long-context Mooncake trace (mean prompt 15k tokens, p99 66k) cannot
# meet a chat TTFT even on an idle replica (a 32k prefill alone takes 3.7 s on this profile).
CASES = (
    TraceCase("azure-conv", TRACES / "azure2023" / "AzureLLMInferenceTrace_conv.csv", 2.0, 0.05),
    TraceCase("azure-code", TRACES / "azure2023" / "AzureLLMInferenceTrace_code.csv", 2.0, 0.05),
    TraceCase("mooncake", TRACES / "mooncake" / "synthetic_trace.jsonl", 10.0, 0.05),
)


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
        )

    def bounds(self) -> Bounds:
        rb = RoleBounds(1, self.max_replicas, gpus_per_replica=self.tp)
        return Bounds(
            prefill=rb, decode=rb, profile=ServingProfile(self.model, self.gpu, self.tp, self.tp, self.dtype)
        )


Controller = Callable[[Observation], Mapping[str, int] | None]


class RatioController:
    """disagg's decide() as the twin's controller."""

    def __init__(self, policy: RatioPolicySpec, bounds: Bounds) -> None:
        self.policy, self.bounds, self.state = policy, bounds, PolicyState()

    def __call__(self, obs: Observation) -> Mapping[str, int] | None:
        decision, self.state = decide(obs, self.policy, self.state, obs.time, self.bounds)
        return {"prefill": decision.prefill, "decode": decision.decode} if decision.changed else None


class DynamoController:
    def __init__(self, settings: DynamoSettings, setup: Setup) -> None:
        self.settings = settings
        self.models = load_models(ServingProfile(setup.model, setup.gpu, setup.tp, setup.tp, setup.dtype))
        self.state = DynamoState()

    def __call__(self, obs: Observation) -> Mapping[str, int] | None:
        targets, self.state = dynamo_throughput_step(obs, self.state, obs.time, self.settings, self.models)
        return targets


class ApaController:
    def __init__(self, settings: ApaSettings) -> None:
        self.settings, self.state = settings, ApaState()

    def __call__(self, obs: Observation) -> Mapping[str, int] | None:
        targets, self.state = apa_step(obs, self.state, obs.time, self.settings)
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
    bounds = setup.bounds()
    return {
        "slo-feedback": lambda: RatioController(ratio_policy(case), bounds),
        "model-based": lambda: RatioController(ratio_policy(case, algorithm="model-based"), bounds),
        "fixed-ratio 1:1": lambda: RatioController(
            ratio_policy(case, algorithm="fixed-ratio", fixedRatio={"prefill": 1, "decode": 1}), bounds
        ),
        "dynamo-throughput": lambda: DynamoController(
            DynamoSettings(
                case.ttft_slo_s,
                case.itl_slo_s,
                prefill_gpus_per_engine=setup.tp,
                decode_gpus_per_engine=setup.tp,
            ),
            setup,
        ),
        "aibrix-apa": lambda: ApaController(ApaSettings(max_replicas=setup.max_replicas)),
    }


# --- measures -------------------------------------------------------------------------------------------


def actions_and_oscillations(result: SimResult, oscillation_s: float) -> tuple[int, int]:
    """Scaling actions (changes of a pool's target) and reversals of direction within ``oscillation_s``."""
    actions = 0
    reversals = 0
    last: dict[str, tuple[float, int]] = {}  # role -> (time, direction) of the last change
    current: dict[str, int] = {}
    for t, targets in result.decisions:
        for role, n in targets.items():
            before = current.get(role)
            current[role] = n
            if before is None:
                before = getattr(result.deployment, role).replicas
            if n == before:
                continue
            actions += 1
            direction = 1 if n > before else -1
            if role in last and last[role][1] != direction and t - last[role][0] <= oscillation_s:
                reversals += 1
            last[role] = (t, direction)
    return actions, reversals


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


def smallest_static(
    reqs: Sequence[Request], case: TraceCase, setup: Setup, startup: float | None = None, max_n: int = 16
) -> tuple[int, int] | None:
    """The (prefill, decode) with the fewest GPUs whose static run meets 90% attainment."""
    best: tuple[int, int] | None = None
    for p in range(1, max_n + 1):
        if best is not None and p + 1 > sum(best):
            break
        for d in range(1, max_n + 1):
            if best is not None and p + d >= sum(best):
                break
            if meets(setup.run(setup.deployment(p, d, startup), reqs), case):
                best = (p, d)
                break
    return best


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
            out.append((start, span, smallest_static(chunk, case, setup, startup=0.0)))
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


def evaluate(name: str, result: SimResult, case: TraceCase, setup: Setup, shift_t: float | None) -> Row:
    rep = result.report(case.ttft_slo_s, case.itl_slo_s)
    actions, osc = actions_and_oscillations(result, setup.oscillation_s)
    return Row(
        name,
        rep.slo_attainment,
        rep.goodput_per_gpu_hour,
        rep.gpu_hours,
        actions,
        osc,
        recovery_time(result, shift_t, case),
        int(result.arrival.size - result.finished),
    )


def fmt_row(r: Row) -> str:
    rec = "-" if r.recovery_s is None else ("never" if math.isinf(r.recovery_s) else f"{r.recovery_s:.0f}s")
    return (
        f"  {r.name:<22} {r.attainment:>7.1%} {r.goodput_per_gpu_h:>11.0f} {r.gpu_hours:>8.2f} "
        f"{r.actions:>7} {r.oscillations:>5} {rec:>9} {r.unfinished:>10}"
    )


def run_case(case: TraceCase, setup: Setup, quick: bool, starts: Sequence[str]) -> dict[str, list[Row]]:
    """Every contender from each start: ``cold`` (the Setup's 2P:2D, whatever the traffic) and ``warm``
    (the allocation the hindsight schedule gives the first window: a service that was already running
    and sized for the traffic it had been seeing, which is how a trace taken from a live service
    begins). The best static split and the hindsight bound do not depend on the start."""
    reqs = load_trace(case.path)
    if quick:
        reqs = [r for r in reqs if r.arrival_s < 900.0]
    print(
        f"\n== {case.name}: {len(reqs)} requests, SLO TTFT p90 <= {case.ttft_slo_s}s, "
        f"ITL <= {case.itl_slo_s * 1000:.0f}ms"
    )
    schedule = hindsight_schedule(reqs, case, setup)
    bound = hindsight_lower_bound(schedule, setup)
    static = smallest_static(reqs, case, setup)
    static_row: Row | None = None
    shift_t: float | None = None
    tables: dict[str, list[Row]] = {}
    first = schedule[0][2] if schedule and schedule[0][2] else (setup.start_prefill, setup.start_decode)
    for start in starts:
        run_setup = setup
        if start == "warm":
            run_setup = replace(setup, start_prefill=first[0], start_decode=first[1])
        print(f"  -- start {start}: {run_setup.start_prefill}P:{run_setup.start_decode}D")
        rows: list[Row] = []
        for name, make in controllers(case, run_setup).items():
            t0 = time.perf_counter()
            result = run_setup.run(run_setup.deployment(), reqs, make())
            if shift_t is None:
                shift_t = largest_shift(result)
            rows.append(evaluate(name, result, case, run_setup, shift_t))
            print(fmt_row(rows[-1]), f"  ({time.perf_counter() - t0:.1f}s)", flush=True)
        if static is not None and static_row is None:
            result = setup.run(setup.deployment(*static), reqs)
            static_row = evaluate(f"best static {static[0]}P:{static[1]}D", result, case, setup, shift_t)
        if static_row is not None:
            rows.append(static_row)
            print(fmt_row(static_row), flush=True)
        else:
            print("  best static: no split up to 16:16 reaches 90%")
        print(f"  {'hindsight lower bound':<22} {'':>7} {'':>11} {bound:>8.2f}")
        if start == "warm" and schedule and schedule[0][2]:
            result = run_setup.run(
                run_setup.deployment(), reqs, ScheduleController(schedule, setup.startup_delay_s)
            )
            ref = evaluate("schedule known ahead", result, case, run_setup, shift_t)
            print(fmt_row(ref), "  (reference: the hindsight schedule, asked for start-up ahead)")
        for line in target_check(rows, bound):
            print(line)
        tables[start] = rows
    plan = ", ".join(f"{a[0]}P:{a[1]}D" if a else "none" for _, _, a in schedule)
    print(f"  (largest traffic shift at t={shift_t}s; hindsight per {setup.window_s:.0f}s window: {plan})")
    return tables


RATIO_POLICIES = ("slo-feedback", "model-based", "fixed-ratio 1:1")


def target_check(rows: Sequence[Row], bound: float) -> list[str]:
    """The issue's targets per ratio policy: attainment >= 90%; GPU-hours >= 20% below the Dynamo-style
    baseline where it reaches 90%; within 15% of the hindsight bound; no worse than the best static split."""
    by_name = {r.name: r for r in rows}
    dynamo = by_name.get("dynamo-throughput")
    static = next((r for r in rows if r.name.startswith("best static")), None)
    out = []
    for name in RATIO_POLICIES:
        r = by_name.get(name)
        if r is None:
            continue
        checks = [f"attainment>=90% {'yes' if r.attainment >= 0.9 else 'NO'}"]
        if dynamo is not None and dynamo.attainment >= 0.9:
            saving = 1.0 - r.gpu_hours / dynamo.gpu_hours
            checks.append(f"vs dynamo {saving:+.0%} GPU-h ({'yes' if saving >= 0.2 else 'NO'})")
        else:
            checks.append("vs dynamo: n/a (dynamo < 90%)")
        over = r.gpu_hours / bound - 1.0 if bound > 0 else math.inf
        checks.append(f"vs hindsight bound {over:+.0%} ({'yes' if over <= 0.15 else 'NO'})")
        if static is not None:
            ok = r.attainment >= static.attainment and r.gpu_hours <= static.gpu_hours
            checks.append(
                f"vs best static {r.attainment - static.attainment:+.1%} attainment, "
                f"{r.gpu_hours / static.gpu_hours - 1.0:+.0%} GPU-h ({'yes' if ok else 'NO'})"
            )
        out.append(f"  targets {name}: " + "; ".join(checks))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", choices=[c.name for c in CASES], action="append")
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
    args = parser.parse_args(argv)
    starts = ("cold", "warm") if args.start == "both" else (args.start,)
    setup = Setup(metric_window_s=args.metric_window or None)
    print(
        f"deployment: {setup.model} {setup.dtype} TP{setup.tp} on {setup.gpu}, cold start "
        f"{setup.start_prefill}P:{setup.start_decode}D, startup {setup.startup_delay_s:.0f}s, "
        f"evaluation every {setup.interval_s:.0f}s, metrics over "
        f"{setup.metric_window_s or setup.interval_s:.0f}s"
    )
    print(
        f"  {'policy':<22} {'SLO ok':>7} {'good/GPU-h':>11} {'GPU-h':>8} {'actions':>7} {'osc':>5} "
        f"{'recovery':>9} {'unfinished':>10}"
    )
    for case in CASES:
        if args.trace and case.name not in args.trace:
            continue
        if not case.path.is_file():
            print(f"\n== {case.name}: {case.path} not found; skipped", file=sys.stderr)
            continue
        run_case(case, setup, args.quick, starts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

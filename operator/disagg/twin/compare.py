"""Fair comparisons on one GPU budget, and a recommendation: pure functions over a :class:`SimDeployment`
and a request list, used by ``disagg simulate --compare all`` and ``--recommend`` and by
``bench/pd_vs_colocated.py``.

**The same GPUs.** Every configuration compared may use at most ``budget`` GPUs. ``--compare all`` sets
the budget to the most GPUs the policy run held at once (its ``GPUs peak``; without a policy, the
deployment's own GPUs) unless ``--gpu-budget`` gives one; ``--recommend`` needs ``--gpu-budget``. A static
configuration need not fill the budget: the static rows are picked among every size within it, so a
configuration that meets the SLO on fewer GPUs is credited for it in goodput per GPU-hour, the figure all
rows are judged by (every row also shows its GPUs and GPU-hours).

**Which configuration wins** (:func:`rank_key`): among configurations where at least ``attainment`` of
all requests (the SLO percentile, 90% by default) met both the TTFT and the ITL target, the highest
goodput per GPU-hour, then the fewest GPUs; when none meets it, the highest attainment.

**Bounded search** (:func:`search`). Candidates run in order of GPUs, smallest first, and two cheap
tests skip a simulation:

* *capacity*: a pool whose optimistic throughput (:func:`capacity_shortfall`: prompts of the trace's mean
  uncached length filling the step budget; decode at the largest batch whose step, at the trace's mean
  context, meets the ITL target, KV unlimited) is below ``PRUNE_CAPACITY_MARGIN`` of the trace's mean
  demand is overloaded on average over the whole trace and cannot meet the SLO;
* *goodput bound*: a static configuration spends at least ``GPUs x last arrival`` GPU-seconds, so its
  goodput per GPU-hour is at most ``requests / that``; once ``keep`` configurations meet the attainment
  target, a candidate whose bound is below the ``keep``-th best cannot enter the top ``keep``.

If every candidate fails the capacity test, the one with the most estimated capacity runs anyway, so a
search always has a result.

**Colocated autoscaled** (:func:`hpa_controller`). The policy engine has no colocated role (the ratio
policy and the Dynamo and AIBrix baselines split P/D pools), so the twin scales a colocated pool the way
a Kubernetes HorizontalPodAutoscaler on the engines' metrics would: two per-pod metrics, KV-cache usage
(target ``HPA_KV_TARGET``) and waiting requests per ready replica (``HPA_WAITING_TARGET``); per metric
``ceil(ready x value / target)`` (replicas not ready yet count as zero on a scale-up, as HPA counts
unready pods), nothing within ``HPA_TOLERANCE`` of the target; the larger of the two; scale-up at most
``max(2 x current, current + 4)`` per evaluation (HPA's default scale-up policies), scale-down to the
highest recommendation of the last ``HPA_SCALE_DOWN_WINDOW_S`` (HPA's default stabilisation window); within
1 and the budget's replicas. It evaluates every ``interval_s`` of the run (the policy's evaluation
interval) rather than HPA's 15 s sync period. The two targets are this tool's choice, not an HPA default.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from disagg.perf.latency import load_latency_model
from disagg.policy.types import Observation
from disagg.twin import profiles
from disagg.twin.deployment import PoolSpec, SimDeployment
from disagg.twin.report import Report, build_report
from disagg.twin.sim import Controller, SimResult, simulate
from disagg.twin.traffic import Request

TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)
# a pool whose optimistic capacity is below this share of the trace's mean demand is not simulated
PRUNE_CAPACITY_MARGIN = 0.8
# the colocated HPA (see the module doc)
HPA_KV_TARGET = 0.6  # mean KV-cache usage of the ready replicas (AIBrix's APA sample targets 0.5)
HPA_WAITING_TARGET = 1.0  # waiting requests per ready replica (vllm:num_requests_waiting)
HPA_TOLERANCE = 0.1  # HPA's --horizontal-pod-autoscaler-tolerance default
HPA_SCALE_DOWN_WINDOW_S = 300.0  # HPA's default behavior.scaleDown.stabilizationWindowSeconds
HPA_SCALE_UP_PODS = 4  # HPA's default scale-up policies: 4 pods or 100% of the current, the larger


@dataclass(frozen=True)
class SloSettings:
    """The SLO runs are judged by and the simulation's evaluation settings; ``percentile`` is also the
    attainment target of the searches (the share of requests that must meet both targets)."""

    ttft_s: float = 1.0
    itl_s: float = 0.05
    percentile: float = 0.9
    interval_s: float = 30.0
    window_s: float = 30.0


@dataclass
class Outcome:
    """One configuration run: what it was, its report and its result."""

    deployment: SimDeployment
    label: str
    report: Report
    result: SimResult = field(repr=False)


@dataclass
class Search:
    """A search's outcomes, best first (:func:`rank_key`), and what it skipped."""

    ranked: list[Outcome]
    candidates: int
    pruned_capacity: int = 0
    pruned_bound: int = 0

    @property
    def simulated(self) -> int:
        return len(self.ranked)

    @property
    def best(self) -> Outcome:
        return self.ranked[0]

    def describe(self) -> str:
        return (
            f"{self.candidates} configurations, {self.simulated} simulated "
            f"({self.pruned_capacity} skipped for capacity, {self.pruned_bound} by the goodput bound)"
        )


Progress = Callable[[int, int, str], None]  # (done, total, label of the candidate just handled)


# --- labels ----------------------------------------------------------------------------------------------
def pool_layout(pool: PoolSpec) -> str:
    """``3xTP4`` (replicas x one replica's layout), ``2xTP8 DP2 EP16`` for a data/expert-parallel one."""
    extra = (f" DP{pool.dp}" if pool.dp > 1 else "") + (f" EP{pool.ep}" if pool.ep > 1 else "")
    return f"{pool.replicas}xTP{pool.tp}{extra}"


def describe(dep: SimDeployment) -> str:
    """``P/D 2xTP4 + 1xTP8 (16 GPUs)`` or ``colocated 4xTP4 (16 GPUs)``."""
    if dep.mode == "colocated":
        assert dep.colocated is not None
        return f"colocated {pool_layout(dep.colocated)} ({dep.gpus} GPUs)"
    assert dep.prefill is not None and dep.decode is not None
    return f"P/D {pool_layout(dep.prefill)} + {pool_layout(dep.decode)} ({dep.gpus} GPUs)"


# --- candidates ------------------------------------------------------------------------------------------
def _base_pools(dep: SimDeployment) -> tuple[PoolSpec, PoolSpec, PoolSpec]:
    """The pools candidates are made from: prefill, decode and colocated (engine flags kept; a
    colocated pool takes the decode pool's, as :meth:`SimDeployment.colocated_equivalent` does)."""
    if dep.mode == "colocated":
        assert dep.colocated is not None
        return dep.colocated, dep.colocated, dep.colocated
    assert dep.prefill is not None and dep.decode is not None
    colocated = dep.colocated_equivalent().colocated
    assert colocated is not None
    return dep.prefill, dep.decode, colocated


def _static(pool: PoolSpec, replicas: int, tp: int | None = None) -> PoolSpec:
    return replace(
        pool, replicas=replicas, tp=pool.tp if tp is None else tp, min_replicas=1, max_replicas=1000
    )


def _pd(dep: SimDeployment, prefill: PoolSpec, decode: PoolSpec) -> SimDeployment:
    out = replace(dep, mode="pd", prefill=prefill, decode=decode, colocated=None, max_gpus=None)
    return replace(out, name=describe(out))


def _colocated(dep: SimDeployment, pool: PoolSpec) -> SimDeployment:
    out = replace(dep, mode="colocated", colocated=pool, prefill=None, decode=None, max_gpus=None)
    return replace(out, name=describe(out))


def pd_candidates(
    dep: SimDeployment,
    budget: int,
    prefill_tps: Iterable[int] | None = None,
    decode_tps: Iterable[int] | None = None,
) -> list[SimDeployment]:
    """Every static P/D deployment of ``dep``'s pools (at each TP of ``prefill_tps`` x ``decode_tps``;
    None: the pools' own) with at least one replica per pool and at most ``budget`` GPUs."""
    base_p, base_d, _ = _base_pools(dep)
    out = []
    for tp_p in (base_p.tp,) if prefill_tps is None else tuple(prefill_tps):
        for tp_d in (base_d.tp,) if decode_tps is None else tuple(decode_tps):
            gp = replace(base_p, tp=tp_p).gpus_per_replica
            gd = replace(base_d, tp=tp_d).gpus_per_replica
            for p in range(1, (budget - gd) // gp + 1):
                for d in range(1, (budget - p * gp) // gd + 1):
                    out.append(_pd(dep, _static(base_p, p, tp_p), _static(base_d, d, tp_d)))
    return out


def colocated_candidates(
    dep: SimDeployment, budget: int, tps: Iterable[int] | None = None
) -> list[SimDeployment]:
    """Every static colocated deployment of ``dep``'s colocated-equivalent pool (at each TP of ``tps``;
    None: its own) with at most ``budget`` GPUs."""
    _, _, base = _base_pools(dep)
    out = []
    for tp in (base.tp,) if tps is None else tuple(tps):
        per = replace(base, tp=tp).gpus_per_replica
        out += [_colocated(dep, _static(base, n, tp)) for n in range(1, budget // per + 1)]
    return out


def supported_tps(dep: SimDeployment, pool: PoolSpec, budget: int) -> tuple[int, ...]:
    """The tensor-parallel sizes a pool can take: 1, 2, 4, 8 that fit a node and the budget and have a
    latency profile for the model, GPU and dtype (the weights fitting, too). A data- or expert-parallel
    pool keeps its own layout (only tensor-only replicas are swept)."""
    layout_fixed = pool.dp > 1 or pool.ep > 1 or pool.overlap
    if layout_fixed:
        return (pool.tp,)
    out = []
    for tp in TENSOR_PARALLEL_SIZES:
        if tp > pool.gpus_per_node or tp > budget:
            continue
        probe = replace(
            dep, mode="colocated", colocated=replace(pool, tp=tp, replicas=1), prefill=None, decode=None
        )
        try:
            profiles.check(probe)
        except ValueError:
            continue
        out.append(tp)
    return tuple(out)


# --- pruning ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Demand:
    """The trace's mean load: uncached prompt tokens and output tokens per second, and mean lengths."""

    prompt_tokens_per_s: float
    output_tokens_per_s: float
    prompt_mean: float  # uncached prompt tokens per request
    context_mean: float  # prompt + half the output: a decoding sequence's mean KV context

    @staticmethod
    def of(reqs: Sequence[Request]) -> Demand:
        """Prompt tokens a prefix cache could not serve (a request's leading blocks seen before count as
        cached, an infinite cache: the optimistic side) and output tokens over the arrival span."""
        seen: set[tuple[int, ...]] = set()
        uncached = 0.0
        for r in reqs:
            hashes = r.prefix_hashes
            hit = 0
            if hashes:
                block = math.ceil(r.prompt_tokens / len(hashes))
                while hit < len(hashes) and hashes[: hit + 1] in seen:
                    hit += 1
                for i in range(hit, len(hashes)):
                    seen.add(hashes[: i + 1])
                hit = min(r.prompt_tokens - 1, hit * block)
            uncached += r.prompt_tokens - hit
        n = max(len(reqs), 1)
        arrivals = [r.arrival_s for r in reqs]
        span = max(max(arrivals, default=0.0) - min(arrivals, default=0.0), 1.0)
        output = float(sum(r.output_tokens for r in reqs))
        prompt_all = float(sum(r.prompt_tokens for r in reqs))
        return Demand(uncached / span, output / span, uncached / n, (prompt_all + output / 2) / n)


def _capacity(dep: SimDeployment, pool: PoolSpec, itl_s: float, demand: Demand) -> tuple[float, float] | None:
    """Optimistic (prompt tokens/s, output tokens/s) of one replica; None where no estimate is made (a
    data- or expert-parallel replica, whose latency model this shortcut does not read)."""
    if pool.parallelism() is not None:
        return None
    lm = load_latency_model(dep.model, dep.gpu, pool.tp, dep.dtype, dep.kv_dtype)
    length = max(1, round(demand.prompt_mean))
    batch = max(1, pool.max_num_batched_tokens // length)
    prompt_rate = length * batch / lm.prefill_time_s([length] * batch)
    ctx = max(1, round(demand.context_mean))

    def step(b: int) -> float:
        return lm.decode_step_time_s(b, b * ctx)

    b = 0
    lo, hi = 1, max(1, pool.max_num_seqs)
    if step(1) <= itl_s:
        while lo < hi:  # the largest batch whose step meets the ITL target
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if step(mid) <= itl_s else (lo, mid - 1)
        b = lo
    return prompt_rate, (b / step(b) if b else 0.0)


def capacity_ratio(dep: SimDeployment, demand: Demand, itl_s: float) -> float | None:
    """The deployment's optimistic capacity over the trace's mean demand on its tighter side (prompt
    tokens for prefill, output tokens for decode; a colocated pool is judged on both, as if serving each
    cost nothing of the other); None: no estimate."""
    need = (demand.prompt_tokens_per_s, demand.output_tokens_per_s)
    pools: list[tuple[PoolSpec | None, tuple[int, ...]]] = (
        [(dep.colocated, (0, 1))] if dep.mode == "colocated" else [(dep.prefill, (0,)), (dep.decode, (1,))]
    )
    ratios = []
    for pool, sides in pools:
        assert pool is not None
        cap = _capacity(dep, pool, itl_s, demand)
        if cap is None:
            return None
        ratios += [pool.replicas * cap[side] / need[side] for side in sides if need[side] > 0]
    return min(ratios, default=math.inf)


def capacity_shortfall(dep: SimDeployment, demand: Demand, itl_s: float) -> bool:
    """True when the deployment's optimistic capacity is below ``PRUNE_CAPACITY_MARGIN`` of the demand."""
    ratio = capacity_ratio(dep, demand, itl_s)
    return ratio is not None and ratio < PRUNE_CAPACITY_MARGIN


# --- running and ranking ---------------------------------------------------------------------------------
def meets(report: Report, attainment: float) -> bool:
    return report.slo_attainment >= attainment


def _num(x: float) -> float:
    return 0.0 if math.isnan(x) else x


def rank_key(report: Report, attainment: float) -> tuple[float, float, float, float]:
    """Larger is better: meeting the attainment target first, by goodput per GPU-hour, then fewer GPUs;
    otherwise by attainment, then goodput per GPU-hour."""
    if meets(report, attainment):
        return (1.0, _num(report.goodput_per_gpu_hour), -report.gpus, 0.0)
    return (0.0, _num(report.slo_attainment), _num(report.goodput_per_gpu_hour), -report.gpus)


def run_one(
    dep: SimDeployment,
    reqs: Sequence[Request],
    slo: SloSettings,
    label: str = "",
    controller: Controller | None = None,
    seed: int = 0,
    progress: Callable[[float, int, int], None] | None = None,
) -> Outcome:
    """Simulate ``dep`` over ``reqs`` and report it against ``slo``."""
    res = simulate(
        dep,
        reqs,
        controller=controller,
        interval_s=slo.interval_s,
        seed=seed,
        percentile=slo.percentile,
        window_s=slo.window_s,
        progress=progress,
    )
    label = label or describe(dep)
    return Outcome(dep, label, build_report(res, slo.ttft_s, slo.itl_s, slo.percentile, label=label), res)


def search(
    candidates: Sequence[SimDeployment],
    reqs: Sequence[Request],
    slo: SloSettings,
    keep: int = 1,
    seed: int = 0,
    progress: Progress | None = None,
    prune: bool = True,
) -> Search:
    """Run the static ``candidates`` (smallest first), skipping what cannot be in the top ``keep`` (see the
    module doc; ``prune=False`` runs every one) and rank what ran, best first."""
    if not candidates:
        raise ValueError("search: no candidate configuration")
    order = sorted(candidates, key=lambda d: (d.gpus, describe(d)))
    demand = Demand.of(reqs)
    last = max((r.arrival_s for r in reqs), default=0.0)
    out = Search([], len(order))
    met: list[float] = []  # goodput per GPU-hour of the configurations meeting the target, best first
    spare: list[tuple[float, SimDeployment]] = []
    for i, dep in enumerate(order):
        bound = len(reqs) * 3600.0 / (dep.gpus * last) if last > 0 else math.inf
        ratio = capacity_ratio(dep, demand, slo.itl_s) if prune else None
        if prune and len(met) >= keep and bound < met[keep - 1]:
            out.pruned_bound += 1
        elif ratio is not None and ratio < PRUNE_CAPACITY_MARGIN:
            out.pruned_capacity += 1
            spare.append((ratio, dep))
        else:
            o = run_one(dep, reqs, slo, seed=seed)
            out.ranked.append(o)
            if meets(o.report, slo.percentile):
                met = sorted([*met, _num(o.report.goodput_per_gpu_hour)], reverse=True)
        if progress is not None:
            progress(i + 1, len(order), describe(dep))
    if not out.ranked:  # everything was short of capacity: run the one closest to enough
        _, dep = max(spare, key=lambda s: (s[0], -s[1].gpus))
        out.ranked.append(run_one(dep, reqs, slo, seed=seed))
        out.pruned_capacity -= 1
    out.ranked.sort(key=lambda o: rank_key(o.report, slo.percentile), reverse=True)
    return out


def best_static_split(
    dep: SimDeployment,
    reqs: Sequence[Request],
    slo: SloSettings,
    gpu_budget: int,
    seed: int = 0,
    progress: Progress | None = None,
    prune: bool = True,
) -> Search:
    """The best static P/D split of ``dep``'s pools (their TP) within ``gpu_budget`` GPUs: every number of
    prefill and decode replicas, at least one each, ranked by :func:`rank_key`."""
    return search(pd_candidates(dep, gpu_budget), reqs, slo, 1, seed, progress, prune)


def best_static_colocated(
    dep: SimDeployment,
    reqs: Sequence[Request],
    slo: SloSettings,
    gpu_budget: int,
    seed: int = 0,
    progress: Progress | None = None,
    prune: bool = True,
) -> Search:
    """The best static colocated size (chunked prefill, the decode pool's TP and engine flags) within
    ``gpu_budget`` GPUs, ranked by :func:`rank_key`."""
    return search(colocated_candidates(dep, gpu_budget), reqs, slo, 1, seed, progress, prune)


# --- colocated autoscaled --------------------------------------------------------------------------------
def hpa_desired(current: int, ready: int, value: float, target: float) -> int:
    """One HPA metric's replica count: ``ceil(ready x value / target)`` beyond the tolerance (on a
    scale-up the replicas not ready yet count as at zero; on a scale-down they are left out), else
    ``current``."""
    if current <= 0 or ready <= 0:
        return current
    ratio = value / target
    if abs(ratio - 1.0) <= HPA_TOLERANCE:
        return current
    if ratio > 1.0:
        with_unready = value * ready / (target * current)
        if with_unready <= 1.0 + HPA_TOLERANCE:
            return current
        return max(current, math.ceil(with_unready * current))
    return min(current, math.ceil(ratio * ready))


def hpa_controller(max_replicas: int, min_replicas: int = 1) -> Controller:
    """A colocated pool scaled like a Kubernetes HPA on KV-cache usage and waiting requests (the module
    doc); stateful, one per run."""
    history: list[tuple[float, int]] = []

    def control(obs: Observation) -> dict[str, int] | None:
        ro = obs.prefill  # a colocated deployment's observation: both roles are the colocated pool
        current, ready = ro.replicas, ro.ready
        if not history:  # HPA seeds an autoscaler's recommendations with its current replicas
            history.append((obs.time, current))
        desired = []
        if ro.kv_usage.ok and ro.kv_usage.value is not None:
            desired.append(hpa_desired(current, ready, ro.kv_usage.value, HPA_KV_TARGET))
        if ro.queue_depth.ok and ro.queue_depth.value is not None and ready > 0:
            desired.append(hpa_desired(current, ready, ro.queue_depth.value / ready, HPA_WAITING_TARGET))
        want = max(desired, default=current)  # HPA: the largest of the metrics' counts
        want = min(want, max(2 * current, current + HPA_SCALE_UP_PODS))
        history[:] = [(t, n) for t, n in history if obs.time - t < HPA_SCALE_DOWN_WINDOW_S]
        history.append((obs.time, want))
        if want < current:
            want = min(current, max(n for _, n in history))
        return {"colocated": max(min_replicas, min(max_replicas, want))}

    return control


def autoscaled_colocated(dep: SimDeployment, gpu_budget: int) -> tuple[SimDeployment, int]:
    """The colocated deployment the HPA scales (the decode pool's TP and engine flags, starting on the
    GPUs ``dep`` starts on, at most the budget) and its most replicas."""
    _, _, base = _base_pools(dep)
    per = base.gpus_per_replica
    most = max(1, gpu_budget // per)
    start = min(most, max(1, dep.gpus // per))
    pool = replace(base, replicas=start, min_replicas=1, max_replicas=most)
    out = replace(dep, mode="colocated", colocated=pool, prefill=None, decode=None, max_gpus=gpu_budget)
    return replace(out, name=f"colocated HPA 1-{most}x{pool_layout(pool).split('x', 1)[1]}"), most


# --- recommendation --------------------------------------------------------------------------------------
def recommend_candidates(dep: SimDeployment, gpu_budget: int) -> list[SimDeployment]:
    """Every P/D configuration (TP per role among :func:`supported_tps`, every split) and every colocated
    size (each supported TP) within ``gpu_budget`` GPUs."""
    base_p, base_d, base_c = _base_pools(dep)
    tps_p = supported_tps(dep, base_p, gpu_budget)
    tps_d = supported_tps(dep, base_d, gpu_budget)
    tps_c = supported_tps(dep, base_c, gpu_budget)
    return [
        *pd_candidates(dep, gpu_budget, tps_p, tps_d),
        *colocated_candidates(dep, gpu_budget, tps_c),
    ]


def recommend(
    dep: SimDeployment,
    reqs: Sequence[Request],
    slo: SloSettings,
    gpu_budget: int,
    top: int = 5,
    seed: int = 0,
    progress: Progress | None = None,
) -> Search:
    """Sweep TP per role, P:D split and colocated vs disaggregated within ``gpu_budget`` GPUs over the
    trace's own arrivals and lengths; the search's ``ranked[:top]`` are the recommendations."""
    candidates = recommend_candidates(dep, gpu_budget)
    if not candidates:
        base = _base_pools(dep)[2]
        sizes = [replace(base, tp=tp).gpus_per_replica for tp in supported_tps(dep, base, base.gpus_per_node)]
        smallest = f"the smallest replica with a latency profile takes {min(sizes)} GPUs" if sizes else "none"
        raise ValueError(
            f"--gpu-budget: no configuration of {dep.model} on {dep.gpu} fits {gpu_budget} GPUs ({smallest})"
        )
    return search(candidates, reqs, slo, top, seed, progress)


def format_recommendations(found: Search, top: int, attainment: float) -> str:
    """The top ``top`` configurations of a search as a fixed-width table, best first."""
    head = ["#", "configuration", "TP P/D", "replicas", "GPUs", "SLO ok", "TTFT p90", "ITL p90", "TPOT p90"]
    head += ["goodput/s", "good/GPU-h", "target"]
    rows = [head]
    for i, o in enumerate(found.ranked[:top], 1):
        r, d = o.report, o.deployment
        if d.mode == "colocated":
            assert d.colocated is not None
            tps, reps = f"{d.colocated.tp}", f"{d.colocated.replicas}"
        else:
            assert d.prefill is not None and d.decode is not None
            tps, reps = f"{d.prefill.tp}/{d.decode.tp}", f"{d.prefill.replicas}+{d.decode.replicas}"
        rows.append(
            [
                str(i),
                o.label,
                tps,
                reps,
                str(r.gpus),
                f"{r.slo_attainment:.1%}",
                f"{r.ttft_p90:.3f}",
                f"{r.itl_p90:.4f}",
                f"{r.tpot_p90:.4f}",
                f"{r.goodput_rps:.2f}",
                f"{r.goodput_per_gpu_hour:.0f}",
                "met" if meets(r, attainment) else "missed",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 1 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def recommendation_dict(o: Outcome, rank: int, attainment: float) -> dict[str, object]:
    """One recommended configuration for summary.json: its layout and its report."""
    d = o.deployment
    pools = {"prefill": d.prefill, "decode": d.decode, "colocated": d.colocated}
    return {
        "rank": rank,
        "mode": d.mode,
        "meets_target": meets(o.report, attainment),
        **{
            role: {"replicas": p.replicas, "tp": p.tp, "dp": p.dp, "ep": p.ep}
            for role, p in pools.items()
            if p is not None
        },
        "report": o.report.as_dict(),
    }


def search_dict(found: Search, top: int, attainment: float) -> dict[str, object]:
    return {
        "candidates": found.candidates,
        "simulated": found.simulated,
        "pruned_capacity": found.pruned_capacity,
        "pruned_bound": found.pruned_bound,
        "top": [recommendation_dict(o, i, attainment) for i, o in enumerate(found.ranked[:top], 1)],
    }

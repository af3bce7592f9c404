"""``decide``: one coordinated prefill:decode decision from one observation. Pure.

An algorithm proposes replicas per role (:mod:`disagg.policy.feedback`, :mod:`disagg.policy.model_based`,
fixed-ratio here); the common machinery then shapes the proposal, in this order:

1. fail-static: a role whose signals are missing holds its current replicas (never scales down on
   missing data; reason ``MetricsMissing``);
2. the deployment's min/max per role;
3. stabilisation, as the HorizontalPodAutoscaler does it: scale up to the lowest recommendation within
   the scale-up window, down to the highest within the (longer) scale-down window, so a short spike or
   dip does not move the pools and a steady load never flaps;
4. per-step caps per role and direction;
5. the replica ceiling learned from pods Unschedulable past a grace period (reason ``ScalingLimited``),
   lifted after ``pendingBackoffSeconds`` to probe for capacity again;
6. the GPU budget (the deployment's maxGPUs and the policy's, whichever is lower), split toward the
   pool whose SLO is breached when it binds (reason ``BudgetClamp``).

In advisory mode the decision is marked ``advisory`` (reported, never applied).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from disagg.api.ratiopolicy import Algorithm, Mode, RatioPolicySpec
from disagg.policy.capacity import (
    LatencyModelLike,
    decode_batch_at_slo,
    load_models,
    prefill_service,
    prompt_quantiles,
    resolve_profile,
    step_shape,
)
from disagg.policy.feedback import (
    StepTime,
    decode_proposal,
    peak_rate,
    prefill_proposal,
    steady_arrivals,
)
from disagg.policy.model_based import (
    QUEUE_MEMORY_S,
    RECURRENCE_S,
    computed_prompts,
    forecast_window_s,
    kv_footprint,
    model_based_proposal,
    update_corrections,
    work_sample,
)
from disagg.policy.proposal import Proposal, RoleProposal
from disagg.policy.types import (
    ROLES,
    Bounds,
    Decision,
    Observation,
    PolicyState,
    Reason,
    Recommendation,
    Role,
)

_BREACH_CODES = ("TTFTBreach", "ITLBreach", "KVPressure")


@dataclass(frozen=True)
class FlapDamping:
    """A pool that had to grow back soon after a shrink was shrunk too early: each such reversal within
    ``memory_windows`` scale-down windows doubles (``factor``) that pool's scale-down window, up to
    ``max_window_s``. Steady traffic never flaps and keeps the configured window; bursty traffic, whose
    quiet spells look like spare capacity, earns a longer memory of its bursts."""

    factor: float = 2.0
    memory_windows: float = 4.0
    max_window_s: float = 3600.0  # the API's largest stabilisation window
    # never more than this multiple of the configured window: a window stretched to an hour once held
    # an overshoot of 8-11 decode replicas for that hour (the overshoot, not the need, was remembered)
    max_factor: float = 2.0

    def memory_s(self, base_window_s: float) -> float:
        return self.memory_windows * base_window_s

    def window(self, base_window_s: float, flaps: tuple[float, ...], now: float) -> float:
        recent = sum(1 for t in flaps if now - t <= self.memory_s(base_window_s))
        if recent == 0 or base_window_s <= 0:
            return base_window_s
        longest = min(base_window_s * self.max_factor, max(self.max_window_s, base_window_s))
        return min(base_window_s * self.factor**recent, longest)


DAMPING = FlapDamping()

# the span over which a pool's direction reversals (a shrink after a growth, a growth after a shrink)
# are counted against RatioPolicy.maxReversalsPerHour
REVERSAL_SPAN_S = 3600.0


def last_move(state_up: dict[str, float], state_down: dict[str, float], role: Role) -> int:
    """The direction of the pool's last change: +1 grew, -1 shrank, 0 never moved."""
    up, down = state_up.get(role, -math.inf), state_down.get(role, -math.inf)
    return 0 if up == down else (1 if up > down else -1)


def reversal_hold(
    role: Role,
    current: int,
    target: int,
    state: PolicyState,
    recent: tuple[float, ...],
    policy: RatioPolicySpec,
) -> Reason | None:
    """Why a shrink must wait for the reversal budget, or None when it may go ahead.

    A pool that last grew and now shrinks reverses its direction; if the load comes back, the growth
    that follows is a second reversal. The shrink waits while those two on top of the ``recent``
    reversals within the hour would pass ``maxReversalsPerHour``. Growth never waits (the SLO comes
    first), and only a growth can follow a held shrink, so a pool never passes the limit.

    Seen on traffic that switches between regimes (validation set): decode shrank to one replica
    between two chat phases and met the second with a start-up and a queue; a pool that has already
    turned within the hour holds its size until that turn ages out, and meets the return ready."""
    if target >= current:
        return None
    if last_move(state.last_scale_up, state.last_scale_down, role) != 1:
        return None  # the last move was a shrink (or there was none): no reversal
    limit = policy.max_reversals_per_hour
    if len(recent) + 2 <= limit:
        return None
    return Reason(
        "ReversalBudget",
        f"{role} held at {current} (wants {target}): {len(recent)} direction reversal(s) within the last "
        f"{REVERSAL_SPAN_S / 60:.0f} minutes, and a shrink now with the growth that may follow it would "
        f"pass maxReversalsPerHour ({limit})",
        role,
    )


def propose(
    obs: Observation, policy: RatioPolicySpec, state: PolicyState, now: float, bounds: Bounds
) -> Proposal:
    """The algorithm's raw proposal."""
    if policy.algorithm is Algorithm.MODEL_BASED:
        profile = resolve_profile(policy, bounds)
        if profile is not None:
            try:
                models = load_models(profile)
            except (ValueError, KeyError) as exc:
                fallback = feedback_proposal(obs, policy, bounds, state)
                note = Reason("ModelUnavailable", f"no latency model ({exc}); using slo-feedback")
                return replace(fallback, prefill=_with_reason(fallback.prefill, note))
            return model_based_proposal(obs, policy, state, now, bounds, models, history_window(policy))
        fallback = feedback_proposal(obs, policy, bounds, state)
        note = Reason("ModelUnavailable", "no model/GPU profile known; using slo-feedback")
        return replace(fallback, prefill=_with_reason(fallback.prefill, note))
    if policy.algorithm is Algorithm.FIXED_RATIO:
        return fixed_ratio_proposal(obs, policy, bounds, state)
    return feedback_proposal(obs, policy, bounds, state)


def _with_reason(p: RoleProposal, reason: Reason) -> RoleProposal:
    return replace(p, reasons=(*p.reasons, reason))


def feedback_proposal(
    obs: Observation, policy: RatioPolicySpec, bounds: Bounds, state: PolicyState | None = None
) -> Proposal:
    history = state.load_history if state is not None else ()
    rate = peak_rate(obs, history, policy.metric_window_seconds)
    # a shrink must hold up against the busiest moment it will be remembered for: the peak over the
    # scale-down window (bursty traffic looks idle between bursts)
    shrink_rate = peak_rate(obs, history, history_window(policy))
    steady = steady_arrivals(obs, history, history_window(policy))
    work_s, correction = prefill_work(obs, policy, bounds, state or PolicyState())
    now_rate = obs.request_rate.value if obs.request_rate.ok else None
    load_ratio = shrink_rate / now_rate if shrink_rate is not None and now_rate else 1.0
    return Proposal(
        prefill_proposal(obs, policy, bounds, rate, shrink_rate, steady, work_s),
        decode_proposal(
            obs,
            policy,
            bounds,
            decode_step_shape(obs, policy, bounds),
            load_ratio,
            decode_kv_batch(obs, policy, bounds),
        ),
        correction,
    )


def prefill_work(
    obs: Observation, policy: RatioPolicySpec, bounds: Bounds, state: PolicyState
) -> tuple[float | None, dict[str, float]]:
    """Busy seconds per request on a prefill replica from the latency model of the deployment's profile
    (a request's share of a batched step at the observed prompt lengths), corrected online as the
    model-based algorithm does; (None, the old corrections) when the profile or the lengths are unknown
    (:func:`disagg.policy.feedback.request_work` then uses the measured, unshared prefill time)."""
    profile = resolve_profile(policy, bounds)
    prompt = obs.prompt_tokens_mean
    if profile is None or not prompt.ok or prompt.value is None or prompt.value <= 0:
        return None, dict(state.correction)
    try:
        models = load_models(profile)
    except (ValueError, KeyError):
        return None, dict(state.correction)
    mb = policy.model_based
    corr = update_corrections(obs, models, state, mb.correction_smoothing, mb.prefill_token_budget)
    computed, computed_p90 = computed_prompts(obs)
    service = prefill_service(
        models.prefill,
        prompt_quantiles(max(computed or prompt.value, 1.0), computed_p90),
        mb.prefill_token_budget,
        corr.get("prefill", 1.0),
    )
    return service.mean_s, corr


def _decode_model(
    obs: Observation, policy: RatioPolicySpec, bounds: Bounds
) -> tuple[LatencyModelLike, float] | None:
    """The decode latency model of the deployment's profile and the observed mean prompt length; None
    when the profile or the lengths are unknown."""
    profile = resolve_profile(policy, bounds)
    prompt = obs.prompt_tokens_mean
    if profile is None or not prompt.ok or prompt.value is None:
        return None
    try:
        return load_models(profile).decode, prompt.value
    except (ValueError, KeyError):
        return None


def _half_output(obs: Observation) -> float:
    out = obs.output_tokens_mean
    return out.value / 2.0 if out.ok and out.value is not None else 0.0


def decode_step_shape(obs: Observation, policy: RatioPolicySpec, bounds: Bounds) -> StepTime | None:
    """The decode step time against batch size at the observed context length, from the twin's latency
    model of the deployment's profile: how ITL grows with the batch when a decode pool shrinks. None
    (the linear upper bound applies) when the profile or the lengths are unknown."""
    known = _decode_model(obs, policy, bounds)
    if known is None:
        return None
    decode, prompt = known
    return step_shape(decode, prompt + _half_output(obs))


def decode_kv_batch(obs: Observation, policy: RatioPolicySpec, bounds: Bounds) -> int | None:
    """The most sequences one decode replica's KV cache holds at the observed context lengths (their
    90th percentile; :func:`disagg.policy.capacity.decode_batch_at_slo` with no ITL limit); None when
    the profile or the lengths are unknown."""
    known = _decode_model(obs, policy, bounds)
    if known is None:
        return None
    decode, prompt = known
    half_out, p90 = _half_output(obs), obs.prompt_tokens_p90
    context_p90 = p90.value + half_out if p90.ok and p90.value is not None else None
    return decode_batch_at_slo(decode, prompt + half_out, math.inf, 1.0, context_p90) or None


def history_window(policy: RatioPolicySpec, bounds: Bounds | None = None) -> float:
    """How long the request-rate history is kept: the longest window any part of the policy reads."""
    return float(
        max(
            policy.model_based.lookahead_seconds,
            policy.metric_window_seconds,
            policy.scale_down.stabilization_window_seconds,
            forecast_window_s(policy, bounds) if bounds is not None else 0.0,
        )
    )


def fixed_ratio_proposal(
    obs: Observation, policy: RatioPolicySpec, bounds: Bounds, state: PolicyState | None = None
) -> Proposal:
    """Total capacity in whole units of the fixed ratio: enough units for the neediest role."""
    ratio = policy.fixed_ratio
    if ratio is None:
        raise ValueError("spec.fixedRatio: required when algorithm is fixed-ratio")
    need = feedback_proposal(obs, policy, bounds, state)
    per_unit = {"prefill": ratio.prefill, "decode": ratio.decode}
    current_units = max(math.ceil(obs.role(r).replicas / per_unit[r]) for r in ROLES)
    wanted = [
        math.ceil(p.replicas / per_unit[r])
        for r, p in zip(ROLES, (need.prefill, need.decode), strict=True)
        if p.replicas is not None
    ]
    held = any(need.role(r).replicas is None for r in ROLES)
    units = max(wanted) if wanted else current_units
    if held:
        units = max(units, current_units)  # fail-static: never shrink on a role's missing data
    units = max(units, 1)
    reasons = tuple(x for r in ROLES for x in need.role(r).reasons)
    breached = {r: need.role(r).breached for r in ROLES}
    note = Reason("FixedRatio", f"{units} x {ratio.prefill}:{ratio.decode}")
    return Proposal(
        RoleProposal(units * ratio.prefill, (*reasons, note), breached["prefill"]),
        RoleProposal(units * ratio.decode, (), breached["decode"]),
    )


def stabilized(
    recs: tuple[Recommendation, ...],
    role: Role,
    current: int,
    now: float,
    up_window: float,
    down_window: float,
) -> int:
    """HPA-style: up to min over the up window, down to max over the down window, else stay.

    ``recs[-1]`` is this evaluation's recommendation; earlier ones count while younger than the window.
    """

    def pick(r: Recommendation) -> int:
        return r.prefill if role == "prefill" else r.decode

    def values(window: float) -> list[int]:
        return [pick(recs[-1])] + [pick(r) for r in recs[:-1] if now - r.time < window]

    up = min(values(up_window))
    down = max(values(down_window))
    if current < up:
        return up
    if current > down:
        return down
    return current


def effective_budget(policy: RatioPolicySpec, bounds: Bounds) -> int | None:
    limits = [b for b in (bounds.max_gpus, policy.gpu_budget.max_gpus if policy.gpu_budget else None) if b]
    return min(limits) if limits else None


def apply_gpu_budget(
    targets: dict[Role, int], bounds: Bounds, budget: int, breached: dict[Role, bool]
) -> tuple[dict[Role, int], Reason | None]:
    """Fit both pools into ``budget`` GPUs, the breached pool first; minimums always kept."""
    g = {r: bounds.role(r).gpus_per_replica for r in ROLES}
    mins = {r: bounds.role(r).min_replicas for r in ROLES}
    total = sum(targets[r] * g[r] for r in ROLES)
    if total <= budget:
        return targets, None
    if sum(mins[r] * g[r] for r in ROLES) > budget:
        return dict(mins), Reason("BudgetClamp", f"minimum replicas already need more than {budget} GPUs")
    hot = [r for r in ROLES if breached[r]]
    out = dict(targets)
    if len(hot) == 1:
        p = hot[0]
        o: Role = "decode" if p == "prefill" else "prefill"
        fit_o = (budget - targets[p] * g[p]) // g[o]
        out[o] = max(mins[o], min(targets[o], fit_o))
        out[p] = max(mins[p], min(targets[p], (budget - out[o] * g[o]) // g[p]))
        msg = f"{budget} GPUs: {p} (breaching) first, {o} gets the rest"
    else:
        scale = budget / total
        for r in ROLES:
            out[r] = max(mins[r], math.floor(targets[r] * scale))
        while sum(out[r] * g[r] for r in ROLES) > budget:  # minimums pushed it over: trim the fullest
            r = max((x for x in ROLES if out[x] > mins[x]), key=lambda x: out[x] / targets[x])
            out[r] -= 1
        while True:  # hand out what is left, to the role furthest below its target
            left = budget - sum(out[r] * g[r] for r in ROLES)
            short = [r for r in ROLES if out[r] < targets[r] and g[r] <= left]
            if not short:
                break
            r = max(short, key=lambda x: (targets[x] - out[x]) / targets[x])
            out[r] += 1
        msg = f"{budget} GPUs split in proportion to need"
    return out, Reason("BudgetClamp", f"GPU budget binds ({total} wanted): {msg}")


# How long an added pod may stay Unschedulable before its pool is limited: a pod the scheduler places a
# moment later (or that waits for a node to be provisioned) is not a missing GPU.
PENDING_GRACE_S = 60.0


def learn_ceiling(
    obs: Observation,
    policy: RatioPolicySpec,
    state: PolicyState,
    now: float,
    bounds: Bounds,
    grace_s: float = PENDING_GRACE_S,
) -> tuple[dict[str, int], dict[str, float]]:
    """The replica ceiling per role learned from pods Unschedulable for ``grace_s`` or longer (the
    replicas that did schedule, at least the pool's minimum and one), and when it was learned; lifted
    after the policy's pendingBackoffSeconds to probe for freed capacity."""
    limited, since = dict(state.limited), dict(state.limited_since)
    for role in ROLES:
        ro = obs.role(role)
        stuck = sum(1 for waited in ro.unschedulable_s if waited >= grace_s)
        if stuck > 0 and ro.replicas > 0:
            ceiling = max(ro.replicas - stuck, bounds.role(role).min_replicas, 1)
            if (
                role not in limited
                or ceiling < limited[role]
                or now - since[role] >= policy.pending_backoff_seconds
            ):
                limited[role], since[role] = ceiling, now
        elif role in limited and now - since.get(role, now) >= policy.pending_backoff_seconds:
            del limited[role]
            since.pop(role, None)
    return limited, since


def decide(
    observation: Observation,
    policy: RatioPolicySpec,
    state: PolicyState,
    now: float,
    bounds: Bounds,
    damping: FlapDamping = DAMPING,
    pending_grace_s: float = PENDING_GRACE_S,
) -> tuple[Decision, PolicyState]:
    """Target replicas for both pools with every reason, and the state to carry to the next call.

    ``pending_grace_s``: how long a pod may stay Unschedulable before its pool is limited."""
    proposal = propose(observation, policy, state, now, bounds)
    current: dict[Role, int] = {r: observation.role(r).replicas for r in ROLES}
    algo_reasons = [x for r in ROLES for x in proposal.role(r).reasons]
    machine_reasons: list[Reason] = []

    raw: dict[Role, int] = {}
    for role in ROLES:
        p = proposal.role(role)
        wish = current[role] if p.replicas is None else p.replicas
        raw[role] = bounds.role(role).clamp(wish)

    windows = (
        float(policy.scale_up.stabilization_window_seconds),
        float(policy.scale_down.stabilization_window_seconds),
    )
    flaps = {r: tuple(state.flaps.get(r, ())) for r in ROLES}
    down_window = {r: damping.window(windows[1], flaps[r], now) for r in ROLES}
    keep = max(windows[0], *down_window.values())
    # With no history (first evaluation, operator restart) the present allocation stands for the past
    # windows: a scale-down must wait out the window rather than act on one sample.
    past = state.recommendations or (Recommendation(now, current["prefill"], current["decode"]),)
    recs = (
        *tuple(r for r in past if now - r.time <= keep),
        Recommendation(now, raw["prefill"], raw["decode"]),
    )

    targets: dict[Role, int] = {}
    for role in ROLES:
        cur, rb = current[role], bounds.role(role)
        t = stabilized(recs, role, cur, now, windows[0], down_window[role])
        if down_window[role] > windows[1] and t > raw[role] and t <= cur:
            machine_reasons.append(
                Reason(
                    "FlapDamping",
                    f"{role} grew back after recent shrinks: scale-down window {down_window[role]:.0f}s",
                    role,
                )
            )
        if t != raw[role] and raw[role] != cur:
            machine_reasons.append(
                Reason(
                    "Stabilizing",
                    f"{role} held at {t} (wants {raw[role]}) within the stabilisation window",
                    role,
                )
            )
        up_cap, down_cap = policy.scale_up.max_step.of(role), policy.scale_down.max_step.of(role)
        capped = min(max(t, cur - down_cap), cur + up_cap)
        if capped != t:
            machine_reasons.append(Reason("StepCapped", f"{role} step limited to {capped - cur:+d}", role))
        targets[role] = rb.clamp(capped)

    reversals = {r: tuple(t for t in state.reversals.get(r, ()) if now - t < REVERSAL_SPAN_S) for r in ROLES}
    for role in ROLES:
        held = reversal_hold(role, current[role], targets[role], state, reversals[role], policy)
        if held is not None:
            machine_reasons.append(held)
            targets[role] = current[role]

    limited, since = learn_ceiling(observation, policy, state, now, bounds, pending_grace_s)
    for role in ROLES:
        if role in limited and targets[role] > limited[role]:
            machine_reasons.append(
                Reason(
                    "ScalingLimited", f"{role} pods stay Pending; holding at {limited[role]} replicas", role
                )
            )
            targets[role] = limited[role]

    budget = effective_budget(policy, bounds)
    if budget is not None:
        breached: dict[Role, bool] = {r: proposal.role(r).breached for r in ROLES}
        targets, budget_reason = apply_gpu_budget(targets, bounds, budget, breached)
        if budget_reason is not None:
            machine_reasons.append(budget_reason)

    changed = any(targets[r] != current[r] for r in ROLES)
    reasons = _order(algo_reasons, machine_reasons, changed)
    last_up, last_down = dict(state.last_scale_up), dict(state.last_scale_down)
    memory = damping.memory_s(windows[1])
    for role in ROLES:
        move = (targets[role] > current[role]) - (targets[role] < current[role])
        if move and move == -last_move(last_up, last_down, role):
            reversals[role] = (*reversals[role], now)
        if targets[role] > current[role]:
            shrunk = last_down.get(role)
            if shrunk is not None and now - shrunk <= windows[1] + 2 * policy.evaluation_interval_seconds:
                flaps[role] = (*flaps[role], now)
            last_up[role] = now
        elif targets[role] < current[role]:
            last_down[role] = now
    rate = observation.request_rate
    span = history_window(policy, bounds)
    history = tuple((t, r) for t, r in state.load_history if now - t <= span) + (
        ((now, rate.value),) if rate.ok and rate.value is not None else ()
    )
    work = work_sample(observation)
    episodes = tuple(t for t in state.prefill_fell_behind if now - t <= RECURRENCE_S)
    if proposal.prefill_fell_behind and (not episodes or now - episodes[-1] > windows[1]):
        episodes = (*episodes, now)  # a new episode: the last one ended more than a scale-down window ago
    peaks = tuple(p for p in state.prefill_peaks if now - p[0] <= RECURRENCE_S) + (
        ((now, work[0]),) if proposal.prefill_peak and work is not None else ()
    )
    waiting = observation.prefill.queue_depth
    prefill_queue = tuple(q for q in state.prefill_queue if now - q[0] <= QUEUE_MEMORY_S)[-2:] + (
        ((now, waiting.value),) if waiting.ok and waiting.value is not None else ()
    )
    work_history = tuple(w for w in state.work_history if now - w[0] <= max(span, RECURRENCE_S)) + (
        ((now, *work),) if work is not None else ()
    )
    kv_used, running = observation.decode.kv_usage, observation.decode.running
    footprint = kv_footprint(observation)
    decode_load = tuple(d for d in state.decode_load if now - d[0] <= windows[1]) + (
        ((now, kv_used.value * observation.decode.ready, running.value, footprint),)
        if kv_used.ok
        and kv_used.value is not None
        and running.ok
        and running.value is not None
        and footprint is not None
        else ()
    )
    new_state = PolicyState(
        recommendations=recs,
        last_scale_up=last_up,
        last_scale_down=last_down,
        limited=limited,
        correction=proposal.correction or dict(state.correction),
        slo_spend=proposal.slo_spend if proposal.slo_spend is not None else state.slo_spend,
        limited_since=since,
        load_history=history,
        work_history=work_history,
        prefill_queue=prefill_queue,
        prefill_fell_behind=episodes,
        prefill_peaks=peaks,
        decode_load=decode_load,
        flaps={r: kept for r in ROLES if (kept := tuple(t for t in flaps[r] if now - t <= memory))},
        reversals={r: reversals[r] for r in ROLES if reversals[r]},
    )
    decision = Decision(
        time=now,
        prefill=targets["prefill"],
        decode=targets["decode"],
        reasons=reasons,
        changed=changed,
        advisory=policy.mode is Mode.ADVISORY,
    )
    return decision, new_state


def _order(algo: list[Reason], machine: list[Reason], changed: bool) -> tuple[Reason, ...]:
    """Breaches first, then missing data, then the rest; a Steady reason when nothing else is said."""

    def rank(r: Reason) -> int:
        if r.code.startswith(_BREACH_CODES):
            return 0
        if r.code in ("MetricsMissing", "ScalingLimited", "BudgetClamp"):
            return 1
        return 2

    out = sorted([*algo, *machine], key=rank)
    if not out:
        out = [Reason("Steady" if not changed else "Rebalance", "latencies within the tolerance band")]
    return tuple(out)

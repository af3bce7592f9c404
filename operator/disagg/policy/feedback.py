"""The ``slo-feedback`` algorithm: scale the bottleneck the latencies point at, shrink only when the
survivors would still meet the SLO. Also the load side of ``fixed-ratio``. Pure.

TTFT as users feel it in P/D is the prefill engine's share (queue + prefill, what the prefill engine's
own TTFT measures, since it returns after the first token) plus the decode side (KV transfer + the
first decode step). A TTFT breach is attributed to the side holding the larger share; an ITL breach or
KV-cache pressure to decode.

Scale-up on a prefill breach sizes for the work arriving (rate x mean prefill time at the target
utilisation) when both are measured (bounded by the per-step cap only), else grows in proportion to
the latency/target ratio (at most doubling per evaluation); always at least one replica, and nothing
more while replicas asked for earlier are still starting (their effect cannot show yet). The per-step
caps and stabilisation windows then shape it. Scale-down proves its safety with a small queueing
model calibrated on the present: a pool of ``n`` replicas whose estimated busy fraction is ``rho``
shrinks to ``m`` only if ``rho * n / m`` stays under the target utilisation and the predicted latency
at ``m`` stays under ``(1 - tolerance)`` of the target, judged at the peak arrival rate of the metric
window; when the arrivals are bursty (peak far above the mean) the prediction, built from window
averages, must stay under half the target instead (:func:`shrink_ceiling`).

Two leading signals act before a breach: steady arrivals whose work keeps the ready prefill replicas
busier than the target utilisation grow prefill (:func:`saturation`), and a decode shrink predicts ITL
from the latency model's step shape when the deployment's profile is known (:func:`itl_growth`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from disagg.api.ratiopolicy import RatioPolicySpec
from disagg.policy.proposal import RoleProposal
from disagg.policy.types import Bounds, Measured, Observation, Reason, RoleBounds

MAX_UP_FACTOR = 2.0  # at most double a pool per evaluation from the latency ratio alone
# arrivals whose peak over the scale-down window stays within this factor of their mean count as steady:
# their busy fraction can be judged from the work per request; burstier arrivals (code completion:
# minutes of silence, then tens of requests a second) keep the conservative unshared prefill time
STEADY_PEAK_TO_MEAN = 2.0
# bursty arrivals shrink the prefill pool only to a size predicted at half the TTFT target. It was first
# chosen on the shared Azure code trace (0.6 and above shrink into the next burst there); on the training
# families (bench/policy_goodput.py --set train, slo-feedback, cold) 0.35, 0.5 and 0.7 give the same
# result (worst attainment 81.0%, 30 target misses in 12 runs), so it is no fit to that trace either way
BURSTY_SHRINK_HEADROOM = 0.5


@dataclass(frozen=True)
class Band:
    """The tolerance band around a latency target."""

    target: float
    tolerance: float

    def ratio(self, value: float) -> float:
        return value / self.target

    def breached(self, value: float) -> bool:
        return value > self.target * (1.0 + self.tolerance)

    def comfortable(self, value: float) -> bool:
        return value < self.target * (1.0 - self.tolerance)

    @property
    def ceiling_after_shrink(self) -> float:
        return self.target * (1.0 - self.tolerance)


def _val(m: Measured) -> float | None:
    return m.value if m.ok else None


def is_idle(obs: Observation) -> bool:
    """No traffic arriving (a measured zero rate, not a missing one)."""
    rate = _val(obs.request_rate)
    return rate is not None and rate <= 0.0


def grow(n: int, ratio: float, ready: int | None = None) -> int:
    """Replicas after a breach with latency/target ``ratio``: proportional, >= n+1, <= 2n.

    While replicas asked for earlier are still starting (``ready < n``) the latency cannot show their
    effect yet: hold at ``n`` instead of piling more on top.
    """
    base = max(n, 1)
    if ready is not None and ready < n:
        return n
    return max(base + 1, math.ceil(base * min(ratio, MAX_UP_FACTOR)))


def prefill_side_ttft(obs: Observation) -> float | None:
    """The prefill engine's share of TTFT: its queue time plus its prefill time."""
    q, c = _val(obs.prefill.queue_time), _val(obs.prefill.compute_time)
    if q is None or c is None:
        return None
    return q + c


def decode_holds_ttft(obs: Observation, ttft: float, side: float | None, target_s: float) -> bool:
    """Whether a TTFT breach belongs to the decode side (KV transfer, decode admission, first step).

    The split ``ttft - side`` alone can't say so: ``ttft`` is a percentile of the whole while the
    prefill side is a sum of window statistics, so a prefill queueing tail also lands "after
    prefill". Adding decode replicas shortens TTFT only when requests wait at the decode pool, so the
    decode side must also show it: requests queued there (at least one per ready replica) or a decode
    queue time of at least a quarter of the target. Without that evidence the breach stays with
    prefill. (Seen without it: a 0.5 s TTFT target grew an idle decode pool to 14 replicas.) Both must
    hold now, not only over the window.
    """
    if side is None or ttft - side <= side:
        return False
    waiting, wait_s = _val(obs.decode.queue_depth), _val(obs.decode.queue_time)
    queued = waiting is not None and waiting >= max(obs.decode.ready, 1)
    # the queue time is a percentile over the metric window: it may describe a queue that has already
    # drained (seen: decode grown +4 per step while its queue was empty and KV 12-16% used). It counts
    # only while requests are still waiting at decode now.
    slow_admission = wait_s is not None and wait_s >= 0.25 * target_s and (waiting or 0.0) > 0
    return queued or slow_admission


def burst_drain_ttft(ttft: float, queued: float, n: int, m: int) -> float:
    """TTFT at ``m`` prefill replicas if the observed queueing comes from bursts: a burst's prompts are
    spread over the replicas and drain in parallel, so the wait in front of a request scales with n/m.

    A low mean arrival rate (what the M/M/1 view sees) says nothing about a burst of simultaneous
    requests (bursty code-completion traffic); their queue time does, and it grows as replicas go.
    """
    return ttft + max(queued, 0.0) * (n / m - 1.0)


def request_work(obs: Observation, modelled_s: float | None = None) -> float | None:
    """Busy seconds one request costs a prefill replica.

    ``modelled_s``: the latency model's share of a batched step for the observed prompt lengths,
    corrected online (what a request costs when batched with others; see
    :func:`disagg.policy.capacity.prefill_service`). Without a model: the measured prefill time of a
    request, unshared. That is an upper bound: prefill is compute-bound, so batching saves little (on
    the twin's Llama-70B profile one 920-token prompt takes 0.076 s, nine take 0.552 s: 0.061 s each),
    far less than the token budget / prompt length that a batch holds (9x here). Dividing by that
    ratio once made a pool of one replica look a third busy at 20 req/s."""
    if modelled_s is not None:
        return modelled_s
    return _val(obs.prefill.compute_time)


def backlog_only(obs: Observation, n: int, utilization: float) -> bool:
    """A TTFT breach that more prefill replicas would not cure: every replica asked for is ready, the
    present arrival rate x prefill time fits ``n`` replicas at the target utilisation, and requests are
    still queued (routed earlier, they wait on the replicas they were sent to: a new replica takes only
    new arrivals). Holding lets the backlog drain instead of adding replicas that arrive idle."""
    rate, c, queue = _val(obs.request_rate), _val(obs.prefill.compute_time), _val(obs.prefill.queue_depth)
    if rate is None or c is None or queue is None or obs.prefill.ready < n or n <= 0:
        return False
    return queue > n and rate * c / n <= utilization


def smallest_safe_prefill(
    obs: Observation,
    n: int,
    band: Band,
    util_cap: float,
    rb: RoleBounds,
    rate: float | None,
    work_s: float | None = None,
    ceiling: float | None = None,
) -> tuple[int, str] | None:
    """Fewest prefill replicas whose predicted TTFT still meets the shrunk target, or None if unprovable.

    Anchored on the TTFT observed now: a shrink adds only the extra waiting it causes. Busy fraction
    rho = arrival rate x work per request / n (``work_s``, else the unshared prefill time); the extra
    wait is the M/M/1 mean wait's growth S x (rho_m/(1-rho_m) - rho/(1-rho)), scaled up when the
    observed queue time exceeds that model, and at least the burst-drain growth (the observed queue
    time x n/m: a burst spreads over fewer replicas).
    """
    s, ttft, q = _val(obs.prefill.compute_time), _val(obs.ttft), _val(obs.prefill.queue_time)
    if rate is None or s is None or ttft is None or q is None or n <= 0:
        return None
    rho = rate * (s if work_s is None else work_s) / n
    if rho >= 1.0:
        return None

    def waiting(x: float) -> float:
        return s * x / (1.0 - x)

    calibration = max(q / waiting(rho), 1.0) if rho > 0 and s > 0 else 1.0
    best: tuple[int, str] | None = None
    for m in range(n - 1, rb.min_replicas - 1, -1):
        if m <= 0:
            break
        rho_m = rho * n / m
        if rho_m >= util_cap:
            break
        poisson = ttft + calibration * (waiting(rho_m) - waiting(rho))
        predicted = max(poisson, burst_drain_ttft(ttft, q, n, m))
        if predicted > (band.ceiling_after_shrink if ceiling is None else ceiling):
            break
        best = (m, f"predicted TTFT {predicted:.3f}s at busy fraction {rho_m:.2f} with {m} replicas")
    return best


# decode step time (s) at a batch of this many sequences per replica: the shape of a latency model
StepTime = Callable[[float], float]


def itl_growth(obs: Observation, n: int, m: int, step_time: StepTime | None) -> float:
    """How much ITL grows when the decode pool's running requests move from ``n`` to ``m`` replicas.

    Without a step-time shape: n/m, the linear upper bound (as if a step had no fixed part). With one
    (a latency model's decode step at the observed context), the ratio of its step times at the two
    batch sizes, anchored on the ITL observed now: the weights are read once per step whatever the
    batch, so a lightly loaded pool shrinks by far less than n/m in ITL. Never below 1.
    """
    running = _val(obs.decode.running)
    if step_time is None or running is None or running <= 0:
        return n / m
    before, after = step_time(running / n), step_time(running / m)
    if before <= 0:
        return n / m
    return max(after / before, 1.0)


def smallest_safe_decode(
    obs: Observation,
    n: int,
    band: Band,
    util_cap: float,
    rb: RoleBounds,
    step_time: StepTime | None = None,
    load_ratio: float = 1.0,
    kv_batch: int | None = None,
    peak_kv: float | None = None,
    peak_running: float | None = None,
    kv_growth: float = 1.0,
) -> tuple[int, str] | None:
    """Fewest decode replicas whose predicted ITL and KV usage stay safe, or None if unprovable.

    ``kv_batch``: the most sequences a replica's KV cache holds at the observed context lengths (from
    the latency model, judged at their 90th percentile); the running sequences at the peak load must
    fit ``m`` replicas at the target utilisation, whatever the instantaneous usage says (with long
    prompts it swings from 2% to 70% between two scrapes).

    With the same requests on fewer replicas, batch per replica grows by n/m; ITL grows by
    :func:`itl_growth` (at most linearly with the batch), KV usage linearly. ``load_ratio``: the load
    the survivors must carry over the present one (the peak of the scale-down window over the rate
    now, at least 1): KV is proven at that load, since a pool whose cache fills queues every new
    request. KV usage unmeasured: no proof, no shrink.

    ``peak_kv`` (KV in use over the scale-down window at its peak, in replica caches: usage x ready
    replicas) and ``peak_running`` (running sequences at the window's peak): the proof holds at the
    higher of them and the present reading grown by ``load_ratio``, since one scrape of a heavy-tailed
    pool's KV use may catch it at a trough. ``kv_growth``: how much more KV a request brings now than
    over the window (its footprint is rising), applied to the present reading on top of ``load_ratio``.
    """
    itl = _val(obs.itl)
    kv = _val(obs.decode.kv_usage)
    if itl is None or kv is None or n <= 0:
        return None
    kv = max(kv * max(load_ratio, 1.0) * max(kv_growth, 1.0), (peak_kv or 0.0) / n)
    running = _val(obs.decode.running)
    if running is not None:
        running = max(running * load_ratio, peak_running or 0.0)
    best: tuple[int, str] | None = None
    for m in range(n - 1, rb.min_replicas - 1, -1):
        if m <= 0:
            break
        scale = n / m
        predicted = itl * itl_growth(obs, n, m, step_time)
        if predicted > band.ceiling_after_shrink:
            break
        if kv * scale > util_cap:
            break
        if kv_batch is not None and running is not None and running / m > kv_batch * util_cap:
            break
        best = (m, f"predicted ITL <= {predicted * 1000:.1f}ms with {m} replicas")
    return best


def shrink_ceiling(band: Band, steady: bool) -> float:
    """The highest predicted TTFT a smaller prefill pool may have. Steady arrivals: the tolerance band's
    lower edge. Bursty ones: at most BURSTY_SHRINK_HEADROOM of the target, since the prediction comes
    from averages over the metric window and a burst shorter than the window lands on the survivors
    at a rate that average hides."""
    if steady:
        return band.ceiling_after_shrink
    return min(band.ceiling_after_shrink, band.target * BURSTY_SHRINK_HEADROOM)


def steady_arrivals(obs: Observation, history: Sequence[tuple[float, float]], window_s: float) -> bool:
    """Whether the arrival rate over ``window_s`` stayed within STEADY_PEAK_TO_MEAN of its mean."""
    now_rate = _val(obs.request_rate)
    if now_rate is None:
        return False
    rates = [now_rate, *(r for t, r in history if obs.time - t <= window_s)]
    mean = sum(rates) / len(rates)
    return mean > 0 and max(rates) <= STEADY_PEAK_TO_MEAN * mean


def peak_rate(obs: Observation, history: Sequence[tuple[float, float]], window_s: float) -> float | None:
    """The highest arrival rate over the metric window (the present one included): shrinking is
    judged against the peak, so a quiet half-minute between bursts does not look like spare capacity."""
    now_rate = _val(obs.request_rate)
    if now_rate is None:
        return None
    recent = [r for t, r in history if obs.time - t <= window_s]
    return max([now_rate, *recent])


def saturation(
    obs: Observation, policy: RatioPolicySpec, n: int, steady: bool, work_s: float | None = None
) -> tuple[int, str] | None:
    """Replicas to add before TTFT breaches: steady arrivals whose work keeps the ready prefill replicas
    busier than the target utilisation. Queueing delay grows without bound as the busy fraction nears
    one, and a replica asked for now serves only after its start-up, so the TTFT percentile is a late
    signal for a load that creeps up (long-context traffic whose prompts lengthen). Bursty arrivals are
    left to the TTFT feedback: their window mean says little about the next burst."""
    rate, work = _val(obs.request_rate), request_work(obs, work_s)
    if not steady or rate is None or work is None or n <= 0 or obs.prefill.ready < n:
        return None
    util, load = policy.feedback.target_utilization, rate * work
    busy = load / n
    if busy <= util:
        return None
    needed = math.ceil(load / util)
    return needed, f"busy fraction {busy:.2f} > {util:.2f} at {rate:.2f} req/s x {work:.3f}s per request"


def prefill_proposal(
    obs: Observation,
    policy: RatioPolicySpec,
    bounds: Bounds,
    rate: float | None = None,
    shrink_rate: float | None = None,
    steady: bool = False,
    work_s: float | None = None,
) -> RoleProposal:
    """``rate``: the arrival rate to size for (the peak over the metric window); the present one if None.
    ``shrink_rate``: the rate a smaller pool must still carry (the peak over the scale-down window);
    ``rate`` if None. ``steady``: the arrivals are steady (see :func:`steady_arrivals`), so a shrink
    may be judged from the work per request. ``work_s``: the modelled busy seconds per request (see
    :func:`request_work`); None: the measured prefill time, unshared."""
    n = obs.prefill.replicas
    band = Band(policy.slo.ttft.target_seconds, policy.tolerance)
    if is_idle(obs):
        return RoleProposal(
            bounds.prefill.min_replicas, (Reason("IdleShrink", "no requests arriving", "prefill"),)
        )
    ttft = _val(obs.ttft)
    if ttft is None:
        return RoleProposal(
            None, (Reason("MetricsMissing", f"TTFT is {obs.ttft.state.value}; holding", "prefill"),)
        )
    side = prefill_side_ttft(obs)
    if band.breached(ttft):
        if decode_holds_ttft(obs, ttft, side, band.target):
            return RoleProposal(n)  # the decode side holds TTFT: decode grows instead
        q, c = _val(obs.prefill.queue_time), _val(obs.prefill.compute_time)
        code = "TTFTBreachPrefillQueue" if (q is None or c is None or q >= c) else "TTFTBreachPrefillCompute"
        load = rate if rate is not None else _val(obs.request_rate)
        starting = obs.prefill.ready < n
        if backlog_only(obs, n, policy.feedback.target_utilization):
            msg = f"TTFT {ttft:.3f}s from a backlog queued before capacity arrived; {n} replicas fit the load"
            return RoleProposal(n, (Reason("TTFTBreachBacklog", msg, "prefill"),), breached=True)
        target = grow(n, band.ratio(ttft), obs.prefill.ready)
        work = request_work(obs, work_s)
        if starting:  # the window's peak was answered by the replicas still starting: size for now
            load = _val(obs.request_rate)
        if load is not None and work is not None and work > 0:
            # enough replicas for the arriving work at the target utilisation (queueing explodes the
            # latency ratio long before it says how much capacity is missing); a measured need, so
            # only the per-step cap bounds it (a long-prompt ramp from 2 replicas reached its size one
            # evaluation later when it was held to doubling: Mooncake 83.3% -> 84.8% attainment)
            needed = math.ceil(load * work / policy.feedback.target_utilization)
            target = max(n if starting else n + 1, needed)
        msg = f"TTFT p{policy.slo.ttft.percentile:g} {ttft:.3f}s > target {band.target:.3f}s"
        return RoleProposal(target, (Reason(code, msg, "prefill"),), breached=True)
    saturated = saturation(obs, policy, n, steady, work_s)
    if saturated is not None:
        return RoleProposal(saturated[0], (Reason("PrefillSaturation", saturated[1], "prefill"),))
    if band.comfortable(ttft):
        load = next((x for x in (shrink_rate, rate) if x is not None), _val(obs.request_rate))
        work = request_work(obs, work_s) if steady or work_s is not None else None
        safe = smallest_safe_prefill(
            obs,
            n,
            band,
            policy.feedback.target_utilization,
            bounds.prefill,
            load,
            work,
            shrink_ceiling(band, steady),
        )
        if safe is not None:
            return RoleProposal(safe[0], (Reason("SurplusCapacity", safe[1], "prefill"),))
    return RoleProposal(n)


def decode_proposal(
    obs: Observation,
    policy: RatioPolicySpec,
    bounds: Bounds,
    step_time: StepTime | None = None,
    load_ratio: float = 1.0,
    kv_batch: int | None = None,
) -> RoleProposal:
    n = obs.decode.replicas
    band = Band(policy.slo.itl.target_seconds, policy.tolerance)
    ttft_band = Band(policy.slo.ttft.target_seconds, policy.tolerance)
    if is_idle(obs):
        return RoleProposal(
            bounds.decode.min_replicas, (Reason("IdleShrink", "no requests arriving", "decode"),)
        )
    reasons: list[Reason] = []
    target: int | None = None
    breached = False
    itl = _val(obs.itl)
    kv = _val(obs.decode.kv_usage)
    if itl is not None and band.breached(itl):
        target = grow(n, band.ratio(itl), obs.decode.ready)
        breached = True
        reasons.append(
            Reason(
                "ITLBreach",
                f"ITL p{policy.slo.itl.percentile:g} {itl * 1000:.1f}ms > target {band.target * 1000:.1f}ms",
                "decode",
            )
        )
    if kv is not None and kv >= policy.feedback.kv_usage_high:
        kv_target = max(n + 1, math.ceil(n * kv / policy.feedback.target_utilization))
        target = max(target or 0, kv_target)
        breached = True
        reasons.append(Reason("KVPressure", f"decode KV-cache usage {kv:.2f}", "decode"))
    ttft, side = _val(obs.ttft), prefill_side_ttft(obs)
    decode_breach = ttft is not None and decode_holds_ttft(obs, ttft, side, ttft_band.target)
    if ttft is not None and side is not None and ttft_band.breached(ttft) and decode_breach:
        target = max(target or 0, grow(n, ttft_band.ratio(ttft), obs.decode.ready))
        breached = True
        reasons.append(
            Reason(
                "TTFTBreachTransferDecode",
                f"TTFT {ttft:.3f}s mostly after prefill ({ttft - side:.3f}s transfer + first step)",
                "decode",
            )
        )
    if target is not None:
        return RoleProposal(target, tuple(reasons), breached=breached)
    if itl is None:
        return RoleProposal(
            None, (Reason("MetricsMissing", f"ITL is {obs.itl.state.value}; holding", "decode"),)
        )
    # a TTFT breach the prefill side holds (its queue + prefill time is the larger share) says nothing
    # about decode: decode may still shrink on its own ITL and KV proof; an unattributed one holds it
    prefill_breach = ttft is not None and side is not None and not decode_breach
    if band.comfortable(itl) and (ttft is None or not ttft_band.breached(ttft) or prefill_breach):
        safe = smallest_safe_decode(
            obs, n, band, policy.feedback.target_utilization, bounds.decode, step_time, load_ratio, kv_batch
        )
        if safe is not None:
            return RoleProposal(safe[0], (Reason("SurplusCapacity", safe[1], "decode"),))
    return RoleProposal(n)

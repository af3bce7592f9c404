"""The request/reply objects of the ratio policy: what it observes, and what it decides and why.

Shared by the operator (observations read from Prometheus and the API server), the twin (observations
computed by the simulator) and the policy engine, so one policy code path runs offline and live.
Pure: no I/O, no kopf, no Kubernetes client.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Literal

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, Role] = ("prefill", "decode")


class SignalState(enum.StrEnum):
    """Why a signal has, or has no, value. Missing data is a state, never a zero."""

    OK = "ok"
    MISSING = "missing"  # the query returned no series (no scrape target, no traffic yet, wrong names)
    STALE = "stale"  # the newest sample is older than the metric window allows
    NAN = "nan"  # the series exists but the value is NaN (e.g. a quantile over zero observations)
    # a value the signal cannot take (infinite, a negative latency/rate/count, a fraction above 1):
    # garbage from the metrics pipeline, held like missing data rather than acted on
    INVALID = "invalid"


@dataclass(frozen=True)
class Measured:
    """One signal value with its state. ``value`` is None unless ``state`` is OK."""

    value: float | None
    state: SignalState = SignalState.OK

    @staticmethod
    def of(value: float | None) -> Measured:
        if value is None:
            return Measured(None, SignalState.MISSING)
        if math.isnan(value):
            return Measured(None, SignalState.NAN)
        return Measured(float(value), SignalState.OK)

    @staticmethod
    def missing(state: SignalState = SignalState.MISSING) -> Measured:
        return Measured(None, state)

    @property
    def ok(self) -> bool:
        return self.state is SignalState.OK and self.value is not None


MISSING = Measured(None, SignalState.MISSING)


@dataclass(frozen=True)
class RoleObservation:
    """What one pool looks like now. Replica counts come from the API server, the rest from metrics."""

    replicas: int  # desired replicas currently applied (spec of the child Deployment)
    ready: int  # pods Ready
    pending: int = 0  # pods that exist but are not scheduled (e.g. no GPU of that type left)
    # how long each of them has been Unschedulable, in seconds (the scheduler found no node): what the
    # Pending-pod ceiling learns from once a pod waited past the grace period (PENDING_GRACE_S)
    unschedulable_s: tuple[float, ...] = ()
    gpus_per_replica: int = 1
    queue_depth: Measured = MISSING  # requests waiting, summed over the pool
    running: Measured = MISSING  # requests running, summed over the pool
    kv_usage: Measured = MISSING  # mean KV-cache usage fraction 0..1 over the pool
    queue_time: Measured = MISSING  # engine queue time at the policy percentile (s)
    compute_time: Measured = MISSING  # mean prefill time (prefill pool) or per-token decode time (decode), s
    # prompt tokens/s (prefill; every prompt token, prefix-cache hits included, as the engines count them)
    # or generated tokens/s (decode)
    token_throughput: Measured = MISSING
    # fraction of prompt tokens served from the prefix cache over the window (0..1): those tokens cost
    # no prefill compute (vLLM prefix_cache_hits / prefix_cache_queries; SGLang cache_hit_rate)
    prefix_hit_rate: Measured = MISSING


@dataclass(frozen=True)
class Observation:
    """Everything the policy may look at for one deployment at one time.

    ``ttft`` and ``itl`` are the latencies users feel at the policy's percentile. In P/D serving the
    prefill engine sees queue + prefill and the decode engine sees KV transfer + first step; the
    metrics adapter combines them (see disagg.metrics) and the twin measures them end to end.
    """

    time: float  # seconds (wall clock live, simulated time offline)
    prefill: RoleObservation
    decode: RoleObservation
    ttft: Measured = MISSING  # seconds
    itl: Measured = MISSING  # seconds
    request_rate: Measured = MISSING  # requests/s arriving
    prompt_tokens_mean: Measured = MISSING
    prompt_tokens_p90: Measured = MISSING
    output_tokens_mean: Measured = MISSING
    output_tokens_p90: Measured = MISSING

    def role(self, role: Role) -> RoleObservation:
        return self.prefill if role == "prefill" else self.decode


@dataclass(frozen=True)
class Reason:
    """One cause behind a decision, machine-readable (``code``) and for people (``message``)."""

    code: str  # e.g. "TTFTBreachPrefillQueue", "ITLBreach", "IdleShrink", "MetricsMissing", "BudgetClamp"
    message: str
    role: Role | None = None


@dataclass(frozen=True)
class Decision:
    """The reply: target replicas for both pools, decided together, with every reason.

    ``changed`` is whether the target differs from the current replicas. In advisory mode the decision
    is reported but never applied.
    """

    time: float
    prefill: int
    decode: int
    reasons: tuple[Reason, ...] = ()
    changed: bool = False
    advisory: bool = False

    def replicas(self, role: Role) -> int:
        return self.prefill if role == "prefill" else self.decode

    @property
    def cause(self) -> str:
        """The primary reason code, e.g. for an Event reason or a metric label."""
        return self.reasons[0].code if self.reasons else "NoChange"


@dataclass(frozen=True)
class Recommendation:
    time: float
    prefill: int
    decode: int


@dataclass(frozen=True)
class PolicyState:
    """What the policy carries from one evaluation to the next (returned, never mutated in place)."""

    recommendations: tuple[Recommendation, ...] = ()  # within the longest stabilisation window
    last_scale_up: dict[str, float] = field(default_factory=dict)  # role -> time
    last_scale_down: dict[str, float] = field(default_factory=dict)
    limited: dict[str, int] = field(default_factory=dict)  # role -> replica ceiling found by Pending pods
    correction: dict[str, float] = field(default_factory=dict)  # model-based: observed/expected per role
    limited_since: dict[str, float] = field(default_factory=dict)  # role -> time the ceiling was learned
    load_history: tuple[tuple[float, float], ...] = ()  # (time, request rate) within the lookahead window
    # (time, prompt tokens/s prefill computes, output tokens/s decode generates), over the same span: the
    # work each pool does. A request rate alone misleads when lengths shift (chat -> long documents: the
    # rate falls while each request's prefill grows five-fold), so the model-based plan forecasts work
    work_history: tuple[tuple[float, float, float], ...] = ()
    # (time, requests queued at prefill) at the last few evaluations: a queue growing at each of them
    # says by how much arrivals outrun the pool now, before the window's average rate shows it
    prefill_queue: tuple[tuple[float, float], ...] = ()
    # when arrivals outran the prefill pool (the start of each such episode) within the last hour: a pool
    # caught out by traffic returning to a level it had seen keeps what that level needs for the hour
    prefill_fell_behind: tuple[float, ...] = ()
    # (time, prompt tokens/s prefill computes) of the evaluations within the last hour at which a
    # prefill-side breach met work well above the hour's usual level: bursts that recur come back to
    # about that level, and a pool shrunk between them meets each with a backlog
    prefill_peaks: tuple[tuple[float, float], ...] = ()
    # (time, decode KV in use in replica caches: usage x ready replicas, sequences running at decode,
    # KV footprint of a request: output x (prompt + output / 2) tokens) over the scale-down window: a
    # decode shrink is proven against the window's peak, not one scrape (with heavy-tailed prompts the
    # pool's KV use swings two-fold between scrapes), and not while the footprint grows
    decode_load: tuple[tuple[float, float, float, float], ...] = ()
    flaps: dict[str, tuple[float, ...]] = field(
        default_factory=dict
    )  # role -> times it grew back after a shrink
    # role -> times within the last hour its size changed against its previous change (see engine)
    reversals: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # model-based: the share of recent evaluations whose latencies breached the SLO (an exponential
    # average); the error budget the sizing may spend (see disagg.policy.model_based.budget_utilization)
    slo_spend: float | None = None


@dataclass(frozen=True)
class RoleBounds:
    """What the DisaggregatedDeployment allows one pool: replica range and GPUs per replica."""

    min_replicas: int = 1
    max_replicas: int = 64
    gpus_per_replica: int = 1
    # seconds from asking for a replica to its serving (model download or cache read, engine start);
    # None: not known, the policy plans over its lookaheadSeconds instead
    startup_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.min_replicas < 0:
            raise ValueError(f"min_replicas must be >= 0, got {self.min_replicas}")
        if self.max_replicas < self.min_replicas:
            raise ValueError(
                f"max_replicas ({self.max_replicas}) must be >= min_replicas ({self.min_replicas})"
            )
        if self.gpus_per_replica < 1:
            raise ValueError(f"gpus_per_replica must be >= 1, got {self.gpus_per_replica}")
        if self.startup_seconds is not None and self.startup_seconds < 0:
            raise ValueError(f"startup_seconds must be >= 0, got {self.startup_seconds}")

    def clamp(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))


@dataclass(frozen=True)
class ReplicaLayout:
    """How one replica's GPUs split the model (the fields of :class:`disagg.perf.moe.Parallelism`): ``dp``
    data-parallel attention ranks of ``tp`` GPUs each, the routed experts of a MoE model over ``ep`` GPUs
    (``tp x dp``; 1: tensor-parallel experts), on nodes of ``gpus_per_node``; ``overlap``: two-batch overlap
    of the all-to-all with compute."""

    tp: int = 1
    dp: int = 1
    ep: int = 1
    gpus_per_node: int = 8
    overlap: bool = False

    @property
    def tensor_only(self) -> bool:
        """Plain tensor parallelism within one node (what the dense profiles model)."""
        return (self.dp, self.ep, self.gpus_per_node, self.overlap) == (1, 1, 8, False)


@dataclass(frozen=True)
class ServingProfile:
    """What the model-based algorithm needs to load a latency model (from the deployment's spec)."""

    model: str
    gpu: str
    tp_prefill: int = 1
    tp_decode: int = 1
    dtype: str = "bf16"
    # each pool's replica layout where it is more than tensor parallelism (data-parallel attention,
    # expert parallelism, several nodes); None: ``tp_<role>`` GPUs of tensor parallelism
    layout_prefill: ReplicaLayout | None = None
    layout_decode: ReplicaLayout | None = None
    # draft tokens per decode step of MTP speculative decoding (disagg.perf.moe.Speculation); 0: none
    mtp_decode: int = 0

    def layout(self, role: str) -> ReplicaLayout | None:
        return self.layout_prefill if role == "prefill" else self.layout_decode


@dataclass(frozen=True)
class Bounds:
    """The deployment's autoscaling limits (spec.autoscaling) plus what the model-based algorithm needs."""

    prefill: RoleBounds = RoleBounds()
    decode: RoleBounds = RoleBounds()
    max_gpus: int | None = None  # spec.autoscaling.maxGPUs; the policy's gpuBudget may lower it
    profile: ServingProfile | None = None

    def role(self, role: Role) -> RoleBounds:
        return self.prefill if role == "prefill" else self.decode

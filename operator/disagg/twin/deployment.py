"""What the twin simulates: a deployment's pools (:class:`PoolSpec`) and the deployment
(:class:`SimDeployment`): engine, GPU, link, start-up and the bounds its policy decides within, from a
small twin document or a validated DisaggregatedDeployment (:meth:`SimDeployment.from_model`, the same
reading as the operator's: :func:`disagg.policy.bounds.bounds_for`). :mod:`disagg.twin.sim` runs it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from disagg.api.deployment import DisaggregatedDeployment
from disagg.api.textfile import MAX_MANIFEST_BYTES, read_text
from disagg.perf.latency import resolve_gpu_name
from disagg.perf.memory import EngineMemory
from disagg.perf.moe import DEFAULT_MTP_ACCEPTANCE, Parallelism, Speculation
from disagg.perf.startup import DEFAULT_ASSUMPTIONS, StartupAssumptions
from disagg.policy.bounds import (
    DEFAULT_GPU,
    GPU_LABELS,
    bounds_for,
    engine_flag,
    engine_int_arg,
    mtp_tokens,
    replica_layout,
)
from disagg.policy.types import Bounds, ReplicaLayout, Role, RoleBounds, ServingProfile
from disagg.twin.engine import DEFAULT_MAX_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS

Routing = Literal["round_robin", "least_outstanding", "random"]


@dataclass(frozen=True)
class PoolSpec:
    """A pool of identical replicas. A replica is ``tp x dp`` GPUs: ``dp`` data-parallel attention ranks
    of ``tp`` GPUs each, the routed experts of a MoE model expert-parallel over all of them (``ep = tp x
    dp``) or tensor-parallel (``ep = 1``), on nodes of ``gpus_per_node``; ``overlap``: two-batch overlap
    of the all-to-all with compute (:class:`disagg.perf.moe.Parallelism`)."""

    replicas: int
    tp: int = 1
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    min_replicas: int = 1
    max_replicas: int = 1000
    dp: int = 1
    ep: int = 1
    gpus_per_node: int = 8
    overlap: bool = False
    # vLLM --gpu-memory-utilization (None: vLLM's 0.9) and --enforce-eager: with max_num_batched_tokens and
    # max_num_seqs they size the engine's KV cache (disagg.perf.memory)
    gpu_memory_utilization: float | None = None
    enforce_eager: bool = False
    # MTP speculative decoding (disagg.perf.moe.Speculation): draft tokens per step (0: off) and the
    # acceptance of each; a DisaggregatedDeployment's from the engine flags (speculation_from_args)
    mtp_tokens: int = 0
    mtp_acceptance: float = DEFAULT_MTP_ACCEPTANCE

    def __post_init__(self) -> None:
        if self.replicas < 0:
            raise ValueError(f"replicas: must be >= 0, got {self.replicas}")
        if self.tp not in (1, 2, 4, 8, 16):
            raise ValueError(f"tp: must be 1, 2, 4, 8 or 16 (two nodes, dense models), got {self.tp}")
        u = self.gpu_memory_utilization
        if u is not None and not 0.0 < u <= 1.0:
            raise ValueError(f"gpu_memory_utilization: must be in (0, 1], got {u}")
        self.parallelism()  # dp, ep, gpus_per_node: ValueError naming the field
        if self.mtp_tokens < 0:
            raise ValueError(f"mtp_tokens: must be >= 0, got {self.mtp_tokens}")
        self.speculation()  # mtp_acceptance

    def engine_memory(self, vllm_defaults: EngineMemory) -> EngineMemory:
        """The flags that size one engine's KV cache: this pool's where it sets them, else what vLLM runs
        with by default on the GPU (``vllm_defaults``; the twin's scheduling defaults, e.g. 256 sequences,
        are not what an engine without --max-num-seqs profiles with)."""
        return replace(
            vllm_defaults,
            gpu_memory_utilization=self.gpu_memory_utilization or vllm_defaults.gpu_memory_utilization,
            max_num_batched_tokens=(
                self.max_num_batched_tokens
                if self.max_num_batched_tokens != DEFAULT_MAX_BATCHED_TOKENS
                else vllm_defaults.max_num_batched_tokens
            ),
            max_num_seqs=(
                self.max_num_seqs if self.max_num_seqs != DEFAULT_MAX_NUM_SEQS else vllm_defaults.max_num_seqs
            ),
            enforce_eager=self.enforce_eager,
        )

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.dp

    def speculation(self) -> Speculation | None:
        """The pool's MTP speculative decoding, or None."""
        return Speculation(self.mtp_tokens, self.mtp_acceptance) if self.mtp_tokens else None

    def layout(self) -> ReplicaLayout | None:
        """The replica's layout as the policy's profile carries it; None for plain tensor parallelism
        (as :func:`disagg.policy.bounds.serving_profile` reads a DisaggregatedDeployment's)."""
        found = ReplicaLayout(self.tp, self.dp, self.ep, self.gpus_per_node, self.overlap)
        return None if found.tensor_only else found

    def parallelism(self) -> Parallelism | None:
        """The replica's parallelism for the MoE latency model; None for plain tensor parallelism."""
        if self.layout() is None:
            return None
        return Parallelism(self.tp, self.dp, self.ep, self.gpus_per_node, self.overlap)


@dataclass(frozen=True)
class SimDeployment:
    model: str
    gpu: str = "h100"
    dtype: str = "bf16"
    kv_dtype: str = "bf16"  # vLLM --kv-cache-dtype: bf16 (auto for bf16 models) or fp8
    mode: Literal["pd", "colocated"] = "pd"
    prefill: PoolSpec | None = None
    decode: PoolSpec | None = None
    colocated: PoolSpec | None = None
    routing: Routing = "least_outstanding"
    link: str = "nic"
    kv_setup_s: float | None = None
    link_gbytes_per_s: float | None = None  # overrides the named link's bandwidth per prefill replica
    startup_delay_s: float = 120.0
    request_overhead_s: float | None = None  # front-end delay before the engine queue; None: profile's
    prefix_caching: bool = True  # vLLM V1 default; only requests carrying prefix hashes can hit
    name: str = "twin"
    max_gpus: int | None = None  # GPU budget of both pools (a DisaggregatedDeployment's maxGPUs)
    # the replica start-up the policy plans with: a DisaggregatedDeployment's estimate from its spec, as
    # the operator's before any pod is Ready; None (a twin document): the policy plans over its lookahead
    planned_startup_s: float | None = None
    # what the twin assumed about the GPU, for the user (e.g. no nodeSelector names one: the default);
    # set by from_model/from_dict, never read from a document
    gpu_note: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.mode == "pd" and (self.prefill is None or self.decode is None):
            raise ValueError("prefill/decode: P/D mode needs both a prefill and a decode pool")
        if self.mode == "colocated" and self.colocated is None:
            raise ValueError("colocated: colocated mode needs a colocated pool")
        if self.mode not in ("pd", "colocated"):
            raise ValueError(f"mode: {self.mode!r} is not 'pd' or 'colocated'")
        if self.routing not in ("round_robin", "least_outstanding", "random"):
            raise ValueError(f"routing: {self.routing!r} is not round_robin, least_outstanding or random")
        if self.kv_dtype not in ("bf16", "fp8"):
            raise ValueError(f"kv_dtype: {self.kv_dtype!r} is not 'bf16' or 'fp8'")
        if self.startup_delay_s < 0:
            raise ValueError(f"startup_delay_s: must be >= 0, got {self.startup_delay_s}")

    @property
    def gpus(self) -> int:
        pools = [self.prefill, self.decode] if self.mode == "pd" else [self.colocated]
        return sum(p.replicas * p.gpus_per_replica for p in pools if p is not None)

    def colocated_equivalent(self) -> SimDeployment:
        """A colocated deployment on the same GPUs (replicas of the decode pool's TP)."""
        if self.mode == "colocated":
            return self
        assert self.decode is not None
        per_replica = self.decode.gpus_per_replica
        spec = replace(
            self.decode, replicas=max(1, self.gpus // per_replica), max_replicas=1000, min_replicas=1
        )
        return replace(self, mode="colocated", colocated=spec, prefill=None, decode=None)

    def policy_bounds(self) -> Bounds:
        """The bounds the ratio policy decides within: the pools' replica ranges and TP, the GPU budget,
        the serving profile and the planned start-up (for a DisaggregatedDeployment, exactly
        :func:`disagg.policy.bounds.bounds_for` of it: what the operator decides within)."""
        if self.prefill is None or self.decode is None:
            raise ValueError("policy bounds: the ratio policy needs a P/D deployment")

        def role(pool: PoolSpec) -> RoleBounds:
            return RoleBounds(
                pool.min_replicas, pool.max_replicas, pool.gpus_per_replica, self.planned_startup_s
            )

        profile = ServingProfile(
            self.model,
            self.gpu,
            self.prefill.tp,
            self.decode.tp,
            self.dtype,
            layout_prefill=self.prefill.layout(),
            layout_decode=self.decode.layout(),
            mtp_decode=self.decode.mtp_tokens,
        )
        return Bounds(role(self.prefill), role(self.decode), self.max_gpus, profile)

    @staticmethod
    def from_model(
        dd: DisaggregatedDeployment, startup: StartupAssumptions = DEFAULT_ASSUMPTIONS
    ) -> SimDeployment:
        """The twin deployment of a validated DisaggregatedDeployment: pools, bounds, GPU budget and
        profile from :func:`disagg.policy.bounds.bounds_for`, engine limits and the KV cache dtype from
        the engine arguments, and the replica start-up its spec implies (weights cached on a volume or
        downloaded, under the ``startup`` assumptions; a model without a profile keeps the default)."""
        spec = dd.spec
        bounds = bounds_for(dd, assumptions=startup)
        profile = bounds.profile
        assert profile is not None  # bounds_for always reads the profile of a DisaggregatedDeployment

        def pool(role: Role) -> PoolSpec:
            args = [*spec.engine.args, *spec.role(role).args]
            rb = bounds.role(role)
            return PoolSpec(
                replicas=spec.role(role).replicas,
                **asdict(replica_layout(spec, role)),
                max_num_seqs=engine_int_arg(args, "--max-num-seqs", DEFAULT_MAX_NUM_SEQS),
                max_num_batched_tokens=engine_int_arg(
                    args, "--max-num-batched-tokens", DEFAULT_MAX_BATCHED_TOKENS
                ),
                gpu_memory_utilization=_float_arg(args, "--gpu-memory-utilization"),
                enforce_eager=_bool_flag(args, "--enforce-eager"),
                mtp_tokens=mtp_tokens(args, spec.model.name),
                min_replicas=rb.min_replicas,
                max_replicas=rb.max_replicas,
            )

        # vLLM --kv-cache-dtype {auto,fp8,fp8_e4m3,fp8_e5m2} (source: vLLM engine arguments docs)
        kv = engine_flag([*spec.engine.args, *spec.prefill.args, *spec.decode.args], "--kv-cache-dtype")
        planned = bounds.prefill.startup_seconds
        name = dd.name or "twin"
        return SimDeployment(
            model=profile.model,
            gpu=profile.gpu,
            dtype=profile.dtype,
            kv_dtype="fp8" if (kv or "auto").startswith("fp8") else "bf16",
            prefill=pool("prefill"),
            decode=pool("decode"),
            startup_delay_s=planned if planned is not None else SimDeployment.startup_delay_s,
            name=name,
            max_gpus=bounds.max_gpus,
            planned_startup_s=planned,
            gpu_note=_selector_gpu_note(name, profile.gpu, _selected_gpus(dd)),
        )

    @staticmethod
    def from_dict(obj: Mapping[str, Any], startup: StartupAssumptions = DEFAULT_ASSUMPTIONS) -> SimDeployment:
        """A small twin deployment document, or a DisaggregatedDeployment object (kind set: validated,
        then :meth:`from_model`)."""
        kind = obj.get("kind")
        if kind == DisaggregatedDeployment.model_fields["kind"].default:
            return SimDeployment.from_model(DisaggregatedDeployment.model_validate(dict(obj)), startup)
        if kind is not None:
            raise ValueError(
                f"deployment: kind {kind!r}: expected a DisaggregatedDeployment or a twin deployment "
                "(model, prefill, decode)"
                + (" - a RatioPolicy goes to --policy" if kind == "RatioPolicy" else "")
            )
        for role in ("prefill", "decode", "colocated"):
            if obj.get(role) is not None and not isinstance(obj[role], Mapping):
                raise ValueError(f"{role}: expected a mapping (replicas, tp, ...), got {obj[role]!r:.60}")
            _known_fields(f"{role}.", obj.get(role) or {}, PoolSpec)
        try:
            pools: dict[str, Any] = {
                k: PoolSpec(**v) for k, v in obj.items() if k in ("prefill", "decode", "colocated") and v
            }
        except TypeError as e:
            raise ValueError(f"prefill/decode/colocated: {e}") from e
        rest = {
            k: v for k, v in obj.items() if k not in ("prefill", "decode", "colocated", "kind", "apiVersion")
        }
        _known_fields("", rest, SimDeployment, internal={"gpu_note"})
        note = None
        if "gpu" not in rest:
            note = (
                f"{rest.get('name', 'twin')}: no gpu field; simulating the default {SimDeployment.gpu} "
                "(set gpu: to simulate another)"
            )
        try:
            return SimDeployment(**rest, **pools, gpu_note=note)
        except TypeError as e:
            raise ValueError(f"deployment: {e}") from e

    @staticmethod
    def load(path: str | Path) -> SimDeployment:
        try:
            docs = [d for d in yaml.safe_load_all(read_text(path, MAX_MANIFEST_BYTES)) if d]
        except yaml.YAMLError as error:
            raise ValueError(
                f"deployment: {path} is not valid YAML: {' '.join(str(error).split())}"
            ) from error
        if not docs:
            raise ValueError(f"deployment: {path} is empty")
        if not isinstance(docs[0], dict):
            raise ValueError(f"deployment: {path} does not hold a mapping")
        return SimDeployment.from_dict(docs[0])


def _float_arg(args: list[str], flag: str) -> float | None:
    value = engine_flag(args, flag)
    return None if value is None else float(value)


def _bool_flag(args: list[str], flag: str) -> bool:
    """A vLLM boolean flag: ``--flag`` or ``--flag=true`` sets it, ``--no-flag`` or ``--flag=false`` clears
    it (the last one wins; vLLM's argparse BooleanOptionalAction)."""
    on = False
    for a in args:
        if a == flag:
            on = True
        elif a == "--no-" + flag[2:]:
            on = False
        elif a.startswith(flag + "="):
            on = a.split("=", 1)[1].strip().lower() in ("1", "true", "yes")
    return on


def _selected_gpus(dd: DisaggregatedDeployment) -> dict[Role, str | None]:
    """The GPU type each pool's nodeSelector names (the labels :func:`disagg.policy.bounds.gpu_of` reads)."""
    out: dict[Role, str | None] = {}
    for role in ("prefill", "decode"):
        selector = dd.spec.role(role).node_selector or {}
        out[role] = next((selector[label] for label in GPU_LABELS if selector.get(label)), None)
    return out


def _gpu_key(gpu: str) -> str:
    """The twin's name of a GPU label value (``NVIDIA-H100-80GB-HBM3`` and ``h100`` are one GPU)."""
    try:
        return resolve_gpu_name(gpu)
    except ValueError:
        return gpu.strip().lower()


def _selector_gpu_note(name: str, simulated: str, selected: Mapping[Role, str | None]) -> str | None:
    """What a user should know about the GPU simulated for a DisaggregatedDeployment, or None."""
    labels = " or ".join(GPU_LABELS)
    if not any(selected.values()):
        return (
            f"{name}: no pool's nodeSelector names a GPU type ({labels}); simulating the default "
            f"{DEFAULT_GPU}, as the operator's model-based policy assumes; set one to simulate another GPU"
        )
    named = {role: gpu for role, gpu in selected.items() if gpu}
    if len(named) == 2 and len({_gpu_key(gpu) for gpu in named.values()}) == 2:
        return (
            f"{name}: the pools' nodeSelectors name different GPUs (prefill {named['prefill']}, decode "
            f"{named['decode']}); the twin simulates both pools on {simulated}, the decode pool's"
        )
    if len(named) == 1:
        (role, gpu), other = next(iter(named.items())), "decode" if "prefill" in named else "prefill"
        return (
            f"{name}: only the {role} pool's nodeSelector names a GPU ({gpu}); simulating {other} on it too"
        )
    return None


def _known_fields(
    prefix: str, given: Mapping[str, Any], cls: type, internal: frozenset[str] | set[str] = frozenset()
) -> None:
    """ValueError naming the keys of ``given`` that ``cls`` (a dataclass) has no field for (or only an
    ``internal`` one, which a document may not set)."""
    known = {f.name for f in fields(cls)} - set(internal)
    unknown = sorted(str(k) for k in given if k not in known)
    if unknown:
        raise ValueError(
            f"deployment: unknown field(s) {', '.join(prefix + k for k in unknown)} "
            f"(known: {', '.join(sorted(known))})"
        )

"""The policy's bounds of a DisaggregatedDeployment, read once from the validated model. Pure.

The operator's autoscaler, ``disagg simulate`` (:meth:`disagg.twin.sim.SimDeployment.from_model`) and the
benchmarks all call :func:`bounds_for`, so the same objects give the same replica ranges, GPUs, GPU
budget, serving profile (what the model-based algorithm loads its latency model from) and replica
start-up everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from disagg.api.deployment import DisaggregatedDeployment, DisaggregatedDeploymentSpec
from disagg.perf.moe import load_moe_archs, resolve_moe_model
from disagg.perf.startup import DEFAULT_ASSUMPTIONS, StartupAssumptions, spec_startup_delay_s, weights_cached
from disagg.policy.types import ROLES, Bounds, ReplicaLayout, Role, RoleBounds, ServingProfile

# Node labels that name the GPU a pool runs on, in the order they are looked for (decode pool first).
GPU_LABELS = ("disagg.dev/gpu-type", "nvidia.com/gpu.product")
DEFAULT_GPU = "h100"


def gpu_of(spec: DisaggregatedDeploymentSpec) -> str:
    """The GPU type named by the pools' node selectors (the decode pool's first), else the default."""
    for role in ("decode", "prefill"):
        selector = spec.role(role).node_selector or {}
        for label in GPU_LABELS:
            if selector.get(label):
                return selector[label]
    return DEFAULT_GPU


def weight_dtype(spec: DisaggregatedDeploymentSpec) -> str:
    """The weights' data type as the latency model knows it: fp8 when the spec asks for fp8, else bf16."""
    named = spec.model.dtype or spec.model.quantization or "bf16"
    return "fp8" if named.lower() == "fp8" else "bf16"


def model_dtype(spec: DisaggregatedDeploymentSpec) -> str:
    """The weights' data type the latency models know: :func:`weight_dtype`, or fp4 where the
    quantization names a 4-bit float format (vLLM ``--quantization`` modelopt_fp4 / mxfp4 / nvfp4)."""
    quantization = spec.model.quantization
    return "fp4" if quantization and "fp4" in quantization.lower() else weight_dtype(spec)


def engine_flag(args: Sequence[str], flag: str) -> str | None:
    """The string value of ``--flag V`` or ``--flag=V`` (the last one wins), or None."""
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def engine_int_arg(args: Sequence[str], flag: str, default: int) -> int:
    """The value of an engine flag given as ``--flag N`` or ``--flag=N`` (the last one wins)."""
    value = engine_flag(args, flag)
    return default if value is None else int(value)


def replica_layout(spec: DisaggregatedDeploymentSpec, role: Role) -> ReplicaLayout:
    """How a replica of ``role`` splits the model: from the role's ``parallelism`` where given, else the
    engine arguments (vLLM ``--data-parallel-size``, ``--enable-expert-parallel``, ``--enable-dbo``;
    SGLang ``--attn-dp-size``, or ``--dp`` with ``--enable-dp-attention``,
    ``--ep``/``--ep-size``/``--moe-a2a-backend``, ``--enable-two-batch-overlap``), else the replica's GPUs
    of tensor parallelism (a MoE replica beyond one node: TP8 attention per node, experts over all GPUs)."""
    rs = spec.role(role)
    par = rs.parallelism
    if par is not None:
        tensor, data = rs.tensor_size, rs.data_size
        ep = tensor * data if (rs.expert_size or 1) > 1 else 1
        return ReplicaLayout(tp=tensor, dp=data, ep=ep, gpus_per_node=rs.gpus_per_node)
    return layout_from_args([*spec.engine.args, *rs.args], rs.gpus_per_replica, spec.model.name)


def layout_from_args(
    args: Sequence[str], gpus: int, model: str, gpus_per_node: int | None = None
) -> ReplicaLayout:
    """How a replica of ``gpus`` GPUs serving ``model`` splits it, from its engine arguments (see
    :func:`replica_layout`): the policy's reading of a spec's args, and the live twin's of a pod's command
    line (``gpus_per_node``: the pod's GPUs, for a replica spanning several pods; None: 8)."""
    present = {a.split("=", 1)[0] for a in args}
    overlap = bool(present & {"--enable-two-batch-overlap", "--enable-dbo"})
    expert = bool(present & {"--enable-expert-parallel", "--ep", "--ep-size", "--moe-a2a-backend"})
    dp = engine_int_arg(args, "--data-parallel-size", 1)
    if "--enable-dp-attention" in present:
        dp = engine_int_arg(args, "--dp", engine_int_arg(args, "--dp-size", dp))
    # SGLang's replacement of --dp-size N --enable-dp-attention, what disagg renders (sglang 0.5.23 wheel,
    # sglang/srt/arg_groups/fields/parallel.py attn_dp_size; disagg.render.engines.sglang)
    dp = engine_int_arg(args, "--attn-dp-size", dp)
    node = 8 if gpus_per_node is None else gpus_per_node  # ReplicaLayout's default
    if dp > 1 or expert or overlap:
        dp = max(1, dp)
        tp = max(1, gpus // dp)
        return ReplicaLayout(tp=tp, dp=dp, ep=tp * dp if expert else 1, overlap=overlap, gpus_per_node=node)
    if resolve_moe_model(model) is not None and gpus > 8:
        return ReplicaLayout(tp=8, dp=gpus // 8, ep=gpus, gpus_per_node=node)
    return ReplicaLayout(tp=gpus, gpus_per_node=node)


# vLLM's MTP methods (vllm 0.33.0 wheel, vllm/config/speculative.py MTPModelTypes: deepseek_mtp and the
# other model-specific names are deprecated aliases that it rewrites to "mtp")
VLLM_MTP_METHODS = ("mtp", "deepseek_mtp", "mimo_mtp", "glm4_moe_mtp", "ernie_mtp", "qwen3_next_mtp")


def speculation_from_args(args: Sequence[str]) -> int:
    """Draft tokens per step of MTP speculative decoding the engine flags ask for (0: none), as the pinned
    wheels read them: vLLM 0.33 ``--speculative-config``/``-sc`` JSON (``method`` an MTP method,
    ``num_speculative_tokens``) or ``--spec-method mtp --spec-tokens k`` (vllm/engine/arg_utils.py); SGLang
    0.5.23 ``--speculative-algorithm EAGLE|NEXTN`` without a ``--speculative-draft-model-path`` (NEXTN
    aliases EAGLE and drafts with the model's own MTP layer; sglang/srt/arg_groups/speculative_hook.py) and
    ``--speculative-num-steps k`` (sglang/srt/arg_groups/fields/spec.py). Other speculative methods (a
    separate draft model, n-gram) are simulated without speculation: the twin has no draft-model profile."""
    raw = engine_flag(args, "--speculative-config") or engine_flag(args, "-sc")
    method, tokens = engine_flag(args, "--spec-method"), engine_flag(args, "--spec-tokens")
    if raw is not None:
        try:
            cfg = json.loads(raw)
        except json.JSONDecodeError:
            raise ValueError(f"--speculative-config: not JSON: {raw!r:.80}") from None
        if isinstance(cfg, dict):
            cfg = {str(k).replace("-", "_"): v for k, v in cfg.items()}
            method = cfg.get("method", method)
            tokens = cfg.get("num_speculative_tokens", tokens)
    if method is not None:
        return int(tokens) if str(method).lower() in VLLM_MTP_METHODS and tokens is not None else 0
    algorithm = engine_flag(args, "--speculative-algorithm")
    if algorithm is None or algorithm.upper() not in ("EAGLE", "NEXTN"):
        return 0
    if engine_flag(args, "--speculative-draft-model-path") or engine_flag(args, "--speculative-draft-model"):
        return 0
    # unset: SGLang picks (3 steps, top-1, 4 draft tokens) for DeepseekV3ForCausalLM
    # (speculative_hook.py _auto_choose_speculative_params)
    return int(engine_flag(args, "--speculative-num-steps") or 3)


def mtp_tokens(args: Sequence[str], model: str) -> int:
    """:func:`speculation_from_args` where ``model`` publishes an MTP module to draft with, else 0 (an
    engine asked to speculate without one fails to start; the twin and the policy model it without)."""
    name = resolve_moe_model(model)
    if name is None or not load_moe_archs()[name].mtp_layers:
        return 0
    return speculation_from_args(args)


def serving_profile(spec: DisaggregatedDeploymentSpec) -> ServingProfile:
    """Model, GPU, each pool's replica layout and the weight dtype: the model-based algorithm's profile."""
    prefill, decode = (replica_layout(spec, role) for role in ROLES)
    return ServingProfile(
        model=spec.model.name,
        gpu=gpu_of(spec),
        tp_prefill=prefill.tp,
        tp_decode=decode.tp,
        dtype=model_dtype(spec),
        layout_prefill=None if prefill.tensor_only else prefill,
        layout_decode=None if decode.tensor_only else decode,
        mtp_decode=mtp_tokens([*spec.engine.args, *spec.decode.args], spec.model.name),
    )


def spec_startup_s(
    spec: DisaggregatedDeploymentSpec, assumptions: StartupAssumptions = DEFAULT_ASSUMPTIONS
) -> float | None:
    """The start-up of one replica the spec implies (weights cached on a volume or downloaded, see
    :mod:`disagg.perf.startup`); None when there is no profile of the model."""
    try:
        return spec_startup_delay_s(spec.to_api(), weight_dtype(spec), assumptions)
    except (ValueError, KeyError):
        return None


def spec_weights_cached(spec: DisaggregatedDeploymentSpec) -> bool:
    """Whether replicas read the weights from a volume (spec.model.cache, or a pvc source)."""
    return weights_cached(spec.to_api())


def bounds_for(
    dd: DisaggregatedDeployment,
    startups: Mapping[Role, float | None] | None = None,
    assumptions: StartupAssumptions = DEFAULT_ASSUMPTIONS,
) -> Bounds:
    """The policy bounds of ``dd``: each pool's replica range (spec.autoscaling.<role>, or the spec's
    replicas when unset), GPUs per replica, maxGPUs, the serving profile, and each pool's replica
    start-up: ``startups`` (e.g. measured on the pods) where given, else the spec's estimate."""
    spec = dd.spec
    estimate = spec_startup_s(spec, assumptions) if startups is None else None
    auto = spec.autoscaling

    def role_bounds(role: Role) -> RoleBounds:
        replicas = spec.replica_bounds(role)
        return RoleBounds(
            min_replicas=replicas.min_replicas,
            max_replicas=replicas.max_replicas,
            gpus_per_replica=spec.role(role).gpus_per_replica,
            startup_seconds=estimate if startups is None else startups.get(role),
        )

    prefill, decode = (role_bounds(role) for role in ROLES)
    return Bounds(
        prefill=prefill,
        decode=decode,
        max_gpus=auto.max_gpus if auto is not None else None,
        profile=serving_profile(spec),
    )

"""Step times of mixture-of-experts, MLA and dense-GQA models under a replica's parallelism.

One replica is ``tp x dp`` GPUs (:class:`Parallelism`): ``dp`` data-parallel attention ranks of ``tp`` GPUs
each, the routed experts either sharded over all of them (expert parallelism, ``ep = tp * dp``) or
tensor-parallel (``ep = 1``). A step of ``num_tokens`` tokens is split evenly over the DP ranks; per layer
and per rank (``m`` tokens, ``T = m * dp`` in the whole replica):

* attention: MLA models from the MLA module tables (projections + latent attention; ``a + b*tokens +
  c*sum(l^2)`` in prefill, ``a + b*batch + g*sum(context)`` in decode), GQA models from the qkv/o GEMMs plus
  the attention fits of the dense profiles; an all-reduce of ``m * hidden`` when ``tp > 1``;
* FFN: dense layers (``dense_layers``, or all of a dense model) as gate_up + down GEMMs sharded by ``tp``;
  MoE layers as router GEMM + shared experts + routed experts, the last from the MoE kernel tables: under
  EP one rank's grouped GEMMs at ``T x imbalance`` tokens (SGLang's DeepEP/DeepGEMM tables where measured:
  contiguous layout in prefill, masked in decode; else vLLM's fused-MoE table), without EP the
  tensor-parallel experts at ``T`` plus an all-reduce;
* all-to-all (EP only, replacing the all-reduce): DeepEP dispatch + combine, normal kernels for steps that
  prefill and low-latency kernels for decode-only steps (what SGLang's ``--deepep-mode auto`` picks), one
  node from the tables; beyond one node the bytes that leave the node cross the NIC (one per GPU):
  low-latency sends every remote token copy, normal sends a token once per remote node it reaches
  (DeepSeek's node-limited routing caps that at ``node_limit``). With ``overlap`` (two-batch overlap,
  SGLang TBO / DeepSeek's dual micro-batch) a MoE layer takes max(compute, all-to-all), else the sum.

``step = overhead_factor * (sum over layers + lm_head) + step_overhead`` with the dense profiles' runtime
(coefficients.yaml), so MoE and dense models carry the same allowance for what kernel tables leave out.
Weights: routed experts split over EP (or TP) ranks, everything else over ``tp`` (replicated per DP rank);
FP8 = 1 byte, NVFP4 = 4 bits + an FP8 scale per 16, MXFP4 = 4 bits + a scale per 32 (OCP MX spec). KV per
token: MLA's compressed latent ``layers x (kv_lora_rank + qk_rope_head_dim)``, replicated over an attention
TP group; GQA ``2 x layers x kv_heads x head_dim``. Coefficients: profiles/moe_coefficients.yaml, written by
``python -m disagg.twin.calibrate_moe`` from the aiconfigurator tables; the runtime reads only YAML. Pure.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from disagg.perf.latency import (
    GIB,
    GpuSpec,
    LatencyModel,
    ModelConfig,
    Runtime,
    load_gpu_spec,
    load_profile_yaml,
)
from disagg.perf.memory import (
    EngineMemory,
    KvBudget,
    Shapes,
    default_engine_memory,
    dense_mlp,
    fused_moe_mlp,
    kv_budget,
)

Mode = Literal["normal", "ll"]
DTYPE_ALIASES: dict[str, str] = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "bf16",
    "auto": "bf16",
    "fp8": "fp8",
    "fp4": "fp4",
    "nvfp4": "fp4",
    "mxfp4": "fp4",
}
# bytes per weight: NVFP4 = 4-bit values + one FP8 scale per 16 (NVIDIA, "Introducing NVFP4"), MXFP4 = 4-bit
# values + one 8-bit scale per 32 (OCP Microscaling Formats v1.0).
NVFP4_BYTES = 0.5 + 1 / 16
MXFP4_BYTES = 0.5 + 1 / 32
# bytes per token element on the wire: DeepEP dispatches FP8 (plus a float scale per 128) and combines BF16
# (deepseek-ai/DeepEP README: "FP8 dispatching and BF16 combining").
DISPATCH_BYTES = 1 + 4 / 128
COMBINE_BYTES = 2


@dataclass(frozen=True)
class Parallelism:
    """How one replica's GPUs split the model: ``dp`` data-parallel attention ranks of ``tp`` GPUs each;
    ``ep`` = ``tp * dp`` shards the routed experts over all of them (expert parallelism), 1 shards each
    expert over them (tensor parallelism). ``overlap``: two-batch overlap of the all-to-all with compute."""

    tp: int = 1
    dp: int = 1
    ep: int = 1
    gpus_per_node: int = 8
    overlap: bool = False
    imbalance: float = 1.0  # tokens of the busiest EP rank / the mean (1.0: balanced, e.g. by EPLB)

    def __post_init__(self) -> None:
        if self.tp not in (1, 2, 4, 8, 16):
            raise ValueError(f"tp: attention tensor parallelism must be 1, 2, 4, 8 or 16, got {self.tp}")
        if self.dp < 1:
            raise ValueError(f"dp: must be >= 1, got {self.dp}")
        if self.ep not in (1, self.gpus):
            raise ValueError(f"ep: must be 1 or tp x dp = {self.gpus}, got {self.ep}")
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node: must be >= 1, got {self.gpus_per_node}")
        if self.imbalance < 1.0:
            raise ValueError(f"imbalance: must be >= 1.0, got {self.imbalance}")

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    @property
    def nodes(self) -> int:
        return math.ceil(self.gpus / self.gpus_per_node)

    @property
    def tp_nodes(self) -> int:
        """Nodes one tensor-parallel group spans (its all-reduce crosses the NICs when more than one)."""
        return math.ceil(self.tp / self.gpus_per_node)

    @staticmethod
    def wide_ep(gpus: int, tp: int = 1, gpus_per_node: int = 8, overlap: bool = True) -> Parallelism:
        """DP attention over ``gpus // tp`` ranks with EP over all ``gpus`` (SGLang ``--tp N --dp N
        --enable-dp-attention --ep N``, vLLM ``--data-parallel-size N --enable-expert-parallel``)."""
        return Parallelism(tp=tp, dp=gpus // tp, ep=gpus, gpus_per_node=gpus_per_node, overlap=overlap)


# DeepSeek-V3 technical report (arXiv 2412.19437) sec. 5.4.3: "the acceptance rate of the second token
# prediction ranges between 85% and 90%", giving "1.8 times TPS"; the low end is the default
DEFAULT_MTP_ACCEPTANCE = 0.85


@dataclass(frozen=True)
class Speculation:
    """Speculative decoding with the model's own multi-token-prediction module (DeepSeek MTP: vLLM
    ``--speculative-config '{"method": "mtp", "num_speculative_tokens": k}'``, SGLang
    ``--speculative-algorithm EAGLE|NEXTN --speculative-num-steps k``). A decode step drafts ``tokens``
    tokens per sequence, one MTP layer each, then verifies them in one forward of the target over
    ``tokens + 1`` tokens per sequence; each draft token is accepted with probability ``acceptance``
    given the ones before it were, so a step emits ``1 + a + ... + a^k`` tokens on average (Leviathan et
    al., ICML 2023, eq. 1; i.i.d. acceptance, which flatters k > 1 with DeepSeek's single MTP module
    reused)."""

    tokens: int = 1
    acceptance: float = DEFAULT_MTP_ACCEPTANCE

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise ValueError(f"speculative tokens: must be >= 1, got {self.tokens}")
        if not 0.0 <= self.acceptance <= 1.0:
            raise ValueError(f"acceptance: must be in [0, 1], got {self.acceptance}")

    @property
    def tokens_per_step(self) -> float:
        """Tokens a sequence emits per verify step, on average."""
        return float(sum(self.acceptance**i for i in range(self.tokens + 1)))


@dataclass(frozen=True)
class MoeArch:
    """A model of profiles/moe_models.yaml (field meanings there)."""

    name: str
    attention: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    params_b: float
    routed_experts: int = 0
    experts_per_token: int = 0
    shared_experts: int = 0
    moe_intermediate: int = 0
    dense_layers: int = 0
    node_limit: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    table_model: str = ""
    native_dtype: str = "bf16"
    sliding_window: int = 0  # tokens a sliding-window layer keeps and attends to (0: none)
    sliding_layers: int = 0  # how many of the layers are sliding-window (gpt-oss: every other one)
    mtp_layers: int = 0  # multi-token-prediction modules published with the model (num_nextn_predict_layers)
    mtp_params_b: float = 0.0  # their parameters (not in params_b)

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.routed_experts else 0

    @property
    def expert_params(self) -> float:
        """Routed-expert parameters (gate, up and down of every expert of every MoE layer)."""
        return float(self.moe_layers * self.routed_experts * 3 * self.hidden * self.moe_intermediate)

    @property
    def full_layers(self) -> int:
        """Layers attending to the whole context (all but the sliding-window ones)."""
        return self.layers - self.sliding_layers

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> int:
        """KV bytes a token of context holds. Sliding-window layers hold only their last ``sliding_window``
        tokens per sequence, whatever its length, and are left out: vLLM's hybrid KV cache manager gives them
        blocks for the window alone (freed as it slides), so its token capacity is that of the full layers;
        the window's few blocks per running sequence (18 x 128 tokens for gpt-oss) are not counted."""
        width = 1 if kv_dtype == "fp8" else 2
        if self.attention == "mla":
            return self.layers * (self.kv_lora_rank + self.qk_rope_head_dim) * width
        return 2 * self.full_layers * self.kv_heads * self.head_dim * width

    def weight_bytes_per_gpu(self, dtype: str, par: Parallelism) -> float:
        """Weights on one GPU: routed experts over their shards, the rest over the attention TP group."""
        expert_bytes = {
            "bf16": 2.0,
            "fp8": 1.0,
            "fp4": MXFP4_BYTES if self.name == "gpt-oss-120b" else NVFP4_BYTES,
        }
        other_bytes = (
            1.0 if dtype == "fp8" else (2.0 if self.routed_experts or dtype == "bf16" else NVFP4_BYTES)
        )
        experts = self.expert_params * expert_bytes[dtype] / par.gpus
        other = (self.params_b * 1e9 - self.expert_params) * other_bytes / par.tp
        return experts + other

    def config(self) -> ModelConfig:
        """The dense latency model's view (names, sizes) for code that reads ``LatencyModel.model``."""
        return ModelConfig(
            self.name,
            self.layers,
            self.hidden,
            self.intermediate,
            self.heads,
            self.kv_heads,
            self.head_dim,
            self.vocab,
            self.params_b,
        )


def _table_moe_archs() -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = load_profile_yaml("moe_models.yaml")["models"]
    return table


def load_moe_archs() -> dict[str, MoeArch]:
    fields = set(MoeArch.__dataclass_fields__) - {"name"}
    return {
        name: MoeArch(name=name, **{k: v for k, v in spec.items() if k in fields})
        for name, spec in _table_moe_archs().items()
    }


def resolve_moe_model(model: str) -> str | None:
    """Canonical name in moe_models.yaml for a model name or Hugging Face id (case-insensitive), or None."""
    key = model.strip().lower()
    for name, spec in _table_moe_archs().items():
        if key == name or key in (a.lower() for a in spec.get("aliases", [])):
            return name
    return None


def normalize_dtype(dtype: str) -> str:
    try:
        return DTYPE_ALIASES[dtype.strip().lower()]
    except KeyError:
        raise ValueError(f"dtype: {dtype!r} is not one of bf16, fp8, fp4 (nvfp4/mxfp4)") from None


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise linear in x; proportional beyond the last point, the first value below the first."""
    if x <= 0:
        return 0.0
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1] * x / xs[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1 = xs[i - 1], xs[i]
    return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0)


def _token_lookup(table: Mapping[str, Sequence[float]], tokens: float) -> float:
    return _interp(table["tokens"], table["ms"], tokens)


class MoeLatencyModel(LatencyModel):
    """Step times for one replica of a MoE/MLA/dense-GQA model under a :class:`Parallelism`.

    Same contract as :class:`LatencyModel` (the twin's engines and the policy use either): ``tp`` is the
    replica's GPU count (its NICs carry KV transfers), ``kv_capacity_tokens`` the whole replica's."""

    def __init__(
        self,
        arch: MoeArch,
        gpu: GpuSpec,
        par: Parallelism,
        dtype: str,
        entry: Mapping[str, Any],
        m_grid: Sequence[int],
        runtime: Runtime,
        kv_dtype: str = "bf16",
        memory: EngineMemory | None = None,
        speculation: Speculation | None = None,
    ) -> None:
        if speculation is not None and not arch.mtp_layers:
            raise ValueError(
                f"speculative decoding: {arch.name} publishes no multi-token-prediction module; the twin "
                "models MTP speculation only"
            )
        self.speculation = speculation
        if kv_dtype not in entry["attn"]:
            raise ValueError(f"kv_dtype: no {kv_dtype} KV attention table for {arch.name} on {gpu.name}")
        if par.ep == 1 and par.gpus > 8 and arch.routed_experts:
            raise ValueError(
                f"parallelism: tensor-parallel experts over {par.gpus} GPUs are not modelled (all-reduce "
                "tables reach 8); use expert parallelism (ep = tp x dp)"
            )
        self.arch = arch
        self.model = arch.config()
        self.gpu = gpu
        self.parallelism = par
        self.tp = par.gpus
        self.dtype = dtype
        self.kv_dtype = kv_dtype
        self.runtime = runtime
        self.source = str(entry["source"])
        self.overhead_factor = runtime.overhead_factor
        self._grid = [float(m) for m in m_grid]
        self._entry = entry
        tp_key = f"tp{par.tp}"
        if tp_key not in entry["gemm"] or tp_key not in entry["attn"][kv_dtype]:
            raise ValueError(
                f"parallelism: no TP{par.tp} attention tables for {arch.name} (TP beyond 8 GPUs is modelled "
                "for dense models; a MoE model spans nodes by expert parallelism)"
            )
        self._gemm = entry["gemm"][tp_key]
        self._router = entry["gemm"]["router_ms"]
        self._ar = self._allreduce_grid(entry, par) if par.tp > 1 else None
        attn = entry["attn"][kv_dtype][tp_key]
        self._ctx = [float(x) for x in attn["ctx_ms"]]
        self._gen = [float(x) for x in attn["gen_ms"]]
        self._fixed = runtime.step_overhead_s
        f = self.overhead_factor
        # seconds per context token of the whole replica (each DP rank holds 1/dp of it)
        # (sliding-window layers stop growing with the context once it passes their window)
        self._gen_g = f * arch.full_layers * self._gen[2] / par.dp / 1000
        self._ctx_c = f * arch.full_layers * self._ctx[2] / par.dp / 1000
        self._moe_tp_key = f"tp{par.gpus}ep1"
        if arch.routed_experts and par.ep == 1 and self._moe_tp_key not in entry["moe"]:
            raise ValueError(
                f"parallelism: no MoE table for TP{par.gpus} experts of {arch.name} on {gpu.name}"
            )
        self.kv_bytes_per_token = arch.kv_bytes_per_token(kv_dtype)
        # what vllm serve runs with on this GPU without memory flags; ``memory``: the engine's own flags
        self.default_memory = default_engine_memory(gpu.total_memory_bytes / GIB, gpu.name)
        self.memory = memory or self.default_memory
        self.kv_budget = self.kv_budget_for(self.memory)
        self.kv_capacity_tokens = self.kv_capacity_for(self.memory)

    def __repr__(self) -> str:
        p = self.parallelism
        return (
            f"MoeLatencyModel({self.arch.name}, {self.gpu.name}, tp={p.tp} dp={p.dp} ep={p.ep}, {self.dtype})"
        )

    def _allreduce_grid(self, entry: Mapping[str, Any], par: Parallelism) -> list[float]:
        """One all-reduce of ``m * hidden`` bf16 elements over the attention TP group, on the m grid (ms).

        Within a node: vLLM's custom all-reduce table. A group spanning ``n`` nodes of ``g`` GPUs (TP16 on two
        8-GPU nodes) runs NCCL's hierarchical all-reduce (vLLM's custom all-reduce is single-node only):
        reduce-scatter inside each node (NCCL table, g GPUs), a ring all-reduce of each GPU's 1/g shard
        between the nodes over its NIC (``2 (n-1)/n x shard`` bytes at the NIC's line rate, gpus.yaml; the
        same line-rate treatment as the internode all-to-all, which reproduces DeepEP's published internode
        times), then an all-gather inside the node (NCCL table)."""
        if par.tp_nodes <= 1:
            return [float(x) for x in entry["allreduce_ms"][f"tp{par.tp}"]]
        g = par.tp // par.tp_nodes
        nccl = entry.get("nccl_ms")
        if nccl is None or f"g{g}" not in nccl["reduce_scatter"]:
            raise ValueError(
                f"parallelism: no NCCL tables for a TP{par.tp} all-reduce over {par.tp_nodes} nodes of {g} "
                f"GPUs for {self.arch.name} on {self.gpu.name}"
            )
        n = par.tp_nodes
        nic_bytes_per_ms = self.gpu.nic_gbit * 1e9 / 8 / 1000
        out = []
        for m, rs, ag in zip(
            self._grid, nccl["reduce_scatter"][f"g{g}"], nccl["all_gather"][f"g{g}"], strict=True
        ):
            shard = m * self.arch.hidden * 2 / g  # bf16 bytes of one GPU's slice after the reduce-scatter
            out.append(float(rs) + float(ag) + 2 * (n - 1) / n * shard / nic_bytes_per_ms)
        return out

    def allreduce_ms(self, m: float) -> float:
        """One attention-TP all-reduce of ``m`` tokens per GPU (ms; 0 without TP)."""
        return self._grid_ms(self._ar, m) if self._ar is not None else 0.0

    # --- memory ----------------------------------------------------------------------------------------
    def weight_bytes_per_gpu(self) -> float:
        w = self.arch.weight_bytes_per_gpu(self.dtype, self.parallelism)
        if self.speculation is not None:  # the MTP module's weights, split as the model's are
            w *= 1 + self.arch.mtp_params_b / self.arch.params_b
        return w

    def _copies(self) -> int:
        # MLA's single latent is replicated on every GPU of an attention TP group; GQA's KV heads are split
        # over it until each GPU holds one head.
        p = self.parallelism
        return p.tp if self.arch.attention == "mla" else max(1, p.tp // max(1, self.arch.kv_heads))

    def kv_budget_for(self, memory: EngineMemory) -> KvBudget:
        """One GPU's KV budget under these engine flags, vLLM's accounting (:mod:`disagg.perf.memory`):
        each DP rank is an engine that profiles its own share (``max_num_batched_tokens`` per rank)."""
        a, p = self.arch, self.parallelism
        # the larger MLP of one token on one GPU: a dense layer's split over tp, or the fused-MoE buffers of
        # the experts it visits (their intermediate split over tp without EP) plus the shared experts'
        dense = dense_mlp(a.intermediate, p.tp) if (a.dense_layers or not a.routed_experts) else 0.0
        moe = 0.0
        if a.routed_experts:
            shards = 1 if p.ep > 1 else p.tp
            moe = fused_moe_mlp(a.hidden, a.moe_intermediate, a.experts_per_token, shards)
            moe += dense_mlp(a.shared_experts * a.moe_intermediate, p.tp)
        shapes = Shapes(hidden=a.hidden, mlp=max(dense, moe), vocab=a.vocab)
        per_gpu_token = self.kv_bytes_per_token * self._copies() / p.tp
        budget = kv_budget(
            self.gpu.total_memory_bytes, self.weight_bytes_per_gpu(), per_gpu_token, shapes, memory
        )
        if budget.blocks <= 0:
            raise ValueError(
                f"{a.name} {self.dtype} does not fit on {p.gpus} x {self.gpu.name}: "
                f"{self.weight_bytes_per_gpu() / GIB:.0f} GiB of weights per GPU; {budget.describe()}"
            )
        return budget

    def kv_capacity_for(self, memory: EngineMemory) -> int:
        """The whole replica's KV tokens: each DP rank holds its own cache (vLLM's per-rank figure x dp)."""
        return self.parallelism.dp * self.kv_budget_for(memory).tokens

    # --- building blocks (ms per layer on one GPU) -----------------------------------------------------
    def _grid_ms(self, table: Sequence[float], m: float) -> float:
        return _interp(self._grid, table, m)

    def _attention_ms(
        self, m: float, prefill_tokens: float, work: float, decode_seqs: float, ctx: float
    ) -> float:
        t = self._grid_ms(self._gemm["attn_linear_ms"], m)
        if prefill_tokens > 0:
            a, b, c = self._ctx
            t += a + b * prefill_tokens + c * work
        if decode_seqs > 0:
            a, b, g = self._gen
            t += a + b * decode_seqs + g * ctx
        return t

    def _routed_ep_ms(self, m: float, mode: Mode) -> float:
        """One EP rank's grouped GEMMs with ``m`` tokens per rank before dispatch."""
        ep = self.parallelism.ep
        wide = self._entry.get("moe_wideep")
        if wide:
            tables = {int(k[2:]): v[mode] for k, v in wide.items() if mode in v}
        else:
            tables = {
                int(k.split("ep")[1]): v for k, v in self._entry["moe"].items() if k.startswith("tp1ep")
            }

        def at(size: int) -> float:
            return _token_lookup(tables[size], m * size)  # the tables' tokens: all ranks' together

        sizes = sorted(tables)
        if ep in tables:
            return at(ep)
        if ep <= sizes[0]:
            return at(sizes[0])
        if ep >= sizes[-1]:
            return at(sizes[-1])
        i = bisect.bisect_right(sizes, ep)
        lo, hi = sizes[i - 1], sizes[i]
        w = math.log(ep / lo) / math.log(hi / lo)
        return at(lo) * (1 - w) + at(hi) * w

    def all_to_all_ms(self, m: float, mode: Mode) -> float:
        """DeepEP dispatch + combine of one MoE layer with ``m`` tokens per rank (ms)."""
        table = self._entry["deepep"][mode]
        t = _token_lookup(table, m)
        nodes = self.parallelism.nodes
        if nodes > 1:
            k = self.arch.experts_per_token
            remote = (nodes - 1) / nodes
            if mode == "ll":
                copies = m * k * remote
            else:
                reached = nodes * (1 - (1 - 1 / nodes) ** k)
                if self.arch.node_limit:
                    reached = min(reached, float(self.arch.node_limit))
                copies = m * reached * remote
            nbytes = copies * self.arch.hidden * (DISPATCH_BYTES + COMBINE_BYTES)
            t += nbytes / (self.gpu.nic_gbit * 1e9 / 8) * 1000
        return t

    def _moe_layer_ms(self, m: float, mode: Mode) -> float:
        p = self.parallelism
        compute = self._grid_ms(self._router, m) + self._grid_ms(self._gemm["shared_ffn_ms"], m)
        if p.ep > 1:
            compute += self._routed_ep_ms(m * p.imbalance, mode)
            comm = self.all_to_all_ms(m, mode)
            return max(compute, comm) if p.overlap else compute + comm
        total = m * p.dp
        compute += _token_lookup(self._entry["moe"][self._moe_tp_key], total)
        if p.gpus > 1:
            compute += _interp(self._grid, self._entry["allreduce_ms"][f"tp{p.gpus}"], total)
        return compute

    # --- the contract ------------------------------------------------------------------------------------
    def step_time_s(
        self,
        num_tokens: int,
        num_seqs: int,
        prefill_attn_work: float = 0.0,
        decode_seqs: int = 0,
        decode_context_tokens: int = 0,
    ) -> float:
        """One engine step. With :class:`Speculation`, a step of decodes only is the time per token each
        sequence emits: (draft + verify) / tokens per step, so the twin's one-token-per-step engines see MTP's
        throughput and mean inter-token latency. Steps with prefill chunks are taken without speculation."""
        spec = self.speculation
        if spec is None or decode_seqs <= 0 or prefill_attn_work > 0:
            return self._forward_s(
                num_tokens, num_seqs, prefill_attn_work, decode_seqs, decode_context_tokens
            )
        k = spec.tokens
        # verify: k + 1 query tokens per sequence through every GEMM, MoE and all-to-all; the KV read once
        verify = self._forward_s(
            num_tokens + k * decode_seqs, num_seqs, 0.0, decode_seqs, decode_context_tokens
        )
        draft = k * self._mtp_draft_s(decode_seqs, decode_context_tokens)
        return (verify + draft) / spec.tokens_per_step

    def _mtp_draft_s(self, seqs: int, context: int) -> float:
        """One draft token for ``seqs`` sequences: the MTP module (one decoder layer of the model's shape) and
        the shared lm_head; its input projection of [embedding; hidden] is left out (2 x hidden^2, small)."""
        p = self.parallelism
        m = math.ceil(seqs / p.dp)
        t = self._attention_ms(m, 0, 0.0, m, context / p.dp) + self.allreduce_ms(m)
        if self.arch.routed_experts:
            t += self._moe_layer_ms(m, "ll")
        else:
            t += self._grid_ms(self._gemm["dense_ffn_ms"], m) + self.allreduce_ms(m)
        t += self._grid_ms(self._gemm["lm_head_ms"], m)
        return self.overhead_factor * self.arch.mtp_layers * t / 1000

    def decode_step_slope_s(self, batch_size: int) -> float:
        slope = self._gen_g * batch_size
        spec = self.speculation
        if spec is None:
            return slope
        # per emitted token: the verify and the k draft layers read the grown context, shared by E tokens
        return slope * (1 + spec.tokens * self.arch.mtp_layers / self.arch.full_layers) / spec.tokens_per_step

    def decode_steps_time_s(self, batch_size: int, total_context_tokens: int, steps: int) -> float:
        if steps <= 0:
            return 0.0
        first = self.decode_step_time_s(batch_size, total_context_tokens)
        return steps * first + self.decode_step_slope_s(batch_size) * steps * (steps - 1) / 2

    def _forward_s(
        self,
        num_tokens: int,
        num_seqs: int,
        prefill_attn_work: float = 0.0,
        decode_seqs: int = 0,
        decode_context_tokens: int = 0,
    ) -> float:
        """One forward of the model over ``num_tokens`` (no speculation)."""
        if num_tokens <= 0:
            return 0.0
        a, p = self.arch, self.parallelism
        dp = p.dp
        m = math.ceil(num_tokens / dp)
        bd = math.ceil(decode_seqs / dp) if decode_seqs else 0
        prefill_tokens = max(0, m - bd) if prefill_attn_work > 0 else 0
        mode: Mode = "normal" if prefill_tokens else "ll"
        ar = self.allreduce_ms(m)
        work, ctx = prefill_attn_work / dp, decode_context_tokens / dp
        attn = self._attention_ms(m, prefill_tokens, work, bd, ctx)
        total = a.full_layers * (attn + ar)
        if a.sliding_layers:
            # each token attends to at most the last ``w`` positions: prefill work (units of sum(2*chunk*prior
            # + chunk^2), about 2 x the positions attended) capped at 2*w per token, decode context at w per
            # sequence
            w = a.sliding_window
            sw = self._attention_ms(
                m, prefill_tokens, min(work, 2.0 * w * prefill_tokens), bd, min(ctx, w * bd)
            )
            total += a.sliding_layers * (sw + ar)
        dense = self._grid_ms(self._gemm["dense_ffn_ms"], m) + ar
        ffn_layers = a.dense_layers if a.routed_experts else a.layers
        total += ffn_layers * dense
        if a.moe_layers:
            total += a.moe_layers * self._moe_layer_ms(m, mode)
        total += self._grid_ms(self._gemm["lm_head_ms"], math.ceil(num_seqs / dp))
        return self.overhead_factor * total / 1000 + self._fixed

    def shard_forward_time_s(
        self, num_tokens: int, prefill_attn_work: float = 0.0, decode_context_tokens: int = 0
    ) -> float:
        raise ValueError(f"{self!r}: a MoE replica has no single TP shard forward to compare")


@functools.cache
def load_moe_latency_model(
    model: str,
    gpu: str,
    dtype: str = "fp8",
    kv_dtype: str = "bf16",
    parallelism: Parallelism | None = None,
    speculation: Speculation | None = None,
) -> MoeLatencyModel:
    """The latency model of a moe_models.yaml model on ``gpu`` with ``dtype`` weights under ``parallelism``
    (default: one GPU), e.g. ``("deepseek-r1", "h200", "fp8", parallelism=Parallelism(tp=8))``."""
    name = resolve_moe_model(model)
    if name is None:
        known = sorted(_table_moe_archs())
        raise ValueError(
            f"model: no MoE twin profile for {model!r}; known: {known} (add one to moe_models.yaml)"
        )
    arch = load_moe_archs()[name]
    gs = load_gpu_spec(gpu)
    kind = normalize_dtype(dtype)
    if kind == "bf16":  # bf16/auto on a checkpoint published quantized serves its quantized weights
        kind = arch.native_dtype
    coef = load_profile_yaml("moe_coefficients.yaml")
    key = f"{name}/{gs.name}/{kind}"
    entry = coef["profiles"].get(key)
    if entry is None:
        have = sorted(k for k in coef["profiles"] if k.startswith(f"{name}/"))
        raise ValueError(f"dtype/gpu: no calibrated MoE profile {key!r}; available: {have}")
    rt = load_profile_yaml("coefficients.yaml")["runtime"]
    runtime = Runtime(
        overhead_factor=float(rt["overhead_factor"]),
        step_overhead_s=float(rt["step_overhead_ms"]) / 1000,
        request_overhead_s=float(rt.get("request_overhead_ms", 0.0)) / 1000,
    )
    par = parallelism if parallelism is not None else Parallelism()
    return MoeLatencyModel(
        arch, gs, par, kind, entry, coef["m_grid"], runtime, kv_dtype, speculation=speculation
    )


def moe_profiles() -> tuple[tuple[str, str, str], ...]:
    """Every calibrated MoE-model profile as (model, gpu, dtype), sorted."""
    out = []
    for key in load_profile_yaml("moe_coefficients.yaml").get("profiles", {}):
        model, gpu, dtype = str(key).split("/")
        out.append((model, gpu, dtype))
    return tuple(sorted(out))

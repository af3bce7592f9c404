"""The engine's real KV capacity: how vLLM (the pinned version, :data:`VLLM_VERSION`) sizes its KV cache.

vLLM 0.33.0 (wheel: ``vllm/v1/worker/gpu_worker.py`` ``init_device`` and ``determine_available_memory``,
``vllm/utils/mem_utils.py`` ``memory_profiling``, ``vllm/v1/worker/utils.py`` ``request_memory``):

* a memory snapshot is taken *after* the CUDA context, the NCCL communicators and the cuBLAS handles exist
  (init_device creates them "before the snapshot, so they count as baseline"); they come out of the
  ``1 - gpu_memory_utilization`` headroom, not out of the KV cache;
* ``requested = ceil(total_memory * gpu_memory_utilization)`` (total as ``cudaMemGetInfo`` reports it);
* a profiling forward pass runs ``max_num_batched_tokens`` tokens and a dummy sampler run over
  ``max_num_seqs`` rows of logits; ``non_kv = consumed (weights and persistent buffers) + the torch peak
  above what stays allocated`` (``transient_peak_headroom``);
* unless the engine is eager, CUDA graphs are captured once against a dummy KV cache and their pool is
  charged to the KV budget (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``, on by default since 0.21);
* ``available = requested - non_kv - cudagraph``; then (``vllm/v1/core/kv_cache_utils.py``)
  ``num_blocks = available // page_bytes`` with ``page_bytes = block_size x`` the KV bytes of one token
  on one GPU (K and V of every layer, the KV heads split over the TP group), and the reported
  "GPU KV cache size" is ``num_blocks x block_size`` tokens.

What vLLM measures this module derives from the architecture; each estimate's basis is at its constant.
Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 2**30
VLLM_VERSION = "0.33.0"
# vLLM's default KV block size on CUDA (``--block-size``, CacheConfig.block_size = 16).
DEFAULT_BLOCK_SIZE = 16

# Bytes per element of the dummy sampler run over [max_num_seqs, vocab] logits, all live at its peak: the
# model-dtype logits (2), the float32 copy the sampler works on (4), then in its second, PyTorch-native pass
# (a seeded generator) the float32 probabilities (4) and the float32 exponential noise it divides them by
# (4); top-k/top-p masking is the in-place Triton kernel (vLLM 0.33 ``gpu_model_runner.py``
# ``_dummy_sampler_run``, ``v1/sample/sampler.py``, ``v1/sample/ops/topk_topp_sampler.py``).
SAMPLER_BYTES_PER_LOGIT = 2 + 4 + 4 + 4
# CUDA-graph memory per captured graph beyond the first: vLLM estimates it from the second capture and
# floors it at 1 MiB ("at least 1 MiB per graph for driver overhead", gpu_model_runner.py
# profile_cudagraph_memory). A published 0.3x log of 30 graphs (19 PIECEWISE + 11 FULL) reports "CUDA graph
# pool memory: 0.11 GiB (actual), 0.14 GiB (estimated)" (github.com/aivrar/vllm-windows-build/issues/4):
# about 5 MiB per graph. An assumption of the twin within a factor of ~2; ~100 graphs x 5 MiB = 0.5 GiB.
CUDAGRAPH_BYTES_PER_GRAPH = 5 * 2**20
# vLLM 0.33 ``_set_cudagraph_sizes``: capture sizes up to min(2 x max_num_seqs, 512, max_num_batched_tokens)
DEFAULT_MAX_CUDAGRAPH_SIZE = 512


@dataclass(frozen=True)
class EngineMemory:
    """The engine flags that decide the KV budget (vLLM's names; defaults are vLLM 0.33's for ``vllm serve``
    on an H100/H200: ``arg_utils.py`` ``_get_default_max_num_seqs_and_batched_tokens``)."""

    gpu_memory_utilization: float = 0.9  # --gpu-memory-utilization
    max_num_batched_tokens: int = 8192  # --max-num-batched-tokens: the profiling forward's tokens
    max_num_seqs: int = 1024  # --max-num-seqs: rows of the profiling sampler run, CUDA-graph sizes
    enforce_eager: bool = False  # --enforce-eager: no CUDA graphs, none charged
    block_size: int = DEFAULT_BLOCK_SIZE  # --block-size
    # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS (default 1): charge the CUDA-graph estimate to the KV budget
    estimate_cudagraphs: bool = True

    def __post_init__(self) -> None:
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization}")
        for name in ("max_num_batched_tokens", "max_num_seqs", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")


def default_engine_memory(total_memory_gib: float, gpu_name: str = "") -> EngineMemory:
    """What ``vllm serve`` without those flags runs with on a GPU of this much memory (vLLM 0.33
    ``arg_utils.py``: >= 160 GiB 16384 tokens / 1024 seqs; >= 70 GiB and not an A100 8192 / 1024; else
    2048 / 256)."""
    if total_memory_gib >= 160:
        return EngineMemory(max_num_batched_tokens=16384, max_num_seqs=1024)
    if total_memory_gib >= 70 and "a100" not in gpu_name.lower():
        return EngineMemory(max_num_batched_tokens=8192, max_num_seqs=1024)
    return EngineMemory(max_num_batched_tokens=2048, max_num_seqs=256)


@dataclass(frozen=True)
class Shapes:
    """What the activation peak depends on, per GPU: ``hidden``, the elements one token's MLP holds live on
    this GPU (``mlp``: :func:`dense_mlp` or :func:`fused_moe_mlp`) and ``vocab``."""

    hidden: int
    mlp: float
    vocab: int
    act_bytes: int = 2  # bf16/fp16 activations (FP8 models compute in bf16 too)


def dense_mlp(intermediate: float, shards: int) -> float:
    """A dense MLP's live elements a token: the gate/up projection's output (2 x intermediate) and the
    activation's output (intermediate), split over the TP shards (vLLM's LlamaMLP)."""
    return 3 * intermediate / shards


def fused_moe_mlp(hidden: int, moe_intermediate: float, experts_per_token: int, shards: int) -> float:
    """vLLM's fused-MoE buffers a token: ``experts_per_token x (max(N, hidden) + N/2)`` with ``N = 2 x
    moe_intermediate / shards`` (one buffer reused for the gate/up output and the down output, and the
    activation's output; vLLM 0.33 ``fused_moe.py`` cache13 and intermediate_cache2)."""
    n = 2 * moe_intermediate / shards
    return experts_per_token * (max(n, hidden) + n / 2)


def forward_peak_bytes(s: Shapes, tokens: int) -> float:
    """The profiling forward's transient peak for ``tokens`` tokens: the MLP's buffers (``s.mlp``) with the
    residual, the normed input and the layer output (3 x hidden) live together; every other tensor of a
    layer is smaller. Checked against vLLM's own profiling: Llama-3.1-8B on an RTX 3090 (V0, where the
    profile forward ran max_model_len tokens) lost 0.92 GiB of KV going from 20k to 29k tokens, 107 KB a
    token; this gives 2 x (3 x 14336 + 3 x 4096) = 111 KB (github.com/vllm-project/vllm/issues/10517)."""
    return float(tokens) * (s.mlp + 3 * s.hidden) * s.act_bytes


def sampler_peak_bytes(s: Shapes, seqs: int) -> float:
    """The dummy sampler run's peak over ``seqs`` rows of full-vocabulary logits (gathered on every rank)."""
    return float(seqs) * s.vocab * SAMPLER_BYTES_PER_LOGIT


def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> list[int]:
    """vLLM 0.33's default CUDA-graph batch sizes: 1, 2, 4, then every 8 below 256, then every 16, up to
    min(2 x max_num_seqs, 512, max_num_batched_tokens) (``vllm/config/vllm.py`` _set_cudagraph_sizes)."""
    top = min(2 * max_num_seqs, DEFAULT_MAX_CUDAGRAPH_SIZE, max_num_batched_tokens)
    sizes = [n for n in (1, 2, 4) if n <= top]
    sizes += list(range(8, min(top + 1, 256), 8))
    sizes += list(range(256, top + 1, 16))
    return sizes


def cudagraph_bytes(s: Shapes, engine: EngineMemory) -> float:
    """vLLM's CUDA-graph estimate: the first (largest) capture, whose pool holds that batch's activations,
    plus a per-graph cost for the rest. Default mode FULL_AND_PIECEWISE captures every size piecewise and
    the decode sizes (at most max_num_seqs) as full graphs."""
    if engine.enforce_eager or not engine.estimate_cudagraphs:
        return 0.0
    sizes = capture_sizes(engine.max_num_seqs, engine.max_num_batched_tokens)
    if not sizes:
        return 0.0
    graphs = len(sizes) + sum(1 for n in sizes if n <= engine.max_num_seqs)
    return forward_peak_bytes(s, max(sizes)) + (graphs - 1) * CUDAGRAPH_BYTES_PER_GRAPH


@dataclass(frozen=True)
class KvBudget:
    """One GPU's memory account, bytes; ``tokens`` is the replica-rank's KV capacity (vLLM's "GPU KV cache
    size")."""

    requested: float
    weights: float
    activation: float
    cudagraph: float
    other: float
    available: float
    page_bytes: float
    blocks: int
    tokens: int

    def describe(self) -> str:
        g = GIB
        return (
            f"requested {self.requested / g:.2f} GiB - weights {self.weights / g:.2f} - activation peak "
            f"{self.activation / g:.2f} - CUDA graphs {self.cudagraph / g:.2f} - other {self.other / g:.2f} "
            f"= {self.available / g:.2f} GiB of KV: {self.blocks} blocks, {self.tokens} tokens"
        )


def kv_budget(
    total_memory_bytes: float,
    weight_bytes: float,
    kv_bytes_per_token: float,
    shapes: Shapes,
    engine: EngineMemory,
    other_bytes: float = 0.0,
) -> KvBudget:
    """One GPU's KV budget. ``kv_bytes_per_token``: one token's KV on this GPU (its share of the heads).
    ``other_bytes``: memory a vLLM version charges beyond these (0 in 0.33, where NCCL, cuBLAS and the CUDA
    context predate the snapshot; vLLM <= 0.6 charged the non-torch memory since the engine's creation,
    which its log printed, e.g. "non_torch_memory 1.79GiB")."""
    requested = float(math.ceil(total_memory_bytes * engine.gpu_memory_utilization))
    activation = max(
        forward_peak_bytes(shapes, engine.max_num_batched_tokens),
        sampler_peak_bytes(shapes, min(engine.max_num_seqs, engine.max_num_batched_tokens)),
    )
    graphs = cudagraph_bytes(shapes, engine)
    available = requested - weight_bytes - activation - graphs - other_bytes
    page = engine.block_size * kv_bytes_per_token
    blocks = int(available // page) if available > 0 else 0
    tokens = blocks * engine.block_size
    return KvBudget(requested, weight_bytes, activation, graphs, other_bytes, available, page, blocks, tokens)

"""The engine's KV capacity (disagg.perf.memory): vLLM's memory accounting against its own start-up logs.

Published points: vLLM prints its memory profile and the KV cache it sized at start-up. Each row is one
such log (model, GPU, TP, vLLM version, flags, what it printed) with its address. The twin derives the
weights, the activation peak, CUDA-graph memory and the page size; where a version charged something the
twin cannot derive (vLLM <= 0.6 charged the non-torch memory since the engine's creation: NCCL, cuBLAS,
the CUDA context) the row carries the logged figure as ``other_gib``.

Errors of the twin's KV tokens against these rows (before: the old 0.9 x datasheet HBM - weights - 4 GiB;
after: this accounting):

    ======================================  =========  ========  =======
    point                                   reported   before    after
    ======================================  =========  ========  =======
    Llama-3-8B   H100 TP1 0.9 (0.6.5, V0)     436,544    -0.5%    +0.8%
    Llama-3-8B   H100 TP2 0.9 (0.6.5, V0)     966,160    +2.6%    +1.3%
    Llama-3.1-8B 3090 TP1 0.9 20k (0.6.4)      31,232   -30.7%    +1.1%
    Llama-3.1-8B 3090 TP1 0.9 29k (0.6.4)      23,648    -8.4%    +1.4%
    Qwen3-235B-FP8 H100 TP4 (~0.9.2, V1)      178,880   +65.7%   +81.5%  (xfail, see the test)
    ======================================  =========  ========  =======

No published log of the pinned 0.33.0 for a profiled model was found: the 0.33-only terms (the dummy
sampler over 1024 rows, CUDA graphs charged to the budget) are derived from its code, not checked here.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from disagg.perf.latency import GIB, load_latency_model, load_model_config
from disagg.perf.memory import (
    CUDAGRAPH_BYTES_PER_GRAPH,
    EngineMemory,
    Shapes,
    capture_sizes,
    default_engine_memory,
    dense_mlp,
    forward_peak_bytes,
    kv_budget,
)
from disagg.perf.moe import Parallelism, load_moe_latency_model
from disagg.twin.deployment import PoolSpec, SimDeployment
from disagg.twin.sim import Pool


@dataclass(frozen=True)
class Point:
    label: str
    total_gib: float  # total_gpu_memory as the log prints it
    datasheet_gib: float  # what the old formula took (the GPU's nominal memory)
    tp: int
    version: str
    util: float
    max_num_batched_tokens: int  # the profiling forward's tokens (V0: max_model_len without chunked prefill)
    max_num_seqs: int
    cudagraphs_charged: bool  # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS in force (>= 0.21)
    other_gib: float  # what that version charged and the twin cannot derive, from the same log
    reported_tokens: int
    url: str


# Llama-3-8B and Llama-3.1-8B share the architecture the twin's llama-3.1-8b profile holds.
POINTS = [
    # "total_gpu_memory 79.22GiB ... model weights take 14.96GiB; non_torch_memory 1.79GiB; PyTorch activation
    # peak memory 1.26GiB; available_kv_cache_memory 53.29GiB": 53.29 GiB / 128 KiB per token, whole blocks.
    Point(
        "Llama-3-8B H100 TP1",
        79.22,
        80,
        1,
        "0.6.5.dev (V0)",
        0.9,
        8192,
        256,
        False,
        1.79,
        436_544,
        "https://github.com/vllm-project/vllm/pull/10511",
    ),
    # same log, -tp 2: "model weights take 7.48GiB; non_torch_memory 3.58GiB; PyTorch activation peak memory
    # 1.26GiB" of 71.29 GiB: 58.97 GiB per GPU / 64 KiB per token per GPU.
    Point(
        "Llama-3-8B H100 TP2",
        79.22,
        80,
        2,
        "0.6.5.dev (V0)",
        0.9,
        8192,
        256,
        False,
        3.58,
        966_160,
        "https://github.com/vllm-project/vllm/pull/10511",
    ),
    # "total_gpu_memory=23.58GiB ... non_torch_memory=0.35GiB kv_cache_size=3.81GiB ... GPU blocks: 1952"
    Point(
        "Llama-3.1-8B RTX 3090 20k",
        23.58,
        24,
        1,
        "0.6.4 (V0)",
        0.9,
        20000,
        256,
        False,
        0.35,
        1952 * 16,
        "https://github.com/vllm-project/vllm/issues/10517",
    ),
    # same comment, --max-model-len 29000: "kv_cache_size=2.89GiB ... # GPU blocks: 1478" (23648 tokens)
    Point(
        "Llama-3.1-8B RTX 3090 29k",
        23.58,
        24,
        1,
        "0.6.4 (V0)",
        0.9,
        29000,
        256,
        False,
        0.35,
        1478 * 16,
        "https://github.com/vllm-project/vllm/issues/10517",
    ),
]
# The spread of the rows after the accounting is +0.8% to +1.4%: the derived activation peak (0.84 GiB
# against the 1.26 GiB V0 logged for its heavier sampler) and small buffers are under 1% of the KV. 5% keeps
# a margin for the log's 0.01 GiB rounding and would still catch any of the old formula's 9-31% misses.
TOLERANCE = 0.05


def twin_tokens(p: Point) -> int:
    m = load_model_config("llama-3.1-8b")
    engine = EngineMemory(
        gpu_memory_utilization=p.util,
        max_num_batched_tokens=p.max_num_batched_tokens,
        max_num_seqs=p.max_num_seqs,
        estimate_cudagraphs=p.cudagraphs_charged,
    )
    shapes = Shapes(hidden=m.hidden, mlp=dense_mlp(m.intermediate, p.tp), vocab=m.vocab)
    budget = kv_budget(
        p.total_gib * GIB,
        m.weight_bytes("bf16") / p.tp,
        m.kv_bytes_per_token() / p.tp,
        shapes,
        engine,
        other_bytes=p.other_gib * GIB,
    )
    return budget.tokens


def old_twin_tokens(p: Point) -> int:
    """The accounting this replaced: 0.9 x datasheet memory - weights - 4 GiB."""
    m = load_model_config("llama-3.1-8b")
    per_gpu = p.datasheet_gib * GIB * p.util - m.weight_bytes("bf16") / p.tp - 4 * GIB
    return int(per_gpu * p.tp // m.kv_bytes_per_token())


@pytest.mark.parametrize("p", POINTS, ids=[p.label for p in POINTS])
def test_kv_tokens_match_vllms_start_up_logs(p: Point) -> None:
    assert twin_tokens(p) == pytest.approx(p.reported_tokens, rel=TOLERANCE)


def test_the_old_formula_missed_the_points_that_move_the_profiling_run() -> None:
    # the record behind the table above: a long max_model_len (V0 profiled that many tokens) cost 1-2 GiB
    # of activations the fixed 4 GiB reserve did not follow
    errors = {p.label: old_twin_tokens(p) / p.reported_tokens - 1 for p in POINTS}
    assert errors["Llama-3.1-8B RTX 3090 20k"] < -0.25
    assert all(abs(twin_tokens(p) / p.reported_tokens - 1) < abs(errors[p.label]) for p in POINTS[2:])


def test_activation_grows_with_the_profiling_tokens_as_vllm_measured() -> None:
    # vLLM lost (3.81 - 2.89) GiB of KV going from 20000 to 29000 profiled tokens: 107 KB a token
    m = load_model_config("llama-3.1-8b")
    shapes = Shapes(hidden=m.hidden, mlp=dense_mlp(m.intermediate, 1), vocab=m.vocab)
    slope = (forward_peak_bytes(shapes, 29000) - forward_peak_bytes(shapes, 20000)) / 9000
    assert slope == pytest.approx((3.81 - 2.89) * GIB / 9000, rel=0.10)


@pytest.mark.xfail(
    strict=True,
    reason=(
        "Qwen3-235B-A22B-FP8 on 4 x H100 (vLLM ~0.9.2, V1) logged 'Available KV cache memory: 8.11 GiB, "
        "GPU KV cache size: 178,880 tokens' (github.com/vllm-project/vllm/issues/21348); the twin finds "
        "~14.6 GiB. The launch used LMCacheConnectorV1, whose GPU buffers, like the FP8 checkpoint's "
        "scales and 0.9's profiling, the twin does not model; the page size (48,128 B per token per GPU) "
        "is within 1.1% of the log's, the budget is not"
    ),
)
def test_moe_kv_tokens_match_a_published_log() -> None:
    lm = load_moe_latency_model("qwen3-235b-a22b", "h100", "fp8", parallelism=Parallelism(tp=4))
    tokens = lm.kv_capacity_for(EngineMemory(estimate_cudagraphs=False))
    assert tokens == pytest.approx(178_880, rel=TOLERANCE)


def test_moe_page_size_matches_the_published_log() -> None:
    # 8.11 GiB held 178,880 tokens: 48.7 KB a token on each GPU; one of the 4 KV heads of 94 layers in bf16
    # is 48,128 B (the log's 1.1% more: 128 blocks of the 8.11 GiB it did not fill, unexplained)
    lm = load_moe_latency_model("qwen3-235b-a22b", "h100", "fp8", parallelism=Parallelism(tp=4))
    b = lm.kv_budget
    assert b.page_bytes / 16 == 94 * 2 * 128 * 2
    assert b.page_bytes / 16 == pytest.approx(8.11 * GIB / 178_880, rel=0.02)
    assert lm.kv_capacity_tokens == b.tokens  # dp 1: the replica's capacity is the rank's


def test_moe_dp_ranks_each_hold_a_cache() -> None:
    one = load_moe_latency_model("deepseek-v3", "h200", "fp8", parallelism=Parallelism(tp=8))
    wide = load_moe_latency_model("deepseek-v3", "h200", "fp8", parallelism=Parallelism.wide_ep(16, tp=8))
    assert wide.kv_capacity_tokens == 2 * wide.kv_budget.tokens
    assert wide.kv_budget.weights < one.kv_budget.weights  # experts over 16 GPUs


def test_fp8_kv_cache_doubles_the_tokens_of_the_same_memory() -> None:
    bf16 = load_latency_model("llama-3.1-70b", "h100", 4, "fp8")
    fp8 = load_latency_model("llama-3.1-70b", "h100", 4, "fp8", kv_dtype="fp8")
    assert fp8.kv_budget.available == bf16.kv_budget.available
    assert fp8.kv_budget.page_bytes * 2 == bf16.kv_budget.page_bytes
    # whole blocks: twice the blocks, or one more
    assert fp8.kv_budget.blocks - 2 * bf16.kv_budget.blocks in (0, 1)


def test_lower_gpu_memory_utilization_shrinks_the_cache_by_that_share_of_the_gpu() -> None:
    lm = load_latency_model("llama-3.1-8b", "h100", 1)
    at_09 = lm.kv_budget_for(EngineMemory(gpu_memory_utilization=0.9))
    at_07 = lm.kv_budget_for(EngineMemory(gpu_memory_utilization=0.7))
    assert at_09.tokens == lm.kv_capacity_tokens  # 0.9 is vLLM's default
    assert at_07.available == pytest.approx(at_09.available - 0.2 * 79.22 * GIB, abs=1)
    assert at_07.tokens < at_09.tokens


def test_enforce_eager_frees_the_cuda_graph_memory_for_kv() -> None:
    lm = load_latency_model("llama-3.1-8b", "h100", 1)
    graphs = lm.kv_budget_for(EngineMemory())
    eager = lm.kv_budget_for(EngineMemory(enforce_eager=True))
    assert eager.cudagraph == 0 and graphs.cudagraph > 0
    assert eager.available == graphs.available + graphs.cudagraph
    assert eager.tokens > graphs.tokens
    # the estimate turned off (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0) charges nothing either
    assert lm.kv_budget_for(EngineMemory(estimate_cudagraphs=False)).tokens == eager.tokens


def test_cuda_graph_sizes_follow_vllms_defaults() -> None:
    sizes = capture_sizes(1024, 8192)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 512 and len(sizes) == 51
    assert capture_sizes(8, 8192)[-1] == 16  # 2 x max_num_seqs
    # 51 piecewise + 51 full decode graphs on the default H100 engine
    lm = load_latency_model("llama-3.1-8b", "h100", 1)
    m = lm.model
    first = forward_peak_bytes(Shapes(m.hidden, dense_mlp(m.intermediate, 1), m.vocab), 512)
    assert lm.kv_budget.cudagraph == first + 101 * CUDAGRAPH_BYTES_PER_GRAPH


def test_more_batched_tokens_cost_kv() -> None:
    lm = load_latency_model("llama-3.1-8b", "h100", 1)
    assert lm.kv_capacity_for(EngineMemory(max_num_batched_tokens=65536)) < lm.kv_capacity_tokens


def test_default_engine_memory_is_vllms_per_gpu_default() -> None:
    assert default_engine_memory(79.22, "h100") == EngineMemory(
        max_num_batched_tokens=8192, max_num_seqs=1024
    )
    assert default_engine_memory(180, "b200").max_num_batched_tokens == 16384
    assert default_engine_memory(80, "a100") == EngineMemory(max_num_batched_tokens=2048, max_num_seqs=256)


def test_a_pool_sizes_its_kv_with_its_engine_flags() -> None:
    lm = load_latency_model("llama-3.1-8b", "h100", 1)
    default = Pool("decode", PoolSpec(replicas=1), lm, False)
    # the twin's scheduling defaults are not engine flags: the pool's cache is the unflagged engine's
    assert default.settings.kv_capacity_tokens == lm.kv_capacity_tokens
    low = Pool("decode", PoolSpec(replicas=1, gpu_memory_utilization=0.6), lm, False)
    eager = Pool("decode", PoolSpec(replicas=1, enforce_eager=True), lm, False)
    assert low.settings.kv_capacity_tokens is not None and eager.settings.kv_capacity_tokens is not None
    assert low.settings.kv_capacity_tokens < lm.kv_capacity_tokens < eager.settings.kv_capacity_tokens
    with pytest.raises(ValueError, match=r"^gpu_memory_utilization"):
        PoolSpec(replicas=1, gpu_memory_utilization=1.5)


def test_engine_memory_flags_come_from_a_disaggregated_deployments_args() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "vllm-nixl.yaml"
    dd = yaml.safe_load(example.read_text())
    plain = SimDeployment.from_dict(dd)
    assert plain.decode is not None and plain.decode.gpu_memory_utilization is None
    assert not plain.decode.enforce_eager
    flagged = copy.deepcopy(dd)
    flagged["spec"]["decode"]["args"] = ["--gpu-memory-utilization=0.8", "--enforce-eager"]
    sim = SimDeployment.from_dict(flagged)
    assert sim.decode is not None and sim.prefill is not None
    assert sim.decode.gpu_memory_utilization == 0.8 and sim.decode.enforce_eager
    assert sim.prefill.gpu_memory_utilization is None and not sim.prefill.enforce_eager
    flagged["spec"]["decode"]["args"] = ["--enforce-eager", "--no-enforce-eager"]
    sim = SimDeployment.from_dict(flagged)
    assert sim.decode is not None and not sim.decode.enforce_eager

"""The MoE/MLA latency model (disagg.perf.moe): properties the kernel tables and the architectures imply."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from disagg.perf.latency import PROFILES_DIR, load_latency_model
from disagg.perf.moe import (
    MoeLatencyModel,
    Parallelism,
    load_moe_archs,
    load_moe_latency_model,
    moe_profiles,
)

EXAMPLES = Path(__file__).parents[2] / "examples"


def example_deployment(name: str) -> dict[str, Any]:
    """The DisaggregatedDeployment document of ``examples/<name>``."""
    return next(
        d
        for d in yaml.safe_load_all((EXAMPLES / name).read_text())
        if d and d.get("kind") == "DisaggregatedDeployment"
    )


def with_decode_args(doc: dict[str, Any], *args: str) -> dict[str, Any]:
    """A copy of ``doc`` whose decode pool has ``args`` appended to its engine args."""
    decode = {**doc["spec"]["decode"]}
    decode["args"] = [*(decode.get("args") or []), *args]
    return {**doc, "spec": {**doc["spec"], "decode": decode}}


def test_every_model_has_a_profile_on_h100_h200_and_b200() -> None:
    have = {(m, g) for m, g, _ in moe_profiles()}
    for model in ("deepseek-v3", "qwen3-235b-a22b", "gpt-oss-120b", "qwen3-32b"):
        for gpu in ("h100", "h200", "b200"):
            assert (model, gpu) in have, (model, gpu)


def test_hugging_face_ids_resolve_through_the_common_loader() -> None:
    lm = load_latency_model("deepseek-ai/DeepSeek-R1", "h200", 8, "fp8")
    assert isinstance(lm, MoeLatencyModel) and lm.arch.name == "deepseek-v3"
    assert isinstance(load_latency_model("Qwen/Qwen3-32B", "h100", 2, "bf16"), MoeLatencyModel)


def test_mla_kv_per_token_is_far_smaller_than_mha() -> None:
    ds = load_moe_archs()["deepseek-v3"]
    mha = 2 * ds.layers * ds.heads * ds.v_head_dim * 2  # K and V of every head, bf16
    assert ds.kv_bytes_per_token("bf16") * 50 < mha
    assert ds.kv_bytes_per_token("fp8") * 2 == ds.kv_bytes_per_token("bf16")


def test_deepseek_r1_fp8_fits_eight_h200_but_not_eight_h100() -> None:
    eight = Parallelism(tp=8)
    h200 = load_moe_latency_model("deepseek-r1", "h200", "fp8", parallelism=eight)
    assert h200.kv_capacity_tokens > 100_000
    with pytest.raises(ValueError, match="does not fit on 8 x h100"):
        load_moe_latency_model("deepseek-r1", "h100", "fp8", parallelism=eight)
    # two H100 nodes with expert parallelism hold it
    assert load_moe_latency_model("deepseek-r1", "h100", "fp8", parallelism=Parallelism.wide_ep(16))


def test_fp4_weights_leave_more_kv_room_than_fp8_on_b200() -> None:
    par = Parallelism(tp=8)
    fp8 = load_moe_latency_model("deepseek-r1", "b200", "fp8", parallelism=par)
    fp4 = load_moe_latency_model("deepseek-r1", "b200", "nvfp4", parallelism=par)
    assert fp4.weight_bytes_per_gpu() < 0.6 * fp8.weight_bytes_per_gpu()
    assert fp4.kv_capacity_tokens > fp8.kv_capacity_tokens


@pytest.mark.parametrize(
    ("model", "gpu", "dtype", "par"),
    [
        ("deepseek-r1", "h200", "fp8", Parallelism(tp=8)),
        ("deepseek-r1", "h100", "fp8", Parallelism.wide_ep(32)),
        ("qwen3-235b-a22b", "h100", "fp8", Parallelism(tp=4)),
        ("gpt-oss-120b", "b200", "mxfp4", Parallelism(tp=1)),
        ("qwen3-32b", "h100", "bf16", Parallelism(tp=2)),
    ],
)
def test_decode_step_grows_with_batch_and_context(model: str, gpu: str, dtype: str, par: Parallelism) -> None:
    lm = load_moe_latency_model(model, gpu, dtype, parallelism=par)
    batches = [par.dp * b for b in (1, 4, 16, 64)]
    steps = [lm.decode_step_time_s(b, b * 2000) for b in batches]
    assert steps == sorted(steps) and steps[-1] > steps[0]
    assert lm.decode_step_time_s(batches[1], batches[1] * 8000) > steps[1]
    # the closed form of k steps agrees with stepping
    b, ctx, k = batches[1], batches[1] * 1000, 5
    stepped = sum(lm.decode_step_time_s(b, ctx + i * b) for i in range(k))
    assert lm.decode_steps_time_s(b, ctx, k) == pytest.approx(stepped, rel=1e-9)


def test_ep_all_to_all_grows_with_node_count() -> None:
    times = {}
    for gpus in (8, 16, 32, 64, 144):
        lm = load_moe_latency_model("deepseek-r1", "h200", "fp8", parallelism=Parallelism.wide_ep(gpus))
        times[gpus] = (lm.all_to_all_ms(128, "ll"), lm.all_to_all_ms(4096, "normal"))
    for mode in (0, 1):
        series = [times[g][mode] for g in sorted(times)]
        assert series == sorted(series) and series[-1] > 1.5 * series[0]


def test_one_node_all_to_all_is_the_measured_table() -> None:
    lm = load_moe_latency_model("deepseek-r1", "h200", "fp8", parallelism=Parallelism.wide_ep(8))
    table = yaml.safe_load((PROFILES_DIR / "moe_coefficients.yaml").read_text())["profiles"]
    deepep = table["deepseek-v3/h200/fp8"]["deepep"]
    for mode in ("ll", "normal"):
        for tokens, ms in zip(deepep[mode]["tokens"], deepep[mode]["ms"], strict=True):
            assert lm.all_to_all_ms(tokens, mode) == pytest.approx(ms)


# deepseek-ai/DeepEP README, low-latency kernels on H800 with CX7 400 Gb/s InfiniBand, 128 tokens per
# batch, hidden 7168, top-8, FP8 dispatch + BF16 combine: dispatch / combine latency by EP size (8 GPUs per
# node). Held out: the tables have one node only; the twin adds the remote bytes over the NIC.
DEEPEP_LL_US = {16: 118 + 195, 64: 173 + 314, 256: 194 + 360}


@pytest.mark.parametrize("ep", sorted(DEEPEP_LL_US))
def test_internode_low_latency_all_to_all_matches_deepep_published(ep: int) -> None:
    lm = load_moe_latency_model("deepseek-r1", "h100", "fp8", parallelism=Parallelism.wide_ep(ep))
    assert lm.all_to_all_ms(128, "ll") * 1000 == pytest.approx(DEEPEP_LL_US[ep], rel=0.15)


def test_dp_attention_splits_the_batch_over_ranks() -> None:
    """Under DP attention a rank sees 1/dp of the batch: 8 ranks with 8x the batch take about one rank's
    time (plus the all-to-all), far less than 8 x."""
    one = load_moe_latency_model("deepseek-r1", "h200", "fp8", parallelism=Parallelism.wide_ep(8))
    step8 = one.decode_step_time_s(8 * 32, 8 * 32 * 2000)
    step1 = one.decode_step_time_s(32, 32 * 2000)
    assert step8 < 3 * step1


def test_two_batch_overlap_hides_all_to_all() -> None:
    base = Parallelism.wide_ep(32, overlap=False)
    lm_seq = load_moe_latency_model("deepseek-r1", "h100", "fp8", parallelism=base)
    lm_tbo = load_moe_latency_model(
        "deepseek-r1", "h100", "fp8", parallelism=Parallelism.wide_ep(32, overlap=True)
    )
    prompts = [2000] * 64
    assert lm_tbo.prefill_time_s(prompts) < lm_seq.prefill_time_s(prompts)


def test_expert_imbalance_slows_the_step() -> None:
    even_par = Parallelism(tp=1, dp=32, ep=32, overlap=False)
    even = load_moe_latency_model("deepseek-r1", "h100", "fp8", parallelism=even_par)
    skew = Parallelism(tp=1, dp=32, ep=32, overlap=False, imbalance=1.5)
    uneven = load_moe_latency_model("deepseek-r1", "h100", "fp8", parallelism=skew)
    assert uneven.prefill_time_s([4000] * 64) > even.prefill_time_s([4000] * 64)


def test_parallelism_is_validated() -> None:
    with pytest.raises(ValueError, match="ep"):
        Parallelism(tp=2, dp=4, ep=4)
    with pytest.raises(ValueError, match="tp"):
        Parallelism(tp=32)
    assert Parallelism.wide_ep(72).nodes == 9 and Parallelism(tp=8).nodes == 1
    with pytest.raises(ValueError, match="dense"):
        load_latency_model("llama-3.1-8b", "h100", 1, parallelism=Parallelism(tp=1, dp=2, ep=2))


def test_wide_ep_capacity_counts_every_rank() -> None:
    """DP attention keeps one copy of the latent cache per rank: capacity grows with the ranks."""
    a = load_moe_latency_model("deepseek-r1", "h100", "fp8", parallelism=Parallelism.wide_ep(16))
    b = load_moe_latency_model("deepseek-r1", "h100", "fp8", parallelism=Parallelism.wide_ep(32))
    assert b.kv_capacity_tokens > 2 * a.kv_capacity_tokens
    assert math.isfinite(b.prefill_time_s([1000]))


def test_shipped_moe_coefficients_are_reproducible(tmp_path: Path) -> None:
    from disagg.twin.calibrate_moe import main as calibrate_main

    shared = Path(__file__).resolve().parents[2] / ".." / "shared" / "calibration"
    if not (shared / "aiconfigurator" / "b200_sxm").is_dir():
        pytest.skip("../shared/calibration not present")
    out = tmp_path / "moe.yaml"
    assert calibrate_main(["--calibration", str(shared), "--out", str(out)]) == 0
    got = yaml.safe_load(out.read_text())
    want = yaml.safe_load((PROFILES_DIR / "moe_coefficients.yaml").read_text())
    assert set(got["profiles"]) == set(want["profiles"])
    for key in want["profiles"]:
        _close(got["profiles"][key], want["profiles"][key], key)


def _close(got: object, want: object, path: str) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), path
        for k in want:
            _close(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _close(g, w, f"{path}[{i}]")
    elif isinstance(want, float):
        # least-squares fits move in their last bits with another BLAS build (see test_twin_latency)
        assert got == pytest.approx(want, rel=1e-6, abs=2e-6), path
    else:
        assert got == want, path


def test_twin_document_with_wide_ep_pools_simulates() -> None:
    from disagg.twin.profiles import check
    from disagg.twin.sim import SimDeployment, simulate
    from disagg.twin.traffic import Request

    dep = SimDeployment.from_dict(
        {
            "model": "deepseek-ai/DeepSeek-R1",
            "gpu": "h200",
            "dtype": "fp8",
            "prefill": {"replicas": 1, "tp": 1, "dp": 16, "ep": 16},
            "decode": {"replicas": 1, "tp": 1, "dp": 16, "ep": 16},
        }
    )
    assert dep.gpus == 32
    check(dep)
    reqs = [Request(i * 0.05, 2000, 100) for i in range(40)]
    res = simulate(dep, reqs, seed=1)
    assert len(res.ttft) == 40 and not np.isnan(res.e2e).any()
    assert float(np.nanmax(res.ttft)) < 2.0  # 16 DP ranks prefill 2000-token prompts arriving at 20/s


def test_deepseek_deployment_beyond_one_node_reads_as_wide_ep() -> None:
    from disagg.api.deployment import DisaggregatedDeployment
    from disagg.policy.bounds import replica_layout
    from disagg.policy.types import ReplicaLayout

    base = example_deployment("vllm-nixl.yaml")

    def layout(model: str, tp: int, args: list[str]) -> ReplicaLayout:
        doc = {**base, "spec": {**base["spec"], "model": {**base["spec"]["model"], "name": model}}}
        doc["spec"]["decode"] = {**base["spec"]["decode"], "tensorParallelSize": tp, "args": args}
        doc["spec"]["decode"].pop("resources", None)
        return replica_layout(DisaggregatedDeployment.model_validate(doc).spec, "decode")

    assert layout("deepseek-ai/DeepSeek-R1", 16, []) == ReplicaLayout(tp=8, dp=2, ep=16)
    sglang = ["--dp", "16", "--enable-dp-attention", "--moe-a2a-backend", "deepep"]  # --tp: the operator's
    assert layout("deepseek-ai/DeepSeek-R1", 16, sglang) == ReplicaLayout(tp=1, dp=16, ep=16)
    vllm = ["--data-parallel-size", "8", "--enable-expert-parallel", "--enable-dbo"]
    assert layout("deepseek-ai/DeepSeek-R1", 8, vllm) == ReplicaLayout(tp=1, dp=8, ep=8, overlap=True)
    assert layout("llama-3.1-70b", 4, []) == ReplicaLayout(tp=4)


def test_engine_limits_of_a_data_parallel_replica_are_per_rank() -> None:
    # vLLM data parallelism runs one engine core per DP rank, each scheduling up to its own
    # max_num_batched_tokens / max_num_seqs: a DP16 replica takes 16 ranks' worth per step (seen before:
    # a 16-GPU DeepSeek prefill replica held to one rank's 8192 tokens per step served 20 req/s of 2k
    # prompts at TTFT p50 71 s)
    from disagg.perf.moe import Parallelism
    from disagg.twin.deployment import PoolSpec
    from disagg.twin.engine import DEFAULT_MAX_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS
    from disagg.twin.sim import Pool

    spec = PoolSpec(replicas=1, tp=1, dp=16, ep=16)
    lm = load_latency_model("deepseek-r1", "h200", 16, "fp8", parallelism=Parallelism(tp=1, dp=16, ep=16))
    pool = Pool("prefill", spec, lm, prefix_caching=True)
    assert pool.settings.max_num_batched_tokens == 16 * DEFAULT_MAX_BATCHED_TOKENS
    assert pool.settings.max_num_seqs == 16 * DEFAULT_MAX_NUM_SEQS
    dense = Pool(
        "prefill", PoolSpec(replicas=1, tp=2), load_latency_model("llama-3.1-70b", "h100", 2, "fp8"), True
    )
    assert dense.settings.max_num_batched_tokens == DEFAULT_MAX_BATCHED_TOKENS


# --- a dense model whose tensor-parallel group spans two nodes (Llama-3.1-405B at TP16) ---------------
def test_tp16_over_two_nodes_all_reduces_slower_than_tp8_in_one_node() -> None:
    """TP16 on two 8-GPU nodes all-reduces over the NICs (50 GB/s per GPU) where TP8 stays on NVLink: slower
    at every size, and at large messages at least the ring's inter-node bytes at line rate."""
    tp8 = load_moe_latency_model("llama-3.1-405b", "h100", "fp8", parallelism=Parallelism(tp=8))
    tp16 = load_moe_latency_model("llama-3.1-405b", "h100", "fp8", parallelism=Parallelism(tp=16))
    for m in (1, 16, 256, 4096):
        assert tp16.allreduce_ms(m) > tp8.allreduce_ms(m), m
    m = 4096
    shard = m * tp16.arch.hidden * 2 / 8
    nic_ms = 2 * (2 - 1) / 2 * shard / (tp16.gpu.nic_gbit * 1e9 / 8) * 1000
    assert tp16.allreduce_ms(m) > nic_ms
    assert tp16.allreduce_ms(m) > 1.5 * tp8.allreduce_ms(m)
    # the same TP8 group split over two 4-GPU nodes pays the NIC too
    split = load_moe_latency_model(
        "llama-3.1-405b", "h200", "fp8", parallelism=Parallelism(tp=8, gpus_per_node=4)
    )
    one = load_moe_latency_model("llama-3.1-405b", "h200", "fp8", parallelism=Parallelism(tp=8))
    assert split.allreduce_ms(1024) > 2 * one.allreduce_ms(1024)
    assert split.decode_step_time_s(64, 64 * 2048) > one.decode_step_time_s(64, 64 * 2048)


def test_llama_405b_bf16_needs_two_h100_nodes() -> None:
    with pytest.raises(ValueError, match="does not fit on 8 x h100"):
        load_latency_model("meta-llama/Llama-3.1-405B-Instruct", "h100", 8, "bf16")
    two = load_latency_model("meta-llama/Llama-3.1-405B-Instruct", "h100", 16, "bf16")
    assert isinstance(two, MoeLatencyModel) and two.parallelism.tp_nodes == 2
    assert two.kv_capacity_tokens > 100_000
    # GQA's 8 KV heads over 16 GPUs: each head held twice, so the capacity per GPU is that of TP8's heads
    assert two._copies() == 2
    # half the weights per GPU of TP8 make the memory-bound decode step faster despite the NIC all-reduce,
    # but not twice as fast
    fp8_8 = load_latency_model("llama-3.1-405b", "h200", 8, "bf16")
    fp8_16 = load_latency_model("llama-3.1-405b", "h200", 16, "bf16")
    t8, t16 = (lm.decode_step_time_s(32, 32 * 2048) for lm in (fp8_8, fp8_16))
    assert 0.5 * t8 < t16 < t8


def test_moe_models_refuse_tensor_parallelism_beyond_a_node() -> None:
    with pytest.raises(ValueError, match="no TP16 attention tables"):
        load_moe_latency_model("qwen3-235b-a22b", "h100", "fp8", parallelism=Parallelism(tp=16, ep=16))


# --- gpt-oss: every other layer a 128-token sliding window ------------------------------------------------
def _without_sliding(lm: MoeLatencyModel) -> MoeLatencyModel:
    from dataclasses import replace

    grid = yaml.safe_load((PROFILES_DIR / "moe_coefficients.yaml").read_text())["m_grid"]
    arch = replace(lm.arch, sliding_layers=0, sliding_window=0)
    return MoeLatencyModel(arch, lm.gpu, lm.parallelism, lm.dtype, lm._entry, grid, lm.runtime)


def test_gpt_oss_sliding_window_halves_kv_per_token() -> None:
    oss = load_moe_latency_model("gpt-oss-120b", "h100", "mxfp4", parallelism=Parallelism(tp=1))
    assert (oss.arch.sliding_layers, oss.arch.sliding_window) == (18, 128)
    full = _without_sliding(oss)
    assert oss.kv_bytes_per_token * 2 == full.kv_bytes_per_token == 2 * 36 * 8 * 64 * 2
    assert 1.9 < oss.kv_capacity_tokens / full.kv_capacity_tokens < 2.1


def test_gpt_oss_sliding_layers_stop_paying_for_long_context() -> None:
    oss = load_moe_latency_model("gpt-oss-120b", "b200", "mxfp4", parallelism=Parallelism(tp=1))
    full = _without_sliding(oss)
    # below the window every layer attends to everything: same step
    assert oss.decode_step_time_s(64, 64 * 100) == pytest.approx(full.decode_step_time_s(64, 64 * 100))
    # past it, the context cost grows for half the layers only
    grow = oss.decode_step_time_s(64, 64 * 32_000) - oss.decode_step_time_s(64, 64 * 1_000)
    grow_full = full.decode_step_time_s(64, 64 * 32_000) - full.decode_step_time_s(64, 64 * 1_000)
    assert grow == pytest.approx(grow_full / 2, rel=0.01)
    assert oss.decode_step_slope_s(64) == pytest.approx(full.decode_step_slope_s(64) / 2)
    assert oss.prefill_time_s([32_000]) < full.prefill_time_s([32_000])


def test_twin_document_with_a_two_node_dense_tp16_pool_simulates() -> None:
    from disagg.twin.profiles import check
    from disagg.twin.sim import SimDeployment, simulate
    from disagg.twin.traffic import Request

    dep = SimDeployment.from_dict(
        {
            "model": "meta-llama/Llama-3.1-405B-Instruct",
            "gpu": "h100",
            "dtype": "bf16",
            "prefill": {"replicas": 1, "tp": 16},
            "decode": {"replicas": 1, "tp": 16},
        }
    )
    assert dep.gpus == 32
    check(dep)
    reqs = [Request(i * 1.0, 2000, 50) for i in range(10)]
    res = simulate(dep, reqs, seed=1)
    assert len(res.ttft) == 10 and not np.isnan(res.e2e).any()


# --- H800: H100 with NVLink cut to 400 GB/s -----------------------------------------------------------------
def test_h800_all_to_all_is_slower_than_h100_and_compute_is_not() -> None:
    h100, h800 = (
        load_moe_latency_model("deepseek-r1", g, "fp8", parallelism=Parallelism.wide_ep(32))
        for g in ("h100", "h800")
    )
    assert h800.gpu.nvlink_gbps == 400 and h800.gpu.nic_gbit == h100.gpu.nic_gbit
    for mode, m in (("normal", 4096), ("normal", 16384), ("ll", 128)):
        assert h800.all_to_all_ms(m, mode) > h100.all_to_all_ms(m, mode), (mode, m)  # type: ignore[arg-type]
    # within a node the NVLink-bound part stretches by 900/400 above the table's latency floor (over 4 nodes
    # the NICs, the same on both, carry most of it); kernels are H100's
    one = Parallelism.wide_ep(16, gpus_per_node=16, overlap=False)
    n100, n800 = (load_moe_latency_model("deepseek-r1", g, "fp8", parallelism=one) for g in ("h100", "h800"))
    assert 1.8 < n800.all_to_all_ms(16384, "normal") / n100.all_to_all_ms(16384, "normal") <= 900 / 400
    assert h800._entry["gemm"] == h100._entry["gemm"] and h800._entry["moe"] == h100._entry["moe"]
    assert h800.prefill_time_s([2000] * 64) > h100.prefill_time_s([2000] * 64)
    assert load_latency_model("qwen3-32b", "NVIDIA-H800", 8, "fp8").gpu.name == "h800"  # the product label


def test_h800_intranode_dispatch_combine_matches_deepep_published() -> None:
    """Held out: deepseek-ai/DeepEP's README measures its normal kernels on H800 within a node (8 ranks,
    4096 tokens per rank, hidden 7168, top-8 of 256 experts, FP8 dispatch, BF16 combine) at 153 GB/s dispatch
    and 158 GB/s combine, bytes counted as tokens received per rank (tests/test_intranode.py)."""
    ranks, experts, topk, hidden, tokens = 8, 256, 8, 7168, 4096
    per_rank = experts // ranks
    miss = math.comb(experts - per_rank, topk) / math.comb(experts, topk)
    received = tokens * ranks * (1 - miss)  # tokens that reach one rank, each once
    published_ms = (received * hidden * (1 + 4 / 128) / 153e9 + received * hidden * 2 / 158e9) * 1000
    one_node = Parallelism.wide_ep(16, gpus_per_node=16, overlap=False)  # nodes == 1: the one-node table
    twin = load_moe_latency_model("deepseek-r1", "h800", "fp8", parallelism=one_node)
    assert twin.all_to_all_ms(tokens, "normal") == pytest.approx(published_ms, rel=0.15)


# --- MTP speculative decoding (DeepSeek's multi-token prediction) -----------------------------------------
def test_mtp_tokens_per_step_is_the_acceptance_weighted_sum() -> None:
    from disagg.perf.moe import Speculation

    assert Speculation(1, 0.85).tokens_per_step == pytest.approx(1.85)
    assert Speculation(3, 0.8).tokens_per_step == pytest.approx(1 + 0.8 + 0.64 + 0.512)
    assert Speculation(2, 0.0).tokens_per_step == 1.0
    with pytest.raises(ValueError, match="acceptance"):
        Speculation(1, 1.5)


def test_mtp_raises_decode_throughput_by_about_the_accepted_tokens() -> None:
    """A decode step with one MTP draft emits 1.85 tokens per sequence at 85% acceptance, at the cost of
    verifying two tokens and one extra layer: at a small, memory-bound batch the throughput gain is near
    1.85 but below it, and it shrinks as the batch makes the verify compute-bound."""
    from disagg.perf.moe import Speculation

    par = Parallelism.wide_ep(16)
    spec = Speculation(1, 0.85)
    plain = load_moe_latency_model("deepseek-r1", "h200", "fp8", parallelism=par)
    mtp = load_moe_latency_model("deepseek-r1", "h200", "fp8", parallelism=par, speculation=spec)

    def gain(per_rank: int) -> float:
        b = per_rank * par.dp
        return plain.decode_step_time_s(b, b * 4000) / mtp.decode_step_time_s(b, b * 4000)

    assert 1.4 < gain(4) < spec.tokens_per_step
    assert 1.0 < gain(256) < gain(4)
    # the closed form of a decode jump agrees with stepping token by token (context grows per emitted token)
    b, ctx, steps = 64, 64 * 4000, 50
    stepped = sum(mtp.decode_step_time_s(b, ctx + i * b) for i in range(steps))
    assert mtp.decode_steps_time_s(b, ctx, steps) == pytest.approx(stepped, rel=1e-9)
    # prefill is not speculated; the MTP module's 14B parameters take GPU memory
    assert mtp.prefill_time_s([2000] * 8) == plain.prefill_time_s([2000] * 8)
    assert mtp.weight_bytes_per_gpu() > plain.weight_bytes_per_gpu()
    assert mtp.kv_capacity_tokens < plain.kv_capacity_tokens
    with pytest.raises(ValueError, match="multi-token-prediction"):
        load_latency_model("qwen3-235b-a22b", "h200", 8, "fp8", speculation=spec)


def test_mtp_is_read_from_the_engine_flags_of_the_pinned_wheels() -> None:
    from disagg.policy.bounds import speculation_from_args as read

    assert read([]) == 0
    assert read(["--speculative-config", '{"method": "deepseek_mtp", "num_speculative_tokens": 1}']) == 1
    assert read(['--speculative-config={"method":"mtp","num_speculative_tokens":2}']) == 2
    assert read(["-sc", '{"method": "mtp", "num-speculative-tokens": 3}']) == 3
    assert read(["--spec-method", "mtp", "--spec-tokens", "2"]) == 2
    assert read(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}']) == 0
    eagle3 = '{"method": "eagle3", "model": "x", "num_speculative_tokens": 3}'
    assert read(["--speculative-config", eagle3]) == 0
    # SGLang: EAGLE/NEXTN on DeepSeek is its MTP layer; unset steps are SGLang's auto choice for DeepseekV3
    assert read(["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1"]) == 1
    assert read(["--speculative-algorithm", "NEXTN"]) == 3
    assert read(["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "x/y"]) == 0
    assert read(["--speculative-algorithm", "NGRAM"]) == 0


def test_deployment_with_mtp_flags_simulates_faster_decode() -> None:
    from disagg.api.deployment import DisaggregatedDeployment
    from disagg.twin.sim import SimDeployment, simulate
    from disagg.twin.traffic import Request

    base = example_deployment("deepseek-r1-wideep-vllm.yaml")
    doc = with_decode_args(
        base, "--speculative-config", '{"method": "deepseek_mtp", "num_speculative_tokens": 1}'
    )
    with_mtp = SimDeployment.from_model(DisaggregatedDeployment.model_validate(doc))
    plain = SimDeployment.from_model(DisaggregatedDeployment.model_validate(base))
    assert with_mtp.decode is not None and with_mtp.decode.mtp_tokens == 1
    assert with_mtp.prefill is not None and with_mtp.prefill.mtp_tokens == 0
    reqs = [Request(i * 0.1, 1000, 200) for i in range(40)]
    itl = [float(np.nanmean(simulate(d, reqs, seed=1).itl_mean)) for d in (plain, with_mtp)]
    assert itl[1] < itl[0] / 1.3


def test_sglang_deployment_with_tp16_over_two_nodes_simulates() -> None:
    """A DisaggregatedDeployment serving Llama-3.1-405B with SGLang at TP16 over two 8-GPU nodes (vLLM
    multi-node is data-parallel only in the operator's rendering, so the API refuses TP across its nodes)."""
    from disagg.api.deployment import DisaggregatedDeployment
    from disagg.twin.profiles import check
    from disagg.twin.sim import SimDeployment, simulate
    from disagg.twin.traffic import Request

    base = example_deployment("sglang-nixl.yaml")
    spec = {**base["spec"], "model": {**base["spec"]["model"], "name": "meta-llama/Llama-3.1-405B-Instruct"}}
    for role in ("prefill", "decode"):
        pool = {k: v for k, v in base["spec"][role].items() if k not in ("tensorParallelSize", "resources")}
        spec[role] = {**pool, "parallelism": {"tensor": 16, "nodesPerReplica": 2, "gpusPerNode": 8}}
    dep = SimDeployment.from_model(DisaggregatedDeployment.model_validate({**base, "spec": spec}))
    assert dep.decode is not None and dep.decode.tp == 16 and dep.decode.gpus_per_replica == 16
    check(dep)
    res = simulate(dep, [Request(i * 0.5, 1000, 20) for i in range(10)], seed=1)
    assert not np.isnan(res.e2e).any()


def test_live_twin_pods_speculate_as_their_command_line_says() -> None:
    from disagg.twin.live.follower import pod_speculation
    from disagg.twin.live.latency import LatencyChoice, load_step_latency

    def pod(*args: str) -> dict[str, object]:
        return {"spec": {"containers": [{"name": "engine", "command": ["vllm", "serve", "m", *args]}]}}

    mtp = pod("--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}')
    spec = pod_speculation(mtp, "deepseek-ai/DeepSeek-R1")
    assert spec is not None and spec.tokens == 2
    assert pod_speculation(pod(), "deepseek-ai/DeepSeek-R1") is None
    assert pod_speculation(mtp, "Qwen/Qwen3-235B-A22B") is None  # no MTP module: emulated without
    assert pod_speculation(mtp, "llama-3.1-8b") is None
    lm = load_step_latency(LatencyChoice("deepseek-r1", "h200", 8, "fp8", speculation=spec))
    assert isinstance(lm, MoeLatencyModel) and lm.speculation == spec


def test_policy_sizes_decode_with_the_mtp_its_engine_flags_ask_for() -> None:
    """The model-based policy's decode latency model is the speculating one where the decode pool's flags
    ask for MTP (else it would plan more decode replicas than the deployment needs)."""
    from disagg.api.deployment import DisaggregatedDeployment
    from disagg.policy.bounds import serving_profile
    from disagg.policy.capacity import load_models

    base = example_deployment("deepseek-r1-wideep-vllm.yaml")
    doc = with_decode_args(base, "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}')
    plain = serving_profile(DisaggregatedDeployment.model_validate(base).spec)
    mtp = serving_profile(DisaggregatedDeployment.model_validate(doc).spec)
    assert (plain.mtp_decode, mtp.mtp_decode) == (0, 1)
    a, b = load_models(plain).decode, load_models(mtp).decode
    assert b.decode_step_time_s(512, 512 * 2000) < a.decode_step_time_s(512, 512 * 2000)
    p_mtp, p_plain = load_models(mtp).prefill, load_models(plain).prefill
    assert p_mtp.prefill_time_s([2000]) == p_plain.prefill_time_s([2000])

"""Fidelity table: the twin's predictions against published measurements, each within 25%.

Points (../shared/README.md and the calibration files):

* aiconfigurator, Llama-3.1-70B FP8, vLLM, H100 TP8, colocated, 1024 or 8192 in / 1024 out at 4 and 64
  requests in flight: TTFT and TPOT. Simulated as a closed loop (each client sends its next request when
  the previous one finished): the clients' steady state (first requests at seeded random times within
  one request's duration as the twin predicts it, measured after a warm-up third) and, since the figure is
  read as the mean of a whole vllm bench serve run of 1000 requests, its first round sent together.
* NVIDIA NIM, Llama-3.3-70B FP8 TP2 on 2xH100, 5000 in / 500 out, 1 in flight: TTFT 407 ms, ITL 18.6 ms;
  and at 5, 25, 50 and 100 in flight (same table), simulated with an FP8 KV cache: the table does not
  say which KV dtype its FP8 profile uses, and with BF16 KV the 50/100 rows are KV-capacity-bound in the
  twin (TTFT 6.2 s and 47 s against 0.83 s and 8.0 s), so FP8 KV is what the measurements imply.
* vidur (independent H100 profiling): per-layer linear-layer times of Llama-2-70B (same shapes as
  Llama-3.1-70B) against token count and TP, compared with the twin's GEMM interpolation of aiconfigurator.
* Splitwise, Llama2-70B H100 TP8 (2023 software stack): prompt 1k 78 ms, 8k 845 ms, token ~30 ms.
* H200, measured here (bench/gpu/results/h200-2026-11-30, bench/gpu/measure_llama_forward.py): one TP
  shard's forward pass of Llama-3.1-8B TP1 and 70B TP4/TP8. The H200 profile is fitted on a subset
  (calibrate.H200_FIT) and checked on the held-out rows; and the twin's H100 profile is compared with the
  H200 measurement (cross-GPU rows: near the HBM ratio where KV reads dominate; not at batch 1, see below).

Train and check (disagg.twin.fidelity.TRAIN): the per-step overhead is fitted on the TPOTs of the two
1024-token aiconfigurator points and the per-request front-end overhead on the 1k/4-in-flight TTFT (see
disagg.twin.calibrate.RUNTIME); the 8192-token points and NIM's TP2 rows are checks. Each closed-loop point
is the mean over 32 client phases. Known misses are strict xfails with the reason, so the table stays
honest:

* TTFT at 64 in flight (aiconfigurator), met since the published figure is read as a whole run's mean.
  The clients' steady state alone (random phases; it meets 1k@4, 71 vs 70 ms) gives 91 / 727 ms against
  185 / 1150 (-51 / -37%). A benchmark's clients all start at t=0 and its mean counts every request (vllm
  bench serve: no warm-up, --num-prompts 1000 by default), so the first round weighs in: 64 prompts sent
  together queue for the 8192-token budget and average 1177 / 9063 ms; over 1000 requests the run's mean
  is 160 / 1261 ms (-13 / +10%), while the 4-in-flight points move by under 1% (sim.run_mean). The count
  is an assumption, not a fit: the source names neither its tool nor its count (10 x C would give
  199 / 1561 ms, +8 / +36%; 5 x C 308 / 2394 ms; bench/twin_fidelity.py prints
  them). The later rounds count at the steady state because the twin's own lockstep (cohorts that never
  part) overshoots the 4-5-in-flight points of both sources about 2x. Before this, five steady-state
  explanations were tried and rejected, each kept as a test: (1) lockstep cohorts (666 / 1089 ms at 64,
  but 144 / 840 ms at 4 and 1255 ms at NIM's 5); (2) drift noise of up to 1 s per request
  (ClosedLoop.jitter_s) meets 8k@64 but leaves 1k@64 at -54% and sends NIM 25/50 to +47/+59%; (3) a front
  end growing with the streams in flight (fidelity.FRONT_END_WHAT_IF: 20 ms + 1.2 ms per stream) meets
  TRAIN but sends NIM 25/50 to +37/+45%; (4) the front end's CPU load (fidelity.FRONT_END_LOAD_WHAT_IF: one
  API-server process, 22 ms / (1 - 180 us x output tokens/s)) meets TRAIN but moves no check, and the
  residuals are not ordered by front-end load (the per-token cost each implies spans 192 us to 3.4 ms);
  (5) the scheduler's knobs: max_num_batched_tokens 2048-16384 gives 88-91 ms at 1k@64, max_num_seqs does
  not bind, and vLLM V1's running-first order is the engine's already. NIM's table is a steady-state figure
  (GenAI-Perf measures in stability windows after the start), so its rows count no first round.
* NIM at 25 in flight: TTFT +25% (a strict xfail at the tolerance's edge), phase-sensitive: the twin's
  25 ms per request is vLLM's; with NIM's own 7.9 ms (the intercept of its two single-request rows) the
  row is -8% and the others stay within the tolerance (a test checks both).
* 8k in at 4 in flight (aiconfigurator): TTFT +24%, inside the tolerance, not the 10% goal. The twin's
  32 phases are bimodal: 20 settle collision-free at 308 ms (+2%), 12 lock a cluster at 425-623 ms. A
  cluster, once formed, re-forms every round: its prompts are prefilled one pass after another, yet each
  prefill pass also advances the others' decodes by one token (continuous batching mixes them), so the
  members still finish one decode pass (~10 ms) apart, re-send together and queue again; up to 30 ms of
  per-request jitter does not break it. The published 301 ms says the measured run had no cluster, so it
  carried a desynchronising force the source does not state (output lengths that vary, client pacing).
* Splitwise: measured on a 2023 stack about 2x slower than vLLM 0.24 kernels; the twin models today's.
* H100 prediction vs H200 measurement at batch 1 for 70B TP4/TP8: 1.02 and 0.90 instead of the HBM
  ratio 1.43, because the measuring script's kernels stream weights far less efficiently than vLLM's.
* vidur Llama-2-7B at TP 1/4/8: between 256 and 1024 tokens the aiconfigurator GEMMs the twin uses are
  26-29% faster than vidur's profiles. vidur's rows hold nothing the twin omits: each is one linear
  layer without bias, timed alone (microsoft/vidur vidur/profiling/mlp/mlp_impl.py; record_function
  profiler by default). One relation per GEMM, vidur = 1.10 x aiconfigurator + 1.4 us, fitted on the 70B
  rows, predicts the 7B rows with a median error of 7% (the same as on the 70B rows; a test checks it).
  The fixed part (profiler and an older stack's kernel choice) weighs more on the 7B's small sharded
  GEMMs; the 70B sums stay within 25%.
"""

from __future__ import annotations

import csv
import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from disagg.perf.latency import load_latency_model
from disagg.twin.fidelity import (
    AICONFIG,
    CLOSED_LOOP,
    FRONT_END_LOAD_WHAT_IF,
    FRONT_END_WHAT_IF,
    MOE_POINTS,
    NIM_CONCURRENCY,
    NIM_SATURATED,
    NIM_SHORT_PROMPT,
    NIM_SINGLE,
    TOLERANCE,
    TRAIN,
    ClosedLoopPoint,
    MoeThroughputPoint,
    closed_loop_latency,
    implied_token_cost,
    is_train,
    moe_throughput_per_node,
    token_rates,
)
from disagg.twin.fidelity import rel_err as _rel_err
from disagg.twin.sim import PoolSpec, SimDeployment, first_round, run_mean

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "calibration"


# the twin's request overhead (calibrate.RUNTIME, 25 ms) was fitted on aiconfigurator's vLLM TP8 point
REQUEST_OVERHEAD_MISS = (
    "front end: the twin charges every request 25 ms before the engine queue (fitted on aiconfigurator's "
    "vLLM 1k@4 point); NIM's two single-request rows (500 and 5000 tokens in) differ by what the twin's "
    "prefill predicts, so the rest is a fixed cost: their intercept is 7.9 ms (disagg twin calibrate on "
    "NIM's table fits 8 ms); a profile fitted to the engine's own runs is the remedy, not a shipped constant"
)


def _label(p: ClosedLoopPoint) -> str:
    return f"{p.isl}in-{p.concurrency}flight"


@pytest.mark.parametrize("point", AICONFIG, ids=_label)
def test_aiconfigurator_tpot(point: ClosedLoopPoint) -> None:
    _, tpot = closed_loop_latency(point)
    assert _rel_err(tpot, point.tpot_s) <= TOLERANCE, (
        f"TPOT twin {tpot * 1e3:.1f} ms vs {point.tpot_s * 1e3} ms"
    )


@pytest.mark.parametrize("point", AICONFIG, ids=_label)
def test_aiconfigurator_ttft(point: ClosedLoopPoint) -> None:
    ttft, _ = closed_loop_latency(point)
    assert _rel_err(ttft, point.ttft_s) <= TOLERANCE, (
        f"TTFT twin {ttft * 1e3:.0f} ms vs {point.ttft_s * 1e3} ms"
    )


@pytest.mark.parametrize("point", AICONFIG, ids=_label)
def test_the_first_round_is_what_the_64_client_points_lacked(point: ClosedLoopPoint) -> None:
    """The clients' steady state alone misses the 64-in-flight TTFTs by more than the tolerance (93 / 715
    ms against 185 / 1150); counting the run's first round, sent together, brings both within 15%, and moves
    the 4-in-flight points by under 2% (their first round is 4 of 1000 requests)."""
    steady, _ = closed_loop_latency(replace(point, num_requests=None))
    whole, _ = closed_loop_latency(point)
    if point.concurrency == 64:
        assert steady < (1 - TOLERANCE) * point.ttft_s, steady
        assert _rel_err(whole, point.ttft_s) <= 0.15, whole
    else:
        assert _rel_err(whole, steady) <= 0.02, (whole, steady)


def test_the_assumed_request_count_is_load_bearing() -> None:
    """The source does not state its request count; 1000 is vllm bench serve's default. A run of 10 x C
    requests would weigh the first round 10% and send 8k@64 past the tolerance: the count is an assumption
    the fidelity table depends on, and bench/twin_fidelity.py prints the alternatives."""
    aic_8k_64 = next(p for p in AICONFIG if p.isl == 8192 and p.concurrency == 64)
    short, _ = closed_loop_latency(aic_8k_64, num_requests=10 * aic_8k_64.concurrency)
    assert short > (1 + TOLERANCE) * aic_8k_64.ttft_s, short


def test_run_mean_weighs_the_first_round_by_its_share_of_the_run() -> None:
    assert run_mean(1.0, 0.1, 64, 1000) == pytest.approx((64 * 1.0 + 936 * 0.1) / 1000)
    assert run_mean(1.0, 0.1, 8, 4) == 1.0  # a run shorter than one round is all first round
    with pytest.raises(ValueError, match="requests"):
        run_mean(1.0, 0.1, 8, 0)


def test_first_round_prompts_queue_for_the_token_budget() -> None:
    """64 prompts of 1024 tokens sent together to an idle TP8 replica: eight fit one 8192-token pass, so the
    first round's mean TTFT is several passes, far above one prompt's alone; its last prompt waits about
    eight passes."""
    aic_1k_64 = next(p for p in AICONFIG if p.isl == 1024 and p.concurrency == 64)
    dep = SimDeployment(model=aic_1k_64.model, dtype="fp8", mode="colocated", colocated=PoolSpec(1, 8))
    alone, _ = first_round(dep, 1, 1024, 1024)
    together, _ = first_round(dep, 64, 1024, 1024)
    assert together > 4 * alone, (alone, together)


@pytest.mark.parametrize(
    "point", [p for p in CLOSED_LOOP if p.concurrency in (4, 5)], ids=lambda p: f"{p.isl}in-{p.concurrency}"
)
def test_clients_starting_together_stay_locked_and_miss_the_low_concurrency_points(
    point: ClosedLoopPoint,
) -> None:
    """The hypothesis that benchmark clients (which all start at t=0) stay in lockstep waves: with fixed
    lengths the twin's cohorts do, and overshoot every 4-5 in flight point by more than 1.7x, while clients
    at random phases meet them; so the measured runs were not in lockstep at low concurrency."""
    locked, _ = closed_loop_latency(point, burst=True)
    spread, _ = closed_loop_latency(point)
    assert locked > 1.7 * point.ttft_s, locked
    assert _rel_err(spread, point.ttft_s) <= TOLERANCE, spread


def test_drift_noise_meets_8k_at_64_but_not_nim_so_it_is_not_adopted() -> None:
    """Re-drawn phases (1 s of drift per request) break the twin's collision-free schedule: 8k@64 comes
    within the tolerance, while NIM's 50-in-flight row overshoots by more than it; see the docstring."""
    aic_8k_64 = next(p for p in AICONFIG if p.isl == 8192 and p.concurrency == 64)
    noisy, _ = closed_loop_latency(aic_8k_64, jitter_s=1.0, seeds=(1, 2, 3, 4))
    assert _rel_err(noisy, aic_8k_64.ttft_s) <= TOLERANCE, noisy
    nim_50 = NIM_CONCURRENCY[2]
    noisy, _ = closed_loop_latency(nim_50, jitter_s=1.0, seeds=(1, 2, 3, 4))
    assert noisy > (1 + TOLERANCE) * nim_50.ttft_s, noisy


def test_front_end_growing_with_streams_fits_train_but_not_the_nim_checks() -> None:
    """fidelity.FRONT_END_WHAT_IF, fitted on TRAIN, meets both training TTFTs and 8k@64 (a check) but sends
    NIM's 50-in-flight row past the tolerance; see the docstring for why it is not in the profile."""
    for p in TRAIN:
        ttft, _ = closed_loop_latency(p, front_end=FRONT_END_WHAT_IF)
        assert _rel_err(ttft, p.ttft_s) <= 0.05, (p.label, ttft)
    aic_8k_64 = next(p for p in AICONFIG if p.isl == 8192 and p.concurrency == 64)
    ttft, _ = closed_loop_latency(aic_8k_64, front_end=FRONT_END_WHAT_IF)
    assert _rel_err(ttft, aic_8k_64.ttft_s) <= TOLERANCE, ttft
    ttft, _ = closed_loop_latency(NIM_CONCURRENCY[2], front_end=FRONT_END_WHAT_IF)
    assert ttft > (1 + TOLERANCE) * NIM_CONCURRENCY[2].ttft_s, ttft


def test_front_end_cpu_load_fits_train_but_moves_no_check_point() -> None:
    """fidelity.FRONT_END_LOAD_WHAT_IF (an API-server process whose CPU is shared by every prompt and output
    token, fitted on TRAIN: 22 ms stretched by 1 / (1 - 180 us x output tokens/s)) meets both training TTFTs,
    but its load term barely touches the checks: 8k@64 stays a miss and NIM@50 moves by under 3%, because
    their token rates (1.8k and 0.8k output tokens/s) are far below 1k@64's 4.1k/s."""
    for p in TRAIN:
        ttft, _ = closed_loop_latency(p, front_end_load=FRONT_END_LOAD_WHAT_IF)
        assert _rel_err(ttft, p.ttft_s) <= 0.05, (p.label, ttft)
    aic_8k_64 = next(p for p in AICONFIG if p.isl == 8192 and p.concurrency == 64)
    ttft, _ = closed_loop_latency(aic_8k_64, front_end_load=FRONT_END_LOAD_WHAT_IF)
    assert ttft < (1 - TOLERANCE) * aic_8k_64.ttft_s, ttft
    nim_50 = NIM_CONCURRENCY[2]
    with_load, _ = closed_loop_latency(nim_50, front_end_load=FRONT_END_LOAD_WHAT_IF)
    without, _ = closed_loop_latency(nim_50, front_end=(FRONT_END_LOAD_WHAT_IF[0], 0.0))
    assert _rel_err(with_load, without) <= 0.03, (with_load, without)


def test_ttft_residuals_are_not_ordered_by_front_end_load() -> None:
    """The hypothesis that the 64-client misses are the API server's CPU load predicts one CPU cost per token
    for every point. The cost each residual over 5% (published - twin, 25 ms request overhead) implies
    spans 192 us (1k@64, the highest load: 4.1k output tokens/s) to 3.4 ms per output token (NIM@5,
    0.2k/s), and 66-336 us per prompt token (thousands of times what a Rust tokenizer needs); and NIM@25,
    between them in load, has a negative residual. So the residuals do not grow with front-end load."""
    twin = {p: closed_loop_latency(p, seeds=(1, 2, 3, 4))[0] for p in CLOSED_LOOP}
    # the points the twin misses by more than 5% (1k@4's residual is 0.2 ms: it needs no front end)
    costs = {p: implied_token_cost(p, t, 0.025) for p, t in twin.items() if _rel_err(t, p.ttft_s) > 0.05}
    per_output = {p.label: c[1] for p, c in costs.items() if c[1] == c[1]}
    per_prompt = [c[0] for c in costs.values() if c[0] == c[0]]
    assert max(per_output.values()) > 10 * min(per_output.values()), per_output
    assert min(per_prompt) > 50e-6, per_prompt
    nim_25 = NIM_CONCURRENCY[1]
    assert twin[nim_25] > nim_25.ttft_s  # negative residual: no added front-end delay closes it
    loads = sorted(token_rates(p)[1] for p in CLOSED_LOOP if p.tp == 2)
    assert loads[0] < token_rates(nim_25)[1] < loads[-1]


def test_nim_rows_with_nims_own_front_end_cost() -> None:
    """What NIM_25_MISS says: with the per-request cost NIM's own single-request rows imply instead of
    vLLM's, the 25-in-flight row comes within 10% and the other rows stay within the tolerance."""
    front_end = (_nim_front_end_s(), 0.0)
    assert 0.005 < front_end[0] < 0.010, front_end
    nim_25 = NIM_CONCURRENCY[1]
    ttft, _ = closed_loop_latency(nim_25, front_end=front_end)
    assert _rel_err(ttft, nim_25.ttft_s) <= 0.10, ttft
    for p in (NIM_SINGLE, *NIM_CONCURRENCY):
        ttft, _ = closed_loop_latency(p, front_end=front_end)
        assert _rel_err(ttft, p.ttft_s) <= TOLERANCE, (p.label, ttft)


def test_nim_25_flips_with_the_request_overhead() -> None:
    """Why NIM@25 is phase-sensitive: with a constant request overhead of 22 ms its TTFT is ~630 ms (-8%),
    with 25 ms (the profile's) ~860 ms (+24%): whether the next client's prompt reaches the engine before
    or after the next step is planned decides which prompts lock together, so a what-if that lowers the
    overhead 'improves' this point whatever its other term does (fidelity.FRONT_END_LOAD_WHAT_IF's base)."""
    nim_25 = NIM_CONCURRENCY[1]
    low, _ = closed_loop_latency(nim_25, front_end=(0.022, 0.0))
    high, _ = closed_loop_latency(nim_25, front_end=(0.025, 0.0))
    assert _rel_err(low, nim_25.ttft_s) <= 0.10, low
    assert high > 1.2 * low, (low, high)


def test_training_split_is_the_1k_prompt_points() -> None:
    """The runtime knobs are fitted on TRAIN only (calibrate.RUNTIME's comment); everything else checks."""
    assert {(p.isl, p.concurrency, p.tp) for p in TRAIN} == {(1024, 4, 8), (1024, 64, 8)}
    assert all(is_train(p) == (p in AICONFIG and p.isl == 1024) for p in CLOSED_LOOP)


def _nim_front_end_s() -> float:
    """The fixed per-request cost NIM's own two single-request rows imply (500 and 5000 tokens in): the
    intercept of TTFT = fixed + prompt x per-token prefill, 7.9 ms."""
    per_token = (NIM_SINGLE.ttft_s - NIM_SHORT_PROMPT.ttft_s) / (NIM_SINGLE.isl - NIM_SHORT_PROMPT.isl)
    return NIM_SHORT_PROMPT.ttft_s - per_token * NIM_SHORT_PROMPT.isl


NIM_25_MISS = (
    "front end and client phase: +25% with the shipped 25 ms per request (vLLM's, fitted on aiconfigurator's "
    "1k@4 point); with NIM's own 7.9 ms (the intercept of its single-request rows) -8%: whether the next "
    "client's prompt reaches the engine before or after the next pass is planned decides which prompts lock "
    "together (test_nim_25_flips_with_the_request_overhead)"
)


@pytest.mark.parametrize(
    "point",
    [
        pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=NIM_25_MISS))
        if p.concurrency == 25
        else p
        for p in NIM_CONCURRENCY
    ],
    ids=lambda p: f"{p.concurrency}flight",
)
def test_nim_llama33_70b_fp8_tp2_under_concurrency_with_fp8_kv(point: ClosedLoopPoint) -> None:
    """NIM's table does not name its KV-cache dtype. With an FP8 KV cache (460k tokens on 2 x H100) the
    twin meets every row, including the saturated one at 100 in flight (83 of 100 prompts fit, the rest
    queue); with BF16 KV (230k tokens) only 41 fit and the 50/100 rows' TTFT is 6 s / 47 s."""
    ttft, itl = closed_loop_latency(point)
    assert _rel_err(ttft, point.ttft_s) <= TOLERANCE, f"TTFT {ttft * 1e3:.0f} vs {point.ttft_s * 1e3:.0f} ms"
    assert _rel_err(itl, point.tpot_s) <= TOLERANCE, f"ITL {itl * 1e3:.1f} vs {point.tpot_s * 1e3:.1f} ms"


def test_nim_fp8_kv_is_what_the_50_in_flight_row_needs() -> None:
    """With BF16 KV the 50-in-flight row is KV-capacity-bound in the twin: prompts queue for seconds."""
    ttft, _ = closed_loop_latency(NIM_CONCURRENCY[2], kv_dtype="bf16")
    assert ttft > 3 * NIM_CONCURRENCY[2].ttft_s


def test_nim_llama33_70b_fp8_tp2_single_request() -> None:
    ttft, itl = closed_loop_latency(NIM_SINGLE)
    assert _rel_err(ttft, NIM_SINGLE.ttft_s) <= TOLERANCE, f"TTFT {ttft * 1e3:.0f} ms vs 407 ms"
    assert _rel_err(itl, NIM_SINGLE.tpot_s) <= TOLERANCE, f"ITL {itl * 1e3:.1f} ms vs 18.6 ms"


def _vidur_h100_linear(model: str = "Llama-2-70b-hf") -> dict[tuple[int, int], float]:
    """vidur/h100_<model>_mlp.csv: per-layer qkv+o+up+down medians (ms) by (tp, num_tokens)."""
    path = SHARED / "vidur" / f"h100_{model}_mlp.csv"
    if not path.is_file():
        pytest.skip(f"{path} not present")
    ops = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
    out: dict[tuple[int, int], float] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            key = (int(row["num_tensor_parallel_workers"]), int(row["num_tokens"]))
            out[key] = sum(float(row[f"time_stats.{op}.median"]) for op in ops)
    return out


@pytest.fixture(scope="module")
def h100_bf16_gemm() -> object:
    from disagg.twin.calibrate import GemmTable, _read_parquet

    gemm_path = SHARED / "aiconfigurator" / "h100_sxm" / "gemm_vllm_0.24.0_gemm_perf.parquet"
    if not gemm_path.is_file():
        pytest.skip(f"{gemm_path} not present")
    return GemmTable(r for r in _read_parquet(gemm_path) if r["gemm_dtype"] == "bfloat16")


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_linear_layers_match_vidur_h100_profiles(tp: int, h100_bf16_gemm: object) -> None:
    from disagg.twin.calibrate import GemmTable, linear_layers_ms, load_archs

    vidur = _vidur_h100_linear()
    assert isinstance(h100_bf16_gemm, GemmTable)
    gemm = h100_bf16_gemm
    arch = load_archs()["llama-3.1-70b"]
    errors = {}
    for tokens in (1, 16, 64, 256, 1024, 4096):
        twin = linear_layers_ms(gemm, arch, tp, tokens)
        errors[tokens] = _rel_err(twin, vidur[(tp, tokens)])
    assert max(errors.values()) <= TOLERANCE, errors


SPLITWISE_STACK = (
    "Splitwise measured a 2023 software stack ~2x slower than the vLLM 0.24 kernels the twin uses"
)


@pytest.mark.xfail(strict=True, reason=SPLITWISE_STACK)
@pytest.mark.parametrize(("prompt", "published_s"), [(1024, 0.078), (8192, 0.845)])
def test_splitwise_prompt_time(prompt: int, published_s: float) -> None:
    m = load_latency_model("llama-3.1-70b", "h100", 8, "bf16")
    assert _rel_err(m.prefill_time_s([prompt]), published_s) <= TOLERANCE


VIDUR_7B_MISS = (
    "vidur's per-GEMM times sit ~10% + ~1.6 us above aiconfigurator's for 7B and 70B shapes alike (see the "
    "next test); the fixed part weighs more on the 7B's small TP-sharded GEMMs, so their sum is 26-29% "
    "above the twin's at 256-1024 tokens"
)


@pytest.mark.parametrize(
    "tp",
    [
        pytest.param(tp, marks=pytest.mark.xfail(strict=True, reason=VIDUR_7B_MISS)) if tp != 2 else tp
        for tp in (1, 2, 4, 8)
    ],
)
def test_linear_layers_match_vidur_h100_llama2_7b(tp: int, h100_bf16_gemm: object) -> None:
    from disagg.twin.calibrate import Arch, linear_layers_ms

    vidur = _vidur_h100_linear("Llama-2-7b-hf")
    # Llama-2-7B config.json: 32 layers, hidden 4096, intermediate 11008, 32 heads (no GQA), head_dim 128.
    arch = Arch("llama-2-7b", 32, 4096, 11008, 32, 32, 128, 32000, 6.7)
    errors = {
        n: _rel_err(linear_layers_ms(h100_bf16_gemm, arch, tp, n), vidur[(tp, n)])  # type: ignore[arg-type]
        for n in (1, 16, 64, 256, 1024, 4096)
    }
    assert max(errors.values()) <= TOLERANCE, errors


# --- H200: measured forward passes (bench/gpu/results/h200-2026-11-30) ------------------------------------
H200_CONFIGS = [("llama-3.1-8b", 1), ("llama-3.1-70b", 4), ("llama-3.1-70b", 8)]
# source: NVIDIA H100 SXM (3.35 TB/s) and H200 (4.8 TB/s) datasheets, as in profiles/gpus.yaml.
HBM_RATIO_H200_H100 = 4.8 / 3.35


def _h200_rows(model: str, tp: int) -> list:  # type: ignore[type-arg]
    from disagg.twin.calibrate import DEFAULT_H200_CSV, read_forward_csv

    return [r for r in read_forward_csv(DEFAULT_H200_CSV) if r.model == model and r.tp == tp]


def _shard_prediction_ms(model: object, row: object) -> float:
    from disagg.perf.latency import LatencyModel
    from disagg.twin.calibrate import ForwardRow

    assert isinstance(model, LatencyModel) and isinstance(row, ForwardRow)
    if row.phase == "prefill":
        return 1e3 * model.shard_forward_time_s(row.tokens, float(row.tokens**2))
    return 1e3 * model.shard_forward_time_s(row.batch, 0.0, row.batch * row.context)


@pytest.mark.parametrize(("model", "tp"), H200_CONFIGS)
def test_h200_profile_predicts_held_out_measurements(model: str, tp: int) -> None:
    """Fit on H200_FIT's rows (decode contexts 512/8192, prompts 1k/4k/16k), check every other row.

    Eager-mode prefill of short prompts is launch-bound on the measuring machine (vLLM runs CUDA graphs), so
    those rows are left out on purpose: calibrate.launch_bound() names them."""
    from disagg.twin.calibrate import H200_FIT, launch_bound

    rows = _h200_rows(model, tp)
    bound = launch_bound(rows)
    held_out = [
        r
        for r in rows
        if (r.phase == "decode" and r.context not in H200_FIT.decode_contexts)
        or (r.phase == "prefill" and r.tokens not in H200_FIT.prefill_tokens and r.tokens not in bound)
    ]
    assert len(held_out) >= 7, held_out
    m = load_latency_model(model, "h200", tp)
    errors = {
        (r.phase, r.batch, r.tokens, r.context): _rel_err(_shard_prediction_ms(m, r), r.ms) for r in held_out
    }
    assert max(errors.values()) <= TOLERANCE, errors


@pytest.mark.parametrize(("model", "tp"), H200_CONFIGS)
def test_h100_prediction_vs_h200_measurement_kv_bound_decode(model: str, tp: int) -> None:
    """Cross-GPU: where decode reads mostly KV (B*C >= 1M tokens), the twin's H100 step over the measured
    H200 step is about the HBM bandwidth ratio 4.8/3.35 = 1.43 (measured 1.35-1.74)."""
    h100 = load_latency_model(model, "h100", tp)
    rows = [r for r in _h200_rows(model, tp) if r.phase == "decode" and r.batch * r.context >= 2**20]
    assert rows
    ratios = {(r.batch, r.context): _shard_prediction_ms(h100, r) / r.ms for r in rows}
    assert all(_rel_err(x, HBM_RATIO_H200_H100) <= TOLERANCE for x in ratios.values()), ratios


WEIGHT_BOUND_MISS = (
    "at batch 1 the measured PyTorch forward streams the weights at ~53% of the H200's HBM peak (14 GB in "
    "5.5 ms for Llama-3.1-8B) while vLLM's GEMMs in aiconfigurator's H100 tables reach ~83% of the H100's; "
    "70B TP8 streams 17 GB in 10.4 ms (~34%), likely the gaps between the script's ~2000 small kernels a "
    "step; so the H100/H200 ratio is 1.02 (TP4) and 0.90 (TP8), not 1.43: a kernel difference, not a GPU one"
)


@pytest.mark.parametrize(
    ("model", "tp"),
    [
        pytest.param(m, tp, marks=pytest.mark.xfail(strict=True, reason=WEIGHT_BOUND_MISS))
        if tp > 1
        else (m, tp)
        for m, tp in H200_CONFIGS
    ],
)
def test_h100_prediction_vs_h200_measurement_weight_bound_decode(model: str, tp: int) -> None:
    """Cross-GPU at batch 1 (weight reads dominate): the HBM ratio would predict 1.43; measured 1.08-1.10 for
    Llama-3.1-8B TP1 (inside the tolerance), 1.02 and 0.90 for 70B TP4/TP8 (xfail, see the reason)."""
    h100 = load_latency_model(model, "h100", tp)
    rows = [r for r in _h200_rows(model, tp) if r.phase == "decode" and r.batch == 1]
    ratios = {r.context: _shard_prediction_ms(h100, r) / r.ms for r in rows}
    assert all(_rel_err(x, HBM_RATIO_H200_H100) <= TOLERANCE for x in ratios.values()), ratios


def _gemm_pairs(gemm: object, model: str) -> tuple[np.ndarray, np.ndarray]:
    """(aiconfigurator ms, vidur ms) for each linear layer, TP degree and token count >= 64 of a model."""
    from disagg.twin.calibrate import GemmTable

    assert isinstance(gemm, GemmTable)
    # config.json of meta-llama/Llama-2-7b-hf and -70b-hf: hidden, intermediate, heads, kv heads.
    hidden, inter, heads, kv = {
        "Llama-2-7b-hf": (4096, 11008, 32, 32),
        "Llama-2-70b-hf": (8192, 28672, 64, 8),
    }[model]
    ops = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
    path = SHARED / "vidur" / f"h100_{model}_mlp.csv"
    if not path.is_file():
        pytest.skip(f"{path} not present")
    aic: list[float] = []
    vid: list[float] = []
    with path.open() as f:
        for row in csv.DictReader(f):
            tp, m = int(row["num_tensor_parallel_workers"]), int(row["num_tokens"])
            if m < 64 or m not in (64, 128, 256, 512, 1024, 2048, 4096):
                continue
            shapes = [
                ((heads + 2 * kv) * 128 // tp, hidden),
                (hidden, heads * 128 // tp),
                (2 * inter // tp, hidden),
                (hidden, inter // tp),
            ]
            for (n, k), op in zip(shapes, ops, strict=True):
                aic.append(gemm.latency(m, n, k))
                vid.append(float(row[f"time_stats.{op}.median"]))
    return np.array(aic), np.array(vid)


def test_vidur_offset_fitted_on_70b_explains_the_7b_rows(h100_bf16_gemm: object) -> None:
    """Why the 7B rows miss: vidur = s * aiconfigurator + o per GEMM, fitted on the 70B rows (s ~1.10,
    o ~1.4 us), predicts the 7B rows with a median error under 10%: nothing is missing from the 7B shapes;
    a per-kernel offset between the two profilers matters more for smaller GEMMs."""
    x70, y70 = _gemm_pairs(h100_bf16_gemm, "Llama-2-70b-hf")
    design = np.stack([x70, np.ones_like(x70)], axis=1) / y70[:, None]
    (scale, offset), *_ = np.linalg.lstsq(design, np.ones_like(y70), rcond=None)
    assert 1.0 < scale < 1.25 and 0.0 < offset < 0.005, (scale, offset)
    x7, y7 = _gemm_pairs(h100_bf16_gemm, "Llama-2-7b-hf")
    assert float(np.median(np.abs(scale * x7 + offset - y7) / y7)) <= 0.10
    # the plain comparison is worse for the 7B rows than for the 70B rows
    assert np.median((y7 - x7) / y7) > np.median((y70 - x70) / y70)


# MoE wide-EP P/D (twin/fidelity.py MOE_POINTS, each with its source): per-node throughput of the twin's
# steady-state steps against the published figure. Held out: nothing in moe_coefficients.yaml is fitted to
# them (kernel tables only); known misses are strict xfails with their cause.
@pytest.mark.parametrize(
    "point",
    [
        pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=p.known_miss)) if p.known_miss else p
        for p in MOE_POINTS
    ],
    ids=lambda p: p.label,
)
def test_moe_wide_ep_throughput_per_node(point: MoeThroughputPoint) -> None:
    twin, _ = moe_throughput_per_node(point)
    assert _rel_err(twin, point.published) <= TOLERANCE


@pytest.mark.parametrize("point", NIM_SATURATED, ids=lambda p: f"{p.concurrency}flight")
def test_nim_past_saturation_waits_as_the_replicas_capacity_says(point: ClosedLoopPoint) -> None:
    """150-250 clients on a replica whose KV cache holds ~85 of these requests (FP8 KV): the rest wait, so
    TTFT is set by the saturated throughput (the KV capacity the twin gives the replica and its step time);
    checks, nothing fitted to them."""
    ttft, itl = closed_loop_latency(point, seeds=(1, 2))
    assert _rel_err(ttft, point.ttft_s) <= TOLERANCE, f"TTFT {ttft:.1f} vs {point.ttft_s:.1f} s"
    assert _rel_err(itl, point.tpot_s) <= TOLERANCE, f"ITL {itl * 1e3:.1f} vs {point.tpot_s * 1e3:.1f} ms"


def test_nim_saturated_waits_grow_with_each_client_as_published() -> None:
    """Past saturation each further client adds one request's share of the saturated throughput to
    everyone's wait: published 26.9 s per 50 clients (150 -> 200 -> 250); the twin's slope within 25%."""
    ttfts = [closed_loop_latency(p, seeds=(1,))[0] for p in NIM_SATURATED]
    published = [p.ttft_s for p in NIM_SATURATED]
    for (a, b), (ra, rb) in zip(itertools.pairwise(ttfts), itertools.pairwise(published), strict=True):
        assert _rel_err(b - a, rb - ra) <= TOLERANCE, (b - a, rb - ra)


@pytest.mark.xfail(strict=True, reason=REQUEST_OVERHEAD_MISS)
def test_nim_short_prompt_single_request_ttft() -> None:
    ttft, _ = closed_loop_latency(NIM_SHORT_PROMPT)
    assert _rel_err(ttft, NIM_SHORT_PROMPT.ttft_s) <= TOLERANCE, f"TTFT {ttft * 1e3:.0f} vs 47.8 ms"


def test_nim_short_prompt_misses_only_by_the_fixed_request_cost() -> None:
    """What the xfail above says: the twin's ITL at 500 in / 2000 out is right, and the TTFT difference
    between NIM's 500- and 5000-token single-request rows (the prefill of 4500 more tokens) is within 5%
    of the twin's; the miss is the fixed per-request cost, which the difference cancels."""
    short_ttft, short_itl = closed_loop_latency(NIM_SHORT_PROMPT)
    long_ttft, _ = closed_loop_latency(replace(NIM_SINGLE, kv_dtype=NIM_SHORT_PROMPT.kv_dtype))
    assert _rel_err(short_itl, NIM_SHORT_PROMPT.tpot_s) <= 0.05
    published = NIM_SINGLE.ttft_s - NIM_SHORT_PROMPT.ttft_s
    assert _rel_err(long_ttft - short_ttft, published) <= 0.05, (long_ttft - short_ttft, published)
    # and the fixed cost the two rows imply is well under the twin's 25 ms
    per_token = published / (NIM_SINGLE.isl - NIM_SHORT_PROMPT.isl)
    fixed = NIM_SHORT_PROMPT.ttft_s - per_token * NIM_SHORT_PROMPT.isl
    assert 0.0 < fixed < 0.015, fixed

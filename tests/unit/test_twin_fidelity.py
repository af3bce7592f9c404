"""Fidelity table: the twin's predictions against published measurements, each within 25%.

Points (../shared/README.md and the calibration files):

* aiconfigurator, Llama-3.1-70B FP8, vLLM, H100 TP8, colocated, 1024 or 8192 in / 1024 out at 4 and 64
  requests in flight: TTFT and TPOT. Simulated as a closed loop (each client sends its next request when
  the previous one finished, first requests at seeded random times within one request's duration) and
  measured after a warm-up third.
* NVIDIA NIM, Llama-3.3-70B FP8 TP2 on 2xH100, 5000 in / 500 out, 1 in flight: TTFT 407 ms, ITL 18.6 ms.
* vidur (independent H100 profiling): per-layer linear-layer times of Llama-2-70B (same shapes as
  Llama-3.1-70B) against token count and TP, compared with the twin's GEMM interpolation of aiconfigurator.
* Splitwise, Llama2-70B H100 TP8 (2023 software stack): prompt 1k 78 ms, 8k 845 ms, token ~30 ms.

Calibration, not prediction: the per-step overhead is set from the NIM ITL and the per-request front-end
overhead from the 1k/4-in-flight TTFT (see disagg.twin.calibrate.RUNTIME); those two rows check the
calibration. Known misses are strict xfails with the reason, so the table stays honest:

* TTFT at 64 in flight (aiconfigurator): the twin's colocated engine admits a new prompt into the next
  mixed step, so at these loads (prefill busy 15-50% of the time) it predicts little queueing; the
  published values imply 2-4 step-times of extra wait that the twin does not model.
* Splitwise: measured on a 2023 stack about 2x slower than vLLM 0.24 kernels; the twin models today's.
* vidur Llama-2-7B at TP 1/4/8: between 256 and 1024 tokens the aiconfigurator GEMMs the twin uses are
  26-29% faster than vidur's profiles (different library versions); the 70B shapes agree within 25%.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from disagg.twin.latency import load_latency_model
from disagg.twin.sim import ClosedLoop, PoolSpec, SimDeployment, simulate

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "calibration"
TOLERANCE = 0.25


@dataclass(frozen=True)
class ClosedLoopPoint:
    isl: int
    concurrency: int
    ttft_s: float
    tpot_s: float


def closed_loop(model: str, tp: int, dtype: str, conc: int, isl: int, osl: int, tpot_guess: float) -> tuple:
    dep = SimDeployment(model=model, dtype=dtype, mode="colocated", colocated=PoolSpec(1, tp))
    total = max(3, conc * 8)
    res = simulate(dep, [], closed_loop=ClosedLoop(conc, isl, osl, total, osl * tpot_guess, True), seed=1)
    k = total // 3
    return float(np.nanmean(res.ttft[k:])), float(np.nanmean(res.itl_mean[k:]))


# aiconfigurator measurements quoted in ../shared/README.md (Llama-3.1-70B FP8, vLLM, H100 TP8, 1024 out).
AICONFIG = [
    ClosedLoopPoint(1024, 4, 0.070, 0.0091),
    ClosedLoopPoint(1024, 64, 0.185, 0.0155),
    ClosedLoopPoint(8192, 4, 0.301, 0.0102),
    ClosedLoopPoint(8192, 64, 1.150, 0.0345),
]
QUEUEING_MISS = "twin predicts too little prefill queueing at 64 in flight (see module docstring)"


def _rel_err(pred: float, pub: float) -> float:
    return abs(pred - pub) / pub


@pytest.mark.parametrize("point", AICONFIG, ids=lambda p: f"{p.isl}in-{p.concurrency}flight")
def test_aiconfigurator_tpot(point: ClosedLoopPoint) -> None:
    _, tpot = closed_loop("llama-3.1-70b", 8, "fp8", point.concurrency, point.isl, 1024, point.tpot_s)
    assert _rel_err(tpot, point.tpot_s) <= TOLERANCE, (
        f"TPOT twin {tpot * 1e3:.1f} ms vs {point.tpot_s * 1e3} ms"
    )


@pytest.mark.parametrize(
    "point",
    [
        pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=QUEUEING_MISS))
        if p.concurrency == 64
        else p
        for p in AICONFIG
    ],
    ids=lambda p: f"{p.isl}in-{p.concurrency}flight",
)
def test_aiconfigurator_ttft(point: ClosedLoopPoint) -> None:
    ttft, _ = closed_loop("llama-3.1-70b", 8, "fp8", point.concurrency, point.isl, 1024, point.tpot_s)
    assert _rel_err(ttft, point.ttft_s) <= TOLERANCE, (
        f"TTFT twin {ttft * 1e3:.0f} ms vs {point.ttft_s * 1e3} ms"
    )


def test_nim_llama33_70b_fp8_tp2_single_request() -> None:
    ttft, itl = closed_loop("meta-llama/Llama-3.3-70B-Instruct", 2, "fp8", 1, 5000, 500, 0.0186)
    assert _rel_err(ttft, 0.407) <= TOLERANCE, f"TTFT {ttft * 1e3:.0f} ms vs 407 ms"
    assert _rel_err(itl, 0.0186) <= TOLERANCE, f"ITL {itl * 1e3:.1f} ms vs 18.6 ms"


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
    "at 256-1024 tokens vLLM 0.24's GEMMs (aiconfigurator) run up to 29% faster than vidur's profiles"
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
    arch = Arch(32, 4096, 11008, 32, 32, 128, 32000, 6.7)
    errors = {
        n: _rel_err(linear_layers_ms(h100_bf16_gemm, arch, tp, n), vidur[(tp, n)])  # type: ignore[arg-type]
        for n in (1, 16, 64, 256, 1024, 4096)
    }
    assert max(errors.values()) <= TOLERANCE, errors

"""Derive the twin's latency coefficients from published measurements and write
disagg/perf/profiles/coefficients.yaml.

Run ``python -m disagg.twin.calibrate [--calibration ../shared/calibration]``; the output is reproducible
from the inputs. Sources (all under ``../shared/calibration``):

* H100 (vLLM 0.24 kernels, ai-dynamo/aiconfigurator, Apache-2.0), times in ms:
  - ``aiconfigurator/h100_sxm/gemm_vllm_0.24.0_gemm_perf.parquet`` columns ``gemm_dtype, m, n, k, latency``
    (``bfloat16`` from torch linear, ``fp8`` from CutlassFP8ScaledMMLinearKernel, vLLM's per-tensor FP8
    path). The per-layer linear layers (qkv, o, gate_up, down, sharded by TP) are bilinearly interpolated
    in (n, k) at each token count m of the grid; lm_head is extrapolated linearly in n beyond 65536.
  - ``attention_vllm_0.24.0_context_attention_perf.parquet`` columns ``batch_size, isl, num_heads,
    num_key_value_heads, head_dim, kv_cache_dtype, window_size, latency``: per layer, fitted as
    ``a + c * batch_size * isl**2`` on the rows with the model's per-GPU head counts, window 0, bf16 KV.
  - ``attention_vllm_0.24.0_generation_attention_perf.parquet`` columns ``batch_size, step`` (= context
    length), heads, ``latency``: per layer, fitted as ``a + g * batch_size * step``.
  - ``comm_vllm_0.24.0_custom_allreduce_perf.parquet`` columns ``num_gpus, message_size`` (elements, bf16),
    ``latency`` for ``backend == vllm_graph``: two all-reduces of ``m * hidden`` elements per layer.
* A100: ``vidur/a100_Meta-Llama-3-{8B,70B}_mlp.csv`` (microsoft/vidur, MIT), per-operator medians in ms
  (``time_stats.{input_layernorm,attn_pre_proj,attn_rope,attn_post_proj,post_attention_layernorm,
  mlp_up_proj,mlp_act,mlp_down_proj,add}.median``) against ``num_tokens`` and
  ``num_tensor_parallel_workers``. Attention, all-reduce and lm_head have no A100 table here, so they are
  the H100 fits scaled by datasheet ratios (attention prefill by BF16 TFLOPS, decode by HBM bandwidth,
  all-reduce by NVLink bandwidth) and are marked as such.
* L40S: the H100 coefficients scaled by datasheet ratios (see profiles/gpus.yaml), clearly marked.
* H200: measured whole forward passes of one TP shard (bench/gpu/results/h200-2026-11-30/llama_forward.csv,
  written by bench/gpu/measure_llama_forward.py on a lent NVIDIA H200: torch 2.11, bf16, random weights,
  CUDA graphs for decode, eager prefill, no all-reduce). Decode rows ``(B, C)`` are fitted as
  ``I_B + g * B * C`` (one intercept per batch, one attention slope); prefill rows as
  ``a + b * L + c * L**2`` with ``c`` the H100 prefill-attention fit (the H200 has the H100's compute). Eager
  prefill of short prompts is bound by Python kernel launches (~10 ms for 32 layers, ~28 ms for 80), not by
  the GPU, so prefill rows under 1.5x the configuration's shortest-prompt time are excluded; vLLM captures
  CUDA graphs and does not pay that floor. Only the rows in ``H200_FIT`` are used; the rest are held out
  for tests/unit/test_twin_fidelity.py. All-reduce comes from the H100 custom all-reduce table (same
  NVLink 900 GB/s); lm_head from the H100 GEMM scaled by HBM bandwidth below 64 tokens. The measured
  forward already contains norms, rope and activations, so these entries carry ``overhead_factor: 1.0``.

The kernel sums omit norms, rope, activations, sampling and CPU overhead; measured end-to-end step times
run about 20-30% above them (../shared/README.md, aiconfigurator section), which the runtime section of
the output models as ``overhead_factor`` times the sum plus a fixed per-step overhead.
"""

from __future__ import annotations

import argparse
import bisect
import csv
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from disagg.perf.latency import PROFILES_DIR, load_model_config
from disagg.perf.latency import ModelConfig as Arch

DEFAULT_CALIBRATION = Path(__file__).resolve().parents[3] / ".." / "shared" / "calibration"
DEFAULT_H200_CSV = (
    Path(__file__).resolve().parents[3]
    / "bench"
    / "gpu"
    / "results"
    / "h200-2026-11-30"
    / "llama_forward.csv"
)
M_GRID: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
TPS: tuple[int, ...] = (1, 2, 4, 8)
VIDUR_LAYER_OPS: tuple[str, ...] = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
# Runtime overhead above the kernel sums. overhead_factor: ../shared/README.md ("measured end-to-end times
# run roughly 20-30% above such sums"; 1.1 because the GEMM tables already include launch gaps);
# step_overhead_ms: per-step scheduler/sampling/launch cost of vLLM's engine, least squares on the relative
# TPOT errors of the training points (disagg.twin.fidelity.TRAIN: aiconfigurator's 1024-token closed loops
# at 4 and 64 in flight, Llama-3.1-70B FP8 TP8: +5% / -7% at 1.4 ms; the earlier 2.0 ms was set on NIM's
# single-request ITL and put every low-concurrency TPOT ~10% high); request_overhead_ms: per-request
# front-end cost before the engine queue (HTTP, tokenisation, detokenisation/streaming of the first token),
# set so the 1024-token TTFT at 4 in flight (70 ms) is met. Every other published point is a check
# (tests/unit/test_twin_fidelity.py, bench/twin_fidelity.py). activation_reserve_gib:
# assumption (vLLM's profiling run leaves a few GiB for activations and CUDA graphs);
# gpu_memory_utilization: vLLM's default 0.9 (--gpu-memory-utilization).
RUNTIME: dict[str, float] = {
    "overhead_factor": 1.1,
    "step_overhead_ms": 1.4,
    "request_overhead_ms": 25.0,
    "activation_reserve_gib": 4.0,
    "gpu_memory_utilization": 0.9,
}


@dataclass(frozen=True)
class H200Split:
    """Which measured H200 rows calibrate the profile; the others are held out for the fidelity test."""

    decode_contexts: tuple[int, ...] = (512, 8192)
    prefill_tokens: tuple[int, ...] = (1024, 4096, 16384)
    launch_bound_ratio: float = 1.5  # prefill rows under this x the shortest prompt's time are launch-bound


H200_FIT = H200Split()


@dataclass(frozen=True)
class ForwardRow:
    """One row of measure_llama_forward.py's CSV (ms for one forward pass of one TP shard)."""

    model: str
    tp: int
    phase: str
    batch: int
    tokens: int
    context: int
    ms: float


class GemmTable:
    """Bilinear interpolation of measured GEMM latency (ms) in (n, k) at a grid value of m."""

    def __init__(self, rows: Iterable[dict[str, Any]]) -> None:
        self._lat: dict[tuple[int, int, int], float] = {}
        ns: set[int] = set()
        ks: set[int] = set()
        for r in rows:
            self._lat[(r["m"], r["n"], r["k"])] = float(r["latency"])
            ns.add(r["n"])
            ks.add(r["k"])
        self._ns = sorted(ns)
        self._ks = sorted(ks)

    @staticmethod
    def _bracket(grid: list[int], x: int) -> tuple[int, int, float, float]:
        """Grid points around x and the extrapolation scale when x is beyond the grid."""
        if x >= grid[-1]:
            return grid[-1], grid[-1], 0.0, x / grid[-1]
        if x <= grid[0]:
            return grid[0], grid[0], 0.0, 1.0
        i = bisect.bisect_left(grid, x)
        lo, hi = grid[i - 1], grid[i]
        if hi == x:
            return hi, hi, 0.0, 1.0
        return lo, hi, (x - lo) / (hi - lo), 1.0

    def latency(self, m: int, n: int, k: int) -> float:
        n0, n1, fn, sn = self._bracket(self._ns, n)
        k0, k1, fk, sk = self._bracket(self._ks, k)

        def at(nn: int, kk: int) -> float:
            return self._lat[(m, nn, kk)]

        low = at(n0, k0) * (1 - fk) + at(n0, k1) * fk
        high = at(n1, k0) * (1 - fk) + at(n1, k1) * fk
        return (low * (1 - fn) + high * fn) * sn * sk


def load_archs() -> dict[str, Arch]:
    """Every model in profiles/models.yaml, as the latency model reads it."""
    data = yaml.safe_load((PROFILES_DIR / "models.yaml").read_text())["models"]
    return {name: load_model_config(name) for name in data}


def load_gpus() -> dict[str, dict[str, Any]]:
    gpus: dict[str, dict[str, Any]] = yaml.safe_load((PROFILES_DIR / "gpus.yaml").read_text())["gpus"]
    return gpus


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    return rows


def linear_layers_ms(gemm: GemmTable, a: Arch, tp: int, m: int) -> float:
    """One transformer layer's linear layers on one GPU for m tokens (ms)."""
    qkv = gemm.latency(m, (a.heads + 2 * a.kv_heads) * a.head_dim // tp, a.hidden)
    out = gemm.latency(m, a.hidden, a.heads * a.head_dim // tp)
    gate_up = gemm.latency(m, 2 * a.intermediate // tp, a.hidden)
    down = gemm.latency(m, a.hidden, a.intermediate // tp)
    return qkv + out + gate_up + down


class AllReduceTable:
    def __init__(self, rows: Iterable[dict[str, Any]]) -> None:
        by_gpus: dict[int, list[tuple[int, float]]] = defaultdict(list)
        for r in rows:
            if r["backend"] == "vllm_graph":
                by_gpus[r["num_gpus"]].append((r["message_size"], float(r["latency"])))
        self._tables = {g: sorted(v) for g, v in by_gpus.items()}

    def latency(self, tp: int, elements: int) -> float:
        if tp == 1:
            return 0.0
        sizes, lats = zip(*self._tables[tp], strict=True)
        if elements >= sizes[-1]:
            return float(lats[-1] * elements / sizes[-1])
        return float(np.interp(np.log(elements), np.log(sizes), lats))


def fit_context_attention(
    rows: list[dict[str, Any]], heads: int, kv_heads: int, hd: int, kv_dtype: str = "bfloat16"
) -> tuple[float, float]:
    """Per-layer prefill attention: latency_ms = a + c * batch * isl^2 (relative least squares)."""
    pts = [
        (r["batch_size"] * r["isl"] ** 2, r["latency"])
        for r in rows
        if (r["num_heads"], r["num_key_value_heads"], r["head_dim"]) == (heads, kv_heads, hd)
        and r["window_size"] == 0
        and r["kv_cache_dtype"] == kv_dtype
    ]
    return _fit_affine(pts)


def fit_generation_attention(
    rows: list[dict[str, Any]], heads: int, kv_heads: int, hd: int, kv_dtype: str = "bfloat16"
) -> tuple[float, float]:
    """Per-layer decode attention: latency_ms = a + g * batch * context (relative least squares)."""
    pts = [
        (r["batch_size"] * r["step"], r["latency"])
        for r in rows
        if (r["num_heads"], r["num_key_value_heads"], r["head_dim"]) == (heads, kv_heads, hd)
        and r["window_size"] == 0
        and r["kv_cache_dtype"] == kv_dtype
    ]
    return _fit_affine(pts)


def _fit_affine(pts: list[tuple[float, float]]) -> tuple[float, float]:
    if not pts:
        raise ValueError("no calibration rows match this attention shape")
    x = np.array([p[0] for p in pts], dtype=float)
    y = np.array([p[1] for p in pts], dtype=float)
    w = 1.0 / y  # relative error
    design = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    coef, *_ = np.linalg.lstsq(design, y * w, rcond=None)
    return max(float(coef[0]), 0.0), max(float(coef[1]), 0.0)


def vidur_linear_ms(path: Path, tp: int) -> dict[int, float]:
    """Per-layer sum of vidur's per-operator medians (ms) by num_tokens for one TP degree."""
    out: dict[int, float] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            if int(row["num_tensor_parallel_workers"]) != tp:
                continue
            n = int(row["num_tokens"])
            out[n] = sum(float(row[f"time_stats.{op}.median"]) for op in VIDUR_LAYER_OPS)
    return out


def _interp_tokens(table: dict[int, float], m: int) -> float:
    xs = sorted(table)
    ys = [table[x] for x in xs]
    if m > xs[-1]:
        return ys[-1] * m / xs[-1]
    return float(np.interp(m, xs, ys))


def weights_fit(a: Arch, gpu: dict[str, Any], tp: int, dtype: str) -> bool:
    bytes_per_param = 1 if dtype == "fp8" else 2
    per_gpu_gib = a.params_b * 1e9 * bytes_per_param / tp / 2**30
    usable = gpu["memory_gib"] * RUNTIME["gpu_memory_utilization"] - RUNTIME["activation_reserve_gib"]
    return bool(per_gpu_gib < usable * 0.85)


def h100_entry(cal: Path, a: Arch, tp: int, dtype: str, cache: dict[str, Any]) -> dict[str, Any]:
    base = cal / "aiconfigurator" / "h100_sxm"
    if "gemm" not in cache:
        rows = _read_parquet(base / "gemm_vllm_0.24.0_gemm_perf.parquet")
        cache["gemm"] = {d: GemmTable(r for r in rows if r["gemm_dtype"] == d) for d in ("bfloat16", "fp8")}
        cache["ctx"] = _read_parquet(base / "attention_vllm_0.24.0_context_attention_perf.parquet")
        cache["gen"] = _read_parquet(base / "attention_vllm_0.24.0_generation_attention_perf.parquet")
        cache["ar"] = AllReduceTable(_read_parquet(base / "comm_vllm_0.24.0_custom_allreduce_perf.parquet"))
    gemm: GemmTable = cache["gemm"]["fp8" if dtype == "fp8" else "bfloat16"]
    ar: AllReduceTable = cache["ar"]
    heads, kvh = a.heads // tp, max(1, a.kv_heads // tp)
    allreduce_ms = [a.layers * 2 * ar.latency(tp, m * a.hidden) for m in M_GRID]
    layers_ms = [
        a.layers * linear_layers_ms(gemm, a, tp, m) + r for m, r in zip(M_GRID, allreduce_ms, strict=True)
    ]
    lm_head_ms = [gemm.latency(m, a.vocab // tp, a.hidden) for m in M_GRID]
    ca, cc = fit_context_attention(cache["ctx"], heads, kvh, a.head_dim)
    ga, gg = fit_generation_attention(cache["gen"], heads, kvh, a.head_dim)
    # FP8 KV cache (vLLM --kv-cache-dtype fp8): the same tables' fp8 rows.
    fca, fcc = fit_context_attention(cache["ctx"], heads, kvh, a.head_dim, "fp8")
    fga, fgg = fit_generation_attention(cache["gen"], heads, kvh, a.head_dim, "fp8")
    return {
        "source": "aiconfigurator/h100_sxm vLLM 0.24 kernel tables (gemm, context/generation attention, "
        "custom all-reduce); see disagg.twin.calibrate",
        "layers_ms": [round(x, 5) for x in layers_ms],
        "allreduce_ms": [round(x, 5) for x in allreduce_ms],
        "lm_head_ms": [round(x, 5) for x in lm_head_ms],
        "ctx_attn_ms": [a.layers * ca, a.layers * cc],
        "gen_attn_ms": [a.layers * ga, a.layers * gg],
        "kv_fp8": {
            "ctx_attn_ms": [a.layers * fca, a.layers * fcc],
            "gen_attn_ms": [a.layers * fga, a.layers * fgg],
        },
    }


def scaled_entry(
    h100: dict[str, Any], gpu: dict[str, Any], ref: dict[str, Any], dtype: str
) -> dict[str, Any]:
    """Datasheet-ratio scaling of an H100 entry (used where no measured table exists)."""
    key = "fp8_tflops" if dtype == "fp8" else "bf16_tflops"
    flops = ref[key] / gpu[key]
    hbm = ref["hbm_tbps"] / gpu["hbm_tbps"]
    # Linear layers are bandwidth-bound at small m and compute-bound at large m: scale the small-m part by
    # HBM and the large-m part by TFLOPS, taking the slower of the two per grid point.
    layers = [
        max(x * hbm if m <= 64 else 0.0, x * flops) for m, x in zip(M_GRID, h100["layers_ms"], strict=True)
    ]
    return {
        "source": f"DATASHEET RATIO from the H100 entry: x{flops:.2f} compute, x{hbm:.2f} HBM "
        "(profiles/gpus.yaml)",
        "layers_ms": [round(x, 5) for x in layers],
        "lm_head_ms": [round(max(x * hbm, x * flops), 5) for x in h100["lm_head_ms"]],
        "ctx_attn_ms": [h100["ctx_attn_ms"][0], h100["ctx_attn_ms"][1] * flops],
        "gen_attn_ms": [h100["gen_attn_ms"][0], h100["gen_attn_ms"][1] * hbm],
    }


def a100_entry(
    cal: Path, name: str, a: Arch, tp: int, h100: dict[str, Any], gpus: dict[str, Any], cache: dict[str, Any]
) -> dict[str, Any] | None:
    vidur_name = {"llama-3.1-8b": "Meta-Llama-3-8B", "llama-3.1-70b": "Meta-Llama-3-70B"}.get(name)
    if vidur_name is None:
        return scaled_entry(h100, gpus["a100"], gpus["h100"], "bf16")
    table = vidur_linear_ms(cal / "vidur" / f"a100_{vidur_name}_mlp.csv", tp)
    if not table:
        return None
    nv = gpus["h100"]["nvlink_gbps"] / gpus["a100"]["nvlink_gbps"]
    flops = gpus["h100"]["bf16_tflops"] / gpus["a100"]["bf16_tflops"]
    hbm = gpus["h100"]["hbm_tbps"] / gpus["a100"]["hbm_tbps"]
    ar: AllReduceTable = cache["ar"]
    layers_ms = [
        a.layers * (_interp_tokens(table, m) + 2 * nv * ar.latency(tp, m * a.hidden)) for m in M_GRID
    ]
    return {
        "source": f"vidur/a100_{vidur_name}_mlp.csv per-operator medians (linear layers, norms, rope, act); "
        "attention, all-reduce and lm_head: DATASHEET RATIO from the H100 entry",
        "layers_ms": [round(x, 5) for x in layers_ms],
        "lm_head_ms": [round(max(x * hbm, x * flops), 5) for x in h100["lm_head_ms"]],
        "ctx_attn_ms": [h100["ctx_attn_ms"][0], h100["ctx_attn_ms"][1] * flops],
        "gen_attn_ms": [h100["gen_attn_ms"][0], h100["gen_attn_ms"][1] * hbm],
    }


def read_forward_csv(path: Path) -> list[ForwardRow]:
    with path.open() as f:
        return [
            ForwardRow(
                r["model"],
                int(r["tp"]),
                r["phase"],
                int(r["batch"]),
                int(r["tokens"]),
                int(r["context"]),
                float(r["ms"]),
            )
            for r in csv.DictReader(f)
        ]


def launch_bound(rows: list[ForwardRow], split: H200Split = H200_FIT) -> set[int]:
    """Prefill lengths whose eager-mode time is within ``launch_bound_ratio`` of the shortest prompt's."""
    prefill = [r for r in rows if r.phase == "prefill"]
    floor = min(r.ms for r in prefill)
    return {r.tokens for r in prefill if r.ms < split.launch_bound_ratio * floor}


def fit_decode_rows(rows: list[ForwardRow]) -> tuple[dict[int, float], float]:
    """Decode rows -> (intercept per batch size, attention slope per context token): ms = I_B + g*B*C."""
    batches = sorted({r.batch for r in rows})
    design = np.zeros((len(rows), len(batches) + 1))
    for i, r in enumerate(rows):
        design[i, batches.index(r.batch)] = 1.0
        design[i, -1] = r.batch * r.context
    y = np.array([r.ms for r in rows])
    w = 1.0 / y  # relative error
    coef, *_ = np.linalg.lstsq(design * w[:, None], y * w, rcond=None)
    return {b: float(coef[i]) for i, b in enumerate(batches)}, max(float(coef[-1]), 0.0)


def fit_prefill_rows(rows: list[ForwardRow], attn_c: float) -> tuple[float, float]:
    """Prefill rows (one prompt of L tokens) minus the attention c*L^2 -> linear part a + b*L (ms)."""
    x = np.array([float(r.tokens) for r in rows])
    y = np.array([r.ms - attn_c * r.tokens**2 for r in rows])
    w = 1.0 / np.array([r.ms for r in rows])
    design = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    coef, *_ = np.linalg.lstsq(design, y * w, rcond=None)
    return float(coef[0]), float(coef[1])


def measured_layers_ms(
    decode_intercepts: dict[int, float], prefill_ab: tuple[float, float], first_prefill: int
) -> list[float]:
    """Per-step linear part on M_GRID: decode intercepts up to the largest batch, the prefill line from the
    first compute-bound prompt length on, linear interpolation in between."""
    bs = sorted(decode_intercepts)
    a, b = prefill_ab
    xs = [float(x) for x in bs] + [float(first_prefill)]
    ys = [decode_intercepts[x] for x in bs] + [a + b * first_prefill]
    return [float(np.interp(m, xs, ys)) if m < first_prefill else a + b * m for m in M_GRID]


def h200_entry(
    rows: list[ForwardRow], a: Arch, tp: int, h100: dict[str, Any], gpus: dict[str, Any], ar: AllReduceTable
) -> dict[str, Any]:
    split = H200_FIT
    bound = launch_bound(rows, split)
    decode = [r for r in rows if r.phase == "decode" and r.context in split.decode_contexts]
    prefill = [
        r for r in rows if r.phase == "prefill" and r.tokens in split.prefill_tokens and r.tokens not in bound
    ]
    if not decode or len(prefill) < 2:
        raise ValueError(
            f"h200 tp{tp}: not enough measured rows to fit (decode {len(decode)}, prefill {len(prefill)})"
        )
    intercepts, g = fit_decode_rows(decode)
    c = h100["ctx_attn_ms"][1]  # same tensor-core throughput as H100 (datasheet), so the same attention
    ab = fit_prefill_rows(prefill, c)
    shard = measured_layers_ms(intercepts, ab, min(r.tokens for r in prefill))
    allreduce = [a.layers * 2 * ar.latency(tp, m * a.hidden) for m in M_GRID]
    hbm = gpus["h100"]["hbm_tbps"] / gpus["h200"]["hbm_tbps"]
    return {
        "source": "MEASURED bench/gpu/results/h200-2026-11-30/llama_forward.csv (torch 2.11 forward of one "
        "TP shard; rows in disagg.twin.calibrate.H200_FIT); all-reduce: aiconfigurator h100_sxm custom "
        "all-reduce (same NVLink); lm_head: H100 GEMM x HBM ratio; prefill attention: H100 fit",
        "overhead_factor": 1.0,
        "layers_ms": [round(x + y, 5) for x, y in zip(shard, allreduce, strict=True)],
        "allreduce_ms": [round(y, 5) for y in allreduce],
        "lm_head_ms": [
            round(x * hbm if m <= 64 else x, 5) for m, x in zip(M_GRID, h100["lm_head_ms"], strict=True)
        ],
        "ctx_attn_ms": [0.0, c],
        "gen_attn_ms": [0.0, g],
    }


def calibrate(cal: Path, h200_csv: Path = DEFAULT_H200_CSV) -> dict[str, Any]:
    archs, gpus = load_archs(), load_gpus()
    h200_rows = read_forward_csv(h200_csv) if h200_csv.is_file() else []
    cache: dict[str, Any] = {}
    entries: dict[str, Any] = {}
    for name, a in archs.items():
        for tp in TPS:
            for dtype in ("bf16", "fp8"):
                h100 = h100_entry(cal, a, tp, dtype, cache)
                if weights_fit(a, gpus["h100"], tp, dtype):
                    entries[f"{name}/h100/tp{tp}/{dtype}"] = h100
                if dtype == "bf16" and weights_fit(a, gpus["a100"], tp, dtype):
                    e = a100_entry(cal, name, a, tp, h100, gpus, cache)
                    if e is not None:
                        entries[f"{name}/a100/tp{tp}/{dtype}"] = e
                if weights_fit(a, gpus["l40s"], tp, dtype):
                    entries[f"{name}/l40s/tp{tp}/{dtype}"] = scaled_entry(
                        h100, gpus["l40s"], gpus["h100"], dtype
                    )
                measured = [r for r in h200_rows if r.model == name and r.tp == tp]
                if dtype == "bf16" and measured:
                    entries[f"{name}/h200/tp{tp}/{dtype}"] = h200_entry(
                        measured, a, tp, h100, gpus, cache["ar"]
                    )
    return {"m_grid": list(M_GRID), "runtime": dict(RUNTIME), "profiles": entries}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calibration", type=Path, default=DEFAULT_CALIBRATION)
    parser.add_argument("--out", type=Path, default=PROFILES_DIR / "coefficients.yaml")
    parser.add_argument(
        "--h200-csv", type=Path, default=DEFAULT_H200_CSV, help="measured H200 forward passes"
    )
    args = parser.parse_args(argv)
    data = calibrate(args.calibration.resolve(), args.h200_csv)
    header = (
        "# GENERATED by `python -m disagg.twin.calibrate` from ../shared/calibration; do not edit by hand.\n"
        "# Units: ms per step for the whole model on one GPU of the TP group. layers_ms/lm_head_ms are\n"
        "# tabulated at m_grid tokens (lm_head at m_grid sequences); ctx_attn_ms = [a, c]: a + c*sum(l^2);\n"
        "# gen_attn_ms = [a, g]: a + g*sum(context). Each entry names its source.\n"
    )
    args.out.write_text(header + yaml.safe_dump(data, sort_keys=False, width=120))
    print(f"wrote {len(data['profiles'])} profiles to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

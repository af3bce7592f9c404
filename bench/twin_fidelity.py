"""Print the twin's fidelity table: every published or measured point, the twin's prediction, the difference.

The same points are asserted (within 25%, known misses as strict xfails with their reason) by
tests/unit/test_twin_fidelity.py; this script only prints them, for the closing note. Seconds on one core.

Usage: python bench/twin_fidelity.py
"""

from __future__ import annotations

import csv
import sys
from dataclasses import replace
from pathlib import Path

from disagg.perf.latency import LatencyModel, load_latency_model
from disagg.twin.calibrate import (
    DEFAULT_H200_CSV,
    H200_FIT,
    Arch,
    ForwardRow,
    GemmTable,
    _read_parquet,
    launch_bound,
    linear_layers_ms,
    load_archs,
    read_forward_csv,
)
from disagg.twin.fidelity import (
    AICONFIG_SOURCE,
    CLOSED_LOOP,
    FRONT_END_LOAD_WHAT_IF,
    FRONT_END_WHAT_IF,
    MOE_POINTS,
    NIM_SOURCE,
    SEEDS,
    TOLERANCE,
    closed_loop_latency,
    implied_token_cost,
    is_train,
    mean_abs_error,
    moe_throughput_per_node,
    token_rates,
)

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "calibration"
# source: NVIDIA H100 SXM (3.35 TB/s) and H200 (4.8 TB/s) datasheets (profiles/gpus.yaml).
HBM_RATIO = 4.8 / 3.35


def row(name: str, twin: float, ref: float, unit: str = "ms", note: str = "") -> None:
    diff = (twin - ref) / ref
    flag = "" if abs(diff) <= TOLERANCE else "  MISS"
    print(f"{name:<58} {twin:>9.1f} {ref:>9.1f} {unit:<3} {diff:>+7.0%}{flag}  {note}")


def closed_loop_rows() -> None:
    print(
        "\n== colocated closed loop (clients at random phases, mean of 32, plus a whole run's first round"
        "\n   where the point counts one, ClosedLoopPoint.num_requests; train/check: fidelity.TRAIN) =="
    )
    errors: dict[str, list[float]] = {}
    steady_only: dict[str, list[float]] = {}
    what_if: dict[str, list[float]] = {}
    implied: list[str] = []
    for p in CLOSED_LOOP:
        ttft, tpot = closed_loop_latency(p)
        split = "train" if is_train(p) else "check"
        src = "aiconfigurator 70B" if p.source == AICONFIG_SOURCE else "NIM 3.3-70B"
        name = f"{src} fp8 TP{p.tp} {p.label}"
        # the hypotheses the points are checked against: clients start together (as the benchmark tools
        # do), locked (no drift) or drifting by up to 2 s per request; and random phases re-drawn as
        # clients drift by up to 1 s per request (noise that breaks the twin's collision-free schedules)
        locked, _ = closed_loop_latency(p, burst=True)
        drift, _ = closed_loop_latency(p, burst=True, jitter_s=2.0, seeds=SEEDS[:4])
        noisy, _ = closed_loop_latency(p, jitter_s=1.0, seeds=SEEDS[:4])
        # and a front end whose cost grows with the streams in flight (not in the profile)
        streams, _ = closed_loop_latency(p, front_end=FRONT_END_WHAT_IF)
        # and one whose delay follows its CPU load (tokens/s), fitted on TRAIN (not in the profile either)
        cpu, cpu_tpot = closed_loop_latency(p, front_end_load=FRONT_END_LOAD_WHAT_IF)
        note = (
            f"{split}; together: locked {locked * 1e3:.0f}, 2 s drift {drift * 1e3:.0f}; "
            f"1 s drift {noisy * 1e3:.0f}; per-stream front end {streams * 1e3:.0f} ms; "
            f"CPU-load front end {cpu * 1e3:.0f} ms"
        )
        prompt_rate, out_rate = token_rates(p)
        per_prompt, per_out = implied_token_cost(p, ttft, 0.025)
        implied.append(
            f"   {name:<46} {prompt_rate:>7.0f} {out_rate:>6.0f}  {(p.ttft_s - ttft) * 1e3:>+6.0f} ms"
            f"  {per_prompt * 1e6:>6.0f} {per_out * 1e6:>6.0f} us"
        )
        for metric, pred, ref in (("TTFT", cpu, p.ttft_s), ("TPOT", cpu_tpot, p.tpot_s)):
            what_if.setdefault(f"{metric} {split}", []).append((pred - ref) / ref)
        steady = ttft
        if p.num_requests:
            # the run's first round counted (the default for this point) against the steady state alone,
            # and the request counts the source might have used instead of the assumed one
            steady, _ = closed_loop_latency(replace(p, num_requests=None))
            alt = {n: closed_loop_latency(p, num_requests=n * p.concurrency)[0] for n in (10, 5)}
            note += (
                f"; run of {p.num_requests}: steady state alone {steady * 1e3:.0f}, "
                + ", ".join(f"{n} x C requests {t * 1e3:.0f}" for n, t in alt.items())
                + " ms"
            )
        steady_only.setdefault(f"TTFT {split}", []).append((steady - p.ttft_s) / p.ttft_s)
        steady_only.setdefault(f"TTFT band {p.band}", []).append((steady - p.ttft_s) / p.ttft_s)
        if p.kv_dtype == "fp8":
            note += "; KV fp8"
        row(f"{name} TTFT", ttft * 1e3, p.ttft_s * 1e3, note=note)
        row(f"{name} {'ITL' if p.source == NIM_SOURCE else 'TPOT'}", tpot * 1e3, p.tpot_s * 1e3, note=split)
        for metric, pred, ref in (("TTFT", ttft, p.ttft_s), ("TPOT", tpot, p.tpot_s)):
            err = (pred - ref) / ref
            for key in (f"band {p.band}", f"TP{p.tp}", f"prompt {p.isl}", split, "all"):
                errors.setdefault(f"{metric} {key}", []).append(err)
    print("\n   mean absolute error (points):")
    groups = ("band", "TP", "prompt", "train", "check", "all")
    for key, errs in sorted(
        errors.items(), key=lambda kv: (groups.index(kv[0][5:].split()[0].rstrip("0123456789")), kv[0])
    ):
        print(f"   {key:<22} {mean_abs_error(errs):>6.1%}  ({len(errs)})")
    print("   the clients' steady state alone (no first round counted anywhere):")
    for key, errs in sorted(steady_only.items()):
        print(f"   {key:<22} {mean_abs_error(errs):>6.1%}  ({len(errs)})")
    print("   with the CPU-load front end (fidelity.FRONT_END_LOAD_WHAT_IF, steady state):")
    for key, errs in sorted(what_if.items()):
        print(f"   {key:<22} {mean_abs_error(errs):>6.1%}  ({len(errs)})")
    print(
        "\n   front-end load (tokens/s, from the published TTFT/TPOT), TTFT residual (published - twin), and"
        "\n   the CPU cost per prompt / per output token a 25 ms processor-sharing front end would need:"
    )
    print("\n".join(implied))


def splitwise_rows() -> None:
    print("\n== Splitwise (2023 stack), Llama2-70B H100 TP8 prompt time ==")
    m = load_latency_model("llama-3.1-70b", "h100", 8, "bf16")
    for prompt, pub in ((1024, 78.0), (8192, 845.0)):
        row(f"Splitwise prompt {prompt}", m.prefill_time_s([prompt]) * 1e3, pub)


def vidur_rows() -> None:
    gemm_path = SHARED / "aiconfigurator" / "h100_sxm" / "gemm_vllm_0.24.0_gemm_perf.parquet"
    if not gemm_path.is_file():
        print("\n(vidur rows skipped: ../shared/calibration not present)")
        return
    print("\n== vidur H100 per-layer linear layers (qkv+o+up+down), worst token count of 1..4096 ==")
    gemm = GemmTable(r for r in _read_parquet(gemm_path) if r["gemm_dtype"] == "bfloat16")
    # config.json of meta-llama/Llama-2-7b-hf: 32 layers, hidden 4096, intermediate 11008, 32 heads.
    archs = {
        "Llama-2-70b-hf": load_archs()["llama-3.1-70b"],
        "Llama-2-7b-hf": Arch("llama-2-7b", 32, 4096, 11008, 32, 32, 128, 32000, 6.7),
    }
    ops = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
    for model, arch in archs.items():
        vid: dict[tuple[int, int], float] = {}
        with (SHARED / "vidur" / f"h100_{model}_mlp.csv").open() as f:
            for r in csv.DictReader(f):
                key = (int(r["num_tensor_parallel_workers"]), int(r["num_tokens"]))
                vid[key] = sum(float(r[f"time_stats.{op}.median"]) for op in ops)
        for tp in (1, 2, 4, 8):
            worst = max(
                (1, 16, 64, 256, 1024, 4096),
                key=lambda n: abs(linear_layers_ms(gemm, arch, tp, n) - vid[(tp, n)]) / vid[(tp, n)],
            )
            row(
                f"vidur {model} TP{tp} at {worst} tokens",
                linear_layers_ms(gemm, arch, tp, worst) * 1e3,
                vid[(tp, worst)] * 1e3,
                "us",
            )


def shard_ms(model: LatencyModel, r: ForwardRow) -> float:
    if r.phase == "prefill":
        return 1e3 * model.shard_forward_time_s(r.tokens, float(r.tokens**2))
    return 1e3 * model.shard_forward_time_s(r.batch, 0.0, r.batch * r.context)


def h200_rows() -> None:
    print("\n== H200 measured forward passes (bench/gpu/results/h200-2026-11-30) ==")
    rows = read_forward_csv(DEFAULT_H200_CSV)
    for model, tp in (("llama-3.1-8b", 1), ("llama-3.1-70b", 4), ("llama-3.1-70b", 8)):
        mine = [r for r in rows if r.model == model and r.tp == tp]
        bound = launch_bound(mine)
        h200, h100 = load_latency_model(model, "h200", tp), load_latency_model(model, "h100", tp)
        for r in mine:
            held = (r.phase == "decode" and r.context not in H200_FIT.decode_contexts) or (
                r.phase == "prefill" and r.tokens not in H200_FIT.prefill_tokens and r.tokens not in bound
            )
            if held:
                shape = f"B={r.batch} C={r.context}" if r.phase == "decode" else f"L={r.tokens}"
                row(f"H200 {model} TP{tp} held-out {r.phase} {shape}", shard_ms(h200, r), r.ms)
        print(f"   (prefill rows launch-bound in eager mode, excluded: {sorted(bound)})")
        for r in mine:
            if r.phase == "decode" and ((r.batch == 1 and r.context == 2048) or r.batch * r.context >= 2**21):
                ratio = shard_ms(h100, r) / r.ms
                row(
                    f"cross-GPU {model} TP{tp} H100twin/H200meas B={r.batch} C={r.context}",
                    ratio * 100,
                    HBM_RATIO * 100,
                    "%",
                    "vs HBM ratio 1.43",
                )


def moe_rows() -> None:
    print("\n== MoE wide-EP P/D, tokens/s per node (steady-state steps; twin/fidelity.py MOE_POINTS) ==")
    for p in MOE_POINTS:
        twin, batch = moe_throughput_per_node(p)
        unit = "tok/rank" if p.phase == "prefill" else "seq/rank"
        why = p.known_miss or p.note
        row(p.label[:58], twin / 1e3, p.published / 1e3, "k/s", f"batch {batch} {unit}; {why}".rstrip("; "))


def main() -> int:
    print(f"{'point':<58} {'twin':>9} {'ref':>9}     {'diff':>7}")
    closed_loop_rows()
    splitwise_rows()
    vidur_rows()
    h200_rows()
    moe_rows()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: goodput per GPU-hour of P/D disaggregated vs colocated serving on published traces.

For each trace (both Azure 2023 traces and the Mooncake sample) and each fleet size, the best static P/D
split and the best static colocated size (chunked prefill) within the fleet's GPUs are compared, through
the same code as ``disagg simulate --compare all`` (:func:`disagg.twin.compare.best_static_split` and
:func:`~disagg.twin.compare.best_static_colocated`: the configuration with the most goodput per GPU-hour
among those where 90% of requests meet the SLO, else the highest attainment). The trace rate is scaled
with the fleet so each size sees the same load per GPU. Prints a table; it is a benchmark, so it reports
numbers and asserts nothing.

    .venv/bin/python bench/pd_vs_colocated.py [--sizes 8,16,32] [--model llama-3.1-70b --tp 4]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

from disagg.twin.compare import SloSettings, best_static_colocated, best_static_split
from disagg.twin.sim import PoolSpec, SimDeployment
from disagg.twin.traffic import load_trace, scale_rate

TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"


@dataclass(frozen=True)
class Workload:
    name: str
    path: Path
    rate_per_16_gpus: float  # trace rate multiplier at 16 GPUs (scaled linearly with the fleet)
    ttft_slo_s: float
    itl_slo_s: float


WORKLOADS = (
    Workload("azure-conv", TRACES / "azure2023" / "AzureLLMInferenceTrace_conv.csv", 3.0, 1.0, 0.05),
    Workload("azure-code", TRACES / "azure2023" / "AzureLLMInferenceTrace_code.csv", 1.0, 1.0, 0.05),
    Workload("mooncake", TRACES / "mooncake" / "synthetic_trace.jsonl", 0.3, 3.0, 0.05),
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--sizes", default="8,16,32", help="fleet sizes in GPUs")
    ap.add_argument("--model", default="llama-3.1-70b")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--only", help="run one workload by name")
    ap.add_argument("--loads", default="0.5,1", help="multipliers of each workload's rate per 16 GPUs")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    loads = [float(x) for x in args.loads.split(",")]
    print(f"{args.model} {args.dtype} on {args.gpu}, TP{args.tp} replicas; goodput: TTFT and mean ITL in SLO")
    header = (
        f"{'trace':11} {'GPUs':>4} {'rate':>6} {'SLO ttft/itl':>12} | {'best P:D':>8} {'GPUs':>4}"
        f" {'P/D good/GPU-h':>14} {'P/D SLO':>7} | {'colo size':>9} {'GPUs':>4} {'colo good/GPU-h':>15}"
        f" {'colo SLO':>8} | {'P/D / colo':>10}"
    )
    print(header)
    print("-" * len(header))
    t0 = time.perf_counter()
    for w in WORKLOADS:
        if args.only and w.name != args.only:
            continue
        if not w.path.is_file():
            print(f"{w.name}: {w.path} not found, skipped")
            continue
        base = load_trace(w.path)
        for load, gpus in ((x, g) for x in loads for g in sizes):
            n = gpus // args.tp
            if n < 2:
                continue
            scale = load * w.rate_per_16_gpus * gpus / 16
            reqs = scale_rate(base, scale)
            rate = len(reqs) / max(reqs[-1].arrival_s, 1e-9)
            dep = SimDeployment(
                model=args.model,
                gpu=args.gpu,
                dtype=args.dtype,
                prefill=PoolSpec(1, args.tp),
                decode=PoolSpec(n - 1, args.tp),
                name=w.name,
            )
            target = SloSettings(w.ttft_slo_s, w.itl_slo_s, interval_s=60.0)
            split = best_static_split(dep, reqs, target, gpus).best
            colo = best_static_colocated(dep, reqs, target, gpus).best
            assert split.deployment.prefill is not None and split.deployment.decode is not None
            assert colo.deployment.colocated is not None
            p_d = f"{split.deployment.prefill.replicas}:{split.deployment.decode.replicas}"
            pd, co = split.report, colo.report
            ratio = (
                pd.goodput_per_gpu_hour / co.goodput_per_gpu_hour if co.goodput_per_gpu_hour else float("inf")
            )
            slo = f"{w.ttft_slo_s:g}s/{w.itl_slo_s * 1e3:g}ms"
            print(
                f"{w.name:11} {gpus:>4} {rate:>6.1f} {slo:>12} | {p_d:>8} {pd.gpus:>4}"
                f" {pd.goodput_per_gpu_hour:>14.0f} {pd.slo_attainment:>7.1%} |"
                f" {colo.deployment.colocated.replicas:>9} {co.gpus:>4}"
                f" {co.goodput_per_gpu_hour:>15.0f} {co.slo_attainment:>8.1%} | {ratio:>10.2f}"
            )
    print(f"({time.perf_counter() - t0:.1f} s wall)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

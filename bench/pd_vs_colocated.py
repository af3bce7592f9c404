"""Benchmark: goodput per GPU-hour of P/D disaggregated vs colocated serving on published traces.

For each trace (both Azure 2023 traces and the Mooncake sample) and each fleet size, the P/D deployment is
tried at every prefill:decode split of the fleet's replicas (the best split is reported, as an operator
would pick it) and compared with colocated serving (chunked prefill) on the same GPUs, through the same
code path as ``disagg simulate --compare colocated`` (SimDeployment.colocated_equivalent + build_report).
The trace rate is scaled with the fleet so each size sees the same load per GPU. Prints a table; it is a
benchmark, so it reports numbers and asserts nothing.

    .venv/bin/python bench/pd_vs_colocated.py [--sizes 8,16,32] [--model llama-3.1-70b --tp 4]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

from disagg.twin.report import Report, build_report
from disagg.twin.sim import PoolSpec, SimDeployment, simulate
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


def run_one(dep: SimDeployment, reqs: list, w: Workload, label: str) -> Report:
    res = simulate(dep, reqs, interval_s=60.0)
    return build_report(res, w.ttft_slo_s, w.itl_slo_s, label=label)


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
        f"{'trace':11} {'GPUs':>4} {'rate':>6} {'SLO ttft/itl':>12} | {'best P:D':>8} {'P/D good/GPU-h':>14}"
        f" {'P/D SLO':>7} | {'colo good/GPU-h':>15} {'colo SLO':>8} | {'P/D / colo':>10}"
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
            best: tuple[Report, str] | None = None
            for p in range(1, n):
                dep = SimDeployment(
                    model=args.model,
                    gpu=args.gpu,
                    dtype=args.dtype,
                    prefill=PoolSpec(p, args.tp),
                    decode=PoolSpec(n - p, args.tp),
                    name=f"{w.name}-{p}p{n - p}d",
                )
                rep = run_one(dep, reqs, w, dep.name)
                if best is None or rep.goodput_per_gpu_hour > best[0].goodput_per_gpu_hour:
                    best = (rep, f"{p}:{n - p}")
            assert best is not None
            colo_dep = SimDeployment(
                model=args.model,
                gpu=args.gpu,
                dtype=args.dtype,
                prefill=PoolSpec(1, args.tp),
                decode=PoolSpec(n - 1, args.tp),
            ).colocated_equivalent()
            colo = run_one(colo_dep, reqs, w, f"{w.name}-colocated")
            pd = best[0]
            ratio = (
                pd.goodput_per_gpu_hour / colo.goodput_per_gpu_hour
                if colo.goodput_per_gpu_hour
                else float("inf")
            )
            slo = f"{w.ttft_slo_s:g}s/{w.itl_slo_s * 1e3:g}ms"
            print(
                f"{w.name:11} {gpus:>4} {rate:>6.1f} {slo:>12} | {best[1]:>8}"
                f" {pd.goodput_per_gpu_hour:>14.0f}"
                f" {pd.slo_attainment:>7.1%} | {colo.goodput_per_gpu_hour:>15.0f} {colo.slo_attainment:>8.1%}"
                f" | {ratio:>10.2f}"
            )
    print(f"({time.perf_counter() - t0:.1f} s wall)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: replay the one-hour Azure conversation trace through the twin on a 16-GPU P/D deployment.

Prints wall time, CPU time (one core) and peak resident memory. Target (issue 4): <= 5 s on one core.

    .venv/bin/python bench/twin_speed.py [--trace PATH] [--model M] [--tp 4] [--prefill 2] [--decode 2]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

from disagg.twin.sim import PoolSpec, SimDeployment, simulate
from disagg.twin.traffic import load_trace

DEFAULT_TRACE = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "azure2023"
DEFAULT_TRACE = DEFAULT_TRACE / "AzureLLMInferenceTrace_conv.csv"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--model", default="llama-3.1-70b")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--prefill", type=int, default=2)
    ap.add_argument("--decode", type=int, default=2)
    ap.add_argument("--rate-scale", type=float, default=1.0)
    args = ap.parse_args(argv)
    if not args.trace.is_file():
        print(f"trace {args.trace} not found", file=sys.stderr)
        return 2
    t0, c0 = time.perf_counter(), time.process_time()
    reqs = load_trace(args.trace)
    t1, c1 = time.perf_counter(), time.process_time()
    if args.rate_scale != 1.0:
        from disagg.twin.traffic import scale_rate

        reqs = scale_rate(reqs, args.rate_scale)
    dep = SimDeployment(
        model=args.model,
        gpu=args.gpu,
        prefill=PoolSpec(args.prefill, args.tp),
        decode=PoolSpec(args.decode, args.tp),
    )
    res = simulate(dep, reqs)
    t2, c2 = time.perf_counter(), time.process_time()
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rep = res.report(ttft_slo_s=1.0, itl_slo_s=0.05)
    tokens = int(res.output.sum())
    print(f"trace            {args.trace.name}: {len(reqs)} requests over {reqs[-1].arrival_s:.0f} s")
    print(
        f"deployment       {args.model} on {args.gpu}: {args.prefill} prefill + {args.decode} decode"
        f" x TP{args.tp} = {dep.gpus} GPUs"
    )
    print(f"load trace       {t1 - t0:6.2f} s wall  {c1 - c0:6.2f} s CPU")
    print(
        f"simulate         {t2 - t1:6.2f} s wall  {c2 - c1:6.2f} s CPU"
        f"  ({tokens / (t2 - t1) / 1e6:.1f} M output tokens/s)"
    )
    print(f"total            {t2 - t0:6.2f} s wall  {c2 - c0:6.2f} s CPU  (target <= 5 s)")
    print(f"peak RSS         {peak_mib:6.0f} MiB")
    print(
        f"finished         {res.finished}/{len(reqs)}; TTFT p90 {rep.ttft_p90:.3f} s;"
        f" ITL p90 {rep.itl_p90:.4f} s; SLO attainment {rep.slo_attainment:.1%}; {rep.gpu_hours:.2f} GPU-h"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

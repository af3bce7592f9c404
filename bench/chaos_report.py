"""The chaos suite as a table: what was done to the system, what was lost, the target, pass or fail.

Starts a local control plane of its own in a temporary directory (the binaries are built into
~/.cache/disagg on first use), runs the cases of disagg.chaos.cases (the ones tests/chaos asserts) and
prints one row per case; with --json, the cases' JSON lines as well. A case that cannot run is a row
with its error. Exit status 1 when a case found a correctness problem.

    .venv/bin/python bench/chaos_report.py [--case operator-killed ...] [--json] [--keep DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import textwrap
from pathlib import Path

from disagg.chaos import CASES, CaseResult, ChaosCluster

COLUMNS = ("case", "done", "measured", "target", "result")
WIDTHS = (18, 40, 50, 28, 20)


def row(result: CaseResult) -> list[str]:
    measured = ", ".join(
        f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in result.figures.items()
    )
    if result.passed:
        verdict = "pass" if result.target_met else "pass (target missed)"
    else:
        verdict = "FAIL"
        measured += "; problems: " + "; ".join(result.problems)
    return [result.case, result.done, measured, result.target, verdict]


def table(results: list[CaseResult]) -> str:
    lines = [" | ".join(c.ljust(w) for c, w in zip(COLUMNS, WIDTHS, strict=True))]
    lines.append("-+-".join("-" * w for w in WIDTHS))
    for result in results:
        cells = [textwrap.wrap(c, w) or [""] for c, w in zip(row(result), WIDTHS, strict=True)]
        for i in range(max(len(c) for c in cells)):
            parts = [(c[i] if i < len(c) else "").ljust(w) for c, w in zip(cells, WIDTHS, strict=True)]
            lines.append(" | ".join(parts).rstrip())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--case", action="append", choices=sorted(CASES), help="run only this case (repeatable)"
    )
    parser.add_argument("--json", action="store_true", help="also print each case's JSON line")
    parser.add_argument("--keep", type=Path, help="work (cluster state, logs) under DIR and keep it")
    args = parser.parse_args(argv)
    names = args.case or list(CASES)
    with tempfile.TemporaryDirectory(prefix="disagg-chaos-") as tmp:
        workdir = args.keep or Path(tmp)
        print(f"starting a local control plane under {workdir} ...", file=sys.stderr, flush=True)
        cc = ChaosCluster.start(workdir)
        results: list[CaseResult] = []
        try:
            for name in names:
                print(f"running {name} ...", file=sys.stderr, flush=True)
                try:
                    result = CASES[name](cc)
                except Exception as error:  # one broken case is a row, the others still run
                    result = CaseResult(name, "(did not run)", {}, "-", (f"{type(error).__name__}: {error}",))
                results.append(result)
                print(result.line(), file=sys.stderr, flush=True)
        finally:
            cc.close()
    print(table(results))
    if args.json:
        for result in results:
            print(result.json_line())
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

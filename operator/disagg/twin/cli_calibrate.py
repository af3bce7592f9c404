"""``disagg twin calibrate``: fit the twin's latency profile to a user's own benchmark runs.

    disagg twin calibrate --measurements FILE [--measurements FILE2 ...] --out profile.yaml
        [--model M] [--gpu G] [--tp N] [--dtype bf16|fp8] [--kv-dtype bf16|fp8]
        [--model-config config.json] [--gpu-spec gpu.yaml] [--holdout loo|none|2,5] [--quiet]

FILE is a vLLM serving benchmark result (``vllm bench serve --save-result``), an AIPerf or GenAI-Perf
export (``profile_export_aiperf.json``) or a CSV (:mod:`disagg.twin.measurements`). The fit
(:mod:`disagg.twin.fit_measured`) prints, per profile, the fitted knobs and the mean relative error of TTFT
and TPOT on the fitted runs, on held-out runs and for the unfitted profile; the profile file goes to
``--out`` (``-``: stdout) for ``disagg simulate --profile``.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from disagg.clicommon import EXIT_FAILURE, EXIT_OK, is_stdout
from disagg.twin import fit_measured
from disagg.twin.cli_simulate import simulation_progress
from disagg.twin.measurements import Defaults, MeasurementError, read_measurements

PROG = "disagg twin calibrate"
DESCRIPTION = (
    "Fit the twin's latency profile (overhead_factor, step and request overhead) to measured runs: vLLM\n"
    "serving benchmark results (vllm bench serve --save-result), AIPerf/GenAI-Perf exports\n"
    "(profile_export_aiperf.json) or a CSV with columns model,gpu,tp,concurrency (or rate),\n"
    "prompt_tokens,output_tokens,ttft_ms,tpot_ms. Prints the fit and held-out errors and writes a profile\n"
    "for `disagg simulate --profile`. A model or GPU the twin does not know needs --model-config\n"
    "(its config.json) or --gpu-spec (datasheet figures)."
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--measurements",
        type=Path,
        action="append",
        required=True,
        metavar="FILE",
        help="vLLM benchmark result JSON, AIPerf/GenAI-Perf export JSON, or CSV (repeatable)",
    )
    parser.add_argument("--out", required=True, help="profile YAML to write (- for stdout)")
    setup = parser.add_argument_group("what the files do not say (a file's own values win)")
    setup.add_argument("--model", help="model name or Hugging Face id")
    setup.add_argument("--gpu", help="GPU type, e.g. h100")
    setup.add_argument("--tp", type=int, help="tensor-parallel size of the replica")
    setup.add_argument("--dtype", help="weight dtype: bf16 (default) or fp8")
    setup.add_argument("--kv-dtype", help="KV-cache dtype: bf16 (default) or fp8")
    new = parser.add_argument_group("a model or GPU the twin does not know")
    new.add_argument("--model-config", type=Path, help="the model's Hugging Face config.json")
    new.add_argument(
        "--gpu-spec",
        type=Path,
        help=f"YAML/JSON of the GPU's datasheet figures: {', '.join(fit_measured.GPU_FIELDS)}",
    )
    parser.add_argument(
        "--holdout",
        default="loo",
        help="held-out runs: loo (leave-one-out, default), none, or 1-based run numbers like 2,5",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def _read_mapping(path: Path, what: str) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))  # JSON is YAML
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        problem = getattr(error, "strerror", None) or " ".join(str(error).split())
        raise MeasurementError(f"{path}: cannot read {what}: {problem}") from None
    if not isinstance(doc, dict):
        raise MeasurementError(f"{path}: {what} must be a mapping of fields")
    return doc


def _pct(value: float | None) -> str:
    return "   n/a" if value is None else f"{value:5.1f}%"


def report_lines(reports: dict[str, fit_measured.FitReport]) -> list[str]:
    lines = []
    for key, rep in reports.items():
        s = rep.summary()
        knobs = ", ".join(f"{k} {rep.start[k]:.3g} -> {v:.3g}" for k, v in rep.knobs.items())
        lines.append(f"{key} ({rep.base_source} kernel tables, {s['points']} runs): {knobs}")
        for label, part in (
            ("fit error     ", "fit_error_pct"),
            ("held-out error", "held_out_error_pct"),
            ("unfitted error", "unfitted_error_pct"),
        ):
            n = {"fit_error_pct": s["fitted_points"], "held_out_error_pct": s["held_out_points"]}.get(
                part, s["points"]
            )
            lines.append(
                f"  {label} ({n:2d} runs): TTFT {_pct(s[part]['ttft'])}  TPOT {_pct(s[part]['tpot'])}"
            )
        for e in rep.fitted:
            p = e.point
            lines.append(
                f"    {p.label:<24} TTFT {1000 * p.observed.ttft_mean_s:8.1f} ms measured, "
                f"{1000 * e.ttft_s:8.1f} fitted; "
                f"TPOT {1000 * p.observed.tpot_mean_s:6.2f} / {1000 * e.tpot_s:6.2f} ms"
            )
    return lines


def _fit_all(plan: fit_measured.Plan, holdout: str, quiet: bool) -> dict[str, fit_measured.FitReport]:
    """Every target's fit, with a progress bar on stderr in a terminal (a fit with leave-one-out over many
    runs takes minutes: each closed-loop run is replayed over several client phases per evaluation)."""
    reports = {}
    with simulation_progress(Console(stderr=True), quiet) as progress:
        for key, target in plan.targets.items():
            total = fit_measured.fits_needed(target, holdout)
            task = progress.add_task(f"fitting {key}", total=total, detail="fits")
            reports[key] = fit_measured.fit_target(
                target, plan, holdout, on_fit=partial(progress.advance, task)
            )
            progress.remove_task(task)
    return reports


def run(args: argparse.Namespace) -> int:
    try:
        defaults = Defaults(args.model, args.gpu, args.tp, args.dtype, args.kv_dtype)
        points = read_measurements(args.measurements, defaults)
        config = _read_mapping(args.model_config, "the model config") if args.model_config else None
        gpu = _read_mapping(args.gpu_spec, "the GPU spec") if args.gpu_spec else None
        plan = fit_measured.plan(points, config, gpu)
        reports = _fit_all(plan, args.holdout, args.quiet)
    except ValueError as error:  # MeasurementError, FitError and ProfileError are ValueErrors
        print(f"{PROG}: {' '.join(str(error).split())}", file=sys.stderr)
        return EXIT_FAILURE
    doc = fit_measured.profile_document(plan, reports, [str(p) for p in args.measurements])
    text = "# Written by `disagg twin calibrate`; use with `disagg simulate --profile`.\n" + yaml.safe_dump(
        json.loads(json.dumps(doc)), sort_keys=False
    )
    for line in report_lines(reports):
        print(line, file=sys.stderr if is_stdout(args.out) else sys.stdout)
    if is_stdout(args.out):
        sys.stdout.write(text)
        return EXIT_OK
    try:
        Path(args.out).write_text(text, encoding="utf-8")
    except OSError as error:
        print(f"{PROG}: {args.out}: cannot write: {error.strerror or error}", file=sys.stderr)
        return EXIT_FAILURE
    print(f"wrote {args.out}", file=sys.stderr)
    return EXIT_OK

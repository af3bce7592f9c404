"""``disagg simulate``: replay a trace through the serving twin and report goodput and latencies.

    disagg simulate --trace T --deployment D [--policy P] [--compare all|colocated] [--out DIR]
    disagg simulate --trace T --deployment D [--policy P] --recommend --gpu-budget N [--top K]
    disagg simulate --traffic poisson|bursty|diurnal|phase-change [--rate R ...] --deployment D ...

T is an Azure LLM inference CSV, a Mooncake JSONL or a BurstGPT CSV (:mod:`disagg.twin.traffic`); instead
of a trace, ``--traffic`` generates arrivals (:mod:`disagg.twin.traffic_args`).
D is a DisaggregatedDeployment YAML (model name, TP and replicas are read from it) or a small twin
deployment YAML (the fields of :class:`disagg.twin.sim.SimDeployment`). P is a RatioPolicy YAML: its SLO
becomes the goodput target and, unless ``--static``, ``disagg.policy.decide`` runs in the loop every
``evaluationIntervalSeconds``. ``--compare colocated`` also runs a colocated deployment on the same GPUs;
``--compare all`` runs, on one GPU budget, the best static P/D split, the best static colocated size and a
colocated pool autoscaled like an HPA (:mod:`disagg.twin.compare`); ``--recommend`` sweeps TP per role,
P:D split and colocated sizes within ``--gpu-budget`` and prints the top configurations by goodput per
GPU-hour among those meeting the SLO.
A table goes to stdout, progress to stderr (a bar in a terminal, one line per run elsewhere), and
``report.html`` plus ``summary.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from disagg.api.common import describe_validation_error
from disagg.api.textfile import MAX_MANIFEST_BYTES, read_text
from disagg.clicommon import EXIT_FAILURE
from disagg.twin import compare, profiles, traffic_args
from disagg.twin.compare import SloSettings
from disagg.twin.decisions import DecisionRecord, bound_spans, cause_counts, policy_run_trace
from disagg.twin.report import Report, format_table, write_html
from disagg.twin.sim import Controller, SimDeployment, SimResult
from disagg.twin.traffic import load_trace, scale_rate, truncate

__all__ = ["SloSettings", "configure", "load_policy", "policy_controller", "run", "simulation_progress"]


def _positive(value: str) -> float:
    """argparse type: a finite number > 0 (a zero duration or SLO would make every figure NaN)."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not (math.isfinite(number) and number > 0):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {value}")
    return number


def _non_negative(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not (math.isfinite(number) and number >= 0):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {value}")
    return number


def _count(value: str) -> int:
    """argparse type: a whole number >= 1 (GPUs, configurations)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return number


def configure(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=Path, help="Azure CSV, Mooncake JSONL or BurstGPT CSV")
    source.add_argument("--traffic", choices=traffic_args.KINDS, help="synthetic arrivals instead of a trace")
    parser.add_argument("--deployment", required=True, type=Path, help="DisaggregatedDeployment or twin YAML")
    parser.add_argument("--policy", type=Path, help="RatioPolicy YAML (SLO and, unless --static, scaling)")
    parser.add_argument("--static", action="store_true", help="report against the policy's SLO, no scaling")
    parser.add_argument(
        "--compare",
        choices=["all", "colocated"],
        help="all: also the best static P/D split, the best static colocated size and colocated "
        "autoscaled, on one GPU budget; colocated: also colocated serving on the same GPUs",
    )
    parser.add_argument(
        "--recommend",
        action="store_true",
        help="sweep TP per role, P:D split and colocated sizes within --gpu-budget; print the best",
    )
    parser.add_argument(
        "--gpu-budget",
        type=_count,
        help="GPUs for --recommend (required) and --compare all (default: the policy run's peak)",
    )
    parser.add_argument("--top", type=_count, help="configurations --recommend prints (default 5)")
    parser.add_argument("--out", type=Path, help="directory for report.html and summary.json")
    parser.add_argument("--ttft-slo", type=_positive, help="TTFT target in seconds (default: policy or 1.0)")
    parser.add_argument("--itl-slo", type=_positive, help="ITL (mean per request) target in s (default 0.05)")
    parser.add_argument("--rate-scale", type=_positive, default=1.0, help="multiply the trace's request rate")
    parser.add_argument(
        "--duration",
        type=_positive,
        help="only the first DURATION seconds of the trace; with --traffic, its length (default 600)",
    )
    parser.add_argument(
        "--startup-delay", type=_non_negative, help="seconds a new replica takes to become ready"
    )
    parser.add_argument("--routing", choices=["least_outstanding", "round_robin", "random"])
    parser.add_argument("--link", choices=["nic", "nvlink"], help="KV transfer path between pools")
    parser.add_argument("--no-prefix-caching", action="store_true", help="disable automatic prefix caching")
    parser.add_argument("--seed", type=int, default=0, help="routing ties and --traffic's draws")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.add_argument(
        "--profile",
        type=Path,
        help="a latency profile from `disagg twin calibrate`, laid over the shipped ones for this run",
    )
    traffic_args.add_arguments(parser)
    parser.set_defaults(func=run)


def simulation_progress(console: Console, quiet: bool) -> Progress:
    """Each run's progress on stderr: a bar in a terminal; off a terminal (a CI log, a pipe) nothing is
    redrawn, only each run's ``done in`` line is printed."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} {task.fields[detail]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=quiet or not console.is_terminal,
    )


def load_policy(path: Path) -> Any:
    """A RatioPolicy (disagg.api.ratiopolicy) from YAML; the error names the bad field."""
    from disagg.api.ratiopolicy import RatioPolicy

    try:
        docs = [d for d in yaml.safe_load_all(read_text(path, MAX_MANIFEST_BYTES)) if d]
    except yaml.YAMLError as error:
        raise ValueError(f"policy: {path} is not valid YAML: {' '.join(str(error).split())}") from error
    if not docs:
        raise ValueError(f"policy: {path} is empty")
    doc = docs[0]
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind != "RatioPolicy":
        raise ValueError(f"policy: {path}: kind {kind!r}: expected a RatioPolicy")
    try:
        return RatioPolicy.model_validate(doc)
    except ValidationError as error:
        raise ValueError(f"policy: {path}: " + "; ".join(describe_validation_error(error))) from error


def policy_controller(spec: Any, dep: SimDeployment, log: list[DecisionRecord] | None = None) -> Controller:
    """Run ``disagg.policy.decide`` in the loop, carrying its state; advisory decisions are not applied.

    The policy decides within :meth:`SimDeployment.policy_bounds`: for a DisaggregatedDeployment the
    bounds the operator reads from the same object (:func:`disagg.policy.bounds.bounds_for`)."""
    from disagg.policy import PolicyState, decide

    bounds = dep.policy_bounds()
    state = PolicyState()

    def control(obs: Any) -> dict[str, int] | None:
        nonlocal state
        decision, state = decide(obs, spec, state, obs.time, bounds)
        if log is not None:
            log.append(
                DecisionRecord(
                    decision.time,
                    decision.prefill,
                    decision.decode,
                    decision.cause,
                    tuple((r.code, r.message, r.role) for r in decision.reasons),
                    decision.changed,
                    decision.advisory,
                )
            )
        if decision.advisory:
            return None
        return {"prefill": decision.prefill, "decode": decision.decode}

    return control


def decision_findings(
    result: SimResult, log: list[DecisionRecord], dep: SimDeployment, policy: Any, slo: SloSettings
) -> list[str]:
    """The policy run's decision causes and a warning per span a bound held while the SLO was missed."""
    from disagg.policy.engine import effective_budget

    bounds = dep.policy_bounds()
    counts = ", ".join(f"{cause} {n}" for cause, n in cause_counts(log))
    changed = sum(r.changed for r in log)
    lines = [f"decisions: {len(log)} evaluations, {changed} changed replicas; causes: {counts or 'none'}"]
    spans = bound_spans(
        result, log, bounds, effective_budget(policy.spec, bounds), slo.ttft_s, slo.itl_s, slo.percentile
    )
    lines += [f"warning: {span.describe(slo.percentile)}" for span in spans]
    return lines


def slo_settings(args: argparse.Namespace, policy: Any) -> SloSettings:
    s = SloSettings()
    if policy is not None:
        slo = policy.spec.slo
        s = SloSettings(
            ttft_s=float(slo.ttft.target_seconds),
            itl_s=float(slo.itl.target_seconds),
            percentile=float(slo.ttft.percentile) / 100.0,
            interval_s=float(policy.spec.evaluation_interval_seconds),
            window_s=float(policy.spec.metric_window_seconds),
        )
    if args.ttft_slo is not None:
        s = replace(s, ttft_s=args.ttft_slo)
    if args.itl_slo is not None:
        s = replace(s, itl_s=args.itl_slo)
    return s


def usage_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the comparison flags together, or None."""
    if args.recommend and args.gpu_budget is None:
        return "--recommend needs --gpu-budget N: the GPUs the configurations it sweeps may use"
    if args.gpu_budget is not None and not args.recommend and args.compare != "all":
        return "--gpu-budget is read by --recommend and --compare all only"
    if args.top is not None and not args.recommend:
        return "--top is read by --recommend only"
    return None


def run(args: argparse.Namespace) -> int:
    problem = usage_error(args)
    if problem is not None:
        print(f"disagg simulate: {problem}", file=sys.stderr)
        return 2
    if args.profile is not None:
        try:
            added = profiles.use_profile(args.profile)
        except ValueError as e:
            print(f"disagg simulate: {' '.join(str(e).split())}", file=sys.stderr)
            return EXIT_FAILURE
        print(f"disagg simulate: note: profile {args.profile}: {', '.join(added)}", file=sys.stderr)
    try:
        dep = SimDeployment.load(args.deployment)
        if args.startup_delay is not None:
            dep = replace(dep, startup_delay_s=args.startup_delay)
        if args.routing:
            dep = replace(dep, routing=args.routing)
        if args.link:
            dep = replace(dep, link=args.link)
        if args.no_prefix_caching:
            dep = replace(dep, prefix_caching=False)
        profiles.check(dep)
        if args.trace is not None:
            traffic_args.check(args)
            reqs = load_trace(args.trace)
            if args.duration is not None:
                reqs = truncate(reqs, args.duration)
            source = f"trace {args.trace.name}"
        else:
            reqs, source = traffic_args.generate(args)
        if args.rate_scale != 1.0:
            reqs = scale_rate(reqs, args.rate_scale)
            source += f", rate x{args.rate_scale:g}"
        if not reqs:
            if args.trace is None:
                raise ValueError(f"traffic: {source}: no request arrived; raise --rate or --duration")
            window = f" in its first {args.duration:g} s" if args.duration is not None else ""
            raise ValueError(f"trace: {args.trace} has no request{window}: nothing to simulate")
        policy = load_policy(args.policy) if args.policy else None
    except (ValueError, OSError) as e:  # TextFileError and pydantic's ValidationError are ValueErrors
        print(f"disagg simulate: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    notes = [dep.gpu_note] if dep.gpu_note else []
    for note in notes:
        print(f"disagg simulate: note: {note}", file=sys.stderr)
    slo = slo_settings(args, policy)
    runs: list[tuple[str, SimDeployment, Controller | None]] = []
    ctl = None
    log: list[DecisionRecord] = []
    if policy is not None and not args.static:
        try:
            ctl = policy_controller(policy.spec, dep, log)
        except ImportError as e:  # the policy engine is optional for the twin
            print(f"disagg simulate: no policy engine ({e}); running static", file=sys.stderr)
    runs.append((f"{dep.name} P/D" + (" +policy" if ctl else ""), dep, ctl))
    if args.compare == "colocated":
        runs.append((f"{dep.name} colocated", dep.colocated_equivalent(), None))
    results: list[tuple[str, SimResult]] = []
    reports: list[Report] = []
    extra: dict[str, Any] = {}
    lines: list[str] = []
    top = args.top or 5
    found: compare.Search | None = None
    stderr = Console(stderr=True, soft_wrap=True, markup=False, highlight=False, emoji=False)
    with simulation_progress(stderr, args.quiet) as progress:
        for label, d, c in runs:
            o = _run_with_progress(progress, args, d, reqs, slo, label, c)
            results.append((label, o.result))
            reports.append(o.report)
        try:
            if args.compare == "all":
                budget = args.gpu_budget or reports[0].gpus
                whose = (
                    "--gpu-budget"
                    if args.gpu_budget
                    else "the policy run's peak"
                    if ctl is not None
                    else "the deployment's GPUs"
                )
                rows, lines, extra["compare"] = _compare_all(progress, args, dep, reqs, slo, budget, whose)
                results += [(o.label, o.result) for o in rows]
                reports += [o.report for o in rows]
            if args.recommend:
                found = _sweep(
                    progress,
                    args,
                    "recommend",
                    lambda cb: compare.recommend(dep, reqs, slo, args.gpu_budget, top, args.seed, cb),
                )
                extra["recommend"] = {
                    "gpu_budget": args.gpu_budget,
                    "attainment_target": slo.percentile,
                    **compare.search_dict(found, top, slo.percentile),
                }
        except ValueError as e:  # no configuration fits the budget
            print(f"disagg simulate: {' '.join(str(e).split())}", file=sys.stderr)
            return 2
    print(f"{source}: {len(reqs)} requests; SLO TTFT<={slo.ttft_s:g}s, mean ITL<={slo.itl_s:g}s")
    print(format_table(reports))
    for line in lines:
        print(line)
    findings = decision_findings(results[0][1], log, dep, policy, slo) if ctl is not None else []
    for line in findings:
        print(line)
    if found is not None:
        print()
        print(
            f"recommend: {found.describe()} within {args.gpu_budget} GPUs; the top "
            f"{min(top, found.simulated)} by goodput per GPU-hour among those where at least "
            f"{slo.percentile:.0%} of requests met TTFT<={slo.ttft_s:g}s and mean ITL<={slo.itl_s:g}s"
        )
        print(compare.format_recommendations(found, top, slo.percentile))
        shown = found.ranked[:top]
        results += [(f"#{i} {o.label}", o.result) for i, o in enumerate(shown, 1)]
        reports += [replace(o.report, label=f"#{i} {o.label}") for i, o in enumerate(shown, 1)]
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        write_html(
            args.out / "report.html",
            results,
            reports,
            title=f"disagg simulate: {source}",
            findings=[*(f"note: {n}" for n in notes), *lines, *findings],
            traces={
                results[0][0]: policy_run_trace(
                    results[0][1], log, dep, policy.spec, slo.ttft_s, slo.itl_s, slo.percentile
                )
            }
            if ctl is not None and policy is not None
            else None,
        )
        summary = {
            "trace": str(args.trace) if args.trace is not None else None,
            "traffic": source if args.trace is None else None,
            "slo": slo.__dict__,
            "notes": notes,
            "runs": [r.as_dict() for r in reports],
            "replicas": {label: [[t, d] for t, d in res.replicas] for label, res in results},
            "decisions": [r.as_dict() for r in log],
            "findings": findings,
            **extra,
        }
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
        print(f"report: {args.out / 'report.html'}")
    return 0


@contextmanager
def _progress_task(
    progress: Progress, args: argparse.Namespace, label: str, unit: str, total: int | None = None
) -> Iterator[_Task]:
    """A progress bar over ``unit`` for one piece of work, removed when it ends; unless --quiet, the work's
    ``done in`` line (after :attr:`_Task.summary`, when the work set one)."""
    t0 = time.monotonic()
    task = _Task(progress, progress.add_task(label, total=total, detail=unit), unit)
    yield task
    progress.remove_task(task.id)
    if not args.quiet:
        said = f"{label}: {task.summary}" if task.summary else label
        progress.console.print(f"{said}: done in {time.monotonic() - t0:.1f}s wall")


@dataclass
class _Task:
    progress: Progress
    id: TaskID
    unit: str
    summary: str = ""

    def show(self, done: int, total: int, where: str) -> None:
        self.progress.update(self.id, completed=done, total=total, detail=f"{self.unit}  {where}")


def _run_with_progress(
    progress: Progress,
    args: argparse.Namespace,
    dep: SimDeployment,
    reqs: list[Any],
    slo: SloSettings,
    label: str,
    controller: Controller | None,
) -> compare.Outcome:
    """One run with a progress bar over its requests and, unless --quiet, a ``done in`` line."""
    with _progress_task(progress, args, label, "requests", len(reqs)) as task:
        return compare.run_one(
            dep,
            reqs,
            slo,
            label,
            controller,
            args.seed,
            lambda now, done, total: task.show(done, total, f"t={now:8.0f}s"),
        )


def _sweep(
    progress: Progress,
    args: argparse.Namespace,
    what: str,
    search: Callable[[compare.Progress], compare.Search],
) -> compare.Search:
    """A search with a progress bar over its configurations and, unless --quiet, a ``done in`` line."""
    with _progress_task(progress, args, what, "configurations") as task:
        found = search(task.show)
        task.summary = found.describe()
        return found


def _compare_all(
    progress: Progress,
    args: argparse.Namespace,
    dep: SimDeployment,
    reqs: list[Any],
    slo: SloSettings,
    budget: int,
    whose: str,
) -> tuple[list[compare.Outcome], list[str], dict[str, Any]]:
    """The three rows --compare all adds to the first run on ``budget`` GPUs, the lines that explain them
    and their summary.json entry."""
    target = slo.percentile

    def best(found: compare.Search) -> compare.Outcome:
        o = found.best
        missed = "" if compare.meets(o.report, target) else f", none met {target:.0%}"
        label = f"best static {o.label}{missed}"
        return compare.Outcome(o.deployment, label, replace(o.report, label=label), o.result)

    split = _sweep(
        progress,
        args,
        "best static P/D split",
        lambda cb: compare.best_static_split(dep, reqs, slo, budget, args.seed, cb),
    )
    colocated = _sweep(
        progress,
        args,
        "best static colocated size",
        lambda cb: compare.best_static_colocated(dep, reqs, slo, budget, args.seed, cb),
    )
    hpa_dep, most = compare.autoscaled_colocated(dep, budget)
    rows = [
        best(split),
        best(colocated),
        _run_with_progress(
            progress, args, hpa_dep, reqs, slo, f"{hpa_dep.name} autoscaled", compare.hpa_controller(most)
        ),
    ]
    lines = [
        f"compare all: every row within {budget} GPUs ({whose}); a static row is the size within it with "
        f"the most goodput per GPU-hour among those where {target:.0%} of requests met the SLO",
        f"  best static P/D split: {split.describe()}",
        f"  best static colocated: {colocated.describe()}",
        f"  colocated autoscaled: an HPA on KV-cache usage ({compare.HPA_KV_TARGET:.0%}) and waiting "
        f"requests ({compare.HPA_WAITING_TARGET:g} per replica), 1 to {most} replicas, starting on "
        f"{hpa_dep.gpus} GPUs",
    ]
    summary = {
        "gpu_budget": budget,
        "gpu_budget_from": whose,
        "attainment_target": target,
        "static_pd": compare.search_dict(split, 1, target),
        "static_colocated": compare.search_dict(colocated, 1, target),
        "autoscaled_colocated": {
            "hpa": {
                "kv_target": compare.HPA_KV_TARGET,
                "waiting_target": compare.HPA_WAITING_TARGET,
                "tolerance": compare.HPA_TOLERANCE,
                "scale_down_window_s": compare.HPA_SCALE_DOWN_WINDOW_S,
                "max_replicas": most,
            },
            "report": rows[2].report.as_dict(),
        },
    }
    return rows, lines, summary

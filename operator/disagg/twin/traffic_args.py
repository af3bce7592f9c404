"""``disagg simulate --traffic KIND``: synthetic arrivals from :mod:`disagg.twin.traffic` instead of a trace.

    --traffic poisson       --rate R [--duration S]                      Poisson arrivals at R req/s
    --traffic bursty        --rate R [--cv C] [--duration S]             gamma inter-arrivals of CV C (3)
    --traffic diurnal       --rate R [--amplitude A] [--period S]        R * (1 + A sin(2 pi t / period))
    --traffic phase-change  [--phase SECONDS:RATE[:PROMPT[:OUTPUT]]]...  consecutive Poisson phases

Every kind takes ``--prompt-mean/--prompt-cv`` and ``--output-mean/--output-cv`` (log-normal token lengths;
the default is the Azure conversation trace's shape: prompt mean 1155, output mean 211) and ``--seed``.
``--duration`` defaults to 600 s; a diurnal ``--period`` to the duration (one cycle over the run).
``phase-change`` without ``--phase`` is chat for half the duration, then long documents (8000-token
prompts) at a quarter of the rate; a ``--phase`` without PROMPT/OUTPUT means uses the chat shape.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from disagg.twin.traffic import (
    CHAT,
    CHAT_OUT,
    DOCS,
    DOCS_OUT,
    LengthDist,
    Phase,
    Request,
    diurnal,
    gamma_bursty,
    phase_change,
    poisson,
)

KINDS = ("poisson", "bursty", "diurnal", "phase-change")
DEFAULT_RATE = 5.0
DEFAULT_DURATION_S = 600.0
DEFAULT_CV = 3.0
DEFAULT_AMPLITUDE = 0.5

# the flags that only mean something with --traffic (argparse dest -> flag)
TRAFFIC_ONLY = {
    "rate": "--rate",
    "cv": "--cv",
    "amplitude": "--amplitude",
    "period": "--period",
    "phases": "--phase",
    "prompt_mean": "--prompt-mean",
    "prompt_cv": "--prompt-cv",
    "output_mean": "--output-mean",
    "output_cv": "--output-cv",
}
# which of those each kind reads (the length flags apply to every kind but phase-change's own phases)
_READS = {
    "poisson": {"rate"},
    "bursty": {"rate", "cv"},
    "diurnal": {"rate", "amplitude", "period"},
    "phase-change": {"rate", "phases"},
}
_LENGTHS = {"prompt_mean", "prompt_cv", "output_mean", "output_cv"}


def _number(value: str, what: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"{what}: must be finite, got {value}")
    return number


def _positive(value: str) -> float:
    number = _number(value, "value")
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {value}")
    return number


def _amplitude(value: str) -> float:
    number = _number(value, "amplitude")
    if not 0 <= number < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return number


@dataclass(frozen=True)
class PhaseArg:
    duration_s: float
    rate: float
    prompt_mean: float | None = None
    output_mean: float | None = None


def _phase(value: str) -> PhaseArg:
    """``SECONDS:RATE[:PROMPT_MEAN[:OUTPUT_MEAN]]``, e.g. ``300:5`` or ``300:1.5:8000:300``."""
    parts = value.split(":")
    if not 2 <= len(parts) <= 4:
        raise argparse.ArgumentTypeError(
            "expected SECONDS:RATE[:PROMPT_MEAN[:OUTPUT_MEAN]] (e.g. 300:5 or 300:1.5:8000:300), "
            f"got {value!r}"
        )
    names = ("seconds", "rate", "prompt mean", "output mean")
    numbers = [_number(p, f"phase {value!r}: {n}") for p, n in zip(parts, names, strict=False)]
    for number, name in zip(numbers, names, strict=False):
        if number <= 0:
            raise argparse.ArgumentTypeError(f"phase {value!r}: {name} must be > 0, got {number:g}")
    return PhaseArg(*numbers)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--traffic`` flags (``--trace`` and ``--traffic`` are declared by the caller, one required)."""
    group = parser.add_argument_group(
        "synthetic traffic (--traffic)",
        "poisson: --rate; bursty: --rate --cv; diurnal: --rate --amplitude --period; "
        "phase-change: --phase SECONDS:RATE[:PROMPT_MEAN[:OUTPUT_MEAN]] (repeat), or chat then long "
        "documents at a quarter of --rate. --duration is the length (default 600 s).",
    )
    group.add_argument("--rate", type=_positive, help=f"mean requests per second (default {DEFAULT_RATE:g})")
    group.add_argument("--cv", type=_positive, help=f"bursty: inter-arrival CV (default {DEFAULT_CV:g})")
    group.add_argument(
        "--amplitude",
        type=_amplitude,
        help=f"diurnal: relative swing in [0, 1) (default {DEFAULT_AMPLITUDE})",
    )
    group.add_argument("--period", type=_positive, help="diurnal: seconds per cycle (default: --duration)")
    group.add_argument(
        "--phase",
        dest="phases",
        action="append",
        type=_phase,
        metavar="SECONDS:RATE[:PROMPT_MEAN[:OUTPUT_MEAN]]",
        help="phase-change: one phase (repeat in order)",
    )
    group.add_argument("--prompt-mean", type=_positive, help=f"prompt tokens mean (default {CHAT.mean:g})")
    group.add_argument("--prompt-cv", type=_positive, help=f"prompt tokens CV (default {CHAT.cv:g})")
    group.add_argument(
        "--output-mean", type=_positive, help=f"output tokens mean (default {CHAT_OUT.mean:g})"
    )
    group.add_argument("--output-cv", type=_positive, help=f"output tokens CV (default {CHAT_OUT.cv:g})")


def check(args: argparse.Namespace) -> None:
    """ValueError naming a ``--traffic`` flag given with ``--trace``, or one the chosen kind ignores."""
    given = [dest for dest in TRAFFIC_ONLY if getattr(args, dest, None) is not None]
    if args.traffic is None:
        if given:
            flags = ", ".join(TRAFFIC_ONLY[d] for d in given)
            raise ValueError(f"{flags}: only with --traffic (a --trace brings its own arrivals and lengths)")
        return
    unused = [TRAFFIC_ONLY[d] for d in given if d not in _READS[args.traffic] | _LENGTHS]
    if unused:
        raise ValueError(f"{', '.join(unused)}: not read by {args.traffic}")
    if args.traffic == "phase-change" and args.phases:
        unused = [TRAFFIC_ONLY[d] for d in given if d in _LENGTHS | {"rate"}]
        unused += ["--duration"] if args.duration is not None else []
        if unused:
            raise ValueError(f"{', '.join(unused)}: each --phase sets its own length, rate and token lengths")


def _length(mean: float | None, cv: float | None, default: LengthDist) -> LengthDist:
    return LengthDist(
        mean=mean if mean is not None else default.mean, cv=cv if cv is not None else default.cv
    )


def generate(args: argparse.Namespace) -> tuple[list[Request], str]:
    """The requests of ``--traffic`` and a one-line description of what was generated."""
    check(args)
    kind: str = args.traffic
    duration = args.duration if args.duration is not None else DEFAULT_DURATION_S
    rate = args.rate if args.rate is not None else DEFAULT_RATE
    prompt = _length(args.prompt_mean, args.prompt_cv, CHAT)
    output = _length(args.output_mean, args.output_cv, CHAT_OUT)
    seed: int = args.seed
    lengths = (
        f"prompt mean {prompt.mean:g} (CV {prompt.cv:g}), output mean {output.mean:g} (CV {output.cv:g})"
    )
    if kind == "poisson":
        return poisson(rate, duration, prompt, output, seed), (
            f"poisson {rate:g} req/s for {duration:g} s, {lengths}, seed {seed}"
        )
    if kind == "bursty":
        cv = args.cv if args.cv is not None else DEFAULT_CV
        return gamma_bursty(rate, duration, cv, prompt, output, seed), (
            f"bursty {rate:g} req/s (inter-arrival CV {cv:g}) for {duration:g} s, {lengths}, seed {seed}"
        )
    if kind == "diurnal":
        amplitude = args.amplitude if args.amplitude is not None else DEFAULT_AMPLITUDE
        period = args.period if args.period is not None else duration
        return diurnal(rate, duration, period, amplitude, prompt, output, seed), (
            f"diurnal {rate:g} req/s x (1 {amplitude:+g} sin(2 pi t / {period:g} s)) for {duration:g} s, "
            f"{lengths}, seed {seed}"
        )
    if args.phases:
        phases = [
            Phase(
                p.duration_s,
                p.rate,
                _length(p.prompt_mean, None, CHAT),
                _length(p.output_mean, None, CHAT_OUT),
            )
            for p in args.phases
        ]
    else:
        half = duration / 2
        phases = [Phase(half, rate, prompt, output), Phase(half, rate / 4, DOCS, DOCS_OUT)]
    shown = ", ".join(
        f"{p.duration_s:g} s at {p.rate:g} req/s (prompt {p.prompt.mean:g}, output {p.output.mean:g})"
        for p in phases
    )
    return phase_change(phases, seed), f"phase-change: {shown}; seed {seed}"

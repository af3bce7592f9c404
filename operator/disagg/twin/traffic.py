"""Request traces for the twin: loaders for published trace formats and synthetic generators.

Formats (auto-detected by :func:`load_trace`):

* Azure LLM inference trace CSV (Azure Public Dataset, Splitwise ISCA 2024): ``TIMESTAMP,ContextTokens,
  GeneratedTokens`` with timestamps like ``2023-11-16 18:15:46.6805900``.
* Mooncake JSONL (kvcache-ai/Mooncake, FAST 2025): ``timestamp`` (ms), ``input_length``, ``output_length``,
  ``hash_ids``.
* BurstGPT CSV (HPMLL/BurstGPT): ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``;
  ``Timestamp`` in seconds; rows with zero response tokens (failed requests) are skipped.

Every loader returns requests sorted by arrival, with arrival times relative to the first request.
Generators take a seed and are deterministic for it.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np


@dataclass(frozen=True, slots=True)
class Request:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_hashes: tuple[int, ...] = ()  # one hash per prompt block (Mooncake: 512 tokens); equal = shared


def _relative(reqs: Iterable[Request]) -> list[Request]:
    out = sorted(reqs, key=lambda r: r.arrival_s)
    if not out:
        return out
    t0 = out[0].arrival_s
    return [replace(r, arrival_s=r.arrival_s - t0) for r in out]


def _parse_azure_time(text: str) -> float:
    # Seven fractional digits: keep microseconds for datetime. The trace's clock has no zone; read it as UTC,
    # not as the machine's local time (where a daylight-saving change inside the trace would move arrivals
    # by an hour, and the epoch offset the last bits of every gap)
    head, _, frac = text.strip().partition(".")
    dt = datetime.fromisoformat(head).replace(tzinfo=UTC)
    return dt.timestamp() + (float("0." + frac) if frac else 0.0)


def load_azure_csv(path: Path) -> list[Request]:
    out: list[Request] = []
    with path.open(newline="") as f:
        for i, row in enumerate(csv.DictReader(f), start=2):
            try:
                out.append(
                    Request(
                        _parse_azure_time(row["TIMESTAMP"]),
                        int(row["ContextTokens"]),
                        int(row["GeneratedTokens"]),
                    )
                )
            except (KeyError, ValueError) as e:
                raise ValueError(f"{path}:{i}: bad Azure trace row ({e}): {row}") from e
    return _relative(out)


def load_mooncake_jsonl(path: Path) -> list[Request]:
    out: list[Request] = []
    with path.open() as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                hashes = tuple(int(h) for h in obj.get("hash_ids", ()))
                out.append(
                    Request(
                        float(obj["timestamp"]) / 1000,
                        int(obj["input_length"]),
                        int(obj["output_length"]),
                        hashes,
                    )
                )
            except (KeyError, ValueError, TypeError) as e:
                raise ValueError(f"{path}:{i}: bad Mooncake record ({e})") from e
    return _relative(out)


def load_burstgpt_csv(path: Path) -> list[Request]:
    out: list[Request] = []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is not None:
            reader.fieldnames = [n.strip() for n in reader.fieldnames]
        for i, row in enumerate(reader, start=2):
            try:
                response = int(float(row["Response tokens"]))
                if response <= 0:
                    continue
                out.append(Request(float(row["Timestamp"]), int(float(row["Request tokens"])), response))
            except (KeyError, ValueError) as e:
                raise ValueError(f"{path}:{i}: bad BurstGPT row ({e}): {row}") from e
    return _relative(out)


def detect_format(path: Path) -> str:
    """``azure``, ``mooncake`` or ``burstgpt`` from the file's first line."""
    with path.open() as f:
        first = f.readline().strip()
    if first.startswith("{"):
        return "mooncake"
    header = {h.strip() for h in first.split(",")}
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= header:
        return "azure"
    if {"Timestamp", "Request tokens", "Response tokens"} <= header:
        return "burstgpt"
    raise ValueError(f"trace: cannot tell the format of {path} from its first line {first[:80]!r}")


def load_trace(path: str | Path) -> list[Request]:
    """Load a trace, detecting Azure CSV, Mooncake JSONL or BurstGPT CSV."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"trace: {p} is not a file")
    loader = {"azure": load_azure_csv, "mooncake": load_mooncake_jsonl, "burstgpt": load_burstgpt_csv}
    try:
        return loader[detect_format(p)](p)
    except UnicodeDecodeError as error:
        raise ValueError(
            f"trace: {p} is not UTF-8 text (byte 0x{error.object[error.start]:02x}): expected an Azure CSV, "
            "Mooncake JSONL or BurstGPT CSV"
        ) from error


# --- transformations ----------------------------------------------------------------------------------
def scale_time(reqs: Sequence[Request], factor: float) -> list[Request]:
    """Stretch (factor > 1) or compress arrival times; the rate changes by 1/factor."""
    if factor <= 0:
        raise ValueError(f"factor: must be > 0, got {factor}")
    return [replace(r, arrival_s=r.arrival_s * factor) for r in reqs]


def scale_rate(reqs: Sequence[Request], factor: float) -> list[Request]:
    """Multiply the request rate by ``factor`` keeping the trace's shape (time compression)."""
    return scale_time(reqs, 1.0 / factor)


def truncate(reqs: Sequence[Request], duration_s: float) -> list[Request]:
    return [r for r in reqs if r.arrival_s < duration_s]


# --- generators ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LengthDist:
    """Log-normal token lengths with a given mean and coefficient of variation, clipped to [lo, hi]."""

    mean: float
    cv: float = 1.0
    lo: int = 1
    hi: int = 32768

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        sigma2 = math.log(1 + self.cv**2)
        mu = math.log(self.mean) - sigma2 / 2
        out: np.ndarray = np.clip(np.rint(rng.lognormal(mu, math.sqrt(sigma2), n)), self.lo, self.hi).astype(
            int
        )
        return out


CHAT = LengthDist(mean=1155, cv=0.8)  # Azure conversation trace: prompt mean 1155 (../shared/README.md)
CHAT_OUT = LengthDist(mean=211, cv=0.9)  # output mean 211
DOCS = LengthDist(mean=8000, cv=0.5)  # long-document phase (assumption for phase-change scenarios)
DOCS_OUT = LengthDist(mean=300, cv=0.8)


def _with_lengths(
    times: np.ndarray, prompt: LengthDist, output: LengthDist, rng: np.random.Generator
) -> list[Request]:
    p = prompt.sample(rng, len(times))
    o = output.sample(rng, len(times))
    return [Request(float(t), int(a), int(b)) for t, a, b in zip(times, p, o, strict=True)]


def poisson(
    rate: float, duration_s: float, prompt: LengthDist = CHAT, output: LengthDist = CHAT_OUT, seed: int = 0
) -> list[Request]:
    return gamma_bursty(rate, duration_s, cv=1.0, prompt=prompt, output=output, seed=seed)


def gamma_bursty(
    rate: float,
    duration_s: float,
    cv: float = 3.0,
    prompt: LengthDist = CHAT,
    output: LengthDist = CHAT_OUT,
    seed: int = 0,
) -> list[Request]:
    """Gamma inter-arrivals with mean 1/rate and coefficient of variation ``cv`` (cv=1 is Poisson)."""
    if rate <= 0 or duration_s <= 0 or cv <= 0:
        raise ValueError("rate, duration_s and cv must be > 0")
    rng = np.random.default_rng(seed)
    shape = 1.0 / cv**2
    n = int(rate * duration_s * 1.5) + 16
    gaps = rng.gamma(shape, 1.0 / (rate * shape), n)
    times = np.cumsum(gaps)
    while times[-1] < duration_s:
        times = np.concatenate([times, times[-1] + np.cumsum(rng.gamma(shape, 1.0 / (rate * shape), n))])
    times = times[times < duration_s]
    return _with_lengths(times, prompt, output, rng)


def nonhomogeneous_poisson(
    rate_fn: np.ndarray, peak: float, duration_s: float, rng: np.random.Generator
) -> np.ndarray:
    """Non-homogeneous Poisson by thinning; ``rate_fn`` sampled per second."""
    n = rng.poisson(peak * duration_s)
    cand = np.sort(rng.uniform(0, duration_s, n))
    keep = rng.uniform(0, peak, n) < rate_fn[np.minimum(cand.astype(int), len(rate_fn) - 1)]
    out: np.ndarray = cand[keep]
    return out


def diurnal(
    mean_rate: float,
    duration_s: float,
    period_s: float = 86400.0,
    amplitude: float = 0.5,
    prompt: LengthDist = CHAT,
    output: LengthDist = CHAT_OUT,
    seed: int = 0,
) -> list[Request]:
    """Rate ``mean_rate * (1 + amplitude * sin(2*pi*t/period))`` (Poisson arrivals)."""
    if not 0 <= amplitude < 1:
        raise ValueError(f"amplitude: must be in [0, 1), got {amplitude}")
    rng = np.random.default_rng(seed)
    t = np.arange(math.ceil(duration_s))
    rate = mean_rate * (1 + amplitude * np.sin(2 * np.pi * t / period_s))
    times = nonhomogeneous_poisson(rate, mean_rate * (1 + amplitude), duration_s, rng)
    return _with_lengths(times, prompt, output, rng)


@dataclass(frozen=True)
class Phase:
    duration_s: float
    rate: float
    prompt: LengthDist = CHAT
    output: LengthDist = CHAT_OUT


def phase_change(phases: Sequence[Phase], seed: int = 0) -> list[Request]:
    """Consecutive Poisson phases, e.g. chat traffic turning into long-document traffic."""
    out: list[Request] = []
    t0 = 0.0
    for i, ph in enumerate(phases):
        part = poisson(ph.rate, ph.duration_s, ph.prompt, ph.output, seed=seed * 1000 + i)
        out.extend(replace(r, arrival_s=r.arrival_s + t0) for r in part)
        t0 += ph.duration_s
    return out


def chat_to_documents(rate: float, phase_s: float, seed: int = 0) -> list[Request]:
    return phase_change([Phase(phase_s, rate), Phase(phase_s, rate / 4, DOCS, DOCS_OUT)], seed=seed)

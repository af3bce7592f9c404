"""Traffic families for judging a ratio policy by how it generalises, and the train/test protocol.

A family is a frozen dataclass of parameters whose ``generate(seed)`` returns a request list (sorted,
deterministic per seed). :func:`sample_params` draws a family's parameters from its documented ranges;
:func:`training_set` and :func:`test_set` fix the cases a policy is tuned on and the ones it is judged on.
The test set uses other seeds and other parameter draws than the training set, half of them outside the
training ranges (steeper ramps, higher peak/trough, shorter and larger bursts, ...): a constant that only
fits the training draws shows up there.

Families (each with a TTFT/ITL SLO suited to its prompt lengths; ITL p90 50 ms everywhere):

* ``diurnal``: a day of traffic compressed into 1 or 2 hours. Production LLM services follow the working
  day: a night trough and a day peak (BurstGPT, Wang et al. 2024, arXiv:2401.17644, reports periodic daily
  patterns in Azure OpenAI conversation traffic; the week-long Azure LLM inference trace 2024 released with
  DynamoLLM, HPCA 2025, shows the same daily cycle). Parameters: peak/trough ratio, ramp steepness (the
  exponent of a raised cosine: above 1 a narrower peak with steeper ramps), where in the day the peak
  falls (early: a fast morning ramp and a slow evening decline), multiplicative per-minute noise.
* ``flash-bursts``: a Poisson baseline plus bursts shorter than an evaluation interval (30 s) of hundreds of
  requests (BurstGPT reports bursty, far from Poisson, arrivals in API traffic; the Azure code trace in
  ../shared is very bursty too).
* ``mix-shift``: phases moving chat -> code -> long documents -> code -> chat ..., each class with its own
  lengths and rate (chat and code lengths from the Azure 2023 conversation and code traces: prompt mean
  1155 / 2048, output mean 211 / 28), with linear ramps between phases.
* ``heavy-tail``: log-normal prompt and output lengths with large spread, correlated through a Gaussian
  copula (a shared latent): long prompts tend to get long answers.
* ``prefix-reuse``: requests that start with one of a pool of shared prefixes (system prompts, documents)
  chosen by Zipf popularity, with a reuse probability; ``prefix_hashes`` hold one id per 512-token block as
  the Mooncake trace format does (kvcache-ai/Mooncake, FAST 2025): equal ids mean an equal prefix.
* ``multi-turn``: sessions of several turns whose prompt grows with the conversation (previous prompt +
  previous answer + the new user message), a think time between turns, prefix hashes shared across the
  turns of a session and a system prompt shared by all sessions; long context (8k-60k tokens), like the
  multi-turn long-context production trace Mooncake published.

Rates are scaled so that the best allocations of the bench's deployment (Llama-3.1-70B FP8, TP2 per replica
on H100, 1..16 replicas per pool) range over a few to about a dozen replicas per pool at peak, and so that a
case stays under :data:`MAX_REQUESTS` requests (a simulation of a few seconds): where a draw would exceed it,
its rate is scaled down to the budget (:meth:`expected_requests`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import ClassVar, Literal

import numpy as np

from disagg.twin.traffic import CHAT, CHAT_OUT, LengthDist, Request, gamma_bursty, nonhomogeneous_poisson

BLOCK_TOKENS = 512  # Mooncake hash_ids: one id per 512-token block
MAX_REQUESTS = 55_000  # per case: keeps one simulation at a few seconds
MAX_PROMPT = 65_536
MAX_OUTPUT = 4_096

# Azure LLM inference trace 2023, code (../shared/README.md): prompt mean 2048, output mean 28
CODE = LengthDist(mean=2048, cv=1.0, hi=16384)
CODE_OUT = LengthDist(mean=28, cv=1.5, lo=1, hi=1024)

Split = Literal["train", "test", "beyond"]
Ranges = Mapping[str, tuple[float, float]]


def _lognormal(mean: float, cv: float) -> tuple[float, float]:
    """(mu, sigma) of a log-normal with this mean and coefficient of variation."""
    s2 = math.log(1.0 + cv * cv)
    return math.log(mean) - s2 / 2.0, math.sqrt(s2)


def _requests(
    times: np.ndarray,
    prompts: np.ndarray,
    outputs: np.ndarray,
    hashes: Sequence[tuple[int, ...]] | None = None,
) -> list[Request]:
    order = np.argsort(times, kind="stable")
    return [
        Request(
            float(times[i]),
            int(prompts[i]),
            int(outputs[i]),
            hashes[i] if hashes is not None else (),
        )
        for i in order
    ]


def _gamma_times(rate: float, cv: float, duration_s: float, seed: int) -> np.ndarray:
    """Arrival times of :func:`disagg.twin.traffic.gamma_bursty` (its lengths are drawn afresh here)."""
    return np.array([r.arrival_s for r in gamma_bursty(rate, duration_s, cv=cv, seed=seed + 7919)])


def _blocks(tokens: int) -> int:
    return -(-tokens // BLOCK_TOKENS)


# --- diurnal -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Diurnal:
    """A day compressed into ``duration_s``: trough at the start and the end, peak at ``peak_at``."""

    name: ClassVar[str] = "diurnal"
    ttft_slo_s: ClassVar[float] = 2.0
    itl_slo_s: ClassVar[float] = 0.05
    TRAIN: ClassVar[Ranges] = {
        "duration_s": (3600, 7200),
        "peak_rate": (12.0, 28.0),
        "peak_to_trough": (2.0, 6.0),
        "steepness": (0.7, 2.0),
        "peak_at": (0.45, 0.65),
        "noise_cv": (0.0, 0.15),
        "prompt_mean": (1000, 3000),
        "output_mean": (150, 400),
    }
    TEST: ClassVar[Ranges] = {
        "duration_s": (3600, 7200),
        "peak_rate": (10.0, 34.0),
        "peak_to_trough": (2.0, 12.0),
        "steepness": (0.5, 4.0),
        "peak_at": (0.3, 0.7),
        "noise_cv": (0.0, 0.3),
        "prompt_mean": (800, 4000),
        "output_mean": (100, 500),
    }
    INTEGER: ClassVar[frozenset[str]] = frozenset()
    RATES: ClassVar[tuple[str, ...]] = ("peak_rate",)

    duration_s: float = 3600.0
    peak_rate: float = 20.0  # req/s at the peak
    peak_to_trough: float = 4.0
    steepness: float = 1.0  # exponent of the raised cosine
    peak_at: float = 0.55  # fraction of the day
    noise_cv: float = 0.1  # per-minute multiplicative noise (AR(1), mean 1)
    prompt_mean: float = 1155.0
    output_mean: float = 211.0

    def __post_init__(self) -> None:
        if self.peak_to_trough < 1 or not 0 < self.peak_at < 1 or self.steepness <= 0:
            raise ValueError(f"diurnal: bad parameters {self}")

    def shape(self, t: np.ndarray) -> np.ndarray:
        """Rate relative to the peak at times ``t`` (noise-free): 1 at the peak, 1/peak_to_trough at night."""
        u = np.clip(np.asarray(t, dtype=float) / self.duration_s, 0.0, 1.0)
        p = self.peak_at
        warped = np.where(u < p, 0.5 * u / p, 0.5 + 0.5 * (u - p) / (1.0 - p))
        bump = ((1.0 - np.cos(2.0 * np.pi * warped)) / 2.0) ** self.steepness
        trough = 1.0 / self.peak_to_trough
        out: np.ndarray = trough + (1.0 - trough) * bump
        return out

    def rate(self, rng: np.random.Generator | None = None) -> np.ndarray:
        """Requests per second for each second of the trace (with noise when ``rng`` is given)."""
        t = np.arange(math.ceil(self.duration_s), dtype=float)
        rate = self.peak_rate * self.shape(t)
        if rng is not None and self.noise_cv > 0:
            minutes = len(t) // 60 + 1
            _, sigma = _lognormal(1.0, self.noise_cv)
            z = np.empty(minutes)
            z[0] = rng.standard_normal()
            for i in range(1, minutes):  # AR(1), correlation 0.7 from one minute to the next
                z[i] = 0.7 * z[i - 1] + math.sqrt(1 - 0.49) * rng.standard_normal()
            rate = rate * np.exp(sigma * z - sigma * sigma / 2.0)[(t // 60).astype(int)]
        return rate

    def expected_requests(self) -> float:
        return float(self.rate().sum())

    def generate(self, seed: int) -> list[Request]:
        rng = np.random.default_rng(seed)
        rate = self.rate(rng)
        times = nonhomogeneous_poisson(rate, float(rate.max()), self.duration_s, rng)
        prompt = LengthDist(self.prompt_mean, CHAT.cv, hi=32768).sample(rng, len(times))
        output = LengthDist(self.output_mean, CHAT_OUT.cv, hi=MAX_OUTPUT).sample(rng, len(times))
        return _requests(times, prompt, output)


# --- flash bursts --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FlashBursts:
    """A Poisson baseline plus ``bursts_per_hour`` bursts, each of :attr:`burst_requests` requests within
    ``burst_s`` seconds; ``burst_share`` of all requests come in bursts."""

    name: ClassVar[str] = "flash-bursts"
    ttft_slo_s: ClassVar[float] = 2.0
    itl_slo_s: ClassVar[float] = 0.05
    TRAIN: ClassVar[Ranges] = {
        "base_rate": (6.0, 16.0),
        "base_prompt_mean": (1000, 2500),
        "bursts_per_hour": (4, 12),
        "burst_s": (8.0, 25.0),
        "burst_share": (0.02, 0.08),
        "burst_prompt_mean": (1000, 3000),
    }
    TEST: ClassVar[Ranges] = {
        "base_rate": (4.0, 20.0),
        "base_prompt_mean": (800, 3000),
        "bursts_per_hour": (2, 24),
        "burst_s": (2.0, 29.0),
        "burst_share": (0.01, 0.15),
        "burst_prompt_mean": (600, 6000),
    }
    INTEGER: ClassVar[frozenset[str]] = frozenset({"bursts_per_hour"})
    RATES: ClassVar[tuple[str, ...]] = ("base_rate",)

    duration_s: float = 3600.0
    base_rate: float = 8.0
    base_prompt_mean: float = 1155.0
    bursts_per_hour: int = 8
    burst_s: float = 15.0  # < 30 s: shorter than one evaluation interval
    burst_share: float = 0.05
    burst_prompt_mean: float = 2000.0

    @property
    def bursts(self) -> int:
        return max(1, round(self.bursts_per_hour * self.duration_s / 3600.0))

    @property
    def burst_requests(self) -> int:
        base = self.base_rate * self.duration_s
        return max(1, round(self.burst_share / (1.0 - self.burst_share) * base / self.bursts))

    def burst_starts(self, rng: np.random.Generator) -> np.ndarray:
        """Burst start times: spread over the trace (one per slot of equal length, jittered inside it)."""
        slot = self.duration_s / self.bursts
        jitter = rng.uniform(0.1, 0.9, self.bursts) * max(slot - self.burst_s, 0.0)
        out: np.ndarray = np.arange(self.bursts) * slot + jitter
        return out

    def expected_requests(self) -> float:
        return self.base_rate * self.duration_s + self.bursts * self.burst_requests

    def generate(self, seed: int) -> list[Request]:
        rng = np.random.default_rng(seed)
        n_base = rng.poisson(self.base_rate * self.duration_s)
        base = np.sort(rng.uniform(0.0, self.duration_s, n_base))
        starts = self.burst_starts(rng)
        burst = np.concatenate([s + rng.uniform(0.0, self.burst_s, self.burst_requests) for s in starts])
        times = np.concatenate([base, burst])
        prompt = np.concatenate(
            [
                LengthDist(self.base_prompt_mean, CHAT.cv, hi=32768).sample(rng, len(base)),
                LengthDist(self.burst_prompt_mean, CHAT.cv, hi=32768).sample(rng, len(burst)),
            ]
        )
        output = CHAT_OUT.sample(rng, len(times))
        return _requests(times, prompt, output)


# --- mix shift -----------------------------------------------------------------------------------------
MIX_ORDER = ("chat", "code", "docs", "code")  # then chat again: chat -> code -> docs -> code -> chat ...


@dataclass(frozen=True)
class MixShift:
    """Phases of one dominant class (chat, code, long documents) with linear ramps between them; during a
    phase the other classes keep ``background`` of their own rate."""

    name: ClassVar[str] = "mix-shift"
    ttft_slo_s: ClassVar[float] = 4.0
    itl_slo_s: ClassVar[float] = 0.05
    TRAIN: ClassVar[Ranges] = {
        "phase_s": (420.0, 900.0),
        "ramp_s": (60.0, 240.0),
        "chat_rate": (12.0, 26.0),
        "chat_output_mean": (200, 450),
        "code_rate": (10.0, 22.0),
        "docs_rate": (2.0, 4.5),
        "docs_prompt_mean": (6000, 12000),
        "background": (0.03, 0.15),
    }
    TEST: ClassVar[Ranges] = {
        "phase_s": (240.0, 1200.0),
        "ramp_s": (0.0, 400.0),
        "chat_rate": (8.0, 32.0),
        "chat_output_mean": (150, 600),
        "code_rate": (6.0, 28.0),
        "docs_rate": (1.0, 6.0),
        "docs_prompt_mean": (4000, 16000),
        "background": (0.0, 0.25),
    }
    INTEGER: ClassVar[frozenset[str]] = frozenset()
    RATES: ClassVar[tuple[str, ...]] = ("chat_rate", "code_rate", "docs_rate")

    duration_s: float = 3600.0
    phase_s: float = 600.0  # mean phase length (each phase drawn in [0.6, 1.4] of it)
    ramp_s: float = 120.0  # 0: abrupt
    chat_rate: float = 16.0
    chat_output_mean: float = 211.0  # Azure conversation trace: 211
    code_rate: float = 12.0
    docs_rate: float = 2.0
    docs_prompt_mean: float = 8000.0
    background: float = 0.1

    def lengths(self) -> dict[str, tuple[LengthDist, LengthDist]]:
        return {
            "chat": (CHAT, LengthDist(self.chat_output_mean, CHAT_OUT.cv, hi=MAX_OUTPUT)),
            "code": (CODE, CODE_OUT),
            "docs": (LengthDist(self.docs_prompt_mean, 0.5, hi=32768), LengthDist(300, 0.8, hi=MAX_OUTPUT)),
        }

    def phases(self, rng: np.random.Generator | None) -> list[tuple[float, str]]:
        """(start, dominant class) of each phase."""
        out: list[tuple[float, str]] = []
        t, i = 0.0, 0
        while t < self.duration_s:
            out.append((t, MIX_ORDER[i % len(MIX_ORDER)]))
            t += self.phase_s * (rng.uniform(0.6, 1.4) if rng is not None else 1.0)
            i += 1
        return out

    def weights(self, rng: np.random.Generator | None) -> dict[str, np.ndarray]:
        """Per class and second: its share of its own full rate (1 in its phase, ``background`` outside),
        ramped linearly over ``ramp_s`` centred on each phase boundary."""
        t = np.arange(math.ceil(self.duration_s), dtype=float)
        phases = self.phases(rng)
        out: dict[str, np.ndarray] = {}
        for cls in ("chat", "code", "docs"):
            level = np.array([1.0 if c == cls else self.background for _, c in phases])
            starts = np.array([s for s, _ in phases])
            idx = np.searchsorted(starts, t, side="right") - 1
            w = level[idx]
            if self.ramp_s > 0 and len(phases) > 1:
                for k in range(1, len(phases)):
                    lo, hi = starts[k] - self.ramp_s / 2, starts[k] + self.ramp_s / 2
                    inside = (t >= lo) & (t < hi)
                    frac = (t[inside] - lo) / self.ramp_s
                    w[inside] = level[k - 1] + (level[k] - level[k - 1]) * frac
            out[cls] = w
        return out

    def rates(self) -> dict[str, float]:
        return {"chat": self.chat_rate, "code": self.code_rate, "docs": self.docs_rate}

    def expected_requests(self) -> float:
        w = self.weights(None)
        return float(sum(self.rates()[c] * w[c].sum() for c in w))

    def generate(self, seed: int) -> list[Request]:
        rng = np.random.default_rng(seed)
        weights = self.weights(rng)
        times, prompts, outputs = [], [], []
        for cls, (pd, od) in self.lengths().items():
            rate = self.rates()[cls] * weights[cls]
            ts = nonhomogeneous_poisson(rate, max(float(rate.max()), 1e-9), self.duration_s, rng)
            times.append(ts)
            prompts.append(pd.sample(rng, len(ts)))
            outputs.append(od.sample(rng, len(ts)))
        return _requests(np.concatenate(times), np.concatenate(prompts), np.concatenate(outputs))


# --- heavy tail ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HeavyTail:
    """Gamma inter-arrivals; log-normal prompt and output lengths of large spread whose logarithms are
    correlated (Gaussian copula, correlation ``rho``)."""

    name: ClassVar[str] = "heavy-tail"
    ttft_slo_s: ClassVar[float] = 4.0
    itl_slo_s: ClassVar[float] = 0.05
    TRAIN: ClassVar[Ranges] = {
        "rate": (6.0, 14.0),
        "arrival_cv": (1.0, 2.0),
        "prompt_median": (500, 1500),
        "prompt_sigma": (1.0, 1.5),
        "output_median": (80, 250),
        "output_sigma": (0.8, 1.2),
        "rho": (0.2, 0.6),
    }
    TEST: ClassVar[Ranges] = {
        "rate": (4.0, 16.0),
        "arrival_cv": (1.0, 3.0),
        "prompt_median": (400, 2000),
        "prompt_sigma": (0.8, 1.8),
        "output_median": (60, 350),
        "output_sigma": (0.6, 1.5),
        "rho": (0.0, 0.85),
    }
    INTEGER: ClassVar[frozenset[str]] = frozenset()
    RATES: ClassVar[tuple[str, ...]] = ("rate",)

    duration_s: float = 3600.0
    rate: float = 8.0
    arrival_cv: float = 1.5  # of the gamma inter-arrival times (1: Poisson)
    prompt_median: float = 1000.0
    prompt_sigma: float = 1.2  # of log(prompt)
    output_median: float = 150.0
    output_sigma: float = 1.0
    rho: float = 0.4

    def expected_requests(self) -> float:
        return self.rate * self.duration_s

    def generate(self, seed: int) -> list[Request]:
        rng = np.random.default_rng(seed)
        times = _gamma_times(self.rate, self.arrival_cv, self.duration_s, seed)
        z1 = rng.standard_normal(len(times))
        z2 = self.rho * z1 + math.sqrt(1.0 - self.rho**2) * rng.standard_normal(len(times))
        prompt = np.clip(np.rint(self.prompt_median * np.exp(self.prompt_sigma * z1)), 16, MAX_PROMPT)
        output = np.clip(np.rint(self.output_median * np.exp(self.output_sigma * z2)), 1, MAX_OUTPUT)
        return _requests(times, prompt, output)


# --- prefix reuse --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PrefixReuse:
    """With probability ``reuse_p`` a request starts with one of ``n_prefixes`` shared prefixes (Zipf
    popularity, exponent ``zipf_s``) followed by its own suffix; otherwise its prompt is its own."""

    name: ClassVar[str] = "prefix-reuse"
    ttft_slo_s: ClassVar[float] = 3.0
    itl_slo_s: ClassVar[float] = 0.05
    TRAIN: ClassVar[Ranges] = {
        "rate": (4.0, 12.0),
        "arrival_cv": (1.0, 2.0),
        "n_prefixes": (20, 200),
        "zipf_s": (0.8, 1.3),
        "prefix_mean": (2000, 7000),
        "suffix_mean": (200, 1200),
        "reuse_p": (0.4, 0.9),
        "output_mean": (100, 350),
    }
    TEST: ClassVar[Ranges] = {
        "rate": (3.0, 15.0),
        "arrival_cv": (1.0, 3.0),
        "n_prefixes": (5, 500),
        "zipf_s": (0.6, 1.6),
        "prefix_mean": (1500, 10000),
        "suffix_mean": (100, 2000),
        "reuse_p": (0.1, 0.97),
        "output_mean": (80, 450),
    }
    INTEGER: ClassVar[frozenset[str]] = frozenset({"n_prefixes"})
    RATES: ClassVar[tuple[str, ...]] = ("rate",)

    duration_s: float = 3600.0
    rate: float = 8.0
    arrival_cv: float = 1.5
    n_prefixes: int = 50
    zipf_s: float = 1.0
    prefix_mean: float = 4000.0  # tokens of a shared prefix (each prefix's length drawn once)
    suffix_mean: float = 500.0
    reuse_p: float = 0.7
    output_mean: float = 200.0

    def expected_requests(self) -> float:
        return self.rate * self.duration_s

    def generate(self, seed: int) -> list[Request]:
        rng = np.random.default_rng(seed)
        times = _gamma_times(self.rate, self.arrival_cv, self.duration_s, seed)
        n = len(times)
        prefix_len = LengthDist(self.prefix_mean, 0.5, lo=BLOCK_TOKENS, hi=32768).sample(rng, self.n_prefixes)
        first_id = np.concatenate([[0], np.cumsum(prefix_len // BLOCK_TOKENS)])
        next_id = int(first_id[-1])
        popularity = 1.0 / np.arange(1, self.n_prefixes + 1) ** self.zipf_s
        choice = rng.choice(self.n_prefixes, n, p=popularity / popularity.sum())
        reuse = rng.uniform(size=n) < self.reuse_p
        suffix = LengthDist(self.suffix_mean, 1.0, hi=16384).sample(rng, n)
        own = LengthDist(self.prefix_mean, 0.5, lo=BLOCK_TOKENS, hi=32768).sample(rng, n)
        output = LengthDist(self.output_mean, 0.9, hi=MAX_OUTPUT).sample(rng, n)
        prompts = np.empty(n, dtype=int)
        hashes: list[tuple[int, ...]] = []
        for i in range(n):
            if reuse[i]:
                k = int(choice[i])
                shared = int(prefix_len[k]) // BLOCK_TOKENS  # full blocks of the prefix
                prompt = int(prefix_len[k]) + int(suffix[i])
                lead = tuple(range(int(first_id[k]), int(first_id[k]) + shared))
            else:
                prompt, shared, lead = int(own[i]) + int(suffix[i]), 0, ()
            fresh = _blocks(prompt) - shared
            hashes.append(lead + tuple(range(next_id, next_id + fresh)))
            next_id += fresh
            prompts[i] = prompt
        return _requests(times, prompts, output, hashes)


# --- multi-turn ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MultiTurn:
    """Sessions arriving as a Poisson process whose rate moves linearly from ``session_rate`` to
    ``session_rate * end_ratio``; each has a geometric number of turns (mean ``turns_mean``). The first
    prompt is a shared system prompt plus the session's own context; each next one adds the previous answer
    and a new user message, until ``max_context``. Think time between a turn's arrival and the next is
    exponential with mean ``think_s`` plus the previous answer's streaming time (``output * 0.03 s``)."""

    name: ClassVar[str] = "multi-turn"
    ttft_slo_s: ClassVar[float] = 10.0
    itl_slo_s: ClassVar[float] = 0.05
    TRAIN: ClassVar[Ranges] = {
        "session_rate": (0.25, 0.7),
        "end_ratio": (0.5, 2.0),
        "turns_mean": (3.0, 6.0),
        "context_mean": (8000, 16000),
        "user_mean": (150, 800),
        "output_mean": (150, 450),
        "think_s": (20.0, 80.0),
        "system_tokens": (500, 3000),
    }
    TEST: ClassVar[Ranges] = {
        "session_rate": (0.15, 0.9),
        "end_ratio": (0.3, 3.0),
        "turns_mean": (2.0, 9.0),
        "context_mean": (6000, 24000),
        "user_mean": (100, 1500),
        "output_mean": (100, 600),
        "think_s": (8.0, 150.0),
        "system_tokens": (0, 4000),
    }
    INTEGER: ClassVar[frozenset[str]] = frozenset()
    RATES: ClassVar[tuple[str, ...]] = ("session_rate",)

    duration_s: float = 3600.0
    session_rate: float = 0.5  # sessions/s at the start
    end_ratio: float = 1.0
    turns_mean: float = 4.0
    context_mean: float = 12000.0
    user_mean: float = 400.0
    output_mean: float = 300.0
    think_s: float = 40.0
    system_tokens: float = 1500.0
    max_context: int = 60000

    def expected_requests(self) -> float:
        return self.session_rate * (1.0 + self.end_ratio) / 2.0 * self.duration_s * self.turns_mean

    def generate(self, seed: int) -> list[Request]:
        rng = np.random.default_rng(seed)
        t = np.arange(math.ceil(self.duration_s), dtype=float)
        rate = self.session_rate * (1.0 + (self.end_ratio - 1.0) * t / self.duration_s)
        starts = nonhomogeneous_poisson(rate, float(rate.max()), self.duration_s, rng)
        system = int(self.system_tokens)
        system_ids = tuple(range(system // BLOCK_TOKENS))
        next_id = len(system_ids)
        context = LengthDist(self.context_mean, 0.6, lo=1000, hi=self.max_context // 2)
        user = LengthDist(self.user_mean, 1.0, hi=8192)
        answer = LengthDist(self.output_mean, 0.9, hi=MAX_OUTPUT)
        times: list[float] = []
        prompts: list[int] = []
        outputs: list[int] = []
        hashes: list[tuple[int, ...]] = []
        p_end = 1.0 / max(self.turns_mean, 1.0)
        for start in starts:
            turns = int(rng.geometric(p_end))
            at = float(start)
            prompt = system + int(context.sample(rng, 1)[0])
            ids = system_ids
            for turn in range(turns):
                if turn > 0:
                    prompt += int(outputs[-1]) + int(user.sample(rng, 1)[0])
                if prompt > self.max_context or at >= self.duration_s:
                    break
                out = int(answer.sample(rng, 1)[0])
                # the full blocks of the previous prompt are shared; the rest is new
                keep = ids if turn == 0 else ids[: prompts[-1] // BLOCK_TOKENS]
                fresh = _blocks(prompt) - len(keep)
                ids = keep + tuple(range(next_id, next_id + fresh))
                next_id += fresh
                times.append(at)
                prompts.append(prompt)
                outputs.append(out)
                hashes.append(ids)
                at += 0.03 * out + float(rng.exponential(self.think_s))
        return _requests(np.array(times), np.array(prompts), np.array(outputs), hashes)


FAMILIES: dict[str, type[Diurnal | FlashBursts | MixShift | HeavyTail | PrefixReuse | MultiTurn]] = {
    f.name: f for f in (Diurnal, FlashBursts, MixShift, HeavyTail, PrefixReuse, MultiTurn)
}
AnyFamily = Diurnal | FlashBursts | MixShift | HeavyTail | PrefixReuse | MultiTurn


# --- parameter sampling --------------------------------------------------------------------------------
def _beyond(train: tuple[float, float], test: tuple[float, float]) -> list[tuple[float, float]]:
    """The parts of the test range outside the training range."""
    out = []
    if test[0] < train[0]:
        out.append((test[0], train[0]))
    if test[1] > train[1]:
        out.append((train[1], test[1]))
    return out


def sample_params(family: str, rng: np.random.Generator, split: Split = "train") -> AnyFamily:
    """A draw of ``family``'s parameters: uniform over its ``TRAIN`` ranges (``train``), its wider ``TEST``
    ranges (``test``), or (``beyond``) outside the training ranges for every parameter whose test range
    extends past them (the others as ``test``). ``duration_s`` is 1 h or 2 h (``diurnal`` only; the other
    families last 1 h). A draw expecting more than :data:`MAX_REQUESTS` requests has its rate fields
    (``RATES``) scaled down to that budget."""
    cls = FAMILIES[family]
    values: dict[str, float] = {}
    for name, (lo, hi) in cls.TEST.items() if split != "train" else cls.TRAIN.items():
        if name == "duration_s":
            values[name] = float(rng.choice([3600.0, 7200.0]))
            continue
        parts = _beyond(cls.TRAIN[name], (lo, hi)) if split == "beyond" else []
        if parts:
            widths = np.array([b - a for a, b in parts])
            a, b = parts[int(rng.choice(len(parts), p=widths / widths.sum()))]
        else:
            a, b = lo, hi
        x = float(rng.uniform(a, b))
        values[name] = float(round(x)) if name in cls.INTEGER else x
    kwargs: dict[str, object] = {k: int(v) if k in cls.INTEGER else v for k, v in values.items()}
    params: AnyFamily = cls(**kwargs)  # type: ignore[arg-type]
    for _ in range(20):  # a fixed part (e.g. the bursts) does not scale: converge on the budget
        expected = params.expected_requests()
        if expected <= MAX_REQUESTS:
            break
        scale = 0.999 * MAX_REQUESTS / expected
        params = replace(params, **{k: getattr(params, k) * scale for k in cls.RATES})
    return params


def params_dict(params: AnyFamily) -> dict[str, float]:
    return {f.name: float(getattr(params, f.name)) for f in fields(params)}


# --- the protocol --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One generated trace of a family: the parameters, the seed, and the family's SLO."""

    name: str  # e.g. "diurnal/train-0"
    split: Split
    params: AnyFamily
    seed: int

    @property
    def family(self) -> str:
        return self.params.name

    @property
    def ttft_slo_s(self) -> float:
        return self.params.ttft_slo_s

    @property
    def itl_slo_s(self) -> float:
        return self.params.itl_slo_s

    def requests(self) -> list[Request]:
        return self.params.generate(self.seed)


CASES_PER_FAMILY = 2
# parameter draws and traffic seeds per set: disjoint seed ranges
_MASTER = {"train": 20250611, "test": 20250612, "validation": 20250613}
_SEEDS = {"train": 1000, "test": 9000, "validation": 5000}


def _cases(split: Literal["train", "test", "validation"], per_family: int) -> list[Case]:
    out: list[Case] = []
    for f, family in enumerate(FAMILIES):
        rng = np.random.default_rng([_MASTER[split], f])
        for j in range(per_family):
            how: Split = "train" if split == "train" else "test" if j % 2 == 0 else "beyond"
            seed = _SEEDS[split] + 100 * f + j
            out.append(Case(f"{family}/{split}-{j}", how, sample_params(family, rng, how), seed))
    return out


def training_set(per_family: int = CASES_PER_FAMILY) -> list[Case]:
    """Cases to tune a policy on: per family, draws from the training ranges."""
    return _cases("train", per_family)


def test_set(per_family: int = CASES_PER_FAMILY) -> list[Case]:
    """Cases to judge a policy on: other seeds; per family, even-numbered cases drawn from the (wider) test
    ranges and odd-numbered ones from outside the training ranges."""
    return _cases("test", per_family)


def validation_set(per_family: int = CASES_PER_FAMILY) -> list[Case]:
    """Cases to choose what the training ranges never exercise (a burst that breaches at prefill, say):
    drawn like the test set, from the test ranges and beyond the training ones, with other parameter
    draws and seeds. Tuning on it is tuning; results are reported on the test set."""
    return _cases("validation", per_family)


def family_names() -> list[str]:
    return list(FAMILIES)

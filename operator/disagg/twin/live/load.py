"""A bounded load generator for twin endpoints: replays a trace or a Poisson rate against 127.0.0.1.

Requests go to ``/v1/completions`` with the prompt as token ids (so the engine counts exactly the
trace's prompt length), ``max_tokens`` = the trace's output length and ``stream: true``; the client
measures TTFT and every inter-token gap from the SSE stream. Bounded by a request count and a wall
time; arrival times are multiplied by ``time_scale`` like the engines' step times, and the latencies it
reports are divided by it (engine seconds).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import numpy as np

from disagg.twin.traffic import load_trace


@dataclass(frozen=True)
class LoadRequest:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class LoadSettings:
    target: str  # base URL of a router, the toy proxy or one engine: http://127.0.0.1:PORT
    max_requests: int = 100
    max_duration_s: float = 60.0  # wall seconds
    time_scale: float = 1.0
    concurrency: int = 512
    model: str | None = None

    def __post_init__(self) -> None:
        parts = urlsplit(self.target)
        if parts.scheme != "http" or parts.hostname not in ("127.0.0.1", "localhost") or parts.port is None:
            raise ValueError(f"target must be http://127.0.0.1:PORT, got {self.target!r}")
        if self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {self.max_requests}")
        if not self.max_duration_s > 0:
            raise ValueError(f"max_duration_s must be > 0, got {self.max_duration_s}")
        if not self.time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")


@dataclass(frozen=True)
class ClientResult:
    ok: bool
    ttft_s: float | None = None
    itls_s: tuple[float, ...] = ()
    tokens: int = 0
    error: str = ""
    # when the request was sent and when its answer ended (time.monotonic(), wall seconds): which requests
    # were in flight at a given moment, and how long each took
    sent_at: float | None = None
    done_at: float | None = None


@dataclass
class LoadReport:
    results: list[ClientResult] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def ok(self) -> int:
        return sum(r.ok for r in self.results)

    @property
    def failed(self) -> int:
        return len(self.results) - self.ok

    def ttft_quantile(self, q: float) -> float | None:
        values = [r.ttft_s for r in self.results if r.ok and r.ttft_s is not None]
        return float(np.quantile(values, q)) if values else None

    def itl_quantile(self, q: float) -> float | None:
        values = [v for r in self.results if r.ok for v in r.itls_s]
        return float(np.quantile(values, q)) if values else None

    def summary(self) -> str:
        def ms(value: float | None) -> str:
            return "n/a" if value is None else f"{value * 1000:.1f} ms"

        return (
            f"requests {len(self.results)} ok {self.ok} failed {self.failed} in {self.wall_s:.1f} s wall; "
            f"TTFT p50 {ms(self.ttft_quantile(0.5))} p90 {ms(self.ttft_quantile(0.9))}; "
            f"ITL p50 {ms(self.itl_quantile(0.5))} p90 {ms(self.itl_quantile(0.9))} (engine seconds)"
        )


def poisson_requests(
    rate: float, count: int, prompt_tokens: int, output_tokens: int, seed: int = 0
) -> list[LoadRequest]:
    """``count`` requests with exponential inter-arrival times at ``rate`` per second, fixed lengths."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    if prompt_tokens < 1 or output_tokens < 1:
        raise ValueError("prompt_tokens and output_tokens must be >= 1")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=count))
    return [LoadRequest(float(t), prompt_tokens, output_tokens) for t in arrivals]


def trace_requests(path: Path, limit: int) -> list[LoadRequest]:
    """The first ``limit`` requests of a trace (Azure CSV, Mooncake JSONL or BurstGPT CSV), from t=0."""
    requests = load_trace(path)[:limit]
    if not requests:
        raise ValueError(f"trace: {path} has no requests")
    start = requests[0].arrival_s
    return [
        LoadRequest(r.arrival_s - start, max(1, int(r.prompt_tokens)), max(1, int(r.output_tokens)))
        for r in requests
    ]


def synthetic_prompt(tokens: int, index: int = 0) -> list[int]:
    """A prompt of exactly ``tokens`` token ids (the engines count ids; the values carry no meaning).

    Each request's ids start at a different offset, so no two prompts share a prefix: a cache-aware
    router (vllm-router's and sglang-router's default policy) would otherwise send every request to the
    one worker holding the "cached" prefix, which traces of distinct documents never do."""
    start = (index * 7919) % 20000  # 7919 is prime, so offsets cycle through all 20000 values
    return [1000 + ((start + i) % 20000) for i in range(tokens)]


async def _one(
    session: aiohttp.ClientSession, settings: LoadSettings, request: LoadRequest, index: int
) -> ClientResult:
    body: dict[str, object] = {
        "prompt": synthetic_prompt(request.prompt_tokens, index),
        "max_tokens": request.output_tokens,
        "stream": True,
    }
    if settings.model:
        body["model"] = settings.model
    sent = time.monotonic()
    first: float | None = None
    last = sent
    gaps: list[float] = []
    tokens = 0
    try:
        async with session.post(
            f"{settings.target}/v1/completions", json=body, headers={"X-Request-Id": f"load-{index}"}
        ) as response:
            if response.status != 200:
                text = (await response.text())[:200]
                return ClientResult(
                    False, error=f"HTTP {response.status}: {text}", sent_at=sent, done_at=time.monotonic()
                )
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                if not any(c.get("text") for c in chunk.get("choices", [])):
                    continue
                now = time.monotonic()
                if first is None:
                    first = now
                else:
                    gaps.append((now - last) / settings.time_scale)
                last = now
                tokens += 1
    except (TimeoutError, aiohttp.ClientError) as err:
        return ClientResult(False, error=repr(err), sent_at=sent, done_at=time.monotonic())
    ttft = None if first is None else (first - sent) / settings.time_scale
    return ClientResult(True, ttft, tuple(gaps), tokens, sent_at=sent, done_at=time.monotonic())


async def run_load(requests: Sequence[LoadRequest], settings: LoadSettings) -> LoadReport:
    """Send the requests at their (scaled) arrival times; stop at max_requests or max_duration_s."""
    report = LoadReport()
    started = time.monotonic()
    deadline = started + settings.max_duration_s
    gate = asyncio.Semaphore(settings.concurrency)
    timeout = aiohttp.ClientTimeout(total=settings.max_duration_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def fire(request: LoadRequest, index: int) -> None:
            async with gate:
                report.results.append(await _one(session, settings, request, index))

        tasks: list[asyncio.Task[None]] = []
        for index, request in enumerate(requests[: settings.max_requests]):
            at = started + request.arrival_s * settings.time_scale
            if at >= deadline:
                break
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            tasks.append(asyncio.get_running_loop().create_task(fire(request, index)))
        remaining = max(0.0, deadline - time.monotonic())
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=remaining)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
    report.wall_s = time.monotonic() - started
    return report

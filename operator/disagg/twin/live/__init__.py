"""The live twin: emulated vLLM/SGLang engines that run in real time behind HTTP endpoints.

Each simulated pod gets an asyncio engine (continuous batching paced by the latency model's step
times, with wall-clock sleeps scaled by ``time_scale``), an aiohttp server on 127.0.0.1 with the
engine's Prometheus exposition, ``/health``, ``/v1/models`` and the OpenAI completion APIs (with
vLLM's NIXL P/D handshake), a follower that mirrors the pods of a DisaggregatedDeployment, a
built-in toy P/D proxy, a bounded load generator and ``disagg twin`` (:mod:`disagg.twin.live.cli`). Token
text is synthetic (deterministic words).

The only part of the twin that does network I/O: the import contracts (pyproject.toml) keep the rest of the
twin pure, and this package's ``__init__`` imports nothing.
"""

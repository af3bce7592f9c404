"""Reading the policy's signals from Prometheus (prometheus-api-client) into an Observation.

I/O lives here; the PromQL is built by :mod:`disagg.metrics.queries` (pure). Every value carries a
:class:`~disagg.policy.types.SignalState`: no series is MISSING, a NaN (e.g. a quantile over zero
observations) is NAN, a pool whose newest sample is older than the metric window is STALE, a value the
signal cannot take (:func:`in_range`: infinite, a negative latency, rate or count, a fraction above 1) is
INVALID; none of them is ever turned into a zero, and the policy acts on none of them (fail-static). A
query that fails (Prometheus down, bad PromQL) counts as MISSING for that signal and is reported in
:attr:`Signals.errors`.

The prefill pool's prefix-cache hit rate is MISSING without series (an engine that exports none, no
scrape yet) and NAN when the pool looked nothing up in the window (vLLM's 0/0); a measured 0 stays 0.

User TTFT is the router's own end-to-end TTFT histogram where the router exports one and it has
observations in the window (:func:`user_ttft`); otherwise prefill-side TTFT + decode-side TTFT at the
policy percentile (see :mod:`disagg.metrics.queries` for why), MISSING if either side is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import requests
from prometheus_api_client import PrometheusConnect
from requests.exceptions import ConnectionError as RequestsConnectionError
from requests.exceptions import Timeout
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError, ReadTimeoutError
from urllib3.util.retry import Retry

from disagg.metrics.queries import (
    TARGET_LABELS,
    Engine,
    QuerySet,
    TargetLabels,
    build_queries,
    running_by_pod_query,
)
from disagg.policy.types import MISSING, Measured, Observation, RoleObservation, SignalState

# RoleObservation fields read from "<role>.<field>" signals; a signal with no query for that role (the
# decode pool's prefix_hit_rate) is MISSING
_ROLE_FIELDS = (
    "queue_depth",
    "running",
    "kv_usage",
    "queue_time",
    "compute_time",
    "token_throughput",
    "prefix_hit_rate",
)


@dataclass(frozen=True)
class Signals:
    """The raw result of one evaluation's queries, by signal name, plus the errors met."""

    values: dict[str, Measured]
    errors: dict[str, str] = field(default_factory=dict)

    def get(self, key: str) -> Measured:
        return self.values.get(key, MISSING)

    def failure(self) -> str | None:
        """Why Prometheus gave no TTFT or ITL (the error of the first of their queries that failed: an
        HTTP error, no answer within the timeout, unreachable); None when it answered them."""
        return next((self.errors[n] for n in LATENCY_SIGNALS if n in self.errors), None)


# the queries the user-facing latencies come from (see user_ttft)
LATENCY_SIGNALS = ("ttft_router", "ttft_prefill_side", "ttft_decode_side", "itl")


# What a signal can be. Fractions (KV-cache usage, the prefix-cache hit rate) lie in [0, 1]; the age of
# the newest sample (the staleness probe) may be any finite number (a target that stamps its own samples
# can be ahead of Prometheus's clock); every other signal (latencies, rates, counts, token lengths,
# compute times) is >= 0. No signal is infinite: histogram_quantile answers the second-highest bucket's
# bound, never +Inf, and the means and rates are finite over consistent counters.
FRACTION_SIGNALS = frozenset(
    {"prefill.kv_usage", "decode.kv_usage", "prefill.prefix_hit_rate", "decode.prefix_hit_rate"}
)
SIGNED_SIGNALS = frozenset({"prefill.sample_age", "decode.sample_age"})
# a ratio of two rates of counters scraped together may overshoot 1 by rounding, never by more
FRACTION_SLACK = 1e-6


def in_range(name: str, measured: Measured) -> Measured:
    """``measured`` if signal ``name`` can take its value, else INVALID (see FRACTION_SIGNALS): a
    negative TTFT read as real would look like an idle pool and shrink it, an infinite one overflows the
    policy's replica arithmetic."""
    value = measured.value
    if not measured.ok or value is None:
        return measured
    if not math.isfinite(value):
        return Measured.missing(SignalState.INVALID)
    if name in SIGNED_SIGNALS:
        return measured
    if value < 0.0 or (name in FRACTION_SIGNALS and value > 1.0 + FRACTION_SLACK):
        return Measured.missing(SignalState.INVALID)
    return measured


def measured_from_result(result: Any) -> Measured:
    """One instant-vector result (``[{"metric": {...}, "value": [ts, "1.5"]}]``) as a Measured; an
    infinite value is INVALID (the range of each signal is :func:`in_range`'s)."""
    if not isinstance(result, list) or not result:
        return Measured.missing(SignalState.MISSING)
    try:
        raw = float(result[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return Measured.missing(SignalState.MISSING)
    if math.isnan(raw):
        return Measured.missing(SignalState.NAN)
    if math.isinf(raw):
        return Measured.missing(SignalState.INVALID)
    return Measured(raw, SignalState.OK)


def values_by_pod(result: object, labels: TargetLabels = TARGET_LABELS) -> dict[str, float | None]:
    """pod -> value (requests running) from an instant-vector result; NaN, infinite, negative or
    unparsable values are unknown (None)."""
    values: dict[str, float | None] = {}
    for series in result if isinstance(result, list) else []:
        try:
            pod = str(series["metric"][labels.pod])
            value = float(series["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        values[pod] = value if math.isfinite(value) and value >= 0.0 else None
    return values


def combine_ttft(prefill_side: Measured, decode_side: Measured) -> Measured:
    """User TTFT from both sides; not OK unless both are (the worse state wins)."""
    if (
        prefill_side.ok
        and decode_side.ok
        and prefill_side.value is not None
        and decode_side.value is not None
    ):
        return Measured(prefill_side.value + decode_side.value, SignalState.OK)
    for m in (prefill_side, decode_side):
        if not m.ok:
            return Measured.missing(m.state)
    return MISSING


def user_ttft(signals: Signals) -> Measured:
    """The TTFT users feel: the router's end-to-end measurement when it has one, else the engine sum."""
    router = signals.get("ttft_router")
    if router.ok:
        return router
    return combine_ttft(signals.get("ttft_prefill_side"), signals.get("ttft_decode_side"))


@dataclass(frozen=True)
class PrometheusAccess:
    """How to reach a secured Prometheus: TLS verification (on unless turned off; against the system CAs or
    ``ca_file``), a bearer token read from ``bearer_token_file`` (a mounted Secret: re-read for every
    client, so a rotated token is picked up) and extra request headers. Never printed: ``headers`` may hold
    credentials, so it is left out of the repr."""

    ca_file: str | None = None
    insecure_skip_verify: bool = False
    bearer_token_file: str | None = None
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def verify(self) -> bool | str:
        """requests' ``verify``: a CA bundle path, or whether to check against the system CAs."""
        if self.insecure_skip_verify:
            return False
        return self.ca_file or True

    def request_headers(self) -> dict[str, str]:
        """The headers of every request; the bearer token (read now) as ``Authorization: Bearer``.
        Raises OSError/ValueError with the file named when the token can't be read."""
        headers = dict(self.headers)
        if self.bearer_token_file:
            try:
                with open(self.bearer_token_file, encoding="utf-8") as handle:
                    token = handle.read().strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise OSError(f"Prometheus bearer token file {self.bearer_token_file}: {exc}") from exc
            if not token:
                raise ValueError(f"Prometheus bearer token file {self.bearer_token_file} is empty")
            headers["Authorization"] = f"Bearer {token}"
        return headers


@dataclass(frozen=True)
class PrometheusSignals:
    """The adapter: one per Prometheus; ``observe`` per deployment and evaluation."""

    url: str
    timeout_s: float = 5.0
    labels: TargetLabels = TARGET_LABELS

    retries: int = 1
    access: PrometheusAccess = field(default_factory=PrometheusAccess)

    def client(self) -> PrometheusConnect:
        """A client with TLS verification on (unless ``access`` turns it off) and ``access``'s headers."""
        retry = Retry(total=self.retries, backoff_factor=0.2, status_forcelist=(502, 503, 504))
        session = requests.Session()
        session.verify = self.access.verify()
        return PrometheusConnect(
            url=self.url,
            headers=self.access.request_headers(),
            session=session,
            timeout=self.timeout_s,
            retry=retry,
        )

    def run(self, queries: QuerySet, client: PrometheusConnect | None = None) -> Signals:
        """Run every query; failures become MISSING with the error kept. An unreachable Prometheus fails
        the rest at once rather than waiting out every query's timeout."""
        values: dict[str, Measured] = {}
        errors: dict[str, str] = {}
        unreachable: str | None = None
        prom = client
        if prom is None:
            try:
                prom = self.client()
            except (OSError, ValueError) as exc:  # an unreadable bearer token: every signal missing
                unreachable = str(exc)
        for name, promql in queries.queries.items():
            if unreachable is not None or prom is None:
                values[name] = Measured.missing(SignalState.MISSING)
                errors[name] = unreachable or "no Prometheus client"
                continue
            try:
                values[name] = in_range(name, measured_from_result(prom.custom_query(promql)))
            except (RequestsConnectionError, Timeout) as exc:
                unreachable = self._unreachable(exc)
                values[name] = Measured.missing(SignalState.MISSING)
                errors[name] = unreachable
            except Exception as exc:  # any other failure of one query is that signal missing
                values[name] = Measured.missing(SignalState.MISSING)
                errors[name] = f"{type(exc).__name__}: {exc}"
        return Signals(values, errors)

    def _unreachable(self, exc: Exception) -> str:
        """What a failed connection says: a timeout (requests wraps urllib3's, retries exhausted, in a
        ConnectionError) as such, rather than the whole query URL urllib3 puts in its message. A refused
        connection is not one (urllib3's NewConnectionError subclasses ConnectTimeoutError)."""
        reason = getattr(exc.args[0], "reason", None) if exc.args else None
        timed_out = isinstance(reason, ReadTimeoutError) or (
            isinstance(reason, ConnectTimeoutError) and not isinstance(reason, NewConnectionError)
        )
        if isinstance(exc, Timeout) or timed_out:
            return f"Prometheus at {self.url} did not answer within {self.timeout_s:g} s"
        return f"Prometheus at {self.url} unreachable: {type(exc).__name__}: {exc}"

    def read(
        self,
        engine: Engine | str,
        namespace: str,
        deployment: str,
        ttft_percentile: float,
        itl_percentile: float,
        window_s: int,
    ) -> Signals:
        return self.run(
            build_queries(
                engine, namespace, deployment, ttft_percentile, itl_percentile, window_s, self.labels
            )
        )

    def observe(
        self,
        engine: Engine | str,
        namespace: str,
        deployment: str,
        pools: Mapping[str, RoleObservation],
        ttft_percentile: float,
        itl_percentile: float,
        window_s: int,
        now: float,
    ) -> tuple[Observation, Signals]:
        """The Observation for one deployment: ``pools`` carry replicas/ready/pending from the API server,
        Prometheus fills in the rest."""
        signals = self.read(engine, namespace, deployment, ttft_percentile, itl_percentile, window_s)
        return observation_from_signals(signals, pools, window_s, now), signals

    def running_per_pod(
        self, engine: Engine | str, namespace: str, deployment: str, role: str
    ) -> dict[str, float | None]:
        """Requests running per pod of one pool; raises when Prometheus cannot answer."""
        query = running_by_pod_query(engine, namespace, deployment, role, self.labels)
        return values_by_pod(self.client().custom_query(query), self.labels)


def _role(signals: Signals, role: str, base: RoleObservation, window_s: int) -> RoleObservation:
    fields: dict[str, Measured] = {}
    for name in _ROLE_FIELDS:
        fields[name] = signals.get(f"{role}.{name}")
    age = signals.get(f"{role}.sample_age")
    if age.ok and age.value is not None and age.value > window_s:
        fields = {k: (Measured.missing(SignalState.STALE) if v.ok else v) for k, v in fields.items()}
    return replace(base, **fields)  # type: ignore[arg-type]


def observation_from_signals(
    signals: Signals, pools: Mapping[str, RoleObservation], window_s: int, now: float
) -> Observation:
    """Assemble the Observation (pure, given the signals)."""
    prefill = _role(signals, "prefill", pools["prefill"], window_s)
    decode = _role(signals, "decode", pools["decode"], window_s)
    ttft = user_ttft(signals)
    itl = signals.get("itl")
    stale_p = prefill.running.state is SignalState.STALE
    stale_d = decode.running.state is SignalState.STALE
    if stale_p or stale_d:
        ttft = Measured.missing(SignalState.STALE) if ttft.ok else ttft
    if stale_d:
        itl = Measured.missing(SignalState.STALE) if itl.ok else itl
    return Observation(
        time=now,
        prefill=prefill,
        decode=decode,
        ttft=ttft,
        itl=itl,
        request_rate=signals.get("request_rate"),
        prompt_tokens_mean=signals.get("prompt_tokens_mean"),
        prompt_tokens_p90=signals.get("prompt_tokens_p90"),
        output_tokens_mean=signals.get("output_tokens_mean"),
        output_tokens_p90=signals.get("output_tokens_p90"),
    )

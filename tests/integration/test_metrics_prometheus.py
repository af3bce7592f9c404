"""The Prometheus adapter against a real Prometheus scraping vLLM-named metrics served on loopback.

Two expositions stand for a prefill and a decode engine pod; the scrape job attaches the target labels
the relabelling would attach to such pods (namespace, pod, disagg_deployment, disagg_role). With the
local cluster, the expositions listen on the pods' own IPs (kwok hands them out of 127.0.0.0/8) at the
engine port, and the relabelling finds them exactly as it finds engines on a real cluster.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server

from disagg.cluster.local import free_ports
from disagg.metrics.prometheus import PrometheusSignals
from disagg.policy.types import Observation, RoleObservation, SignalState

LATENCY_BUCKETS = (0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 1.0, 2.0, 5.0)
TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
POOLS = {"prefill": RoleObservation(replicas=1, ready=1), "decode": RoleObservation(replicas=1, ready=1)}


class Engine:
    """A few vLLM metrics in a private registry, served over HTTP on a loopback address."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # names: vllm-project/vllm docs/design/metrics.md
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT", buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "ITL", buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Histogram(
            "vllm:request_queue_time_seconds", "queue", buckets=LATENCY_BUCKETS, registry=r
        )
        self.prefill = Histogram(
            "vllm:request_prefill_time_seconds", "prefill", buckets=LATENCY_BUCKETS, registry=r
        )
        self.prompt = Histogram("vllm:request_prompt_tokens", "prompt", buckets=TOKEN_BUCKETS, registry=r)
        self.output = Histogram("vllm:request_generation_tokens", "output", buckets=TOKEN_BUCKETS, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "waiting", registry=r)
        self.running = Gauge("vllm:num_requests_running", "running", registry=r)
        server, thread = start_http_server(port, addr=host, registry=r)
        self.server, self.thread = server, thread
        self.port = int(server.server_port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engines() -> Iterator[dict[str, Engine]]:
    pair = {"prefill": Engine(), "decode": Engine()}
    try:
        yield pair
    finally:
        for e in pair.values():
            e.close()


def scrape_config(engines: dict[str, Engine]) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "engines",
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{e.port}"],
                        "labels": {
                            "namespace": "prod",
                            "pod": f"llama-{role}-0",
                            "disagg_deployment": "llama",
                            "disagg_role": role,
                        },
                    }
                    for role, e in engines.items()
                ],
            }
        ],
    }


def poll(
    fn: Callable[[], Observation], done: Callable[[Observation], bool], timeout_s: float = 60.0
) -> Observation:
    deadline = time.monotonic() + timeout_s
    obs = fn()
    while not done(obs) and time.monotonic() < deadline:
        time.sleep(0.5)
        obs = fn()
    return obs


def test_quantiles_come_out_and_absent_series_are_missing(
    prometheus_factory: Callable[[dict[str, Any]], Any], engines: dict[str, Engine]
) -> None:
    prom = prometheus_factory(scrape_config(engines))
    signals = PrometheusSignals(prom.url)

    def observe(deployment: str = "llama") -> Observation:
        obs, _ = signals.observe("vllm", "prod", deployment, POOLS, 90, 90, 60, now=time.time())
        return obs

    # both targets scraped once with empty histograms: nothing observed yet, so no quantile at all
    first = poll(observe, lambda o: o.prefill.queue_depth.ok and o.decode.running.ok)
    assert first.prefill.queue_depth.value == 0.0  # a gauge that exists and is 0 is a real 0
    assert first.ttft.state is not SignalState.OK

    p, d = engines["prefill"], engines["decode"]
    for i in range(100):
        p.ttft.observe(0.25 + 0.001 * i)  # prefill side: 0.25..0.35 s
        p.queue.observe(0.05)
        p.prefill.observe(0.2)
        p.prompt.observe(900)
        d.ttft.observe(0.04)  # decode side: KV transfer + first step
        d.itl.observe(0.025)
        d.output.observe(200)
    p.waiting.set(3)
    d.running.set(42)

    obs = poll(observe, lambda o: o.ttft.ok and o.itl.ok and o.decode.running.value == 42)
    # user TTFT = prefill-side p90 (in the 0.3-0.4 bucket) + decode-side p90 (in the 0.03-0.05 bucket)
    assert obs.ttft.value is not None and 0.33 <= obs.ttft.value <= 0.45
    assert obs.itl.value is not None and 0.02 <= obs.itl.value <= 0.03
    assert obs.prefill.queue_time.value is not None and 0.03 <= obs.prefill.queue_time.value <= 0.05
    assert obs.prefill.compute_time.value == pytest.approx(0.2)  # the mean prefill time
    assert obs.prompt_tokens_mean.value == pytest.approx(900)
    assert obs.output_tokens_mean.value == pytest.approx(200)
    assert obs.prefill.queue_depth.value == 3.0 and obs.decode.running.value == 42.0
    # never exposed by these engines: MISSING, not 0
    assert obs.decode.kv_usage.state is SignalState.MISSING
    assert obs.request_rate.state is SignalState.MISSING  # no vllm:request_success_total here
    # exposed but never observed in the window: a quantile over nothing is NaN
    assert obs.decode.queue_time.state is SignalState.NAN

    # a deployment Prometheus has never seen: everything MISSING, nothing zero
    other = observe("no-such-deployment")
    for m in (
        other.ttft,
        other.itl,
        other.prompt_tokens_mean,
        other.prefill.queue_depth,
        other.decode.running,
    ):
        assert m.state is SignalState.MISSING and m.value is None


def test_unreachable_prometheus_is_missing_with_the_error_kept() -> None:
    with socket.socket() as held:  # bound, never listening: connections to it are refused
        held.bind(("127.0.0.1", 0))
        signals = PrometheusSignals(f"http://127.0.0.1:{held.getsockname()[1]}", timeout_s=1.0)
        obs, raw = signals.observe("vllm", "prod", "llama", POOLS, 90, 90, 60, now=0.0)
    assert obs.ttft.state is SignalState.MISSING and obs.decode.running.state is SignalState.MISSING
    assert raw.errors and all("Error" in e or "error" in e for e in raw.errors.values())


def engine_pod(name: str, role: str, port: int) -> dict[str, Any]:
    """An engine pod as the renderer labels and annotates it; the in-test exposition listens on its IP."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/name": "disagg",
                "disagg.dev/deployment": "llama",
                "disagg.dev/role": role,
            },
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(port),
                "prometheus.io/path": "/metrics",
            },
        },
        "spec": {
            "nodeSelector": {"type": "kwok"},
            "containers": [
                {"name": "engine", "image": "engine", "ports": [{"name": "http", "containerPort": port}]}
            ],
        },
    }


def test_relabelling_finds_engine_pods_through_the_apiserver(
    kubeconfig: Any,
    k8s_api: Any,
    namespace: str,
    prometheus_factory: Callable[[dict[str, Any]], Any],
) -> None:
    from kubernetes import client

    from disagg.cluster.wait import wait_for

    core = client.CoreV1Api(k8s_api)
    roles = ("prefill", "decode")
    # the engine port the pods declare: one no program holds on any address (vLLM's 8000 may be taken by a
    # server on 0.0.0.0, which would keep the expositions off the pods' IPs)
    (port,) = free_ports(1, host="0.0.0.0")
    for role in roles:
        core.create_namespaced_pod(namespace, engine_pod(f"llama-{role}-0", role, port))

    def pod_ips() -> dict[str, str] | None:
        ips = {r: core.read_namespaced_pod(f"llama-{r}-0", namespace).status.pod_ip for r in roles}
        return ips if all(ips.values()) else None

    ips = wait_for(pod_ips, what="kwok to give both pods an IP")
    assert len(set(ips.values())) == 2 and all(ip.startswith("127.") for ip in ips.values()), ips
    engines = {role: Engine(ips[role], port) for role in roles}  # each on its pod's own IP
    try:
        _observe_through_relabelling(kubeconfig, namespace, prometheus_factory, engines)
    finally:
        for engine in engines.values():
            engine.close()


def _observe_through_relabelling(
    kubeconfig: Any,
    namespace: str,
    prometheus_factory: Callable[[dict[str, Any]], Any],
    engines: dict[str, Engine],
) -> None:
    from disagg.metrics.relabel import engine_scrape_config

    job = engine_scrape_config(kubeconfig_file=str(kubeconfig), namespaces=[namespace], scrape_interval_s=1)
    prom = prometheus_factory({"global": {"scrape_interval": "1s"}, "scrape_configs": [job]})
    engines["prefill"].waiting.set(5)
    engines["decode"].running.set(17)
    signals = PrometheusSignals(prom.url)

    def observe() -> Observation:
        obs, _ = signals.observe("vllm", namespace, "llama", POOLS, 90, 90, 60, now=time.time())
        return obs

    obs = poll(observe, lambda o: o.prefill.queue_depth.ok and o.decode.running.ok, timeout_s=90)
    assert obs.prefill.queue_depth.value == 5.0  # selected by namespace, disagg_deployment, disagg_role
    assert obs.decode.running.value == 17.0
    assert observe_other(signals, namespace).decode.running.state is SignalState.MISSING


def observe_other(signals: PrometheusSignals, namespace: str) -> Observation:
    obs, _ = signals.observe("vllm", namespace, "other", POOLS, 90, 90, 60, now=time.time())
    return obs


def _bcrypt(password: str) -> str | None:
    """A bcrypt hash (what basic_auth_users holds) from the C library's crypt, if it has bcrypt."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # crypt leaves the stdlib in 3.13
        try:
            import crypt
        except ImportError:
            return None
    hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))
    return hashed if hashed and hashed.startswith("$2") else None


def test_a_prometheus_with_tls_and_basic_auth(tmp_path: Path) -> None:
    """A real Prometheus serving HTTPS with a private CA and basic auth (--web.config.file): verification
    is on by default, so the unknown CA is refused; with the CA bundle and the credentials (an extra
    Authorization header) the adapter reads; wrong credentials are a missing signal, not a crash."""
    import base64

    from cryptography.hazmat.primitives import serialization

    from disagg.cluster.certs import CertSettings, issue_certificate, make_ca
    from disagg.cluster.prometheus import PrometheusSettings, WebConfig, start_prometheus
    from disagg.metrics.prometheus import PrometheusAccess
    from disagg.metrics.queries import QuerySet

    hashed = _bcrypt("s3cret")
    if hashed is None:
        pytest.skip("no bcrypt in this C library's crypt: cannot write basic_auth_users")
    ca_key, ca_cert = make_ca(CertSettings())
    key, cert = issue_certificate(ca_key, ca_cert, "prometheus", ip_addresses=("127.0.0.1",), server=True)
    pem = serialization.Encoding.PEM
    (tmp_path / "ca.crt").write_bytes(ca_cert.public_bytes(pem))
    (tmp_path / "tls.crt").write_bytes(cert.public_bytes(pem))
    (tmp_path / "tls.key").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    web = WebConfig(
        # keys of the exporter-toolkit web configuration Prometheus reads from --web.config.file
        # (https://prometheus.io/docs/prometheus/latest/configuration/https/)
        config={
            "tls_server_config": {
                "cert_file": str(tmp_path / "tls.crt"),
                "key_file": str(tmp_path / "tls.key"),
            },
            "basic_auth_users": {"disagg": hashed},
        },
        ca_file=tmp_path / "ca.crt",
        basic_auth=("disagg", "s3cret"),
    )
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": []}
    prom = start_prometheus(config, tmp_path / "prom", PrometheusSettings(tie_to_parent=True), web=web)
    try:
        assert prom.url.startswith("https://")
        queries = QuerySet({"one": "vector(1)"})
        basic = "Basic " + base64.b64encode(b"disagg:s3cret").decode()
        ca = str(tmp_path / "ca.crt")

        refused = PrometheusSignals(prom.url).run(queries)  # system CAs only: the private CA is unknown
        assert refused.get("one").state is SignalState.MISSING and "SSL" in refused.errors["one"]

        access = PrometheusAccess(ca_file=ca, headers=(("Authorization", basic),))
        answered = PrometheusSignals(prom.url, access=access).run(queries)
        assert answered.errors == {} and answered.get("one").value == 1.0

        wrong = PrometheusAccess(ca_file=ca, headers=(("Authorization", "Basic d3Jvbmc6d3Jvbmc="),))
        unauthorized = PrometheusSignals(prom.url, access=wrong).run(queries)
        assert unauthorized.get("one").state is SignalState.MISSING and "401" in unauthorized.errors["one"]
    finally:
        prom.stop()

"""A real Prometheus started by the project scrapes an in-test /metrics endpoint, and discovers pods through
the local apiserver with kubernetes_sd_configs (what the e2e uses to find engine pods)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from disagg.cluster.local import ClusterInfo, free_ports
from disagg.cluster.prometheus import PrometheusProcess, kubernetes_pod_sd_config
from disagg.cluster.wait import wait_for

StartPrometheus = Callable[[dict[str, Any]], PrometheusProcess]


@pytest.fixture
def metrics_endpoint() -> Iterator[tuple[str, Gauge]]:
    """A /metrics endpoint on 127.0.0.1 exposing one gauge, served by prometheus_client in a thread."""
    registry = CollectorRegistry()
    gauge = Gauge("disagg_test_queue_depth", "a gauge the test sets", registry=registry)
    (port,) = free_ports(1)
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        yield f"127.0.0.1:{port}", gauge
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _values(prom: PrometheusProcess, expr: str) -> list[float]:
    return [float(sample["value"][1]) for sample in prom.query(expr)]


def test_prometheus_scrapes_a_static_target(
    prometheus_factory: StartPrometheus, metrics_endpoint: tuple[str, Gauge]
) -> None:
    address, gauge = metrics_endpoint
    gauge.set(7)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "in-test", "static_configs": [{"targets": [address]}]}],
    }
    prom = prometheus_factory(config)
    assert wait_for(
        lambda: _values(prom, 'disagg_test_queue_depth{job="in-test"}') == [7.0], what="the gauge"
    )
    gauge.set(11)
    assert wait_for(lambda: _values(prom, "disagg_test_queue_depth") == [11.0], what="the updated gauge")

    # a reload with a changed config takes effect: the job is renamed
    config["scrape_configs"][0]["job_name"] = "renamed"
    prom.reload(config)
    assert wait_for(lambda: _values(prom, 'up{job="renamed"}') == [1.0], what="the reloaded job")


def test_prometheus_discovers_annotated_pods_through_the_apiserver(
    cluster: ClusterInfo, k8s_api: Any, namespace: str, prometheus_factory: StartPrometheus
) -> None:
    """kwok gives each pod its own IP out of 127.0.0.0/8; Prometheus scrapes pod IP and annotated port."""
    core = client.CoreV1Api(k8s_api)
    (port,) = free_ports(1)

    def pod(name: str, scrape: str) -> client.V1Pod:
        return client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=name,
                labels={"disagg.dev/role": "decode", "disagg.dev/deployment": "llama"},
                annotations={
                    "prometheus.io/scrape": scrape,
                    "prometheus.io/port": str(port),
                    "prometheus.io/path": "/metrics",
                },
            ),
            spec=client.V1PodSpec(
                node_selector={"type": "kwok"},
                containers=[
                    client.V1Container(
                        name="engine",
                        image="engine",
                        ports=[client.V1ContainerPort(name="http", container_port=port)],
                    )
                ],
            ),
        )

    core.create_namespaced_pod(namespace, pod("decode-0", "true"))
    core.create_namespaced_pod(namespace, pod("not-scraped", "false"))

    def pod_ips() -> list[str] | None:
        ips = [core.read_namespaced_pod(n, namespace).status.pod_ip for n in ("decode-0", "not-scraped")]
        return ips if all(ips) else None

    ips = wait_for(pod_ips, what="kwok to give both pods an IP")
    assert len(set(ips)) == 2 and all(ip.startswith("127.") for ip in ips), ips
    with _exposition(ips[0], port) as gauge:
        gauge.set(3)
        _scrape_discovered(cluster, namespace, prometheus_factory)


@contextlib.contextmanager
def _exposition(host: str, port: int) -> Iterator[Gauge]:
    """The one-gauge /metrics endpoint, listening on ``host`` (a pod's IP)."""
    registry = CollectorRegistry()
    gauge = Gauge("disagg_test_queue_depth", "a gauge the test sets", registry=registry)
    server, thread = start_http_server(port, addr=host, registry=registry)
    try:
        yield gauge
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _scrape_discovered(cluster: ClusterInfo, namespace: str, prometheus_factory: StartPrometheus) -> None:
    prom = prometheus_factory(
        {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [kubernetes_pod_sd_config(cluster, namespace)],
        }
    )
    expr = f'disagg_test_queue_depth{{namespace="{namespace}"}}'
    samples = wait_for(lambda: prom.query(expr), timeout_s=90, what="a sample from the discovered pod")
    assert len(samples) == 1
    labels = samples[0]["metric"]
    assert labels["pod"] == "decode-0"
    assert labels["disagg_role"] == "decode"
    assert labels["disagg_deployment"] == "llama"
    assert float(samples[0]["value"][1]) == 3.0
    pods_seen = {t["labels"].get("pod") for t in prom.active_targets()}
    assert pods_seen == {"decode-0"}

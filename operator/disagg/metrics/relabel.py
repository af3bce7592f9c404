"""How Prometheus must discover and label the engine pods so :mod:`disagg.metrics.queries` finds them.

Prometheus's kubernetes_sd (``role: pod``) exposes each pod label as
``__meta_kubernetes_pod_label_<name>`` with every character that is not a letter, digit or underscore
replaced by ``_`` (so ``disagg.dev/role`` becomes ``__meta_kubernetes_pod_label_disagg_dev_role``) and
annotations as ``__meta_kubernetes_pod_annotation_<name>`` the same way. Source: Prometheus
configuration docs, ``<kubernetes_sd_config>`` pod role. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from disagg.metrics.queries import TARGET_LABELS, TargetLabels

_POD_LABEL = "__meta_kubernetes_pod_label_"
_POD_ANNOTATION = "__meta_kubernetes_pod_annotation_"


def scrape_relabel_configs(labels: TargetLabels = TARGET_LABELS) -> list[dict[str, Any]]:
    """Relabelling for a kubernetes_sd pod job: keep disagg engine and router pods that ask to be
    scraped, scrape them on their annotated port and path, and attach the target labels the queries
    select on."""
    return [
        {
            "source_labels": [f"{_POD_ANNOTATION}prometheus_io_scrape"],
            "action": "keep",
            "regex": "true",
        },
        {
            # the engines, and the router for its end-to-end TTFT where it exports one
            # (disagg.metrics.queries.ROUTER_METRICS)
            "source_labels": [f"{_POD_LABEL}disagg_dev_role"],
            "action": "keep",
            "regex": "prefill|decode|router",
        },
        {
            "source_labels": ["__address__", f"{_POD_ANNOTATION}prometheus_io_port"],
            "action": "replace",
            "regex": r"([^:]+)(?::\d+)?;(\d+)",
            "replacement": "$1:$2",
            "target_label": "__address__",
        },
        {
            "source_labels": [f"{_POD_ANNOTATION}prometheus_io_path"],
            "action": "replace",
            "regex": "(.+)",
            "target_label": "__metrics_path__",
        },
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": labels.namespace},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": labels.pod},
        {"source_labels": [f"{_POD_LABEL}disagg_dev_deployment"], "target_label": labels.deployment},
        {"source_labels": [f"{_POD_LABEL}disagg_dev_role"], "target_label": labels.role},
    ]


def engine_scrape_config(
    job_name: str = "disagg-engines",
    api_server: str | None = None,
    kubeconfig_file: str | None = None,
    namespaces: Sequence[str] = (),
    scrape_interval_s: int = 5,
    labels: TargetLabels = TARGET_LABELS,
) -> dict[str, Any]:
    """A whole scrape job for the engine pods (Prometheus outside the cluster gives ``api_server`` and
    ``kubeconfig_file``; inside it uses its service account)."""
    if api_server and kubeconfig_file:
        raise ValueError(
            "engine_scrape_config: give api_server or kubeconfig_file, not both (Prometheus refuses both)"
        )
    sd: dict[str, Any] = {"role": "pod"}
    if api_server:
        sd["api_server"] = api_server
    if kubeconfig_file:
        sd["kubeconfig_file"] = kubeconfig_file
    if namespaces:
        sd["namespaces"] = {"names": list(namespaces)}
    return {
        "job_name": job_name,
        "scrape_interval": f"{scrape_interval_s}s",
        "kubernetes_sd_configs": [sd],
        "relabel_configs": scrape_relabel_configs(labels),
    }

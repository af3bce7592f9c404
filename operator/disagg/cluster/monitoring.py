"""The Prometheus Operator's CRDs in the local control plane (ServiceMonitor, PodMonitor, PrometheusRule).

Only the CRDs, as the pinned release ships them (copied from its Go module by
:func:`disagg.cluster.binaries.ensure_prometheus_operator_crds`, never written here): the API server then
validates the chart's monitoring objects against their real schemas (server-side dry run, ``helm
install``). No Prometheus Operator runs: the tests' Prometheus is configured directly
(:mod:`disagg.cluster.prometheus`).
"""

from __future__ import annotations

from typing import Any

import httpx
import yaml

from disagg.cluster.binaries import BuildSettings, ensure_prometheus_operator_crds
from disagg.cluster.lws import apply_objects


def crds(build: BuildSettings | None = None) -> list[dict[str, Any]]:
    return [
        doc
        for path in ensure_prometheus_operator_crds(build)
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def install(client: httpx.Client, build: BuildSettings | None = None) -> list[str]:
    """Server-side apply of the CRDs; their names. Raises lws.LwsInstallError naming a refused one."""
    objects = crds(build)
    apply_objects(client, objects)
    return [str(crd["metadata"]["name"]) for crd in objects]

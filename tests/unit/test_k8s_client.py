"""The operator's API client: authenticated from a kubeconfig, with a connection pool as large as the
requests it makes at once."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from disagg.controller.settings import ControllerSettings
from disagg.k8s.client import load_api_client

KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_the_operators_client_keeps_a_connection_for_every_request_it_can_make_at_once(
    tmp_path: Path,
) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(KUBECONFIG)
    settings = ControllerSettings(max_workers=6, apply_concurrency=5)
    client = load_api_client(config, connections=settings.api_connections)
    assert settings.api_connections == 30
    assert client.rest_client.pool_manager.connection_pool_kw["maxsize"] == 30
    # without a size the kubernetes client's own default stays (5 per CPU)
    default = load_api_client(config)
    assert default.configuration.connection_pool_maxsize == multiprocessing.cpu_count() * 5

"""A real Prometheus on 127.0.0.1 for tests and the demo, and the scrape config that discovers engine pods.

``start_prometheus(config, workdir)`` writes ``config`` (a prometheus.yml as a dict) under ``workdir``,
starts Debian's Prometheus with the lifecycle API on a free port and waits for ``/-/ready``.
"""

from __future__ import annotations

import contextlib
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from disagg.cluster.binaries import BuildSettings, ensure_binary
from disagg.cluster.layout import ClusterInfo
from disagg.cluster.processes import free_ports, spawn_logged, stop_process_group


class PrometheusError(RuntimeError):
    """Prometheus did not start, reload or answer; the message carries the end of its log."""


@dataclass(frozen=True)
class PrometheusSettings:
    start_timeout_s: float = 60.0
    stop_timeout_s: float = 10.0
    retention: str = "1d"
    log_level: str = "info"
    # kill Prometheus when the thread that started it exits (for test sessions, like the cluster's)
    tie_to_parent: bool = False
    build: BuildSettings = field(default_factory=BuildSettings)
    # listen on this port (None: a free one), e.g. to restart Prometheus where its clients know it
    port: int | None = None


@dataclass(frozen=True)
class WebConfig:
    """Prometheus' --web.config.file (the Prometheus exporter-toolkit web configuration: keys
    ``tls_server_config`` {cert_file, key_file, ...} and ``basic_auth_users`` {user: bcrypt hash}, see
    https://prometheus.io/docs/prometheus/latest/configuration/https/), and how this module's own requests
    (readiness, queries, reload) pass it: the CA to verify with and the basic-auth credentials."""

    config: dict[str, Any]
    ca_file: Path | None = None
    basic_auth: tuple[str, str] | None = None

    @property
    def scheme(self) -> str:
        return "https" if "tls_server_config" in self.config else "http"

    def client_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self.ca_file is not None:
            options["verify"] = ssl.create_default_context(cafile=str(self.ca_file))
        if self.basic_auth is not None:
            options["auth"] = self.basic_auth
        return options


@dataclass
class PrometheusProcess:
    url: str
    workdir: Path
    config_path: Path
    log_path: Path
    process: subprocess.Popen[bytes]
    settings: PrometheusSettings
    web: WebConfig | None = None

    def _options(self) -> dict[str, Any]:
        return self.web.client_options() if self.web is not None else {}

    def reload(self, config: dict[str, Any] | None = None) -> None:
        """Write ``config`` (if given) and ask Prometheus to reload it (POST /-/reload)."""
        if config is not None:
            _write_config(self.config_path, config)
        response = httpx.post(f"{self.url}/-/reload", timeout=10.0, **self._options())
        if response.status_code != 200:
            raise PrometheusError(
                f"reload failed: HTTP {response.status_code} {response.text}\n{self.log_tail()}"
            )

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; the ``result`` list of the answer (empty when no series matches)."""
        response = httpx.get(
            f"{self.url}/api/v1/query", params={"query": expr}, timeout=10.0, **self._options()
        )
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        if body.get("status") != "success":
            raise PrometheusError(f"query {expr!r} failed: {body}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def active_targets(self) -> list[dict[str, Any]]:
        response = httpx.get(
            f"{self.url}/api/v1/targets", params={"state": "active"}, timeout=10.0, **self._options()
        )
        response.raise_for_status()
        targets: list[dict[str, Any]] = response.json()["data"]["activeTargets"]
        return targets

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        stop_process_group(self.process, self.settings.stop_timeout_s)
        (self.workdir / "prometheus.pid").unlink(missing_ok=True)

    def log_tail(self, tail_bytes: int = 3000) -> str:
        if not self.log_path.is_file():
            return "(no log)"
        data = self.log_path.read_bytes()
        return data[-tail_bytes:].decode(errors="replace")

    def __enter__(self) -> PrometheusProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _write_config(path: Path, config: dict[str, Any]) -> None:
    if not isinstance(config, dict):
        raise PrometheusError(
            f"config: expected a mapping (prometheus.yml as a dict), got {type(config).__name__}"
        )
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def start_prometheus(
    config: dict[str, Any],
    workdir: Path,
    settings: PrometheusSettings | None = None,
    web: WebConfig | None = None,
) -> PrometheusProcess:
    """Start Prometheus with ``config`` on a free 127.0.0.1 port (``settings.port`` if set) and wait until
    it is ready; with ``web``, serving TLS and/or basic auth as its web configuration says."""
    settings = settings or PrometheusSettings()
    binary = ensure_binary("prometheus", settings.build)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "prometheus.yml"
    _write_config(config_path, config)
    (port,) = free_ports(1) if settings.port is None else (settings.port,)
    url = f"{web.scheme if web is not None else 'http'}://127.0.0.1:{port}"
    log_path = workdir / "prometheus.log"
    args = [
        str(binary),
        f"--config.file={config_path}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--storage.tsdb.retention.time={settings.retention}",
        f"--log.level={settings.log_level}",
    ]
    if web is not None:
        web_path = workdir / "web.yml"
        web_path.write_text(yaml.safe_dump(web.config, sort_keys=False))
        args.append(f"--web.config.file={web_path}")
    process = spawn_logged(args, log_path, cwd=workdir, tie_to_parent=settings.tie_to_parent)
    (workdir / "prometheus.pid").write_text(f"{process.pid}\n")
    prom = PrometheusProcess(url, workdir, config_path, log_path, process, settings, web)
    try:
        _wait_ready(prom)
    except BaseException:
        prom.stop()
        raise
    return prom


def _wait_ready(prom: PrometheusProcess) -> None:
    deadline = time.monotonic() + prom.settings.start_timeout_s
    while time.monotonic() < deadline:
        code = prom.process.poll()
        if code is not None:
            raise PrometheusError(f"prometheus exited with code {code}:\n{prom.log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{prom.url}/-/ready", timeout=2.0, **prom._options()).status_code == 200:
                return
        time.sleep(0.2)
    raise PrometheusError(
        f"prometheus not ready after {prom.settings.start_timeout_s:.0f} s:\n{prom.log_tail()}"
    )


def _meta_annotation(name: str) -> str:
    return "__meta_kubernetes_pod_annotation_" + "".join(c if c.isalnum() else "_" for c in name)


def _meta_label(name: str) -> str:
    return "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in name)


def kubernetes_pod_sd_config(
    cluster: ClusterInfo, namespace: str, job_name: str | None = None, scrape_interval: str | None = None
) -> dict[str, Any]:
    """A scrape config discovering the pods of ``namespace`` through the local apiserver.

    Keeps Running pods annotated ``prometheus.io/scrape: "true"`` (one target per pod: the container port
    named ``http`` or a pod without declared ports), scrapes ``prometheus.io/path`` at the pod IP and
    ``prometheus.io/port`` (the local cluster's pod IPs are loopback addresses, where the live twin's
    engines listen, so this is the rule a real cluster uses), and labels the series with
    ``namespace``, ``pod``, ``disagg_role`` (disagg.dev/role), ``disagg_deployment`` (disagg.dev/deployment).
    """
    # Relabelling semantics per https://prometheus.io/docs/prometheus/latest/configuration/configuration/#relabel_config
    relabel: list[dict[str, Any]] = [
        {"source_labels": [_meta_annotation("prometheus.io/scrape")], "regex": "true", "action": "keep"},
        {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "Running", "action": "keep"},
        {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "|http", "action": "keep"},
        {
            "source_labels": ["__meta_kubernetes_pod_ip", _meta_annotation("prometheus.io/port")],
            "regex": r"(.+);(\d+)",
            "replacement": "$1:$2",
            "target_label": "__address__",
        },
        {
            "source_labels": [_meta_annotation("prometheus.io/path")],
            "regex": "(.+)",
            "replacement": "$1",
            "target_label": "__metrics_path__",
        },
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        # label names as disagg.metrics.queries.TargetLabels selects on
        {"source_labels": [_meta_label("disagg.dev/role")], "target_label": "disagg_role"},
        {"source_labels": [_meta_label("disagg.dev/deployment")], "target_label": "disagg_deployment"},
    ]
    config: dict[str, Any] = {
        "job_name": job_name or f"kubernetes-pods-{namespace}",
        "kubernetes_sd_configs": [
            {
                "role": "pod",
                "api_server": cluster.server,
                "namespaces": {"names": [namespace]},
                "tls_config": {
                    "ca_file": str(cluster.ca_cert),
                    "cert_file": str(cluster.client_cert),
                    "key_file": str(cluster.client_key),
                },
            }
        ],
        "relabel_configs": relabel,
    }
    if scrape_interval is not None:
        config["scrape_interval"] = scrape_interval
    return config

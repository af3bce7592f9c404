"""prometheus-adapter on the local control plane: the external metrics API the real HPA controller reads.

The HPA controller in kube-controller-manager reads External metrics from ``external.metrics.k8s.io``, an
aggregated API. Here it is served by the released prometheus-adapter (built from its Go module,
:mod:`disagg.cluster.binaries`) as a process on 127.0.0.1, reading the tests' Prometheus with the rules of
:func:`disagg.metrics.external.adapter_config`. The API server's aggregation layer (the ``requestheader``
and ``proxy-client`` flags of :class:`disagg.cluster.local.LocalCluster`) reaches it through an
``ExternalName`` Service named ``localhost``: kube-aggregator resolves an ExternalName Service to that host
and the APIService's port (k8s.io/apiserver v0.37.2 pkg/util/proxy/proxy.go, ResolveCluster), since
Endpoints may not hold loopback addresses. The adapter's serving certificate names
``<service>.<namespace>.svc``, the server name the aggregator verifies (kube-aggregator v0.37.2
pkg/controllers/status/remote/remote_available_controller.go).

The adapter authenticates as its own user with a client certificate from the cluster's CA, bound to what
its release's manifests bind: ``system:auth-delegator`` (TokenReviews and SubjectAccessReviews for the
callers) and ``extension-apiserver-authentication-reader`` in kube-system (the requestheader CA), plus
read access to namespaces and pods.
"""

from __future__ import annotations

import base64
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from disagg.cluster.binaries import BuildSettings, ensure_binary
from disagg.cluster.certs import Pki, issue_certificate
from disagg.cluster.layout import ClusterInfo, kubeconfig_dict
from disagg.cluster.lws import APPLY_PATCH
from disagg.cluster.processes import free_ports, spawn_logged, stop_process_group
from disagg.metrics.external import adapter_config

USER = "disagg-metrics-adapter"
NAMESPACE = "kube-system"
SERVICE = "disagg-metrics-adapter"
API_GROUP = "external.metrics.k8s.io"
API_VERSION = "v1beta1"
FIELD_MANAGER = "disagg-cluster"


class MetricsAdapterError(RuntimeError):
    """The adapter could not be started or registered; the message says which step and shows its log."""


@dataclass(frozen=True)
class AdapterSettings:
    build: BuildSettings = field(default_factory=BuildSettings)
    # How often the adapter lists Prometheus' series to learn which metrics exist (its default, 10 min,
    # would hide an engine that started after the adapter).
    relist_interval: str = "10s"
    start_timeout_s: float = 90.0
    tie_to_parent: bool = True
    verbosity: int = 2


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def rbac_objects() -> list[dict[str, Any]]:
    """The adapter user's bindings (as prometheus-adapter's own deploy/manifests grant its account)."""
    subject = [{"kind": "User", "name": USER, "apiGroup": "rbac.authorization.k8s.io"}]
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{USER}:system:auth-delegator"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:auth-delegator",
            },
            "subjects": subject,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{USER}-auth-reader", "namespace": NAMESPACE},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "extension-apiserver-authentication-reader",
            },
            "subjects": subject,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"{USER}-resource-reader"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["namespaces", "pods", "services"],
                    "verbs": ["get", "list", "watch"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{USER}-resource-reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"{USER}-resource-reader",
            },
            "subjects": subject,
        },
    ]


def registration_objects(port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """The ExternalName Service and the APIService that route external.metrics.k8s.io to the adapter."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": SERVICE, "namespace": NAMESPACE},
            "spec": {"type": "ExternalName", "externalName": "localhost"},
        },
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": f"{API_VERSION}.{API_GROUP}"},
            "spec": {
                "group": API_GROUP,
                "version": API_VERSION,
                "service": {"name": SERVICE, "namespace": NAMESPACE, "port": port},
                "caBundle": _b64(ca_bundle),
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
            },
        },
    ]


_PATHS = {
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{name}",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings/{name}",
    "Service": "/api/v1/namespaces/{namespace}/services/{name}",
    "APIService": "/apis/apiregistration.k8s.io/v1/apiservices/{name}",
}


def _apply(client: httpx.Client, objects: Sequence[Mapping[str, Any]]) -> None:
    for obj in objects:
        meta = obj["metadata"]
        path = _PATHS[str(obj["kind"])].format(name=meta["name"], namespace=meta.get("namespace", ""))
        response = client.patch(
            path,
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            json=dict(obj),
            headers={"Content-Type": APPLY_PATCH},
        )
        if response.status_code not in (200, 201):
            raise MetricsAdapterError(
                f"applying {obj['kind']} {meta['name']}: HTTP {response.status_code} {response.text}"
            )


def _load_ca(pki: Pki) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise MetricsAdapterError(f"{pki.ca_key}: not the EC key the local CA is made with")
    return key, x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())


def _pem(key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> tuple[bytes, bytes]:
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


def write_credentials(info: ClusterInfo, workdir: Path) -> tuple[Path, Path, Path]:
    """The adapter's kubeconfig (its client certificate) and its serving certificate and key."""
    pki = Pki(info.state_dir / "pki")
    ca_key, ca_cert = _load_ca(pki)
    workdir.mkdir(parents=True, exist_ok=True)
    client_key, client_cert = _pem(*issue_certificate(ca_key, ca_cert, USER))
    kubeconfig = workdir / "kubeconfig"
    config = kubeconfig_dict(info.server, pki.ca_cert.read_bytes(), client_cert, client_key, USER)
    kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
    kubeconfig.chmod(0o600)
    serving_key, serving_cert = _pem(
        *issue_certificate(
            ca_key,
            ca_cert,
            SERVICE,
            dns_names=(f"{SERVICE}.{NAMESPACE}.svc", "localhost"),
            ip_addresses=("127.0.0.1",),
            server=True,
        )
    )
    cert_path, key_path = workdir / "serving.crt", workdir / "serving.key"
    cert_path.write_bytes(serving_cert)
    key_path.write_bytes(serving_key)
    key_path.chmod(0o600)
    return kubeconfig, cert_path, key_path


def adapter_args(
    port: int,
    prometheus_url: str,
    kubeconfig: Path,
    cert: Path,
    key: Path,
    config: Path,
    settings: AdapterSettings,
) -> list[str]:
    """prometheus-adapter v0.12.0's flags (cmd/adapter/adapter.go, and the generic apiserver options of
    sigs.k8s.io/custom-metrics-apiserver v1.30.0 pkg/cmd/builder.go it embeds)."""
    return [
        f"--secure-port={port}",
        "--bind-address=127.0.0.1",
        f"--tls-cert-file={cert}",
        f"--tls-private-key-file={key}",
        f"--lister-kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--prometheus-url={prometheus_url}",
        f"--metrics-relist-interval={settings.relist_interval}",
        f"--config={config}",
        f"--v={settings.verbosity}",
    ]


@dataclass
class MetricsAdapter:
    port: int
    log_path: Path
    process: subprocess.Popen[bytes]

    def log_tail(self, size: int = 3000) -> str:
        data = self.log_path.read_bytes() if self.log_path.is_file() else b""
        return data[-size:].decode(errors="replace")

    def stop(self) -> None:
        stop_process_group(self.process)


def _available(client: httpx.Client) -> bool:
    response = client.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{API_VERSION}.{API_GROUP}")
    if response.status_code != 200:
        return False
    conditions = (response.json().get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Available" and c.get("status") == "True" for c in conditions)


def start_metrics_adapter(
    info: ClusterInfo, prometheus_url: str, workdir: Path, settings: AdapterSettings | None = None
) -> MetricsAdapter:
    """Start prometheus-adapter against ``prometheus_url``, register it as external.metrics.k8s.io and
    wait until the API server reports the APIService Available."""
    settings = settings or AdapterSettings()
    binary = ensure_binary("prometheus-adapter", settings.build)
    kubeconfig, cert, key = write_credentials(info, workdir)
    config = workdir / "adapter-config.yaml"
    config.write_text(yaml.safe_dump(adapter_config(), sort_keys=False))
    (port,) = free_ports(1)
    log_path = workdir / "prometheus-adapter.log"
    with info.client() as client:
        _apply(client, rbac_objects())
        process = spawn_logged(
            [str(binary), *adapter_args(port, prometheus_url, kubeconfig, cert, key, config, settings)],
            log_path,
            cwd=workdir,
            tie_to_parent=settings.tie_to_parent,
        )
        adapter = MetricsAdapter(port, log_path, process)
        try:
            _apply(client, registration_objects(port, Pki(info.state_dir / "pki").ca_cert.read_bytes()))
            deadline = time.monotonic() + settings.start_timeout_s
            while not _available(client):
                if process.poll() is not None:
                    raise MetricsAdapterError(
                        f"prometheus-adapter exited ({process.returncode}):\n{adapter.log_tail()}"
                    )
                if time.monotonic() > deadline:
                    raise MetricsAdapterError(
                        f"APIService {API_VERSION}.{API_GROUP} not Available after "
                        f"{settings.start_timeout_s:.0f} s:\n{adapter.log_tail()}"
                    )
                time.sleep(0.5)
        except BaseException:
            adapter.stop()
            raise
    return adapter

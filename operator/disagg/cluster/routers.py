"""The released routers as local processes: vllm-router and sglang-router from their PyPI wheels.

``start_router(kind, argv, kubeconfig, workdir)`` runs the command line the operator renders for a
DisaggregatedDeployment's router (:func:`disagg.render.builders.router_command`) with the binary of the
pinned release (:func:`disagg.cluster.released.ensure_venv`), as the kubelet would run the container:
``$(VAR)`` references are expanded from the container's environment (``POD_NAMESPACE``), and only the
listen addresses change (``--host``/``--prometheus-host`` 127.0.0.1, free ports), so nothing listens
beyond loopback. The router finds the engine pods with its own Kubernetes service discovery through
``KUBECONFIG``; :func:`service_account_kubeconfig` writes one that authenticates as the router's
ServiceAccount (a TokenRequest), so the RBAC the operator renders for it is what is exercised.
"""

from __future__ import annotations

import base64
import os
import re
import ssl
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import yaml

from disagg.cluster.layout import ClusterInfo
from disagg.cluster.processes import free_ports, spawn_logged, stop_process_group
from disagg.cluster.released import ensure_venv, pinned_releases

RouterKind = Literal["vllm", "sglang"]
ROUTER_KINDS: tuple[RouterKind, ...] = ("vllm", "sglang")
# the PyPI package of each kind (disagg.cluster.released.pinned_releases keys)
ROUTER_PACKAGES: Mapping[RouterKind, str] = {"vllm": "vllm-router", "sglang": "sglang-router"}
# How the rendered command starts each router (disagg.render.builders.router_command): the head that the
# cached release's executable replaces.
RENDERED_HEADS: Mapping[RouterKind, tuple[str, ...]] = {
    "vllm": ("vllm-router",),
    "sglang": ("python3", "-m", "sglang_router.launch_router"),
}
# The path a started router answers once its HTTP server is up: vllm-router 0.1.17 and sglang-router 0.3.2
# both serve /liveness (strings of vllm_router_rs.abi3.so; sglang_router_rs server.rs "/liveness").
LIVENESS_PATH = "/liveness"
_KUBELET_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class RouterError(RuntimeError):
    """A router did not start or answer; the message carries the end of its log."""


@dataclass(frozen=True)
class RouterSettings:
    start_timeout_s: float = 60.0
    stop_timeout_s: float = 10.0
    # kill the router when the thread that started it exits (for test sessions, like the cluster's)
    tie_to_parent: bool = False
    versions: Mapping[RouterKind, str] = field(default_factory=dict)  # absent: the pinned release


@dataclass
class RouterProcess:
    kind: RouterKind
    argv: list[str]  # what runs (executable first)
    url: str  # http://127.0.0.1:PORT
    metrics_url: str | None  # the router's Prometheus exposition, when it serves one
    log_path: Path
    process: subprocess.Popen[bytes]
    settings: RouterSettings

    def running(self) -> bool:
        return self.process.poll() is None

    def get(self, path: str, timeout_s: float = 5.0) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", timeout=timeout_s)

    def serving(self) -> bool:
        """Its HTTP server answers (any status: PD routers report unready without workers)."""
        try:
            self.get(LIVENESS_PATH, timeout_s=2.0)
        except httpx.HTTPError:
            return False
        return True

    def wait_serving(self, timeout_s: float | None = None) -> None:
        limit = self.settings.start_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        while True:
            code = self.process.poll()
            if code is not None:
                raise RouterError(f"{self.kind} router exited with code {code}:\n{self.log_tail()}")
            if self.serving():
                return
            if time.monotonic() > deadline:
                raise RouterError(f"{self.kind} router not serving after {limit:.0f} s:\n{self.log_tail()}")
            time.sleep(0.2)

    def stop(self) -> None:
        stop_process_group(self.process, self.settings.stop_timeout_s)

    def log_tail(self, tail_bytes: int = 4000) -> str:
        if not self.log_path.is_file():
            return "(no log)"
        return self.log_path.read_bytes()[-tail_bytes:].decode(errors="replace")

    def __enter__(self) -> RouterProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def expand_kubelet_vars(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """``$(VAR)`` replaced by ``env[VAR]`` as the kubelet expands a container's command (an unknown
    ``$(VAR)`` stays as written, ``$$`` is a literal ``$``)."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return [_KUBELET_VAR.sub(one, word) for word in argv]


def with_option(argv: Sequence[str], option: str, value: str) -> list[str]:
    """``argv`` with ``option``'s value set to ``value`` (replaced where given, else appended)."""
    out = list(argv)
    for i, word in enumerate(out):
        if word == option and i + 1 < len(out):
            out[i + 1] = value
            return out
        if word.startswith(f"{option}="):
            out[i] = f"{option}={value}"
            return out
    return [*out, option, value]


def option_value(argv: Sequence[str], option: str) -> str | None:
    for i, word in enumerate(argv):
        if word == option and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(f"{option}="):
            return word.partition("=")[2]
    return None


def router_executable(kind: RouterKind, settings: RouterSettings | None = None) -> list[str]:
    """The cached release's command head for ``kind`` (installed on first use)."""
    settings = settings or RouterSettings()
    package = ROUTER_PACKAGES[kind]
    version = settings.versions.get(kind) or pinned_releases()[package].version
    bin_dir = ensure_venv(package, version)
    if kind == "vllm":
        return [str(bin_dir / "vllm-router")]
    return [str(bin_dir / "python"), "-m", "sglang_router.launch_router"]


def local_router_argv(
    kind: RouterKind, rendered: Sequence[str], head: Sequence[str], port: int, metrics_port: int
) -> list[str]:
    """The rendered command with the release's executable for its head and loopback listen addresses."""
    expected = RENDERED_HEADS[kind]
    if tuple(rendered[: len(expected)]) != expected:
        raise RouterError(f"a {kind} router command starts with {list(expected)}, got {list(rendered[:3])}")
    argv = [*head, *rendered[len(expected) :]]
    argv = with_option(argv, "--host", "127.0.0.1")
    argv = with_option(argv, "--port", str(port))
    if option_value(argv, "--prometheus-port") is not None or option_value(argv, "--prometheus-host"):
        argv = with_option(argv, "--prometheus-host", "127.0.0.1")
        argv = with_option(argv, "--prometheus-port", str(metrics_port))
    return argv


def start_router(
    kind: RouterKind,
    argv: Sequence[str],
    kubeconfig: Path,
    workdir: Path,
    env: Mapping[str, str] | None = None,
    settings: RouterSettings | None = None,
    wait: bool = True,
) -> RouterProcess:
    """Run the rendered router command ``argv`` locally against the cluster of ``kubeconfig``.

    ``env`` is the container's environment (e.g. ``{"POD_NAMESPACE": ns}``), used to expand ``$(VAR)``
    and passed to the process. Returns once the router's HTTP server answers (``wait``).
    """
    if kind not in ROUTER_KINDS:
        raise ValueError(f"kind must be one of {ROUTER_KINDS}, got {kind!r}")
    settings = settings or RouterSettings()
    container_env = dict(env or {})
    port, metrics_port = free_ports(2)
    expanded = expand_kubelet_vars(argv, container_env)
    command = local_router_argv(kind, expanded, router_executable(kind, settings), port, metrics_port)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"{kind}-router.log"
    process_env = {
        **{k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "HTTP_PROXY", "HTTPS_PROXY")},
        **container_env,
        "KUBECONFIG": str(kubeconfig),
        "NO_PROXY": "127.0.0.0/8,localhost",
    }
    process = spawn_logged(
        command, log_path, cwd=workdir, env=process_env, tie_to_parent=settings.tie_to_parent
    )
    metrics = option_value(command, "--prometheus-port")
    router = RouterProcess(
        kind=kind,
        argv=command,
        url=f"http://127.0.0.1:{port}",
        metrics_url=f"http://127.0.0.1:{metrics}/metrics" if metrics else None,
        log_path=log_path,
        process=process,
        settings=settings,
    )
    if wait:
        try:
            router.wait_serving()
        except BaseException:
            router.stop()
            raise
    return router


def request_token(
    cluster: ClusterInfo, namespace: str, service_account: str, expiration_s: int = 3600
) -> str:
    """A token for ``namespace/service_account`` from the TokenRequest API (what a projected
    ServiceAccount token volume holds in a pod)."""
    context = ssl.create_default_context(cafile=str(cluster.ca_cert))
    context.load_cert_chain(str(cluster.client_cert), str(cluster.client_key))
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": expiration_s},
    }
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token"
    with httpx.Client(base_url=cluster.server, verify=context, timeout=10.0) as client:
        response = client.post(path, json=body)
    if response.status_code != 201:
        raise RouterError(
            f"TokenRequest for {namespace}/{service_account}: HTTP {response.status_code} {response.text}"
        )
    token: str = response.json()["status"]["token"]
    return token


def token_kubeconfig(server: str, ca_pem: bytes, token: str, user: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "disagg-local",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {"name": user, "context": {"cluster": "disagg-local", "user": user, "namespace": namespace}}
        ],
        "current-context": user,
        "preferences": {},
    }


def service_account_kubeconfig(
    cluster: ClusterInfo, namespace: str, service_account: str, path: Path, expiration_s: int = 3600
) -> Path:
    """Write a kubeconfig that authenticates as ``namespace/service_account`` (a TokenRequest token)."""
    token = request_token(cluster, namespace, service_account, expiration_s)
    config = token_kubeconfig(
        cluster.server,
        cluster.ca_cert.read_bytes(),
        token,
        f"system:serviceaccount:{namespace}:{service_account}",
        namespace,
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path

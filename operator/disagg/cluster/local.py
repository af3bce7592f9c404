"""LocalCluster: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and the LeaderWorkerSet
controller on 127.0.0.1.

Every process is started in its own session with its pid recorded under ``<state_dir>/pids`` and its
output in ``<state_dir>/logs``; ``up`` reuses a running cluster, ``down`` stops the processes by pid and
removes the state directory. kwok turns the Node objects created here into Ready nodes with GPUs and
makes the pods scheduled onto them Running and Ready. The LeaderWorkerSet controller's CRDs, RBAC and
webhooks are installed from its release (:mod:`disagg.cluster.lws`), and the Prometheus Operator's CRDs
from its (:mod:`disagg.cluster.monitoring`), so monitoring objects are validated by the API server; so are
the Gateway API's and the Inference Extension's (:mod:`disagg.cluster.gateway`, for spec.router.type
gateway-api).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import yaml

from disagg.cluster import gateway, lws, monitoring
from disagg.cluster.binaries import BuildSettings, ensure_binary
from disagg.cluster.certs import FRONT_PROXY_CLIENT, Pki, generate_pki
from disagg.cluster.kwok_stages import kwok_config_documents
from disagg.cluster.layout import (
    COMPONENTS,
    DEFAULT_NODE_POOLS,
    GPU_RESOURCE,
    KWOK_NODE_ANNOTATION,
    ClusterInfo,
    ClusterSettings,
    ClusterStatus,
    ComponentStatus,
    NodePool,
    default_state_dir,
    kubeconfig_dict,
    node_manifest,
    node_ready,
)
from disagg.cluster.processes import (
    free_ports,
    kill_with_parent,
    port_free,
    process_running,
    spawn_logged,
    stop_process_group,
)

# The layout and process helpers lived here; tests, benches and the CLI import them from this module too.
__all__ = [
    "COMPONENTS",
    "DEFAULT_NODE_POOLS",
    "GPU_RESOURCE",
    "KWOK_NODE_ANNOTATION",
    "LOOPBACK_POD_OCTETS",
    "ClusterError",
    "ClusterInfo",
    "ClusterSettings",
    "ClusterStatus",
    "ComponentStatus",
    "LocalCluster",
    "NodePool",
    "claim_loopback_pod_cidr",
    "default_state_dir",
    "free_ports",
    "kill_with_parent",
    "kubeconfig_dict",
    "loopback_pod_cidr",
    "node_manifest",
    "process_running",
    "spawn_logged",
    "stop_process_group",
]


class ClusterError(RuntimeError):
    """The control plane could not be started or reached; the message names the component."""


class LocalCluster:
    """A control plane of real components under one state directory."""

    def __init__(
        self,
        state_dir: Path | None = None,
        nodes: Sequence[NodePool] | None = None,
        settings: ClusterSettings | None = None,
        build: BuildSettings | None = None,
    ) -> None:
        self.state_dir = Path(state_dir) if state_dir is not None else default_state_dir()
        # None: the pools a previous `up` of this state directory recorded, else DEFAULT_NODE_POOLS
        self.nodes = tuple(nodes) if nodes is not None else self._recorded_nodes()
        self.settings = settings or ClusterSettings()
        self.build = build or BuildSettings()
        for pool in self.nodes:
            if pool.count < 0 or pool.gpus_per_node < 0:
                raise ValueError(f"nodes: pool {pool.gpu_type!r} needs count >= 0 and gpus_per_node >= 0")

    # -- paths -----------------------------------------------------------------------------------------
    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def pids_dir(self) -> Path:
        return self.state_dir / "pids"

    @property
    def pki(self) -> Pki:
        return Pki(self.state_dir / "pki")

    @property
    def kubeconfig_path(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def pod_cidr(self) -> str | None:
        """The pod CIDR this cluster's kwok allocates from (None before the first ``up``)."""
        recorded = (self._read_state() or {}).get("pod_cidr")
        return str(recorded) if recorded else self.settings.pod_cidr

    def log_path(self, component: str) -> Path:
        return self.logs_dir / f"{component}.log"

    def _kubeconfig_for(self, identity: str) -> Path:
        return self.kubeconfig_path if identity == "admin" else self.state_dir / f"{identity}.kubeconfig"

    def _recorded_nodes(self) -> tuple[NodePool, ...]:
        recorded = (self._read_state() or {}).get("nodes")
        if isinstance(recorded, list) and recorded:
            with contextlib.suppress(TypeError):
                return tuple(NodePool(**pool) for pool in recorded)
        return DEFAULT_NODE_POOLS

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialise up/down of one state directory across processes."""
        self.state_dir.parent.mkdir(parents=True, exist_ok=True)
        lock = self.state_dir.parent / f".{self.state_dir.name}.lock"
        with lock.open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # -- public API ------------------------------------------------------------------------------------
    def up(self) -> ClusterInfo:
        """Start the control plane (or reuse the running one) and wait for the nodes to be Ready."""
        with self._locked():
            info = self._running_info()
            if info is not None:
                self._ensure_nodes(info)
                self._install_monitoring_crds(info)  # a cluster started before they were installed
                self._install_gateway_crds(info)
                self._wait_nodes_ready(info)
                return info
            self._stop_processes()
            binaries = {name: ensure_binary(name, self.build) for name in COMPONENTS}
            monitoring.crds(self.build)  # obtained before anything starts, like the programs
            gateway.crds(self.build)
            try:
                return self._start(binaries)
            except BaseException:
                self._stop_processes()
                raise

    def down(self, keep_state: bool = False) -> None:
        """Stop every process this state directory records (by pid) and remove the directory."""
        with self._locked():
            self._stop_processes()
            if not keep_state and self.state_dir.exists():
                shutil.rmtree(self.state_dir, ignore_errors=True)

    def status(self) -> ClusterStatus:
        state = self._read_state()
        components = []
        for name in COMPONENTS:
            pid = self._read_pid(name)
            binary = Path(state["binaries"][name]) if state and name in state.get("binaries", {}) else None
            components.append(
                ComponentStatus(
                    name, pid, pid is not None and process_running(pid, binary), self.log_path(name)
                )
            )
        info = self._info_from_state(state) if state else None
        ready, ready_nodes, total = False, 0, 0
        if info is not None and all(c.running for c in components):
            with contextlib.suppress(httpx.HTTPError, ssl.SSLError, OSError), self.client(info) as client:
                ready = client.get("/readyz").status_code == 200
                ready_nodes, total = self._count_ready_nodes(client)
        return ClusterStatus(
            self.state_dir, info.server if info else None, tuple(components), ready, ready_nodes, total
        )

    def info(self) -> ClusterInfo | None:
        state = self._read_state()
        return self._info_from_state(state) if state else None

    def component_logs(self, tail_bytes: int = 4000) -> dict[str, str]:
        """The end of each component's log, for failure reports."""
        logs: dict[str, str] = {}
        for name in COMPONENTS:
            path = self.log_path(name)
            if path.is_file():
                with path.open("rb") as handle:
                    handle.seek(max(0, path.stat().st_size - tail_bytes))
                    logs[name] = handle.read().decode(errors="replace")
        return logs

    @contextlib.contextmanager
    def client(self, info: ClusterInfo) -> Iterator[httpx.Client]:
        with info.client() as client:
            yield client

    @contextlib.contextmanager
    def component_down(self, component: str, sig: signal.Signals = signal.SIGKILL) -> Iterator[None]:
        """One component stopped (``sig`` to its process group) for the length of the block, then started
        again with the command line and environment it ran with, the others left running; for chaos
        tests. Returns once a restarted etcd or API server answers its health check."""
        pid = self._read_pid(component)
        if component not in COMPONENTS or pid is None or not process_running(pid):
            raise ClusterError(f"{component}: not a running component of {self.state_dir}")
        proc = Path(f"/proc/{pid}")
        argv = [a.decode() for a in (proc / "cmdline").read_bytes().split(b"\0")[:-1]]
        env = dict(
            e.decode().split("=", 1) for e in (proc / "environ").read_bytes().split(b"\0") if b"=" in e
        )
        self._signal(pid, sig)
        while process_running(pid):
            self._reap(pid)
            time.sleep(0.05)
        self._reap(pid)
        try:
            yield
        finally:
            started = {component: self._spawn(component, Path(argv[0]), argv[1:], env)}
            info = self.info()
            if info is not None and component == "kube-apiserver":
                with self.client(info) as client:
                    self._wait(component, started, lambda: self._ok(client, "/readyz"))
            elif component == "etcd":
                port = int((self._read_state() or {})["ports"]["etcd-client"])
                self._wait(component, started, lambda: self._etcd_healthy(port))

    def restart_component(self, component: str, sig: signal.Signals = signal.SIGKILL) -> None:
        """Stop one component and start it again at once (see :meth:`component_down`)."""
        with self.component_down(component, sig):
            pass

    # -- state -----------------------------------------------------------------------------------------
    def _read_state(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None
        return data

    def _info_from_state(self, state: Mapping[str, Any]) -> ClusterInfo:
        return ClusterInfo(
            kubeconfig=self.kubeconfig_path,
            server=str(state["server"]),
            state_dir=self.state_dir,
            ca_cert=self.pki.ca_cert,
            client_cert=self.pki.client_cert("admin"),
            client_key=self.pki.client_key("admin"),
            logs_dir=self.logs_dir,
            pod_cidr=state.get("pod_cidr") or self.settings.pod_cidr,
        )

    def _read_pid(self, component: str) -> int | None:
        try:
            return int((self.pids_dir / f"{component}.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def _running_info(self) -> ClusterInfo | None:
        status = self.status()
        if not status.running:
            return None
        state = self._read_state()
        return self._info_from_state(state) if state else None

    # -- processes -------------------------------------------------------------------------------------
    def _spawn(
        self, component: str, binary: Path, args: Sequence[str], env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.pids_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path(component).open("ab")
        try:
            proc = subprocess.Popen(
                [str(binary), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.state_dir,
                env=None if env is None else dict(env),
                start_new_session=True,
                preexec_fn=kill_with_parent if self.settings.tie_to_parent else None,
            )
        finally:
            log.close()
        (self.pids_dir / f"{component}.pid").write_text(f"{proc.pid}\n")
        return proc

    def _stop_processes(self) -> None:
        state = self._read_state() or {}
        binaries: Mapping[str, str] = state.get("binaries", {})
        targets: list[tuple[str, int]] = []
        for name in reversed(COMPONENTS):
            pid = self._read_pid(name)
            binary = Path(binaries[name]) if name in binaries else None
            if pid is not None and process_running(pid, binary):
                targets.append((name, pid))
        for _, pid in targets:
            self._signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.settings.stop_timeout_s
        for _, pid in targets:
            while process_running(pid) and time.monotonic() < deadline:
                self._reap(pid)
                time.sleep(0.05)
            if process_running(pid):
                self._signal(pid, signal.SIGKILL)
            self._reap(pid)
        for name in COMPONENTS:
            (self.pids_dir / f"{name}.pid").unlink(missing_ok=True)

    @staticmethod
    def _signal(pid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)  # the component and anything it spawned
            else:
                os.kill(pid, sig)

    @staticmethod
    def _reap(pid: int) -> None:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)

    # -- startup ---------------------------------------------------------------------------------------
    def _start(self, binaries: Mapping[str, Path]) -> ClusterInfo:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        pki = generate_pki(self.state_dir / "pki", self.settings.service_ip)
        etcd_client, etcd_peer, apiserver_port, kwok_port, lws_webhook, lws_health = self._ports()
        server = f"https://127.0.0.1:{apiserver_port}"
        self._write_kubeconfigs(pki, server)
        pod_cidr = self._choose_pod_cidr()
        state = {
            "server": server,
            "pod_cidr": pod_cidr,
            "ports": {
                "etcd-client": etcd_client,
                "etcd-peer": etcd_peer,
                "apiserver": apiserver_port,
                "kwok": kwok_port,
                "lws-webhook": lws_webhook,
                "lws-health": lws_health,
            },
            "binaries": {name: str(path) for name, path in binaries.items()},
            "nodes": [asdict(pool) for pool in self.nodes],
        }
        self.state_file.write_text(json.dumps(state, indent=2))
        info = self._info_from_state(state)
        procs: dict[str, subprocess.Popen[bytes]] = {}
        procs["etcd"] = self._spawn("etcd", binaries["etcd"], self._etcd_args(etcd_client, etcd_peer))
        self._wait("etcd", procs, lambda: self._etcd_healthy(etcd_client))
        procs["kube-apiserver"] = self._spawn(
            "kube-apiserver",
            binaries["kube-apiserver"],
            self._apiserver_args(pki, etcd_client, apiserver_port),
        )
        with self.client(info) as client:
            self._wait("kube-apiserver", procs, lambda: self._ok(client, "/readyz"))
            procs["kube-controller-manager"] = self._spawn(
                "kube-controller-manager",
                binaries["kube-controller-manager"],
                self._controller_manager_args(pki),
            )
            procs["kube-scheduler"] = self._spawn(
                "kube-scheduler", binaries["kube-scheduler"], self._scheduler_args()
            )
            procs["kwok"] = self._spawn("kwok", binaries["kwok"], self._kwok_args(kwok_port, pod_cidr))
        self._ensure_nodes(info)
        procs["lws-controller"] = self._start_lws(
            info, pki, binaries["lws-controller"], lws.LwsPorts(lws_webhook, lws_health), procs
        )
        self._install_monitoring_crds(info, procs)
        self._install_gateway_crds(info, procs)
        self._wait_nodes_ready(info, procs)
        with self.client(info) as client:
            # the controller-manager is working once it has made the default ServiceAccount
            self._wait(
                "kube-controller-manager",
                procs,
                lambda: self._ok(client, "/api/v1/namespaces/default/serviceaccounts/default"),
            )
        return info

    def _ports(self) -> list[int]:
        """The ports of a previous run of this state directory when they are all free again (etcd keeps
        its peer URL in its data, and a kubeconfig handed out stays valid), else fresh free ports."""
        previous = (self._read_state() or {}).get("ports", {})
        names = ("etcd-client", "etcd-peer", "apiserver", "kwok", "lws-webhook", "lws-health")
        if all(isinstance(previous.get(n), int) for n in names) and all(
            port_free(previous[n]) for n in names
        ):
            return [int(previous[n]) for n in names]
        return free_ports(len(names))

    def _write_kubeconfigs(self, pki: Pki, server: str) -> None:
        ca = pki.ca_cert.read_bytes()
        for identity in ("admin", "controller-manager", "scheduler", "kwok", "lws-controller"):
            config = kubeconfig_dict(
                server,
                ca,
                pki.client_cert(identity).read_bytes(),
                pki.client_key(identity).read_bytes(),
                identity,
            )
            path = self._kubeconfig_for(identity)
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            path.chmod(0o600)

    def _etcd_args(self, client_port: int, peer_port: int) -> list[str]:
        client_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        return [
            "--name=disagg",
            f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=disagg={peer_url}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync",  # a throwaway test store: durability is not needed, speed is
            "--log-level=warn",
        ]

    def _apiserver_args(self, pki: Pki, etcd_client: int, port: int) -> list[str]:
        return [
            f"--etcd-servers=http://127.0.0.1:{etcd_client}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--tls-cert-file={pki.apiserver_cert}",
            f"--tls-private-key-file={pki.apiserver_key}",
            f"--client-ca-file={pki.ca_cert}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={self.settings.service_account_issuer}",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={self.settings.service_cidr}",
            # the `kubernetes` Service cannot point at a loopback address; nothing here needs its endpoints
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            "--profiling=false",
            f"--cert-dir={self.state_dir / 'apiserver-certs'}",
            # The aggregation layer, for extension API servers such as the metrics adapter that serves
            # external.metrics.k8s.io to the HPA controller (disagg.cluster.metrics_adapter). Flags as
            # https://kubernetes.io/docs/tasks/extend-kubernetes/configure-aggregation-layer/ lists them;
            # one CA here signs both client and front-proxy certificates.
            f"--requestheader-client-ca-file={pki.ca_cert}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki.client_cert(FRONT_PROXY_CLIENT)}",
            f"--proxy-client-key-file={pki.client_key(FRONT_PROXY_CLIENT)}",
            f"--v={self.settings.log_verbosity}",
            *self.settings.extra_apiserver_args,
        ]

    def _controller_manager_args(self, pki: Pki) -> list[str]:
        return [
            f"--kubeconfig={self._kubeconfig_for('controller-manager')}",
            f"--service-account-private-key-file={pki.sa_key}",
            f"--root-ca-file={pki.ca_cert}",
            "--use-service-account-credentials=true",
            "--controllers=*",
            f"--cluster-signing-cert-file={pki.ca_cert}",
            f"--cluster-signing-key-file={pki.ca_key}",
            "--leader-elect=false",
            "--secure-port=0",
            f"--v={self.settings.log_verbosity}",
        ]

    def _scheduler_args(self) -> list[str]:
        return [
            f"--kubeconfig={self._kubeconfig_for('scheduler')}",
            "--leader-elect=false",
            "--secure-port=0",
            f"--v={self.settings.log_verbosity}",
        ]

    def _start_lws(
        self,
        info: ClusterInfo,
        pki: Pki,
        binary: Path,
        ports: lws.LwsPorts,
        procs: dict[str, subprocess.Popen[bytes]],
    ) -> subprocess.Popen[bytes]:
        """The LWS release's CRDs and RBAC, its controller, then its webhooks once they serve (before
        that the API server would refuse every LeaderWorkerSet: the webhooks fail closed)."""
        with self.client(info) as client:
            try:
                lws.apply_objects(client, [*lws.crds(self.build), *lws.rbac(self.build)])
            except lws.LwsInstallError as error:
                raise ClusterError(f"lws-controller: {error}") from error
            self._wait("lws-controller", procs, lambda: lws.crds_established(client, self.build))
        config = self.state_dir / "lws-config.yaml"
        config.write_text(yaml.safe_dump(lws.controller_config(ports, pki.webhook_dir), sort_keys=False))
        env = {**os.environ, "KUBECONFIG": str(self._kubeconfig_for("lws-controller"))}
        proc = self._spawn("lws-controller", binary, [f"--config={config}", "--zap-log-level=info"], env)
        procs["lws-controller"] = proc
        ca = str(pki.ca_cert)
        self._wait("lws-controller", procs, lambda: self._https_up(f"https://127.0.0.1:{ports.webhook}/", ca))
        self._wait("lws-controller", procs, lambda: self._http_ok(f"http://127.0.0.1:{ports.health}/readyz"))
        with self.client(info) as client:
            try:
                lws.apply_objects(
                    client, lws.webhook_configurations(ports.webhook, pki.ca_cert.read_bytes(), self.build)
                )
            except lws.LwsInstallError as error:
                raise ClusterError(f"lws-controller: {error}") from error
        return proc

    def _install_monitoring_crds(
        self, info: ClusterInfo, procs: Mapping[str, subprocess.Popen[bytes]] | None = None
    ) -> None:
        """The Prometheus Operator's CRDs (no operator runs), applied and Established."""
        with self.client(info) as client:
            try:
                names = monitoring.install(client, self.build)
            except lws.LwsInstallError as error:
                raise ClusterError(f"prometheus-operator CRDs: {error}") from error
            self._wait("kube-apiserver", procs or {}, lambda: lws.established(client, names))

    def _install_gateway_crds(
        self, info: ClusterInfo, procs: Mapping[str, subprocess.Popen[bytes]] | None = None
    ) -> None:
        """The Gateway API's and the Inference Extension's CRDs (no gateway runs), applied and Established."""
        with self.client(info) as client:
            try:
                names = gateway.install(client, self.build)
            except lws.LwsInstallError as error:
                raise ClusterError(f"gateway API CRDs: {error}") from error
            self._wait("kube-apiserver", procs or {}, lambda: lws.established(client, names))

    @staticmethod
    def _https_up(url: str, ca: str) -> bool:
        """Whether a TLS server answers at ``url`` with a certificate the CA signed (any HTTP status)."""
        try:
            httpx.get(url, verify=ssl.create_default_context(cafile=ca), timeout=2.0)
        except httpx.HTTPError:
            return False
        return True

    @staticmethod
    def _http_ok(url: str) -> bool:
        try:
            return httpx.get(url, timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _choose_pod_cidr(self) -> str:
        """The configured pod CIDR, else the one a previous run of this state directory used, else a free
        loopback /16 (claimed in the cache, so concurrent local clusters never hand out the same pod IP)."""
        if self.settings.pod_cidr is not None:
            return self.settings.pod_cidr
        previous = (self._read_state() or {}).get("pod_cidr")
        prefer = previous if isinstance(previous, str) and previous else None
        return claim_loopback_pod_cidr(self.state_dir, self.build.cache_root, prefer)

    def _kwok_args(self, port: int, pod_cidr: str) -> list[str]:
        key, value = KWOK_NODE_ANNOTATION
        config = self.state_dir / "kwok.yaml"
        config.write_text(yaml.safe_dump_all(kwok_config_documents(), sort_keys=False))
        return [
            f"--kubeconfig={self._kubeconfig_for('kwok')}",
            f"--config={config}",
            f"--node-lease-duration-seconds={self.settings.node_lease_seconds}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={key}={value}",
            # kwok v0.8 takes the address part as the first pod IP (pkg/kwok/controllers/utils.go parseCIDR
            # keeps it; ipPool hands out that address, then the next ones)
            f"--cidr={pod_cidr}",
            "--node-ip=127.0.0.1",
            f"--server-address=127.0.0.1:{port}",
        ]

    # -- waiting ---------------------------------------------------------------------------------------
    def _wait(
        self, component: str, procs: Mapping[str, subprocess.Popen[bytes]], check: Callable[[], bool]
    ) -> None:
        deadline = time.monotonic() + self.settings.start_timeout_s
        while time.monotonic() < deadline:
            for name, proc in procs.items():
                code = proc.poll()
                if code is not None:
                    raise ClusterError(self._failure(name, f"exited with code {code}"))
            if check():
                return
            time.sleep(self.settings.poll_interval_s)
        raise ClusterError(self._failure(component, f"not ready after {self.settings.start_timeout_s:.0f} s"))

    def _failure(self, component: str, what: str) -> str:
        tail = self.component_logs(3000).get(component, "(no log)")
        return f"{component} {what}; log {self.log_path(component)} ends with:\n{tail}"

    @staticmethod
    def _etcd_healthy(port: int) -> bool:
        try:
            response = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200 and '"health":"true"' in response.text.replace(" ", "")

    @staticmethod
    def _ok(client: httpx.Client, path: str) -> bool:
        try:
            return client.get(path).status_code == 200
        except httpx.HTTPError:
            return False

    def _ensure_nodes(self, info: ClusterInfo) -> None:
        with self.client(info) as client:
            for pool in self.nodes:
                for index in range(pool.count):
                    manifest = node_manifest(pool, index)
                    response = client.post("/api/v1/nodes", json=manifest)
                    if response.status_code not in (201, 409):
                        name = manifest["metadata"]["name"]
                        raise ClusterError(
                            f"creating node {name}: HTTP {response.status_code} {response.text}"
                        )

    def expected_node_names(self) -> list[str]:
        return [pool.node_name(i) for pool in self.nodes for i in range(pool.count)]

    def _count_ready_nodes(self, client: httpx.Client) -> tuple[int, int]:
        response = client.get("/api/v1/nodes", params={"labelSelector": "type=kwok"})
        response.raise_for_status()
        items = response.json().get("items", [])
        ready = sum(1 for node in items if node_ready(node))
        return ready, len(items)

    def _wait_nodes_ready(
        self, info: ClusterInfo, procs: Mapping[str, subprocess.Popen[bytes]] | None = None
    ) -> None:
        expected = set(self.expected_node_names())
        with self.client(info) as client:

            def all_ready() -> bool:
                response = client.get("/api/v1/nodes", params={"labelSelector": "type=kwok"})
                if response.status_code != 200:
                    return False
                ready = {n["metadata"]["name"] for n in response.json().get("items", []) if node_ready(n)}
                return expected <= ready

            self._wait("kwok", procs or {}, all_ready)


# Second octets of 127.0.0.0/8 handed out as pod /16s: 127.0.x (127.0.0.1 is the API server, the node IP and
# every component's address) and 127.1-63 stay free for whatever else the machine binds on loopback.
LOOPBACK_POD_OCTETS = range(64, 255)


def loopback_pod_cidr(octet: int) -> str:
    """kwok's --cidr for the /16 ``127.<octet>.0.0``: pods get 127.<octet>.0.1, .0.2, ..."""
    return f"127.{octet}.0.1/16"


def claim_loopback_pod_cidr(state_dir: Path, cache_root: Path, prefer: str | None = None) -> str:
    """Claim a loopback /16 for the cluster of ``state_dir`` (``prefer`` first, e.g. the one it used
    before): one whose claim file under ``<cache>/pod-cidrs/`` is absent, names ``state_dir``, or names a
    state directory whose cluster no longer runs."""
    claims = cache_root / "pod-cidrs"
    claims.mkdir(parents=True, exist_ok=True)
    octets = list(LOOPBACK_POD_OCTETS)
    preferred = [o for o in octets if loopback_pod_cidr(o) == prefer]
    with (claims / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            for octet in [*preferred, *octets]:
                claim = claims / f"127.{octet}"
                owner = claim.read_text().strip() if claim.is_file() else ""
                if owner and Path(owner) != state_dir and (_cluster_alive(Path(owner)) or _fresh(claim)):
                    continue
                claim.write_text(f"{state_dir}\n")
                return loopback_pod_cidr(octet)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    raise ClusterError(f"no free loopback pod CIDR left under {claims} (every 127.N/16 is claimed)")


# A claim younger than this holds even though its cluster is not running yet: a cluster claims its /16
# before it starts its processes, so two clusters starting at once would otherwise take the same one (seen:
# two test sessions' live twins binding the same pod IPs).
CLAIM_STARTUP_GRACE_S = 300.0


def _fresh(claim: Path) -> bool:
    try:
        return time.time() - claim.stat().st_mtime < CLAIM_STARTUP_GRACE_S
    except OSError:
        return False


def _cluster_alive(state_dir: Path) -> bool:
    """Whether the cluster of another state directory still runs (its kwok or API server is alive, running
    the program its state recorded: a pid recycled since by another program does not count)."""
    lc = LocalCluster(state_dir=state_dir)
    binaries = (lc._read_state() or {}).get("binaries", {})
    for component in ("kwok", "kube-apiserver"):
        pid = lc._read_pid(component)
        binary = Path(binaries[component]) if component in binaries else None
        if pid is not None and process_running(pid, binary):
            return True
    return False

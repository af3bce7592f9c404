"""The local cluster's layout: its kwok GPU node pools, settings and components, the Node objects and
kubeconfigs made from them, and what ``up`` and ``status`` report (:class:`ClusterInfo`,
:class:`ClusterStatus`). Plain data; :mod:`disagg.cluster.local` runs it."""

from __future__ import annotations

import base64
import contextlib
import os
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from disagg.cluster.binaries import BuildSettings, cached_path


@dataclass(frozen=True)
class NodePool:
    """``count`` kwok nodes with ``gpus_per_node`` GPUs of one type (labels from the shared contract)."""

    gpu_type: str
    product: str
    count: int
    gpus_per_node: int = 8
    cpu: str = "192"
    memory: str = "2Ti"
    pods: str = "110"
    # Extended resources besides the GPUs, e.g. what an RDMA device plugin advertises ("rdma/ib").
    extended: tuple[tuple[str, str], ...] = ()

    def node_name(self, index: int) -> str:
        return f"kwok-{self.gpu_type}-{index}"


DEFAULT_NODE_POOLS: tuple[NodePool, ...] = (
    # H100 nodes carry one RDMA device per GPU, as an RDMA device plugin advertises them (rdma/ib, the
    # default of spec.kvTransfer.rdma.resourceName), so RDMA examples schedule here as on a GPU cluster.
    NodePool(gpu_type="h100", product="NVIDIA-H100-80GB-HBM3", count=4, extended=(("rdma/ib", "8"),)),
    NodePool(gpu_type="l40s", product="NVIDIA-L40S", count=2),
    # H200 nodes for the multi-node (LeaderWorkerSet) examples: a DeepSeek-R1 wide-EP deployment takes a
    # 2-node prefill group and a 4-node decode group of 8 GPUs each (examples/deepseek-r1-wideep-*.yaml);
    # two more nodes leave room for one more 2-node group, and no more (gang scaling runs out of them).
    NodePool(gpu_type="h200", product="NVIDIA-H200", count=8, extended=(("rdma/ib", "8"),)),
)

# kwok manages only nodes that carry this annotation (its --manage-nodes-with-annotation-selector).
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
GPU_RESOURCE = "nvidia.com/gpu"

# Start order; ``down`` stops in reverse. The LeaderWorkerSet controller (sigs.k8s.io/lws) runs multi-node
# replicas: its CRDs and webhooks are installed when it starts.
COMPONENTS: tuple[str, ...] = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "lws-controller",
)


@dataclass(frozen=True)
class ClusterSettings:
    service_cidr: str = "10.96.0.0/16"
    service_ip: str = "10.96.0.1"  # first address of service_cidr: the `kubernetes` Service
    # kwok hands pod IPs out of this range. None: a /16 inside 127.0.0.0/8 that no other running local
    # cluster uses (Linux routes all of 127.0.0.0/8 to the loopback interface, so the live twin's engine for
    # a pod can listen on that pod's own IP and everything reaches pods exactly as on a real cluster).
    pod_cidr: str | None = None
    service_account_issuer: str = "https://kubernetes.default.svc.cluster.local"
    start_timeout_s: float = 180.0
    stop_timeout_s: float = 5.0  # then SIGKILL: the state is disposable
    poll_interval_s: float = 0.2
    log_verbosity: int = 1
    # kill the components if the process that started them dies (for test sessions, not for the CLI)
    tie_to_parent: bool = False
    node_lease_seconds: int = (
        40  # kwok renews each node's Lease, which keeps the node lifecycle controller content
    )
    extra_apiserver_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterInfo:
    kubeconfig: Path
    server: str
    state_dir: Path
    ca_cert: Path
    client_cert: Path
    client_key: Path
    logs_dir: Path
    pod_cidr: str | None = None  # what kwok hands pod IPs out of (a loopback /16 unless configured)

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with KUBECONFIG set and the cached kubectl and
        helm (versions matching the server) first on PATH."""
        env = dict(os.environ if base is None else base)
        env["KUBECONFIG"] = str(self.kubeconfig)
        dirs = [str(path.parent) for name in ("kubectl", "helm") if (path := cached_path(name)) is not None]
        if dirs:
            env["PATH"] = os.pathsep.join([*dirs, env.get("PATH", "")])
        return env

    @contextlib.contextmanager
    def client(self) -> Iterator[httpx.Client]:
        """An HTTP client of the API server as the admin (its client certificate, the cluster's CA)."""
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        context.load_cert_chain(str(self.client_cert), str(self.client_key))
        with httpx.Client(base_url=self.server, verify=context, timeout=10.0) as client:
            yield client


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None
    running: bool
    log: Path


@dataclass(frozen=True)
class ClusterStatus:
    state_dir: Path
    server: str | None
    components: tuple[ComponentStatus, ...]
    apiserver_ready: bool
    nodes_ready: int
    nodes_total: int

    @property
    def running(self) -> bool:
        return all(c.running for c in self.components) and self.apiserver_ready


def default_state_dir() -> Path:
    return BuildSettings().cache_root / "cluster-default"


def kubeconfig_dict(server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, user: str) -> dict[str, Any]:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "disagg-local", "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": b64(cert_pem), "client-key-data": b64(key_pem)},
            }
        ],
        "contexts": [{"name": "disagg-local", "context": {"cluster": "disagg-local", "user": user}}],
        "current-context": "disagg-local",
        "preferences": {},
    }


def node_manifest(pool: NodePool, index: int) -> dict[str, Any]:
    """A Node object for kwok: GPU capacity and the GPU labels of the shared contract."""
    name = pool.node_name(index)
    capacity = {
        "cpu": pool.cpu,
        "memory": pool.memory,
        "pods": pool.pods,
        GPU_RESOURCE: str(pool.gpus_per_node),
        **dict(pool.extended),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {
                KWOK_NODE_ANNOTATION[0]: KWOK_NODE_ANNOTATION[1],
                "node.alpha.kubernetes.io/ttl": "0",
            },
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "nvidia.com/gpu.product": pool.product,
                "nvidia.com/gpu.count": str(pool.gpus_per_node),
                "disagg.dev/gpu-type": pool.gpu_type,
            },
        },
        "spec": {},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def node_ready(node: Mapping[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

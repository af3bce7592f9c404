"""A local Kubernetes control plane made of real components (etcd, kube-apiserver, controller-manager,
scheduler, kwok, the LeaderWorkerSet controller) plus Prometheus, built from the package registries and
cached under ~/.cache/disagg."""

from disagg.cluster.local import (
    DEFAULT_NODE_POOLS,
    ClusterError,
    ClusterInfo,
    ClusterSettings,
    ClusterStatus,
    LocalCluster,
    NodePool,
)

__all__ = [
    "DEFAULT_NODE_POOLS",
    "ClusterError",
    "ClusterInfo",
    "ClusterSettings",
    "ClusterStatus",
    "LocalCluster",
    "NodePool",
]

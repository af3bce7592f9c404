"""``disagg cluster up | down | status | env | build``: the local control plane from the command line."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import time
from pathlib import Path

from disagg.clicommon import EXIT_FAILURE, EXIT_USAGE
from disagg.cluster.binaries import COMPONENT_OF, BinaryError, ensure_all
from disagg.cluster.layout import DEFAULT_NODE_POOLS
from disagg.cluster.local import ClusterError, LocalCluster, NodePool

# GPU type -> the nvidia.com/gpu.product label GPU feature discovery puts on such nodes
KNOWN_PRODUCTS: dict[str, str] = {
    "h100": "NVIDIA-H100-80GB-HBM3",
    "h200": "NVIDIA-H200",
    "a100": "NVIDIA-A100-SXM4-80GB",
    "l40s": "NVIDIA-L40S",
    "l4": "NVIDIA-L4",
}

# the GPU types whose default node pools advertise rdma/ib (cluster.layout.DEFAULT_NODE_POOLS)
RDMA_TYPES = frozenset(pool.gpu_type for pool in DEFAULT_NODE_POOLS if dict(pool.extended).get("rdma/ib"))

_POOL = re.compile(
    r"^(?P<type>[a-z0-9-]+)=(?P<count>\d+)(?:x(?P<gpus>\d+))?(?::(?P<product>[A-Za-z0-9._-]+))?$"
)


def parse_node_pools(text: str) -> tuple[NodePool, ...]:
    """``h100=4x8,l40s=2x8`` -> node pools: ``TYPE=COUNT[xGPUS][:PRODUCT]``; known types need no PRODUCT."""
    pools: list[NodePool] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = _POOL.match(item)
        if match is None:
            raise ValueError(f"--nodes: {item!r} is not TYPE=COUNT[xGPUS][:PRODUCT] (e.g. h100=4x8)")
        gpu_type = match["type"]
        product = match["product"] or KNOWN_PRODUCTS.get(gpu_type)
        if product is None:
            raise ValueError(
                f"--nodes: unknown GPU type {gpu_type!r}; name its product, e.g. {gpu_type}=2x8:NVIDIA-X"
            )
        gpus = int(match["gpus"]) if match["gpus"] else 8
        # SXM nodes of the RDMA types carry one RDMA device per GPU, as the default pools do, so the
        # RDMA and multi-node examples schedule on a pool given here too
        extended = (("rdma/ib", str(gpus)),) if gpu_type in RDMA_TYPES else ()
        pools.append(
            NodePool(
                gpu_type=gpu_type,
                product=product,
                count=int(match["count"]),
                gpus_per_node=gpus,
                extended=extended,
            )
        )
    if not pools:
        raise ValueError("--nodes: no node pool given")
    return tuple(pools)


def _cluster(args: argparse.Namespace) -> LocalCluster:
    state_dir = Path(args.state_dir) if args.state_dir else None
    # without --nodes: the pools this state directory was started with, else the defaults
    nodes = parse_node_pools(args.nodes) if getattr(args, "nodes", None) else None
    return LocalCluster(state_dir=state_dir, nodes=nodes)


def cmd_up(args: argparse.Namespace) -> int:
    started = time.monotonic()
    try:
        cluster = _cluster(args)
    except ValueError as exc:  # --nodes: the command line, not the cluster
        print(f"disagg cluster up: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        info = cluster.up()
    except (ClusterError, BinaryError, ValueError) as exc:
        print(f"disagg cluster up: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(f"control plane ready in {time.monotonic() - started:.1f} s at {info.server}", file=sys.stderr)
    print(f"export KUBECONFIG={info.kubeconfig}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    _cluster(args).down(keep_state=args.keep_state)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    status = _cluster(args).status()
    print(f"state:  {status.state_dir}")
    print(f"server: {status.server or '-'} ({'ready' if status.apiserver_ready else 'not ready'})")
    for comp in status.components:
        state = "running" if comp.running else "stopped"
        print(f"  {comp.name:<24} {state:<8} pid {comp.pid or '-':<8} log {comp.log}")
    print(f"nodes:  {status.nodes_ready}/{status.nodes_total} Ready")
    return 0 if status.running else 1


def cmd_env(args: argparse.Namespace) -> int:
    info = _cluster(args).info()
    if info is None:
        print("disagg cluster env: no cluster state; run `disagg cluster up` first", file=sys.stderr)
        return 1
    print(f"export KUBECONFIG={info.kubeconfig}")
    path = info.env().get("PATH")
    if path and path != os.environ.get("PATH"):
        print(f"export PATH={shlex.quote(path)}")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    try:
        paths = ensure_all(args.programs or None)
    except BinaryError as exc:
        print(f"disagg cluster build: {exc}", file=sys.stderr)
        return 1
    for name, path in paths.items():
        print(f"{name}\t{path}")
    return 0


def configure(parser: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state-dir", help="state, pids and logs (default ~/.cache/disagg/cluster-default)")
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    up = sub.add_parser(
        "up",
        parents=[common],
        help="start the control plane (or reuse the running one) and wait for Ready nodes",
    )
    up.add_argument(
        "--nodes", help="node pools, TYPE=COUNT[xGPUS][:PRODUCT],... (default h100=4x8,l40s=2x8,h200=8x8)"
    )
    up.set_defaults(func=cmd_up)
    down = sub.add_parser(
        "down", parents=[common], help="stop every process the cluster started and remove its state"
    )
    down.add_argument("--keep-state", action="store_true", help="keep the state directory (logs, etcd data)")
    down.set_defaults(func=cmd_down)
    sub.add_parser(
        "status", parents=[common], help="which components run, and how many nodes are Ready"
    ).set_defaults(func=cmd_status)
    sub.add_parser(
        "env",
        parents=[common],
        help="print `export KUBECONFIG=...` and PATH with the matching kubectl and helm",
    ).set_defaults(func=cmd_env)
    build = sub.add_parser(
        "build", help="obtain (build once, then cache) the programs now: all, or those named"
    )
    build.add_argument("programs", nargs="*", metavar="PROGRAM", help=", ".join(COMPONENT_OF))
    build.set_defaults(func=cmd_build)

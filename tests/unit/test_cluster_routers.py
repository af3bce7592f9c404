"""The local cluster's loopback pod CIDRs and the router launcher's command-line handling (no processes)."""

from __future__ import annotations

import ipaddress
import json
import os
import time
from pathlib import Path

import pytest

from disagg.cluster.local import (
    CLAIM_STARTUP_GRACE_S,
    LOOPBACK_POD_OCTETS,
    claim_loopback_pod_cidr,
    loopback_pod_cidr,
)
from disagg.cluster.routers import RouterError, expand_kubelet_vars, local_router_argv, with_option


def test_pod_cidrs_are_loopback_and_leave_the_components_address_alone() -> None:
    for octet in LOOPBACK_POD_OCTETS:
        network = ipaddress.ip_network(loopback_pod_cidr(octet), strict=False)
        assert network.subnet_of(ipaddress.ip_network("127.0.0.0/8"))
        assert ipaddress.ip_address("127.0.0.1") not in network
    assert loopback_pod_cidr(64) == "127.64.0.1/16"  # kwok hands out 127.64.0.1, .0.2, ...


def test_concurrent_clusters_claim_distinct_pod_cidrs(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    running = tmp_path / "running"
    (running / "pids").mkdir(parents=True)
    (running / "pids" / "kwok.pid").write_text(f"{os.getpid()}\n")  # a live process: that cluster runs
    first = claim_loopback_pod_cidr(running, cache)
    second = claim_loopback_pod_cidr(tmp_path / "other", cache)
    assert first != second
    # a state directory gets its previous CIDR back while nobody else holds it
    assert claim_loopback_pod_cidr(tmp_path / "other", cache, prefer=second) == second
    # a fresh claim holds while its cluster is still starting (no process yet): two clusters starting at
    # once get distinct CIDRs
    starting = claim_loopback_pod_cidr(tmp_path / "starting", tmp_path / "cache2")
    assert claim_loopback_pod_cidr(tmp_path / "also-starting", tmp_path / "cache2") != starting
    # a claim whose cluster no longer runs is taken over once it is older than a start-up
    stale = tmp_path / "stale"
    assert claim_loopback_pod_cidr(stale, tmp_path / "cache4") == loopback_pod_cidr(64)
    age(tmp_path / "cache4")
    assert claim_loopback_pod_cidr(tmp_path / "new", tmp_path / "cache4") == loopback_pod_cidr(64)
    # ... and so is one whose recorded pid now runs another program than the kwok its state names
    recycled = tmp_path / "recycled"
    (recycled / "pids").mkdir(parents=True)
    (recycled / "pids" / "kwok.pid").write_text(f"{os.getpid()}\n")
    (recycled / "state.json").write_text(json.dumps({"binaries": {"kwok": "/nonexistent/kwok"}}))
    cache3 = tmp_path / "cache3"
    assert claim_loopback_pod_cidr(recycled, cache3) == loopback_pod_cidr(64)
    age(cache3)
    assert claim_loopback_pod_cidr(tmp_path / "next", cache3) == loopback_pod_cidr(64)


def age(cache: Path) -> None:
    """Every pod-CIDR claim under ``cache`` made older than a cluster's start-up grace."""
    old = time.time() - CLAIM_STARTUP_GRACE_S - 1
    for claim in (cache / "pod-cidrs").glob("127.*"):
        os.utime(claim, (old, old))


def test_rendered_router_commands_run_locally_on_loopback() -> None:
    rendered = ["vllm-router", "--vllm-pd-disaggregation", "--host", "0.0.0.0", "--port", "8000"]
    rendered += ["--service-discovery-namespace", "$(POD_NAMESPACE)", "--prometheus-host", "0.0.0.0"]
    rendered += ["--prometheus-port", "29000", "--note", "$$(KEPT)"]
    expanded = expand_kubelet_vars(rendered, {"POD_NAMESPACE": "ns"})
    argv = local_router_argv("vllm", expanded, ["/venv/bin/vllm-router"], 4000, 4001)
    assert argv[:2] == ["/venv/bin/vllm-router", "--vllm-pd-disaggregation"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "4000"
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    assert argv[argv.index("--prometheus-port") + 1] == "4001"
    assert argv[argv.index("--service-discovery-namespace") + 1] == "ns"
    assert argv[-1] == "$(KEPT)"  # $$ escapes, as the kubelet's expansion
    sglang = ["python3", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    head = ["/venv/bin/python", "-m", "sglang_router.launch_router"]
    local = local_router_argv("sglang", sglang, head, 4000, 4001)
    assert local[:4] == [*head, "--pd-disaggregation"] and "--prometheus-port" not in local
    with pytest.raises(RouterError, match="starts with"):
        local_router_argv("vllm", sglang, ["x"], 1, 2)
    assert with_option(["--port=1"], "--port", "2") == ["--port=2"]

"""`disagg cluster up | status | env | down` on a second, small control plane of its own: `up` is idempotent,
restarts what crashed on the same address with the data kept, and `down` leaves no process or file behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes import config as k8s_config

from disagg.cluster.binaries import ensure_binary
from disagg.cluster.local import COMPONENTS, LocalCluster, process_running
from disagg.cluster.wait import wait_for

DISAGG = str(Path(sys.executable).parent / "disagg")


def _disagg(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DISAGG, "cluster", *args], capture_output=True, text=True, timeout=240, check=False
    )


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "cli-cluster"
    try:
        yield path
    finally:
        LocalCluster(state_dir=path).down()  # whatever the test left running


def _pids(state_dir: Path) -> dict[str, int]:
    return {name: int((state_dir / "pids" / f"{name}.pid").read_text()) for name in COMPONENTS}


def test_cli_up_is_idempotent_restarts_crashed_components_and_down_cleans_up(state_dir: Path) -> None:
    up = _disagg("up", "--state-dir", str(state_dir), "--nodes", "h100=1x8,l40s=1x4")
    assert up.returncode == 0, up.stderr
    kubeconfig = state_dir / "kubeconfig"
    assert up.stdout.strip() == f"export KUBECONFIG={kubeconfig}"
    env_lines = _disagg("env", "--state-dir", str(state_dir)).stdout.splitlines()
    assert env_lines[0] == f"export KUBECONFIG={kubeconfig}"
    # the kubectl matching the server comes first on PATH
    assert env_lines[1].startswith(f"export PATH={ensure_binary('kubectl').parent}{os.pathsep}")

    status = _disagg("status", "--state-dir", str(state_dir))
    assert status.returncode == 0, status.stdout
    assert "nodes:  2/2 Ready" in status.stdout

    api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
    try:
        core = client.CoreV1Api(api)
        l40s = core.read_node("kwok-l40s-0")
        assert l40s.status.allocatable["nvidia.com/gpu"] == "4"
        core.create_namespaced_config_map(
            "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="kept"))
        )
        server = json.loads((state_dir / "state.json").read_text())["server"]
        first_pids = _pids(state_dir)

        # a second `up` reuses the running processes
        assert _disagg("up", "--state-dir", str(state_dir)).returncode == 0
        assert _pids(state_dir) == first_pids

        # a crashed apiserver: status says so, and `up` brings the control plane back on the same address
        os.kill(first_pids["kube-apiserver"], signal.SIGKILL)
        # dead once killed, though nobody may reap it: its parent, `disagg cluster up`, has exited and PID 1
        # need not reap orphans (a zombie until then)
        wait_for(lambda: not process_running(first_pids["kube-apiserver"]), what="the apiserver to die")
        assert _disagg("status", "--state-dir", str(state_dir)).returncode == 1
        again = _disagg("up", "--state-dir", str(state_dir))  # the node pools it recorded
        assert again.returncode == 0, again.stderr
        assert json.loads((state_dir / "state.json").read_text())["server"] == server
        assert core.read_namespaced_config_map("kept", "default").metadata.name == "kept"
        second_pids = _pids(state_dir)
        assert {n.metadata.name for n in core.list_node().items} == {"kwok-h100-0", "kwok-l40s-0"}
    finally:
        api.close()

    programs = {n: Path(p) for n, p in json.loads((state_dir / "state.json").read_text())["binaries"].items()}
    down = _disagg("down", "--state-dir", str(state_dir))
    assert down.returncode == 0, down.stderr
    assert not state_dir.exists()
    # none of the components runs (a pid recycled by another program since is not one of them)
    assert not any(
        process_running(pids[name], programs[name])
        for pids in (first_pids, second_pids)
        for name in COMPONENTS
    )

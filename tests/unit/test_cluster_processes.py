"""Process liveness as `disagg cluster status | up | down` judge it from the pids they recorded: a process
that exited is dead even while no parent has reaped it (a zombie), and a recycled pid running another
program is not the component."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from disagg.cluster.local import process_running


def test_a_running_process_is_running_and_named_by_its_program() -> None:
    program = Path(Path(f"/proc/{os.getpid()}/cmdline").read_bytes().split(b"\0")[0].decode())
    assert process_running(os.getpid())
    assert process_running(os.getpid(), program)
    assert not process_running(os.getpid(), Path("/nonexistent/kube-apiserver"))


def test_an_exited_process_is_dead_before_and_after_it_is_reaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    # wait for the exit without reaping it: the child stays a zombie in /proc until child.wait()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    stat = Path(f"/proc/{child.pid}/stat").read_text()
    assert stat[stat.rfind(")") + 1 :].split()[0] == "Z"
    assert not process_running(child.pid)
    assert not process_running(child.pid, Path(sys.executable))
    child.wait()
    assert not process_running(child.pid)


def test_a_process_whose_name_looks_like_a_zombie_state_is_running() -> None:
    # /proc/<pid>/stat is "pid (comm) state ...", and comm is whatever the process calls itself
    script = (
        "import ctypes, sys\n"
        "ctypes.CDLL(None).prctl(15, b'x) Z (y', 0, 0, 0)  # PR_SET_NAME\n"
        "print('named', flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "named\n"
        assert "x) Z (y" in Path(f"/proc/{child.pid}/stat").read_text()
        assert process_running(child.pid)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()


def test_node_pools_from_the_command_line_carry_rdma_where_the_default_pools_do() -> None:
    # a custom H200 pool must still schedule the multi-node RDMA examples (rdma/ib per GPU), an L40S
    # pool (no RDMA in the defaults) gets none
    from disagg.cluster.cli import parse_node_pools

    h200, l40s, h100 = parse_node_pools("h200=4x8,l40s=2x8,h100=2x4")
    assert dict(h200.extended) == {"rdma/ib": "8"}
    assert dict(h100.extended) == {"rdma/ib": "4"}
    assert l40s.extended == ()

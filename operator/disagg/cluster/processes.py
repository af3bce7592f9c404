"""The processes of a local cluster on this machine: spawn one in its own process group (tied to its
parent's life if asked), stop the group, tell whether a pid still runs (and runs the program recorded), and
pick free TCP ports for their servers. Used by the control plane, Prometheus, the routers and the demo."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free TCP ports on ``host`` (bound together, then released). ``host="0.0.0.0"``
    gives ports free on every local address, e.g. for a server on a kwok pod's own 127.x IP."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # the components' servers (Go) set SO_REUSEADDR, so connections in TIME_WAIT do not block them
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# The C library the interpreter runs on (glibc, musl, ...), loaded here rather than between fork and exec,
# where dlopen could wait on a lock another thread of the parent held.
_LIBC = ctypes.CDLL(None, use_errno=True)


def kill_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """preexec_fn: the kernel sends SIGKILL to the child when the thread that forked it exits."""
    pr_set_pdeathsig = 1
    _LIBC.prctl(pr_set_pdeathsig, signal.SIGKILL)


def spawn_logged(
    command: Sequence[str],
    log_path: Path,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    tie_to_parent: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``command`` in a new process group (so :func:`stop_process_group` stops it and what it
    spawned), stdout and stderr appended to ``log_path``; ``env`` None inherits this process's."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=None if env is None else dict(env),
            start_new_session=True,
            preexec_fn=kill_with_parent if tie_to_parent else None,
        )


def stop_process_group(process: subprocess.Popen[bytes] | None, timeout_s: float = 15.0) -> None:
    """SIGTERM the process group ``process`` leads (started with start_new_session); SIGKILL after
    ``timeout_s``. Nothing to do for None or a process that already exited."""
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


# /proc/<pid>/stat states of a process that has exited: its parent has not reaped it yet (a zombie, e.g. a
# component whose `disagg cluster up` is gone, under a PID 1 that does not reap orphans) or is reaping it
_EXITED_STATES = frozenset("ZX")


def process_running(pid: int, binary: Path | None = None) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie is dead, whatever its parent does),
    and, with ``binary``, runs that program (so a recycled pid is not taken for a component)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if binary is not None else []
    except OSError:
        return False
    # "pid (comm) state ...": comm may hold spaces and parentheses, the state follows the last ')'
    fields = stat[stat.rfind(")") + 1 :].split()
    if not fields or fields[0] in _EXITED_STATES:
        return False
    return binary is None or (bool(cmdline) and cmdline[0].decode(errors="replace") == str(binary))

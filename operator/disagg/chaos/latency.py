"""Apply -> all children: how long after a DisaggregatedDeployment is applied the API server has announced
every child the renderer says it has (issue 13, case 6: p99 <= 300 ms for one deployment's children).

The clock stops on a watch the measurer holds open (one per child kind, label ``disagg.dev/deployment``),
which stamps each child's first ADDED event: a watch costs the server nothing per apply, where polling
with LISTs adds its own requests to every sample and loads the server while the operator applies.

Each deployment is deleted once measured, and :func:`settle` waits until it and what grew from it
(children, ReplicaSets, pods) are gone, so every apply meets the same cluster; without it the garbage
collector falls behind a create-delete loop (71 pods and 105 ReplicaSets were still queued 33 s after
three runs of 50) and later runs measure that backlog on the same cores.

Used by the chaos case ``apply-latency`` and by bench/apply_to_children.py.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from disagg.api.deployment import DisaggregatedDeployment
from disagg.k8s.apply import DEPLOYMENT_LABEL
from disagg.k8s.client import (
    CHILD_KINDS,
    DEPLOYMENT,
    DISAGG_DEPLOYMENT,
    POD,
    SERVICE,
    JsonDict,
    Kind,
    KubeApi,
)
from disagg.render import render_children

REPLICASET = Kind("apps/v1", "ReplicaSet", "replicasets")
P99_TARGET_MS = 300.0  # issue 13: one deployment's children applied within 300 ms at p99
WATCH_OPEN_TIMEOUT_S = 30.0
ChildName = tuple[str, str]  # (kind, name)


class ChildWatch:
    """One watch per child kind on the deployment label in ``namespace``; stamps each child's first ADDED
    event with ``time.perf_counter()``. Kinds whose CRD is not installed are skipped."""

    def __init__(self, kube: KubeApi, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.seen: dict[ChildName, float] = {}
        self.changed = threading.Condition()
        self.stopped = threading.Event()
        self.ready = threading.Barrier(len(CHILD_KINDS) + 1)
        self.responses: list[Any] = []
        self.threads = [
            threading.Thread(target=self._watch, args=(kind,), daemon=True, name=f"watch-{kind.plural}")
            for kind in CHILD_KINDS
        ]

    def __enter__(self) -> ChildWatch:
        for thread in self.threads:
            thread.start()
        self.ready.wait(timeout=WATCH_OPEN_TIMEOUT_S)  # every watch is open (or its kind is not served)
        return self

    def __exit__(self, *_: object) -> None:
        self.stopped.set()
        for response in list(self.responses):
            with contextlib.suppress(Exception):  # already ended
                response.response.shutdown()  # wakes the thread blocked reading its stream

    def _open(self, kind: Kind) -> Any:
        query = [("watch", "true"), ("labelSelector", DEPLOYMENT_LABEL), ("timeoutSeconds", "3600")]
        client = self.kube.api_client
        method, url, headers, body, _ = client.param_serialize(
            "GET", kind.path(self.namespace), query_params=query, auth_settings=["BearerToken"]
        )
        return client.call_api(method, url, headers, body)  # not read: the body is streamed

    def _watch(self, kind: Kind) -> None:
        response = self._open(kind)
        self.responses.append(response)
        self.ready.wait(timeout=WATCH_OPEN_TIMEOUT_S)
        if response.status != 200:  # an optional kind whose CRD is not installed
            return
        pending = b""
        try:
            for chunk in response.response.stream(amt=None):
                *lines, pending = (pending + chunk).split(b"\n")  # one JSON event a line
                self._on_lines(kind, lines)
                if self.stopped.is_set():
                    return
        except Exception:
            if not self.stopped.is_set():  # closed by __exit__ (or the cluster went away after it): done
                raise

    def _on_lines(self, kind: Kind, lines: list[bytes]) -> None:
        stamp = time.perf_counter()
        for line in lines:
            if not line.strip():
                continue
            event = json.loads(line)
            if event.get("type") != "ADDED":
                continue
            key = (kind.kind, event["object"]["metadata"]["name"])
            with self.changed:
                self.seen.setdefault(key, stamp)
                self.changed.notify_all()

    def wait_for(self, want: set[ChildName], timeout_s: float) -> float | None:
        """perf_counter when the last of ``want`` was announced, or None after ``timeout_s``."""
        with self.changed:
            if not self.changed.wait_for(lambda: want <= self.seen.keys(), timeout=timeout_s):
                return None
            return max(self.seen[key] for key in want)


def rendered_children(manifest: Mapping[str, Any]) -> set[ChildName]:
    """The (kind, name) of every child the renderer gives ``manifest`` (what the operator applies)."""
    dd = DisaggregatedDeployment.model_validate(manifest)
    return {(c["kind"], c["metadata"]["name"]) for c in render_children(dd)}


def time_apply(
    kube: KubeApi, manifest: JsonDict, watch: ChildWatch, timeout_s: float, field_manager: str
) -> float | None:
    """Seconds from applying ``manifest`` to the last of its children announced on ``watch``; None when
    they were not all announced within ``timeout_s``."""
    want = rendered_children(manifest)
    started = time.perf_counter()
    kube.apply(manifest, field_manager=field_manager)
    done = watch.wait_for(want, timeout_s)
    return None if done is None else done - started


def settle(kube: KubeApi, namespace: str, timeout_s: float) -> bool:
    """Wait until ``namespace`` holds no deployment, Deployment, Service, ReplicaSet or pod (the deleted
    deployment's cascade has run); False when some remain after ``timeout_s``."""
    return _until(lambda: not any(kube.list(k, namespace) for k in _CASCADE), timeout_s, 0.05)


def wait_deleted(kube: KubeApi, namespace: str, timeout_s: float) -> bool:
    """Wait until the operator has let go of every deployment deleted in ``namespace`` (an operator stopped
    before that leaves its finalizer on them: the namespace can't go, and the controller-manager and API
    server retry it for good, 24% and 10% of a core here, loading everything measured later)."""
    return _until(lambda: not kube.list(DISAGG_DEPLOYMENT, namespace), timeout_s, 0.1)


_CASCADE = (DISAGG_DEPLOYMENT, REPLICASET, POD, DEPLOYMENT, SERVICE)


def _until(done: Callable[[], bool], timeout_s: float, interval_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile of ``values`` (not empty)."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


@dataclass(frozen=True)
class LatencyRun:
    """One operator's applies, in milliseconds, in the order they were made."""

    samples_ms: list[float]

    def q(self, p: float) -> float:
        return percentile(self.samples_ms, p)

    def q_after_first(self, p: float) -> float:
        """Without the run's first apply (it meets an operator whose watches may still be starting)."""
        return percentile(self.samples_ms[1:] or self.samples_ms, p)

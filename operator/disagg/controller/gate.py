"""One reconcile at a time per object, with bursts of triggers folded into a single follow-up run.

Watch events for a DisaggregatedDeployment and for each of its children arrive on different kopf workers
(threads, for synchronous handlers). Reconciles of one object must not overlap, and ten child events in a
burst need one more run, not ten: a run reads the object and its children afresh, so a trigger that
arrives while another run is waiting to start is already covered by that run. Triggers carry a level
(e.g. refresh the status only, or apply everything); the queued run does the highest level asked of it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


@dataclass
class _Slot:
    lock: threading.Lock = field(default_factory=threading.Lock)
    waiting: bool = False
    level: int = 0


class ReconcileGate:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._slots: dict[Hashable, _Slot] = {}

    def run(self, key: Hashable, level: int, work: Callable[[int], T]) -> tuple[bool, T | None]:
        """Run ``work(level)`` under the key's lock.

        When a run for the key is already queued, raise its level to ``level`` if higher and return
        (False, None): that run will do this trigger's work.
        """
        with self._guard:
            slot = self._slots.setdefault(key, _Slot())
            if slot.waiting:
                slot.level = max(slot.level, level)
                return False, None
            slot.waiting, slot.level = True, level
        with slot.lock:
            with self._guard:
                slot.waiting = False
                granted = slot.level
            return True, work(granted)

    def forget(self, key: Hashable) -> None:
        """Drop the key's slot (the object is gone); a run in progress finishes normally."""
        with self._guard:
            slot = self._slots.get(key)
            if slot is not None and not slot.waiting and not slot.lock.locked():
                del self._slots[key]


class TriggerQueue(Generic[K]):
    """Triggers run on a thread pool, at most one pending run per key.

    A watch handler that only triggers returns at once, so kopf can drop the event's body instead of
    holding it while the handler waits for a thread (a rollout of hundreds of deployments brings thousands
    of child events). Triggers for a key whose run has not started yet fold into that run at the highest
    level asked; a trigger that comes once the run has started queues the next one (which reads afresh).
    """

    def __init__(self, submit: Callable[[Callable[[], None]], object], run: Callable[[K, int], None]):
        self._submit = submit
        self._run = run
        self._guard = threading.Lock()
        self._pending: dict[K, int] = {}

    def trigger(self, key: K, level: int) -> bool:
        """Queue a run of ``key`` at ``level``; False when a pending run took the trigger over."""
        with self._guard:
            if key in self._pending:
                self._pending[key] = max(self._pending[key], level)
                return False
            self._pending[key] = level
        try:
            self._submit(lambda: self._start(key))
        except RuntimeError:  # the pool is shut down: the operator is stopping
            with self._guard:
                self._pending.pop(key, None)
            return False
        return True

    def pending(self) -> int:
        with self._guard:
            return len(self._pending)

    def _start(self, key: K) -> None:
        with self._guard:
            level = self._pending.pop(key)
        self._run(key, level)

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
from typing import TypeVar

T = TypeVar("T")


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

"""The kopf handlers of the reconciler: thin triggers around :class:`disagg.controller.reconcile.Reconciler`.

What triggers a reconcile of a DisaggregatedDeployment:
- its first watch event while it has never been reconciled (no status, nothing applied by this process):
  a new deployment's children are applied without waiting for kopf's creation path, whose handler then
  finds that generation applied and does nothing;
- its creation, a change of its spec/labels/annotations, and the operator's start (create/update/resume);
- a change of ``status.autoscaling.desiredReplicas`` that asks for replicas other than those applied
  (a watch-event handler: kopf's field handlers ignore status, the autoscaler's channel to the reconciler);
- any watch event of a child it controls (the watch asks the API server for objects with the deployment
  label; a child whose label is removed by hand leaves that selection, which the watch reports as a
  deletion): drift is undone, and readiness flows into status;
- a resync timer, as a safety net for anything missed.
All of them go through one per-object gate, so reconciles of one object never overlap; the watch-event
triggers fold into at most one pending run per object on the handler thread pool.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import kopf

from disagg.controller.gate import ReconcileGate, TriggerQueue
from disagg.controller.reconcile import FULL, SKIP, Key, Reconciler, TransientError
from disagg.controller.settings import ControllerSettings
from disagg.k8s.apply import controller_owner
from disagg.k8s.client import CHILD_KINDS, DISAGG_DEPLOYMENT

GROUP, VERSION, PLURAL = DISAGG_DEPLOYMENT.resource
# (group, version, plural) of every kind the renderer may produce; their events lead back to the owner.
CHILD_RESOURCES: tuple[tuple[str, str, str], ...] = tuple(kind.resource for kind in CHILD_KINDS)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReconcileContext:
    reconciler: Reconciler
    gate: ReconcileGate
    settings: ControllerSettings
    # where watch events' reconciles run (kopf's handler thread pool); None runs them in the caller
    executor: Executor | None = None
    triggers: TriggerQueue[Key] = field(init=False)

    def __post_init__(self) -> None:
        submit = self.executor.submit if self.executor is not None else _call
        object.__setattr__(self, "triggers", TriggerQueue(submit, self._run_triggered))

    def trigger(self, key: Key, level: int) -> None:
        """Reconcile ``key`` at ``level`` on the pool and return at once (a watch handler's way)."""
        if level != SKIP:
            self.triggers.trigger(key, level)

    def _run_triggered(self, key: Key, level: int) -> None:
        try:
            _reconcile_quietly(self, key, "a watch event or resync", level)
        except Exception:  # a thread pool would keep it in a future nobody reads
            log.exception("reconcile of %s/%s after a watch event or resync failed", *key)

    def reconcile(self, key: Key, level: int = FULL, unless_applied: int | None = None) -> None:
        """Reconcile (FULL) or refresh the status (REFRESH) under the gate; TransientError propagates.

        With ``unless_applied`` (a generation), a full run is skipped when, once its turn comes, that
        generation has been applied without a problem already (by a run a watch event started).
        """
        if level == SKIP:
            return
        self.gate.run(key, level, self._work(key, unless_applied))

    def _work(self, key: Key, unless_applied: int | None = None) -> Callable[[int], object]:
        def work(level: int) -> object:
            if level >= FULL:
                if unless_applied is not None and self.reconciler.is_current(key, unless_applied):
                    return None
                return self.reconciler.reconcile(*key)
            return self.reconciler.refresh_status(*key)

        return work

    def forget(self, key: Key) -> None:
        self.reconciler.forget(key)
        self.gate.forget(key)


def owner_key(body: Mapping[str, Any]) -> Key | None:
    """(namespace, name) of the DisaggregatedDeployment that controls this object, if one does."""
    return controller_owner(body, DISAGG_DEPLOYMENT.kind, GROUP)


def is_controlled_child(body: Mapping[str, Any], **_: Any) -> bool:
    """kopf ``when`` filter for child watch events."""
    return owner_key(body) is not None


def register(registry: kopf.OperatorRegistry, context: ReconcileContext) -> None:
    """Register the reconciler's handlers on ``registry``."""

    def on_spec(namespace: str | None, name: str, reason: str, body: Mapping[str, Any], **_: Any) -> None:
        # A new object's children were usually applied already, from its first watch event (below):
        # the creation handler then has nothing to add unless that run failed or the spec moved on.
        generation = int((body.get("metadata") or {}).get("generation") or 0)
        unless_applied = generation if reason == kopf.Reason.CREATE else None
        try:
            context.reconcile((namespace or "", name), unless_applied=unless_applied)
        except TransientError as error:
            raise kopf.TemporaryError(str(error), delay=context.settings.retry_delay_s) from error

    for decorator in (kopf.on.resume, kopf.on.create, kopf.on.update):
        decorator(GROUP, VERSION, PLURAL, registry=registry, id="reconcile")(on_spec)

    # The watch-event handlers are coroutines that decide on the event loop (cheap, in-memory) and hand
    # the reconcile to the pool: they never wait for a thread while holding the event's body.
    async def on_own_event(event: Mapping[str, Any], body: Mapping[str, Any], **_: Any) -> None:
        metadata = body.get("metadata") or {}
        key: Key = (str(metadata.get("namespace", "")), str(metadata.get("name", "")))
        if event.get("type") == "DELETED":
            context.forget(key)
            return
        if context.reconciler.never_reconciled(body):
            # A new deployment: apply its children now rather than after kopf's creation path (which
            # first writes its finalizer and waits for that write to come back on the watch).
            context.trigger(key, FULL)
            return
        if not context.reconciler.needs_reapply(body):
            return
        log.info("desired replicas of %s/%s changed: reconciling", *key)
        context.trigger(key, FULL)

    kopf.on.event(GROUP, VERSION, PLURAL, registry=registry, id="replicas-watch")(on_own_event)

    async def on_child_event(event: Mapping[str, Any], body: Mapping[str, Any], **_: Any) -> None:
        key = owner_key(body)
        if key is None:
            return
        deleted = event.get("type") == "DELETED"
        level = context.reconciler.child_event_level(key, body, deleted=deleted)
        if deleted:  # deleted, or its deployment label was removed (it left the watch's selection)
            log.info(
                "%s/%s was deleted: reconciling %s/%s", body.get("kind"), body["metadata"].get("name"), *key
            )
        context.trigger(key, level)

    for group, version, plural in CHILD_RESOURCES:
        kopf.on.event(
            group, version, plural, registry=registry, id=f"child-{plural}", when=is_controlled_child
        )(on_child_event)

    # A trigger too: kopf cannot cancel a synchronous timer at shutdown (with hundreds of deployments it left
    # their resync threads orphaned, with a warning each), and a resync due while a run waits folds into it.
    async def resync(namespace: str | None, name: str, **_: Any) -> None:
        context.trigger((namespace or "", name), FULL)

    kopf.timer(
        GROUP,
        VERSION,
        PLURAL,
        registry=registry,
        id="resync",
        interval=context.settings.resync_interval_s,
        initial_delay=context.settings.resync_interval_s,  # creation and resume reconcile already
    )(resync)


def _reconcile_quietly(context: ReconcileContext, key: Key, why: str, level: int = FULL) -> None:
    """Reconcile from a handler kopf does not retry: a transient failure is logged; the resync retries."""
    try:
        context.reconcile(key, level)
    except TransientError as error:
        log.warning("reconcile of %s/%s after %s failed, will retry on resync: %s", *key, why, error)


def _call(work: Callable[[], None]) -> None:
    work()

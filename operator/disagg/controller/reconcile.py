"""One reconcile of a DisaggregatedDeployment: validate, render, apply, then report in status and Events.

Synchronous and free of kopf, so the same code runs from the kopf handlers, the resync timer, the
child-watch handlers and the benchmark. Never raises for a bad object: an invalid spec, a render error
or a manifest the API server rejects becomes ``Degraded`` with a reason, a message and a Warning Event.
Only transient API errors (connection trouble, 5xx, conflicts) raise :class:`TransientError` so the
caller can retry later.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from disagg.api.deployment import DisaggregatedDeployment
from disagg.controller.metrics import ControllerMetrics
from disagg.controller.modelcache import MODEL_CACHED, ModelCacheState, gated_replicas, model_cache_state
from disagg.controller.settings import ControllerSettings
from disagg.controller.status import Problem, RoleState, build_status, role_state, status_differs
from disagg.k8s.apply import (
    ApplyError,
    ApplyResult,
    ChildKey,
    apply_children,
    child_key,
    first_difference,
    is_owned_by,
    list_owned_children,
    matches,
    with_owner,
)
from disagg.k8s.client import (
    DEPLOYMENT,
    DISAGG_DEPLOYMENT,
    JOB,
    LEADERWORKERSET,
    PVC,
    SERVICE,
    JsonDict,
    KubeApi,
)
from disagg.k8s.events import post_event
from disagg.render import effective_replicas, render_children, scale_limit, stale_decision
from disagg.render.names import pools_selector

ROLE_LABEL = "disagg.dev/role"
STATUS_WRITE_ATTEMPTS = 3

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)

# What a trigger asks for (ReconcileGate levels): nothing, a status refresh from the children, or everything.
SKIP, REFRESH, FULL = -1, 0, 1


@dataclass(frozen=True)
class Applied:
    """What the last full reconcile of an object did: the basis for cheap handling of child events."""

    generation: int
    replicas: dict[str, int] | None  # applied to prefill/decode; None when the render failed
    manifests: dict[ChildKey, JsonDict]  # exactly as applied (owner reference included)
    problem: Problem | None
    wanted: dict[str, int] | None = None  # the replicas asked for, before the model cache gate
    model_cached: tuple[bool, str, str] | None = None  # the ModelCached condition written
    stale: str | None = None  # why the decision was not applied as decided (render.stale_decision)
    scale_limit: str | None = None  # why the pools do not sum to spec.replicas (render.scale_limit)


class TransientError(Exception):
    """The reconcile could not finish for a reason that may go away by itself; retry later."""


@dataclass(frozen=True)
class Outcome:
    problem: Problem | None
    applied: ApplyResult | None
    status_written: bool
    replicas: Mapping[str, int] | None  # the replicas applied to prefill/decode, when the apply succeeded


def format_validation_error(error: ValidationError) -> str:
    """One line per error, each naming the field by its path in the object (e.g. spec.prefill.replicas)."""
    lines = []
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"])
        lines.append(f"{path}: {item['msg']}" if path else str(item["msg"]))
    return "; ".join(lines)


def validate(obj: Mapping[str, Any]) -> tuple[DisaggregatedDeployment | None, Problem | None]:
    try:
        return DisaggregatedDeployment.model_validate(dict(obj)), None
    except ValidationError as error:
        return None, Problem("InvalidSpec", format_validation_error(error))


def render(
    dd: DisaggregatedDeployment, cache: ModelCacheState | None = None
) -> tuple[list[JsonDict], dict[str, int] | None, Problem | None]:
    """The children and the replicas they carry (0 per pool while the model cache gate holds them); a
    Problem instead when the renderer refuses the spec."""
    try:
        replicas = dict(effective_replicas(dd))
        if cache is not None:
            replicas = gated_replicas(replicas, cache)
        return [dict(child) for child in render_children(dd, replicas)], replicas, None
    except (ValueError, KeyError, TypeError, ValidationError) as error:
        return [], None, Problem("RenderFailed", f"{type(error).__name__}: {error}")


def _role_of(obj: Mapping[str, Any]) -> str | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    role = labels.get(ROLE_LABEL)
    return str(role) if role else None


# The children whose status is a pool's replica counts: a Deployment, or for a multi-node pool a
# LeaderWorkerSet, whose status counts groups the same way (replicas, readyReplicas: groups whose leader and
# workers are all Ready, updatedReplicas, observedGeneration; kubernetes-sigs/lws v0.9.0
# pkg/controllers/leaderworkerset_controller.go, updateConditions/updateStatus).
WORKLOAD_KINDS = ("Deployment", "LeaderWorkerSet")


def role_states(children: Mapping[tuple[str, str], Mapping[str, Any]]) -> dict[str, RoleState | None]:
    """prefill/decode/router -> the state of that role's Deployment (or LeaderWorkerSet), from a set of live
    children."""
    states: dict[str, RoleState | None] = {"prefill": None, "decode": None, "router": None}
    for (kind, _), obj in children.items():
        role = _role_of(obj)
        if kind in WORKLOAD_KINDS and role in states:
            states[role] = role_state(obj)
    return states


def router_endpoint(children: Mapping[tuple[str, str], Mapping[str, Any]]) -> str | None:
    """In-cluster URL of the router's Service (the non-headless Service with role router and an http
    port); None under spec.router.type gateway-api, whose router Service is the endpoint picker's gRPC
    (clients enter through the Gateway)."""
    for (kind, name), obj in sorted(children.items()):
        spec = obj.get("spec") or {}
        if kind != "Service" or _role_of(obj) != "router" or spec.get("clusterIP") == "None":
            continue
        port = next((p for p in spec.get("ports") or [] if p.get("name") == "http"), None)
        if port is None:
            continue
        namespace = obj["metadata"].get("namespace")
        return f"http://{name}.{namespace}.svc:{port.get('port')}"
    return None


def _condition_of(cache: ModelCacheState | None) -> tuple[bool, str, str] | None:
    if cache is None or cache.condition is None:
        return None
    return cache.condition.status, cache.condition.reason, cache.condition.message


class Reconciler:
    """Reconciles DisaggregatedDeployments through a KubeApi; remembers what it applied per object."""

    def __init__(
        self,
        api: KubeApi,
        settings: ControllerSettings,
        metrics: ControllerMetrics | None = None,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.api = api
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self._lock = threading.Lock()
        self._applied: dict[Key, Applied] = {}

    # -- memory of the last full reconcile per object ------------------------------------------------------

    def applied(self, key: Key) -> Applied | None:
        with self._lock:
            return self._applied.get(key)

    def applied_replicas(self, key: Key) -> dict[str, int] | None:
        found = self.applied(key)
        return dict(found.replicas) if found is not None and found.replicas is not None else None

    def wanted_replicas(self, key: Key) -> dict[str, int] | None:
        """The replicas the last full reconcile was asked for (before the model cache gate held them)."""
        found = self.applied(key)
        if found is None or found.replicas is None:
            return None
        return dict(found.wanted if found.wanted is not None else found.replicas)

    def forget(self, key: Key) -> None:
        with self._lock:
            self._applied.pop(key, None)

    def _remember(self, key: Key, applied: Applied) -> None:
        with self._lock:
            self._applied[key] = applied

    def child_event_level(self, key: Key, child: Mapping[str, Any], deleted: bool) -> int:
        """How much work a watch event of one child needs.

        FULL when the child is gone or differs from what was applied (drift) or nothing is known yet, and
        for every event of the model cache's download Job (its status decides whether the pools run);
        REFRESH for a Deployment or LeaderWorkerSet that still matches (its status may have changed:
        readiness); SKIP for
        any other child that still matches (e.g. the echo of our own apply).
        """
        applied = self.applied(key)
        if deleted or applied is None or child.get("kind") == JOB.kind:
            return FULL
        desired = applied.manifests.get(child_key(child))
        if desired is None:
            return FULL
        if not matches(desired, child):
            log.info(
                "drift in %s/%s: %s",
                child.get("kind"),
                child["metadata"].get("name"),
                first_difference(desired, child),
            )
            return FULL
        return REFRESH if child.get("kind") in WORKLOAD_KINDS else SKIP

    def is_current(self, key: Key, generation: int) -> bool:
        """Whether this process applied the object's spec at ``generation`` without a problem."""
        applied = self.applied(key)
        return applied is not None and applied.problem is None and applied.generation == generation

    def never_reconciled(self, obj: Mapping[str, Any]) -> bool:
        """A new object: nothing applied for it in this process, no status from any run, not going away."""
        metadata = obj.get("metadata") or {}
        if metadata.get("deletionTimestamp"):
            return False
        key: Key = (str(metadata.get("namespace", "")), str(metadata.get("name", "")))
        return self.applied(key) is None and not (obj.get("status") or {}).get("observedGeneration")

    def needs_reapply(self, obj: Mapping[str, Any]) -> bool:
        """Whether the replicas the object asks for now differ from what was last applied for it."""
        metadata = obj.get("metadata") or {}
        applied = self.wanted_replicas((metadata.get("namespace", ""), metadata.get("name", "")))
        if applied is None:
            return False  # not applied in this process yet: the create/resume handlers take care of it
        dd, problem = validate(obj)
        if dd is None or problem is not None:
            return False
        try:
            wanted = dict(effective_replicas(dd))
        except (ValueError, KeyError, TypeError):
            return False
        return wanted != applied

    # -- the reconcile ------------------------------------------------------------------------------------

    def reconcile(self, namespace: str, name: str) -> Outcome | None:
        """Reconcile the object as it is now on the server; None when it is gone or being deleted."""
        try:
            obj = self.api.get(DISAGG_DEPLOYMENT, namespace, name)
        except (ApiException, OSError) as error:
            raise TransientError(f"reading {namespace}/{name}: {error}") from error
        if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
            self.forget((namespace, name))
            return None
        return self.reconcile_object(obj)

    def refresh_status(self, namespace: str, name: str) -> Outcome | None:
        """Status from the children as they are now, without applying (the cheap path for readiness).

        Falls back to a full reconcile when this process has not reconciled the object yet.
        """
        applied = self.applied((namespace, name))
        if applied is None:
            return self.reconcile(namespace, name)
        try:
            obj = self.api.get(DISAGG_DEPLOYMENT, namespace, name)
        except (ApiException, OSError) as error:
            raise TransientError(f"reading {namespace}/{name}: {error}") from error
        if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
            self.forget((namespace, name))
            return None
        written = self._write_status(
            obj, self._live_children(obj), applied.problem, applied.generation, applied.model_cached
        )
        return Outcome(applied.problem, None, written, applied.replicas)

    def reconcile_object(self, obj: JsonDict) -> Outcome:
        started = time.perf_counter()
        result = "error"
        try:
            outcome = self._reconcile(obj)
            result = "degraded" if outcome.problem is not None else "ok"
            return outcome
        finally:
            if self.metrics is not None:
                self.metrics.reconciles.labels(result=result).inc()
                self.metrics.reconcile_seconds.observe(time.perf_counter() - started)

    def _reconcile(self, obj: JsonDict) -> Outcome:
        metadata = obj["metadata"]
        key: Key = (metadata["namespace"], metadata["name"])
        dd, problem = validate(obj)
        children: list[JsonDict] = []
        replicas: dict[str, int] | None = None
        wanted: dict[str, int] | None = None
        cache: ModelCacheState | None = None
        keep: set[ChildKey] = set()
        stale: str | None = None
        limited: str | None = None
        recorded = self.applied(key)
        if dd is not None:
            cache, job = self._model_cache(obj, dd)
            if job is not None:
                keep.add(child_key(job))  # a Job's pod template is immutable: never re-applied
            children, replicas, problem = render(dd, cache)
            if problem is None:
                problem = self._claim_taken(obj, dd)
            if problem is None:
                wanted = dict(effective_replicas(dd))  # it just succeeded inside render
                stale = stale_decision(dd)
                limited = scale_limit(dd)
        model_cached = _condition_of(cache)
        applied: ApplyResult | None = None
        generation = int(metadata.get("generation") or 0)
        manifests = {child_key(m): m for m in (with_owner(c, obj) for c in children)}
        if problem is None:
            # remembered before applying, so the watch events our own apply causes are not taken for drift
            self._remember(
                key, Applied(generation, replicas, manifests, None, wanted, model_cached, stale, limited)
            )
            try:
                applied = apply_children(
                    self.api,
                    obj,
                    children,
                    field_manager=self.settings.field_manager,
                    concurrency=self.settings.apply_concurrency,
                    keep=keep,
                    fresh=recorded is None and not (obj.get("status") or {}).get("observedGeneration"),
                )
            except ApplyError as error:
                problem = Problem("ApplyFailed", str(error), transient=not error.permanent)
            except OSError as error:
                problem = Problem("ApplyFailed", f"API server unreachable: {error}", transient=True)
        if applied is None:
            manifests, replicas = {}, None
        elif problem is None and cache is not None and cache.problem is not None:
            problem = cache.problem  # the download failed: the children are applied, the object Degraded
        self._remember(
            key, Applied(generation, replicas, manifests, problem, wanted, model_cached, stale, limited)
        )
        if applied is not None:
            self._count_changes(applied)
            self._announce_changes(obj, applied)
            self._announce_once(obj, "StaleScalingDecision", stale, recorded.stale if recorded else None)
            self._announce_once(obj, "ScaleLimited", limited, recorded.scale_limit if recorded else None)

        live = applied.live if applied is not None else self._live_children(obj)
        written = self._write_status(obj, live, problem, generation, model_cached)
        if problem is not None and problem.transient:
            raise TransientError(problem.message)
        return Outcome(problem, applied, written, replicas)

    def _model_cache(
        self, obj: Mapping[str, Any], dd: DisaggregatedDeployment
    ) -> tuple[ModelCacheState | None, JsonDict | None]:
        """The model cache gate from the live download Job (one GET), and that Job when it exists."""
        if dd.spec.model.cache is None:
            return None, None
        previous = next(
            (
                c
                for c in (obj.get("status") or {}).get("conditions") or []
                if isinstance(c, Mapping) and c.get("type") == MODEL_CACHED
            ),
            None,
        )
        name = model_cache_state(dd, None).job_name
        job = None
        if name is not None:
            try:
                found = self.api.get(JOB, dd.namespace, name)
            except (ApiException, OSError) as error:
                raise TransientError(f"reading Job {name}: {error}") from error
            uid = (obj.get("metadata") or {}).get("uid")
            # Only our own Job counts: one of the same name that someone else owns is left to the apply
            # (which fails, naming it) rather than taken for the download.
            job = found if found is not None and is_owned_by(found, str(uid)) else None
        return model_cache_state(dd, job, previous), job

    def _claim_taken(self, obj: Mapping[str, Any], dd: DisaggregatedDeployment) -> Problem | None:
        """A Problem when spec.model.cache.create names a claim another object controls (one GET).

        Every DisaggregatedDeployment applies its children with the same field manager, so two creating
        the same claim would each replace the other's owner reference on every reconcile, forever; the
        second one is refused instead, with a reason the user can act on.
        """
        cache = dd.spec.model.cache
        if cache is None or cache.create is None:
            return None
        try:
            claim = self.api.get(PVC, dd.namespace, cache.claim_name)
        except (ApiException, OSError) as error:
            raise TransientError(f"reading PersistentVolumeClaim {cache.claim_name}: {error}") from error
        if claim is None:
            return None
        uid = str((obj.get("metadata") or {}).get("uid"))
        refs = (claim.get("metadata") or {}).get("ownerReferences") or []
        other = next((r for r in refs if r.get("controller") and r.get("uid") != uid), None)
        if other is None:
            return None
        return Problem(
            "ModelCacheClaimTaken",
            f"spec.model.cache.claimName {cache.claim_name!r} is controlled by {other.get('kind')} "
            f"{other.get('name')!r}: name another claim to create, or leave out spec.model.cache.create to "
            "mount that one as a claim you manage",
        )

    def _live_children(self, obj: Mapping[str, Any]) -> dict[tuple[str, str], JsonDict]:
        try:
            return list_owned_children(self.api, obj, kinds=(DEPLOYMENT, LEADERWORKERSET, SERVICE))
        except (ApiException, OSError) as error:
            log.warning("could not list the children of %s: %s", obj["metadata"]["name"], error)
            return {}

    def _count_changes(self, applied: ApplyResult) -> None:
        if self.metrics is None:
            return
        for action, items in (("created", applied.created), ("updated", applied.updated)):
            if items:
                self.metrics.child_changes.labels(action=action).inc(len(items))
        if applied.pruned:
            self.metrics.child_changes.labels(action="pruned").inc(len(applied.pruned))

    def _announce_changes(self, obj: Mapping[str, Any], applied: ApplyResult) -> None:
        for reason, verb, items in (
            ("ChildrenCreated", "created", applied.created),
            ("ChildrenUpdated", "updated", applied.updated),
            ("ChildrenPruned", "deleted", applied.pruned),
        ):
            if items:
                message = f"{verb} {', '.join(items)}"
                log.info("%s/%s: %s", obj["metadata"]["namespace"], obj["metadata"]["name"], message)
                post_event(self.api, obj, reason, message, "Normal")

    def _announce_once(
        self, obj: Mapping[str, Any], reason: str, message: str | None, before: str | None
    ) -> None:
        """An Event once per message, not at every reconcile: StaleScalingDecision when the autoscaler's
        decision does not fit the spec's bounds, ScaleLimited when the pools cannot sum to spec.replicas;
        either way the pools are held within the bounds (see :func:`disagg.render.effective_replicas`)."""
        if message is None or message == before:
            return
        log.info("%s/%s: %s", obj["metadata"]["namespace"], obj["metadata"]["name"], message)
        post_event(self.api, obj, reason, message, "Normal")

    def _write_status(
        self,
        obj: JsonDict,
        live: Mapping[tuple[str, str], Mapping[str, Any]],
        problem: Problem | None,
        generation: int,
        model_cached: tuple[bool, str, str] | None = None,
    ) -> bool:
        """Patch the status when it changed (optimistic concurrency; re-read and retry on a conflict).

        ``generation`` is the spec generation the status describes (the one last reconciled);
        ``model_cached`` the ModelCached condition under spec.model.cache.
        """
        metadata = obj["metadata"]
        roles, endpoint = role_states(live), router_endpoint(live)
        current_obj: JsonDict | None = obj
        for _ in range(STATUS_WRITE_ATTEMPTS):
            if current_obj is None:
                return False
            current = current_obj.get("status") or {}
            new = build_status(
                current,
                generation,
                roles,
                endpoint,
                problem,
                self.clock(),
                model_cached,
                pools_selector(metadata["name"]),
            )
            if not status_differs(current, new):
                return False
            try:
                self.api.merge_patch_status(
                    DISAGG_DEPLOYMENT,
                    metadata["namespace"],
                    metadata["name"],
                    new,
                    resource_version=current_obj["metadata"].get("resourceVersion"),
                )
            except ApiException as error:
                if error.status == 409:
                    current_obj = self._reread(metadata["namespace"], metadata["name"])
                    continue
                if error.status == 404:
                    return False
                raise TransientError(f"writing the status of {metadata['name']}: {error}") from error
            except OSError as error:  # the API server unreachable (k8s.client.ApiUnreachable)
                raise TransientError(f"writing the status of {metadata['name']}: {error}") from error
            if self.metrics is not None:
                self.metrics.status_writes.inc()
            self._announce_problem(current_obj, current, problem)
            return True
        raise TransientError(f"the status of {metadata['name']} kept changing underneath")

    def _reread(self, namespace: str, name: str) -> JsonDict | None:
        try:
            return self.api.get(DISAGG_DEPLOYMENT, namespace, name)
        except (ApiException, OSError) as error:
            raise TransientError(f"reading {namespace}/{name}: {error}") from error

    def _announce_problem(
        self, obj: Mapping[str, Any], old: Mapping[str, Any], problem: Problem | None
    ) -> None:
        """A Warning Event when the object becomes degraded for a new reason or message (not every resync)."""
        if problem is None:
            return
        before = next((c for c in old.get("conditions") or [] if c.get("type") == "Degraded"), None)
        if (
            before is not None
            and before.get("status") == "True"
            and before.get("reason") == problem.reason
            and before.get("message") == problem.message
        ):
            return
        log.warning(
            "%s/%s: %s: %s",
            obj["metadata"]["namespace"],
            obj["metadata"]["name"],
            problem.reason,
            problem.message,
        )
        post_event(self.api, obj, problem.reason, problem.message, "Warning")

"""Server-side apply of rendered children, owned by their DisaggregatedDeployment, and pruning of the rest.

One field manager owns every field the renderer writes; conflicts are forced, because the operator is
the declared owner of those fields (a hand edit to one of them is drift to undo). Fields nobody renders
(e.g. annotations another controller adds) are left alone by server-side apply.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from kubernetes.client.exceptions import ApiException

from disagg.api.quantity import same_quantity
from disagg.k8s.client import CHILD_KINDS, JsonDict, Kind, KubeApi, kind_of

DEPLOYMENT_LABEL = "disagg.dev/deployment"
FIELD_MANAGER = "disagg-operator"
# Client errors that retrying the same request cannot fix (the manifest or the permissions are wrong).
PERMANENT_STATUSES = frozenset({400, 403, 404, 405, 413, 415, 422})

ChildKey = tuple[str, str]  # (kind, name)


class ApplyError(Exception):
    """Applying (or pruning) one child failed; names the child and carries the API server's message."""

    def __init__(self, child: str, status: int | None, message: str) -> None:
        super().__init__(f"{child}: {message}")
        self.child = child
        self.status = status
        self.message = message

    @property
    def permanent(self) -> bool:
        return self.status in PERMANENT_STATUSES


@dataclass
class ApplyResult:
    created: list[str] = field(default_factory=list)  # "Kind/name"
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    live: dict[ChildKey, JsonDict] = field(default_factory=dict)  # the objects as the server returned them

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.pruned)


def owner_reference(owner: Mapping[str, Any]) -> JsonDict:
    """A controller owner reference to the DisaggregatedDeployment (garbage collection cascades)."""
    metadata = owner["metadata"]
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": metadata["name"],
        "uid": metadata["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def with_owner(child: Mapping[str, Any], owner: Mapping[str, Any]) -> JsonDict:
    """A copy of child placed in the owner's namespace with the owner reference set."""
    out = copy.deepcopy(dict(child))
    metadata = out.setdefault("metadata", {})
    metadata["namespace"] = owner["metadata"]["namespace"]
    metadata["ownerReferences"] = [owner_reference(owner)]
    return out


def is_owned_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == owner_uid and ref.get("controller") for ref in refs)


def controller_owner(obj: Mapping[str, Any], kind: str, api_group: str) -> tuple[str, str] | None:
    """(namespace, name) of the object's controller when it is a ``kind`` of ``api_group``, else None."""
    metadata = obj.get("metadata") or {}
    for ref in metadata.get("ownerReferences") or []:
        if (
            ref.get("controller")
            and ref.get("kind") == kind
            and str(ref.get("apiVersion", "")).startswith(f"{api_group}/")
        ):
            return str(metadata.get("namespace", "")), str(ref.get("name"))
    return None


# Where the API server stores a resource quantity in canonical form ("0.5" -> "500m", "1024Mi" -> "1Gi"):
# the amounts of resources.requests/limits (containers, PVCs) and emptyDir's sizeLimit.
_QUANTITY_PARENTS = frozenset({"requests", "limits"})
_QUANTITY_KEYS = frozenset({"sizeLimit"})


def _is_quantity_field(parent: str, key: str) -> bool:
    return parent in _QUANTITY_PARENTS or key in _QUANTITY_KEYS


def _same_scalar(want: Any, have: Any, quantity: bool = False) -> bool:
    if want == have or (not isinstance(want, Mapping | list) and str(want) == str(have)):
        return True
    return quantity and same_quantity(want, have)


def matches(desired: Any, live: Any, _keys: tuple[str, str] = ("", "")) -> bool:
    """Whether every field of ``desired`` holds in ``live`` (the server may add fields; none may differ).

    What server-side apply with our manifest would restore, approximately: a False here may be a
    normalisation, which only costs a no-op apply; a True is never drift. Quantities are compared by
    value (the server stores ``cpu: "0.5"`` as ``500m``: not drift, else re-applied at every resync).
    ``_keys`` is (parent key, key) of ``desired`` in the whole manifest.
    """
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(
            k in live and matches(v, live[k], (_keys[1], str(k))) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list | tuple)
            and len(desired) == len(live)
            and all(matches(w, h) for w, h in zip(desired, live, strict=True))
        )
    return _same_scalar(desired, live, _is_quantity_field(*_keys))


def first_difference(desired: Any, live: Any, path: str = "") -> str | None:
    """Where ``matches`` fails first, as a path with both values (for logs); None when it holds."""
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return f"{path or '.'}: object vs {type(live).__name__}"
        for key, value in desired.items():
            if key not in live:
                return f"{path}.{key}: missing"
            found = first_difference(value, live[key], f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(desired, list):
        if not isinstance(live, list | tuple) or len(desired) != len(live):
            return f"{path}: list of {len(desired)} vs {live!r:.80}"
        for index, (want, have) in enumerate(zip(desired, live, strict=True)):
            found = first_difference(want, have, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    parent, _, key = path.rpartition(".")
    quantity = _is_quantity_field(parent.rpartition(".")[2], key)
    return None if _same_scalar(desired, live, quantity) else f"{path}: {desired!r:.80} vs {live!r:.80}"


def child_key(obj: Mapping[str, Any]) -> ChildKey:
    return str(obj["kind"]), str(obj["metadata"]["name"])


def child_label(key: ChildKey) -> str:
    return f"{key[0]}/{key[1]}"


def list_owned_children(
    api: KubeApi, owner: Mapping[str, Any], kinds: Sequence[Kind] = CHILD_KINDS, pool: Executor | None = None
) -> dict[ChildKey, JsonDict]:
    """Children of the owner, found by the deployment label and confirmed by the controller reference;
    with a ``pool``, the kinds are listed concurrently (one request per kind)."""
    metadata = owner["metadata"]
    selector = f"{DEPLOYMENT_LABEL}={metadata['name']}"

    def list_kind(kind: Kind) -> list[JsonDict]:
        return api.list(kind, metadata["namespace"], label_selector=selector)

    listed = pool.map(list_kind, kinds) if pool is not None else map(list_kind, kinds)
    found: dict[ChildKey, JsonDict] = {}
    for objs in listed:
        for obj in objs:
            if is_owned_by(obj, metadata["uid"]):
                found[child_key(obj)] = obj
    return found


def _list_for_apply(
    api: KubeApi, owner: Mapping[str, Any], kinds: Sequence[Kind], pool: Executor
) -> dict[ChildKey, JsonDict]:
    try:
        return list_owned_children(api, owner, kinds, pool)
    except ApiException as error:
        raise ApplyError("children", error.status, api_message(error)) from error


def api_message(error: ApiException) -> str:
    try:
        body = json.loads(error.body or "")
    except ValueError:
        return str(error.reason or error)
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return str(error.reason or error)


_VOLATILE_METADATA = (
    "resourceVersion",
    "managedFields",
    "generation",
    "creationTimestamp",
    "uid",
    "selfLink",
)


def _content(obj: Mapping[str, Any]) -> JsonDict:
    """The object without status and server bookkeeping: what an apply can change."""
    out = {k: v for k, v in obj.items() if k != "status"}
    out["metadata"] = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in _VOLATILE_METADATA}
    return out


def _apply_one(api: KubeApi, manifest: JsonDict, field_manager: str) -> tuple[int, JsonDict]:
    try:
        return api.apply_with_status(manifest, field_manager=field_manager, force=True)
    except ApiException as error:
        raise ApplyError(child_label(child_key(manifest)), error.status, api_message(error)) from error


# Children are applied in two waves so that what pods reference (RBAC, ConfigMaps, Services, the model
# cache's claim) exists before the workloads that create the pods; within a wave the requests go out
# concurrently. The download Job goes with the Deployments, after the claim it mounts. A
# PodDisruptionBudget only selects pods, whether they exist yet or not, so it goes with the workloads
# (a third wave of its own cost every create one more round trip).
LATER_WAVES: tuple[tuple[str, ...], ...] = (
    ("Deployment", "StatefulSet", "LeaderWorkerSet", "Job", "PodDisruptionBudget"),
)


def apply_waves(manifests: Sequence[JsonDict]) -> list[list[JsonDict]]:
    """The manifests grouped into apply waves, each keeping the renderer's order."""
    later = {kind: index + 1 for index, kinds in enumerate(LATER_WAVES) for kind in kinds}
    waves: list[list[JsonDict]] = [[] for _ in range(len(LATER_WAVES) + 1)]
    for manifest in manifests:
        waves[later.get(str(manifest.get("kind")), 0)].append(manifest)
    return [wave for wave in waves if wave]


def apply_children(
    api: KubeApi,
    owner: Mapping[str, Any],
    children: Sequence[Mapping[str, Any]],
    field_manager: str = FIELD_MANAGER,
    kinds: Sequence[Kind] = CHILD_KINDS,
    concurrency: int = 4,
    keep: Collection[ChildKey] = (),
    fresh: bool = False,
) -> ApplyResult:
    """Make the cluster hold exactly ``children`` for ``owner``: apply each, prune owned leftovers.

    A child whose live object already holds every rendered field is not re-applied (a resync of an
    unchanged object costs only the listing). A child in ``keep`` that exists is left as it is, neither
    applied nor pruned (a Job, whose pod template is immutable once created). Returns what was created,
    updated, left unchanged and pruned. Raises ApplyError naming a child that failed; the others may
    have been applied.

    ``fresh`` says the owner has never been reconciled, so there is nothing to compare with: every child
    is applied first and the children are listed afterwards, only to prune leftovers (of an operator
    that died before recording its work, say). A new deployment's children then exist one listing
    sooner; a child found to exist already (200, not 201) is counted as updated, since what it held
    before is not known.
    """
    namespace = owner["metadata"]["namespace"]
    for child in children:
        kind_of(child, kinds)  # fail early, naming the kind, before touching anything
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        fresh = fresh and not keep  # what to keep must be seen before applying
        existing = {} if fresh else _list_for_apply(api, owner, kinds, pool)
        result = ApplyResult()
        pending: list[JsonDict] = []
        for child in children:
            manifest = with_owner(child, owner)
            key = child_key(manifest)
            before = existing.get(key)
            if before is not None and (key in keep or matches(manifest, before)):
                result.live[key] = before
                result.unchanged.append(child_label(key))
            else:
                pending.append(manifest)

        for wave in apply_waves(pending):
            replies = list(pool.map(lambda m: _apply_one(api, m, field_manager), wave))
            for manifest, (code, live) in zip(wave, replies, strict=True):
                key = child_key(manifest)
                before = existing.get(key)
                result.live[key] = live
                label = child_label(key)
                if code == HTTPStatus.CREATED:
                    result.created.append(label)
                elif before is None or _content(before) != _content(live):
                    result.updated.append(label)
                else:
                    result.unchanged.append(label)
        if fresh:
            existing = _list_for_apply(api, owner, kinds, pool)

    for key, obj in existing.items():
        if key in result.live:
            continue
        kind = kind_of(obj, kinds)
        try:
            if api.delete(kind, namespace, key[1], uid=obj["metadata"].get("uid")):
                result.pruned.append(child_label(key))
        except ApiException as error:
            raise ApplyError(child_label(key), error.status, api_message(error)) from error
    return result

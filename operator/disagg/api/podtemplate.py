"""How a ``podTemplate`` override merges: over the rendered pod template, and a role's over
``spec.common``'s. Pure: the API defines the merge (``disagg.render`` applies it), so
:meth:`disagg.api.deployment.DisaggregatedDeploymentSpec.role` can hand every consumer the same
effective pool."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

# Lists a strategic merge patch merges item by item, and the key it matches items on (the
# patchMergeKey tags of k8s.io/api/core/v1 types.go). Other lists are replaced whole, as SMP does.
SMP_MERGE_KEYS: Mapping[str, str] = MappingProxyType(
    {
        "containers": "name",
        "initContainers": "name",
        "ephemeralContainers": "name",
        "volumes": "name",
        "env": "name",
        "volumeMounts": "mountPath",
        "ports": "containerPort",
        "imagePullSecrets": "name",
    }
)
# Lists whose matching items are replaced rather than merged: a Volume is patchStrategy "retainKeys"
# (a volume source replaced, never two sources), and an env var is exactly one of value / valueFrom.
SMP_REPLACE_ITEMS = frozenset({"volumes", "env"})


def deep_merge(base: Any, override: Any, key: str | None = None) -> Any:
    """``override`` merged over ``base`` the way a strategic merge patch merges a pod template.

    Dicts merge recursively; the lists of :data:`SMP_MERGE_KEYS` merge item by item on their merge key
    (an item of the same key merged, or replaced for :data:`SMP_REPLACE_ITEMS`; new ones appended);
    every other value, lists included, is replaced. ``key`` is the field ``base`` is the value of.
    """
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for name, value in override.items():
            merged[name] = deep_merge(base[name], value, name) if name in base else copy.deepcopy(value)
        return merged
    merge_key = SMP_MERGE_KEYS.get(key or "")
    if (
        merge_key is not None
        and isinstance(base, list)
        and isinstance(override, list)
        and _keyed(base, merge_key)
        and _keyed(override, merge_key)
    ):
        result = [copy.deepcopy(item) for item in base]
        index = {item[merge_key]: i for i, item in enumerate(result)}
        for item in override:
            at = index.get(item[merge_key])
            if at is None:
                index[item[merge_key]] = len(result)
                result.append(copy.deepcopy(item))
            elif key in SMP_REPLACE_ITEMS:
                result[at] = copy.deepcopy(item)
            else:
                result[at] = deep_merge(result[at], item)
        return result
    return copy.deepcopy(override)


def _keyed(items: list[Any], merge_key: str) -> bool:
    return all(isinstance(item, dict) and item.get(merge_key) is not None for item in items)

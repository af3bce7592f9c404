"""Installing the operator's CustomResourceDefinitions (generated from the models in :mod:`disagg.api`)."""

from __future__ import annotations

import time

from disagg.api.crd import all_crds
from disagg.k8s.client import CRD, JsonDict, KubeApi

CRD_FIELD_MANAGER = "disagg-crds"
POLL_INTERVAL_S = 0.2


def is_established(crd: JsonDict | None) -> bool:
    """Whether the API server serves the CRD (its ``Established`` condition is True)."""
    conditions = ((crd or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def install_crds(kube: KubeApi, timeout_s: float = 60.0, field_manager: str = CRD_FIELD_MANAGER) -> list[str]:
    """Server-side apply every CRD and wait until the API server serves them all; their names.

    Raises TimeoutError when one is not Established within ``timeout_s``.
    """
    names = [str(kube.apply(crd, field_manager)["metadata"]["name"]) for crd in all_crds()]
    deadline = time.monotonic() + timeout_s
    while True:
        waiting = [name for name in names if not is_established(kube.get(CRD, None, name))]
        if not waiting:
            return names
        if time.monotonic() >= deadline:
            raise TimeoutError(f"CRDs {', '.join(waiting)} not Established within {timeout_s:g} s")
        time.sleep(POLL_INTERVAL_S)

"""KEDA's CRDs in the local control plane (ScaledObject, TriggerAuthentication), as its pinned release ships
them (copied from its Go module by :func:`disagg.cluster.binaries.ensure_module_files`, never written here).

Only the CRDs: the API server validates a ScaledObject that targets a DisaggregatedDeployment's /scale
(examples/autoscaling/keda-scaledobject.yaml) against KEDA's real schema. The KEDA operator is not built
here (its module pulls in every scaler's cloud SDK); what it does with a ScaledObject, create and drive an
HPA on the same target, is what the HPA e2e (tests/e2e/test_hpa_scale.py) runs with the real HPA.
"""

from __future__ import annotations

from typing import Any

import httpx
import yaml

from disagg.cluster.binaries import BuildSettings, ensure_module_files
from disagg.cluster.lws import apply_objects

KEDA_MODULE = "github.com/kedacore/keda/v2"
KEDA_CRDS: tuple[str, ...] = (
    "config/crd/bases/keda.sh_scaledobjects.yaml",
    "config/crd/bases/keda.sh_triggerauthentications.yaml",
)


def crds(build: BuildSettings | None = None) -> list[dict[str, Any]]:
    build = build or BuildSettings()
    paths = ensure_module_files("keda", KEDA_MODULE, build.versions.keda, KEDA_CRDS, build)
    return [doc for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc]


def install(client: httpx.Client, build: BuildSettings | None = None) -> list[str]:
    """Server-side apply of the CRDs; their names. Raises lws.LwsInstallError naming a refused one."""
    objects = crds(build)
    apply_objects(client, objects)
    return [str(crd["metadata"]["name"]) for crd in objects]

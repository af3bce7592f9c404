"""The Gateway API and Gateway API Inference Extension CRDs in the local control plane.

Only the CRDs, as the pinned releases ship them in their Go modules (copied by
:func:`disagg.cluster.binaries.ensure_module_files`, never written here): the InferencePool
(``inference.networking.k8s.io/v1``) and the Gateway API's standard channel kinds an HTTPRoute to a
Gateway involves. The API server then validates what ``spec.router.type: gateway-api`` renders against
their real schemas (server-side dry run). No Gateway implementation and no endpoint picker run here.
"""

from __future__ import annotations

from typing import Any

import httpx
import yaml

from disagg.cluster.binaries import BuildSettings, ensure_module_files
from disagg.cluster.lws import apply_objects

GIE_MODULE = "sigs.k8s.io/gateway-api-inference-extension"
# gateway-api-inference-extension v1.6.0: config/crd/bases holds the v1 InferencePool and the
# x-k8s.io InferencePoolImport; only the pool is rendered.
GIE_CRDS: tuple[str, ...] = ("config/crd/bases/inference.networking.k8s.io_inferencepools.yaml",)
GATEWAY_API_MODULE = "sigs.k8s.io/gateway-api"
# gateway-api v1.6.3: config/crd/standard, the kinds a route to a Gateway involves (the directory's
# ValidatingAdmissionPolicy, gateway.networking.k8s.io_vap_safeupgrades.yaml, is not a CRD).
GATEWAY_API_CRDS: tuple[str, ...] = tuple(
    f"config/crd/standard/gateway.networking.k8s.io_{plural}.yaml"
    for plural in ("gatewayclasses", "gateways", "httproutes", "grpcroutes", "referencegrants")
)


def crds(build: BuildSettings | None = None) -> list[dict[str, Any]]:
    """The CRD documents of both pinned modules (downloaded once)."""
    build = build or BuildSettings()
    versions = build.versions
    paths = [
        *ensure_module_files(
            "gateway-api-inference-extension",
            GIE_MODULE,
            versions.gateway_api_inference_extension,
            GIE_CRDS,
            build,
        ),
        *ensure_module_files(
            "gateway-api", GATEWAY_API_MODULE, versions.gateway_api, GATEWAY_API_CRDS, build
        ),
    ]
    return [
        doc
        for path in paths
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "CustomResourceDefinition"
    ]


def install(client: httpx.Client, build: BuildSettings | None = None) -> list[str]:
    """Server-side apply of the CRDs; their names. Raises lws.LwsInstallError naming a refused one."""
    objects = crds(build)
    apply_objects(client, objects)
    return [str(crd["metadata"]["name"]) for crd in objects]

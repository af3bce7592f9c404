"""The LeaderWorkerSet controller (sigs.k8s.io/lws) in the local control plane, installed from its release.

Multi-node replicas are LeaderWorkerSet groups, so the local cluster runs the real controller, built from
the pinned Go module (:mod:`disagg.cluster.binaries`), with what its release ships (copied from the module
at build time, never written here): both CRDs, the ClusterRole its manager needs, and its webhooks. The
webhooks are not optional: the pod webhook labels every group pod (group index, worker index) and injects
LWS_LEADER_ADDRESS and friends, which the controller and the engines' flags rely on.

Differences from the in-cluster install, each because there is no in-cluster network here:

- the webhooks are called by URL (``https://127.0.0.1:PORT/PATH``) instead of through the
  ``webhook-service`` Service, with the local CA as caBundle; the serving certificate comes from
  :mod:`disagg.cluster.certs`, so LWS's internal cert rotator is off (``internalCertManagement.enable:
  false``, a field of LWS's own Configuration API);
- the manager runs as a process with a client certificate (user ``lws-controller-manager``) bound to the
  release's ClusterRole, leader election off (one replica), metrics off.

The kustomize patches the release applies to its webhook manifests (config/webhook/*-patch.yaml: scope the
pod webhooks to pods carrying the LWS name label) are applied here as the JSON patches they are.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from disagg.cluster.binaries import BuildSettings, lws_manifest
from disagg.k8s.crds import is_established

FIELD_MANAGER = "disagg-cluster"
APPLY_PATCH = "application/apply-patch+yaml"
# The user of the controller's client certificate (disagg.cluster.certs.CLIENT_IDENTITIES).
LWS_USER = "lws-controller-manager"
# kustomize's namePrefix in the release's config/default (lws-): the names the objects have when installed
NAME_PREFIX = "lws-"

CRD_FILES = (
    "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml",
    "config/crd/bases/disaggregatedset.x-k8s.io_disaggregatedsets.yaml",
)
WEBHOOK_FILE = "config/webhook/manifests.yaml"
WEBHOOK_PATCHES = {
    "MutatingWebhookConfiguration": "config/webhook/mutating-patch.yaml",
    "ValidatingWebhookConfiguration": "config/webhook/validating-patch.yaml",
}
ROLE_FILE = "config/rbac/role.yaml"

_PATHS = {
    "CustomResourceDefinition": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "MutatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
}


class LwsInstallError(RuntimeError):
    """An object of the LWS release could not be applied; the message names it."""


@dataclass(frozen=True)
class LwsPorts:
    webhook: int
    health: int


def _load(relative: str, build: BuildSettings | None) -> list[dict[str, Any]]:
    path = lws_manifest(relative, build)
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def controller_config(ports: LwsPorts, cert_dir: Path) -> dict[str, Any]:
    """LWS's Configuration (config.lws.x-k8s.io/v1alpha1, api/config/v1alpha1 of the module)."""
    return {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": ports.webhook, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},  # controller-runtime: "0" serves no metrics
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports.health}"},
    }


def crds(build: BuildSettings | None = None) -> list[dict[str, Any]]:
    return [doc for relative in CRD_FILES for doc in _load(relative, build)]


def rbac(build: BuildSettings | None = None) -> list[dict[str, Any]]:
    """The release's ClusterRole (prefixed as its kustomization names it) bound to the controller's user."""
    (role,) = _load(ROLE_FILE, build)
    role = copy.deepcopy(role)
    name = NAME_PREFIX + str(role["metadata"]["name"])
    role["metadata"] = {"name": name}
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": LWS_USER}],
    }
    return [role, binding]


def _json_patch(doc: dict[str, Any], ops: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The RFC 6902 operations kustomize applies to the webhook manifests (replace and add only)."""
    result = copy.deepcopy(doc)
    for op in ops:
        if op.get("op") not in ("replace", "add"):
            raise LwsInstallError(f"LWS webhook patch: unsupported operation {op!r}")
        *parents, last = [p for p in str(op["path"]).split("/") if p]
        target: Any = result
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            target[int(last)] = copy.deepcopy(op["value"])
        else:
            target[last] = copy.deepcopy(op["value"])
    return result


def webhook_configurations(
    webhook_port: int, ca_pem: bytes, build: BuildSettings | None = None
) -> list[dict[str, Any]]:
    """The release's webhook configurations, patched as its kustomization does, calling 127.0.0.1 by URL."""
    ca_bundle = base64.b64encode(ca_pem).decode()
    result = []
    for doc in _load(WEBHOOK_FILE, build):
        patches = WEBHOOK_PATCHES.get(str(doc["kind"]))
        if patches is not None:
            ops = yaml.safe_load(lws_manifest(patches, build).read_text()) or []
            doc = _json_patch(doc, ops)
        doc["metadata"] = {"name": NAME_PREFIX + str(doc["metadata"]["name"])}
        for hook in doc.get("webhooks") or []:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{webhook_port}{path}", "caBundle": ca_bundle}
        result.append(doc)
    return result


def apply_objects(client: httpx.Client, objects: Sequence[Mapping[str, Any]]) -> None:
    """Server-side apply of cluster-scoped objects (JSON is YAML, so the apply content type takes it)."""
    for obj in objects:
        kind, name = str(obj["kind"]), str(obj["metadata"]["name"])
        response = client.patch(
            f"{_PATHS[kind]}/{name}",
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            json=dict(obj),
            headers={"Content-Type": APPLY_PATCH},
        )
        if response.status_code not in (200, 201):
            raise LwsInstallError(f"applying {kind} {name}: HTTP {response.status_code} {response.text}")


def established(client: httpx.Client, names: Sequence[str]) -> bool:
    """Whether the API server serves every one of these CRDs (their ``Established`` condition)."""
    for name in names:
        response = client.get(f"{_PATHS['CustomResourceDefinition']}/{name}")
        if response.status_code != 200 or not is_established(response.json()):
            return False
    return True


def crds_established(client: httpx.Client, build: BuildSettings | None = None) -> bool:
    return established(client, [str(crd["metadata"]["name"]) for crd in crds(build)])

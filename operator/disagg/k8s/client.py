"""A small, dict-in dict-out REST layer over the Kubernetes Python client.

The typed client deserialises into generated models (lossy for custom resources, and it hides
server-side apply behind per-kind methods); the operator only needs a handful of verbs on a handful of
kinds, so it speaks to the API server with plain JSON through the client's authenticated transport.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

import urllib3.exceptions
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from disagg.api import deployment as deployment_api
from disagg.api import ratiopolicy as ratiopolicy_api
from disagg.api.common import GROUP_VERSION

JsonDict = dict[str, Any]

APPLY_PATCH = "application/apply-patch+yaml"  # server-side apply; JSON is valid YAML
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class Kind:
    """Where a kind lives in the REST tree."""

    api_version: str  # "apps/v1", "v1", "disagg.dev/v1alpha1"
    kind: str
    plural: str
    namespaced: bool = True
    # Served by a CRD that a cluster may not have (LeaderWorkerSet): listing it there finds nothing
    # instead of failing with 404, so clusters without it keep reconciling single-node pools.
    optional: bool = False

    @property
    def group(self) -> str:
        """The API group ("" for the core group)."""
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    @property
    def resource(self) -> tuple[str, str, str]:
        """(group, version, plural): how kopf and the dynamic clients name the resource."""
        return self.group, self.version, self.plural

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str = "") -> str:
        group_version = self.api_version
        base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
        if self.namespaced:
            if namespace is None:
                raise ValueError(f"{self.kind} is namespaced: a namespace is required")
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
            if subresource:
                base += f"/{subresource}"
        return base


DEPLOYMENT = Kind("apps/v1", "Deployment", "deployments")
STATEFULSET = Kind("apps/v1", "StatefulSet", "statefulsets")
SERVICE = Kind("v1", "Service", "services")
CONFIGMAP = Kind("v1", "ConfigMap", "configmaps")
PDB = Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets")
SERVICEACCOUNT = Kind("v1", "ServiceAccount", "serviceaccounts")
ROLE = Kind("rbac.authorization.k8s.io/v1", "Role", "roles")
ROLEBINDING = Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings")
EVENT = Kind("v1", "Event", "events")
POD = Kind("v1", "Pod", "pods")
JOB = Kind("batch/v1", "Job", "jobs")  # the model cache's download Job
# Multi-node pools (spec.<role>.parallelism.nodesPerReplica > 1): sigs.k8s.io/lws, its own CRD.
LEADERWORKERSET = Kind("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets", optional=True)
PVC = Kind("v1", "PersistentVolumeClaim", "persistentvolumeclaims")  # the model cache's claim
# spec.router.type gateway-api (disagg.render.gateway): the Inference Extension's pool and the Gateway API's
# route, their own CRDs.
INFERENCE_POOL = Kind("inference.networking.k8s.io/v1", "InferencePool", "inferencepools", optional=True)
HTTP_ROUTE = Kind("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes", optional=True)
# The operator's own kinds, named where their models are (disagg.api).
DISAGG_DEPLOYMENT = Kind(GROUP_VERSION, deployment_api.KIND, deployment_api.PLURAL)
RATIO_POLICY = Kind(GROUP_VERSION, ratiopolicy_api.KIND, ratiopolicy_api.PLURAL)
CRD = Kind("apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions", False)
KOPF_PEERING = Kind("kopf.dev/v1", "KopfPeering", "kopfpeerings")  # kopf's peering (the chart's CRD)

# The kinds the renderer may produce, hence the kinds the pruner looks at and the operator watches for
# drift (and nothing else); the chart's RBAC grants exactly these.
CHILD_KINDS: tuple[Kind, ...] = (
    DEPLOYMENT,
    STATEFULSET,
    SERVICE,
    CONFIGMAP,
    PDB,
    SERVICEACCOUNT,
    ROLE,
    ROLEBINDING,
    JOB,
    PVC,
    LEADERWORKERSET,
    INFERENCE_POOL,
    HTTP_ROUTE,
)


def kind_of(obj: Mapping[str, Any], kinds: Sequence[Kind] = CHILD_KINDS) -> Kind:
    """The Kind entry for a manifest, by apiVersion and kind."""
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    for entry in kinds:
        if entry.api_version == api_version and entry.kind == kind:
            return entry
    raise ValueError(f"unsupported child kind {api_version}/{kind}: the operator manages {_names(kinds)}")


def _names(kinds: Sequence[Kind]) -> str:
    return ", ".join(f"{k.api_version}/{k.kind}" for k in kinds)


def load_api_client(
    kubeconfig: str | os.PathLike[str] | None = None, connections: int | None = None
) -> k8s_client.ApiClient:
    """An authenticated client: the given kubeconfig, else $KUBECONFIG/~/.kube/config, else in-cluster.

    ``connections`` sizes urllib3's pool: the client's default is 5 per CPU (10 on two cores), and a
    caller that makes more requests at once than that has urllib3 open and drop the extra connections
    ("Connection pool is full, discarding connection"), a new TCP and TLS handshake for each."""
    configuration = k8s_client.Configuration()
    if kubeconfig is not None:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig), client_configuration=configuration
        )
    elif os.environ.get("KUBECONFIG") or Path("~/.kube/config").expanduser().exists():
        k8s_config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    if connections is not None:
        configuration.connection_pool_maxsize = connections
    return k8s_client.ApiClient(configuration)


def is_status(error: BaseException, *codes: int) -> bool:
    """Whether an exception is an API error with one of the given HTTP status codes."""
    return isinstance(error, ApiException) and error.status in codes


class ApiUnreachable(OSError):
    """The API server could not be reached or dropped the connection (refused, reset, timed out, TLS):
    a transport failure, temporary by nature. urllib3 raises its own exceptions for these (``MaxRetryError``
    wrapping ``NewConnectionError``, ``ProtocolError``, ``ReadTimeoutError``), none of them an OSError;
    :meth:`KubeApi.request` raises this instead, so callers need only ``except (ApiException, OSError)``."""


# What a YAML parser must not see raw in a server-side apply body (sent as application/apply-patch+yaml;
# JSON is YAML 1.2, but the API server reads it with go-yaml): DEL and the C1 controls (NEL among them, which
# go-yaml folds into a space inside a quoted string), U+FEFF, U+FFFE, U+FFFF, and U+2028/U+2029 (line
# breaks to YAML 1.1). They are written as \uXXXX escapes, which name valid code points. Source: go-yaml's
# readerc.go (yaml_parser_update_buffer refuses control characters) and scannerc.go.
_YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]")


def yaml_safe_json(body: Any) -> bytes:
    r"""``body`` as JSON a YAML parser reads back unchanged, UTF-8 encoded.

    Python's json.dumps escapes every non-ASCII character by default, and a character beyond the Basic
    Multilingual Plane (an emoji in a servedName) as a UTF-16 surrogate pair ``\ud83d\ude80``: valid JSON,
    but go-yaml refuses a surrogate escape ("found invalid Unicode character escape code", scannerc.go:
    YAML's \u escapes name code points, and a surrogate is none), so every apply of such a child failed.
    Raw UTF-8 is what YAML wants; only the characters above are escaped.
    """
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return _YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode("utf-8")


def _transport_reason(error: urllib3.exceptions.HTTPError) -> str:
    """One line: the underlying cause of a urllib3 failure (MaxRetryError keeps it in ``reason``)."""
    cause: BaseException = error
    if isinstance(error, urllib3.exceptions.MaxRetryError) and error.reason is not None:
        cause = error.reason
    return f"{type(cause).__name__}: {cause}".splitlines()[0]


class KubeApi:
    """JSON verbs on the API server. Thread-safe as far as the underlying urllib3 pool is."""

    def __init__(self, api_client: k8s_client.ApiClient, request_timeout_s: float = 30.0) -> None:
        self.api_client = api_client
        self.request_timeout_s = request_timeout_s

    def request(
        self,
        method: str,
        path: str,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str | None = None,
        accept: str = "application/json",
    ) -> JsonDict:
        return self.request_with_status(method, path, query, body, content_type, accept)[1]

    def request_with_status(
        self,
        method: str,
        path: str,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str | None = None,
        accept: str = "application/json",
    ) -> tuple[int, JsonDict]:
        """The HTTP status (e.g. 201 when an apply created the object) and the JSON reply."""
        headers = {"Accept": accept}
        if content_type is not None:
            headers["Content-Type"] = content_type
        elif body is not None:
            headers["Content-Type"] = "application/json"
        if content_type == APPLY_PATCH and body is not None and not isinstance(body, bytes | str):
            body = yaml_safe_json(body)  # bytes go out as they are (the client would json.dumps them)
        m, url, hdrs, payload, _ = self.api_client.param_serialize(
            method,
            path,
            query_params=list(query) or None,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self.api_client.call_api(
                m, url, hdrs, payload, _request_timeout=self.request_timeout_s
            )
            response.read()  # type: ignore[no-untyped-call]
        except urllib3.exceptions.HTTPError as error:
            raise ApiUnreachable(
                f"{method} {path}: API server unreachable: {_transport_reason(error)}"
            ) from error
        text = response.data.decode("utf-8") if response.data else ""
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=text, data=None)
        result = json.loads(text) if text else {}
        if not isinstance(result, dict):
            raise ValueError(f"{method} {path}: expected a JSON object, got {type(result).__name__}")
        return int(response.status), result

    def get(self, kind: Kind, namespace: str | None, name: str) -> JsonDict | None:
        """The object, or None when it does not exist."""
        try:
            return self.request("GET", kind.path(namespace, name))
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def list(self, kind: Kind, namespace: str | None, label_selector: str = "") -> list[JsonDict]:
        query = [("labelSelector", label_selector)] if label_selector else []
        try:
            items = self.request("GET", kind.path(namespace), query=query).get("items") or []
        except ApiException as error:
            if kind.optional and error.status == HTTPStatus.NOT_FOUND:
                return []  # the CRD is not installed: there is none
            raise
        # List items carry no apiVersion/kind; put them back so the objects stand alone.
        return [{"apiVersion": kind.api_version, "kind": kind.kind, **item} for item in items]

    def apply(
        self, obj: Mapping[str, Any], field_manager: str, force: bool = True, kind: Kind | None = None
    ) -> JsonDict:
        """Server-side apply of a whole manifest (the fields it names become ours).

        ``kind`` is needed only for kinds other than the children, DisaggregatedDeployment and CRDs.
        """
        return self.apply_with_status(obj, field_manager, force, kind)[1]

    def apply_with_status(
        self, obj: Mapping[str, Any], field_manager: str, force: bool = True, kind: Kind | None = None
    ) -> tuple[int, JsonDict]:
        """Server-side apply; the HTTP status says whether it created the object (201) or not (200)."""
        kind = kind or kind_of(obj, (*CHILD_KINDS, DISAGG_DEPLOYMENT, CRD))
        metadata = obj.get("metadata") or {}
        query = [("fieldManager", field_manager)]
        if force:
            query.append(("force", "true"))
        path = kind.path(metadata.get("namespace"), metadata["name"])
        return self.request_with_status("PATCH", path, query=query, body=dict(obj), content_type=APPLY_PATCH)

    def delete(self, kind: Kind, namespace: str | None, name: str, uid: str | None = None) -> bool:
        """Delete (background propagation); with uid, only that incarnation. False when already gone."""
        body: JsonDict = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", kind.path(namespace, name), body=body)
        except ApiException as error:
            if error.status in (404, 409):
                return False
            raise
        return True

    def merge_patch_status(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        status: JsonDict,
        resource_version: str | None = None,
    ) -> JsonDict:
        """JSON merge patch of the status subresource (null values delete keys).

        With ``resource_version`` the patch only succeeds against that version of the object (409
        Conflict otherwise), so a status computed from a stale read never overwrites a newer one.
        """
        body: JsonDict = {"status": status}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        path = kind.path(namespace, name, subresource="status")
        return self.request("PATCH", path, body=body, content_type=MERGE_PATCH)

    def create(self, kind: Kind, namespace: str | None, obj: Mapping[str, Any]) -> JsonDict:
        return self.request("POST", kind.path(namespace), body=dict(obj))

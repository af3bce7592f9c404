"""Child names, labels and selectors (the shared naming contract).

Children of a DisaggregatedDeployment ``NAME``: Deployments and Services ``NAME-prefill``,
``NAME-decode``, ``NAME-router``; headless Services ``NAME-prefill-headless`` and
``NAME-decode-headless``; for a pool whose replicas span several nodes, a LeaderWorkerSet
``NAME-prefill-lws`` / ``NAME-decode-lws`` instead of its Deployment (not ``NAME-ROLE``: the LeaderWorkerSet
controller creates its headless Service under the LeaderWorkerSet's name, and leaves it to an existing
Service of that name, which would be our ClusterIP ``NAME-ROLE``: the leader address would not resolve);
with spec.model.cache, the download Job ``NAME-download-HASH`` (one per model
id and revision) and, when the operator creates it, the PersistentVolumeClaim spec.model.cache.claimName.
Every child and pod carries :func:`labels`.
"""

from __future__ import annotations

import hashlib
from typing import Literal

Component = Literal["prefill", "decode", "router", "model-cache"]

MANAGED_BY = "disagg-operator"
ROLE_LABEL = "disagg.dev/role"
DEPLOYMENT_LABEL = "disagg.dev/deployment"
# On the pods of a LeaderWorkerSet group: "leader" (the pod that serves HTTP, which Services and the
# router select) or "worker".
GROUP_ROLE_LABEL = "disagg.dev/group-role"
LWS_SUFFIX = "-lws"


def child_name(dd_name: str, component: Component) -> str:
    return f"{dd_name}-{component}"


def lws_name(dd_name: str, component: Component) -> str:
    """The LeaderWorkerSet of a multi-node pool (see the module docstring for why not ``NAME-ROLE``)."""
    return f"{dd_name}-{component}{LWS_SUFFIX}"


def headless_name(dd_name: str, component: Component) -> str:
    return f"{dd_name}-{component}-headless"


def model_download_job_name(dd_name: str, model_id: str, revision: str | None) -> str:
    """``NAME-download-HASH``: a new Job per (model id, revision), so a changed revision downloads again.

    Seven hex digits keep the name within 63 characters for the longest DisaggregatedDeployment name
    (46 + len("-download-") + 7), the limit of the job-name label the Job controller puts on its pods.
    """
    digest = hashlib.sha256(f"{model_id}@{revision or ''}".encode()).hexdigest()[:7]
    return f"{dd_name}-download-{digest}"


def selector_labels(dd_name: str, component: Component) -> dict[str, str]:
    """The immutable Deployment selector: which pods belong to one pool."""
    return {
        "app.kubernetes.io/name": "disagg",
        "app.kubernetes.io/instance": dd_name,
        ROLE_LABEL: component,
    }


def pools_selector(dd_name: str) -> str:
    """Both pools' pods as one label selector in string form (the /scale subresource's status.selector,
    which HPA parses with labels.Parse)."""
    common = selector_labels(dd_name, "prefill")
    role = common.pop(ROLE_LABEL)
    parts = [f"{key}={value}" for key, value in sorted(common.items())]
    return ",".join([*parts, f"{ROLE_LABEL} in ({role},decode)"])


def labels(dd_name: str, component: Component) -> dict[str, str]:
    """All labels of a child and of its pods."""
    return {
        "app.kubernetes.io/name": "disagg",
        "app.kubernetes.io/instance": dd_name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/part-of": "disagg",
        ROLE_LABEL: component,
        DEPLOYMENT_LABEL: dd_name,
    }

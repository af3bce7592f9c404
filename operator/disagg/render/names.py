"""Child names, labels and selectors (the shared naming contract).

Children of a DisaggregatedDeployment ``NAME``: Deployments and Services ``NAME-prefill``,
``NAME-decode``, ``NAME-router``; headless Services ``NAME-prefill-headless`` and
``NAME-decode-headless``. Every child and pod carries :func:`labels`.
"""

from __future__ import annotations

from typing import Literal

Component = Literal["prefill", "decode", "router"]

MANAGED_BY = "disagg-operator"
ROLE_LABEL = "disagg.dev/role"
DEPLOYMENT_LABEL = "disagg.dev/deployment"


def child_name(dd_name: str, component: Component) -> str:
    return f"{dd_name}-{component}"


def headless_name(dd_name: str, component: Component) -> str:
    return f"{dd_name}-{component}-headless"


def selector_labels(dd_name: str, component: Component) -> dict[str, str]:
    """The immutable Deployment selector: which pods belong to one pool."""
    return {
        "app.kubernetes.io/name": "disagg",
        "app.kubernetes.io/instance": dd_name,
        ROLE_LABEL: component,
    }


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

"""Small Kubernetes pod fragments shared by engine and connector modules. Pure."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def port(name: str, number: int) -> Obj:
    """A TCP container port."""
    return {"name": name, "containerPort": number, "protocol": "TCP"}


def pod_ip_env(name: str) -> Obj:
    """An environment variable holding the pod's IP (downward API)."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}

"""Kubernetes Events (core/v1) about a DisaggregatedDeployment, so `kubectl describe dd` tells the story."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any, Literal

from kubernetes.client.exceptions import ApiException

from disagg.api.common import rfc3339, shorten
from disagg.k8s.client import EVENT, JsonDict, KubeApi

EventType = Literal["Normal", "Warning"]
COMPONENT = "disagg-operator"
# Source: NoteLengthLimit = 1024 in k8s.io/kubernetes/pkg/apis/core/validation/events.go (the API server's
# limit on an Event's note/message; kube-scheduler cuts its Event messages to it the same way).
MAX_EVENT_MESSAGE = 1024

log = logging.getLogger(__name__)


def build_event(
    involved: Mapping[str, Any],
    reason: str,
    message: str,
    event_type: EventType = "Normal",
    component: str = COMPONENT,
    now: dt.datetime | None = None,
) -> JsonDict:
    """A core/v1 Event about ``involved`` (a whole object dict)."""
    metadata = involved["metadata"]
    stamp = rfc3339(now)
    message = shorten(message, MAX_EVENT_MESSAGE)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{metadata['name']}.", "namespace": metadata["namespace"]},
        "involvedObject": {
            "apiVersion": involved["apiVersion"],
            "kind": involved["kind"],
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "uid": metadata.get("uid"),
            "resourceVersion": metadata.get("resourceVersion"),
        },
        "reason": reason,
        "message": message,
        "type": event_type,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": component,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def post_event(
    api: KubeApi,
    involved: Mapping[str, Any],
    reason: str,
    message: str,
    event_type: EventType = "Normal",
    component: str = COMPONENT,
) -> bool:
    """Post an Event; failures are logged, never raised (an Event is never worth failing a reconcile)."""
    event = build_event(involved, reason, message, event_type, component)
    try:
        api.create(EVENT, event["metadata"]["namespace"], event)
    except (ApiException, OSError) as error:
        log.warning("could not post event %s on %s: %s", reason, involved["metadata"]["name"], error)
        return False
    return True

"""The kwok Stages this cluster uses: what a fake kubelet does to its nodes and pods.

kwok (v0.8) refuses to start without stages. These are written for this project: a node turns Ready with the
capacity it was created with and keeps a heartbeat; a pod bound to a kwok node becomes Running and Ready at
once (with a pod IP from kwok's --cidr, or the node IP for hostNetwork pods); a pod being deleted is removed
at once, or, annotated ``disagg.dev/terminate-after-grace``, when its termination grace period ends (its
deletionTimestamp), as a kubelet whose engine drains for the whole grace would hold it (how kwok's own
pod-delete stage reads the deletionTimestamp: its kustomize/stage/pod/general/pod-delete.yaml).
The Stage API and the template functions (Now, Quote, YAML, Version, NodeConditions, NodeIP,
NodeIPWith, PodIPWith) are
kwok's: https://kwok.sigs.k8s.io/docs/user/stages-configuration/

A pod annotated ``disagg.dev/ready-when-served`` (the demo's engine pods) becomes Running but not Ready, and
turns Ready once the live twin serves it (the twin annotates it ``disagg.dev/twin-endpoint`` when its
emulated engine has loaded the model), as the engine's readiness probe would hold a real pod back: its
Ready condition's lastTransitionTime then tells the model loading apart, as on a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_READY = '.status.conditions.[] | select( .type == "Ready" ) | .status'
# opt-in: kwok holds the pod's Ready condition False until the live twin serves it
READY_WHEN_SERVED = "disagg.dev/ready-when-served"
# opt-in: kwok removes a pod being deleted only at its deletionTimestamp (the end of its grace period)
TERMINATE_AFTER_GRACE = "disagg.dev/terminate-after-grace"
# what the live twin annotates a pod with once its engine serves (disagg.twin.live.follower)
TWIN_ENDPOINT = "disagg.dev/twin-endpoint"


def _annotation(key: str) -> str:
    return f'.metadata.annotations["{key}"]'


@dataclass(frozen=True)
class StageSettings:
    # node conditions are refreshed this often; liveness itself comes from kwok's node leases
    node_heartbeat_ms: int = 60_000
    node_heartbeat_jitter_ms: int = 15_000


def _stage(
    name: str, kind: str, expressions: list[dict[str, Any]], nxt: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceRef": {"apiGroup": "v1", "kind": kind},
        "selector": {"matchExpressions": expressions},
        "next": nxt,
    }
    spec.update(extra)
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name}, "spec": spec}


_NODE_STATUS = """\
{{ $now := Now }}
{{ $since := or .metadata.creationTimestamp $now }}
conditions:
{{ range NodeConditions }}
- type: {{ .type | Quote }}
  status: {{ .status | Quote }}
  reason: {{ .reason | Quote }}
  message: {{ .message | Quote }}
  lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $since | Quote }}
{{ end }}
addresses:
- type: InternalIP
  address: {{ NodeIP | Quote }}
- type: Hostname
  address: {{ .metadata.name | Quote }}
capacity:
{{ YAML .status.capacity 1 }}
allocatable:
{{ YAML (or .status.allocatable .status.capacity) 1 }}
nodeInfo:
  architecture: amd64
  operatingSystem: linux
  kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
  kubeProxyVersion: {{ printf "kwok-%s" Version | Quote }}
  containerRuntimeVersion: {{ printf "kwok-%s" Version | Quote }}
  kernelVersion: {{ printf "kwok-%s" Version | Quote }}
  osImage: kwok
  machineID: ""
  bootID: ""
  systemUUID: ""
phase: Running
"""

# The pod's readiness: its conditions and container statuses, Ready (and ContainersReady) __READY__;
# __SINCE__ is when the pod started (Initialized, the containers' startedAt).
_READINESS = """\
conditions:
- type: Initialized
  status: "True"
  lastTransitionTime: {{ __SINCE__ | Quote }}
- type: ContainersReady
  status: "__READY__"
  lastTransitionTime: {{ $now | Quote }}
- type: Ready
  status: "__READY__"
  lastTransitionTime: {{ $now | Quote }}
{{ range .spec.readinessGates }}
- type: {{ .conditionType | Quote }}
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: __CONTAINER_READY__
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ __SINCE__ | Quote }}
{{ end }}
"""


def _readiness(ready: bool, since: str) -> str:
    value = "True" if ready else "False"
    return (
        _READINESS.replace("__READY__", value)
        .replace("__CONTAINER_READY__", value.lower())
        .replace("__SINCE__", since)
    )


_POD_RUNNING_TAIL = """\
initContainerStatuses:
{{ range .spec.initContainers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
{{ with NodeIPWith .spec.nodeName }}
hostIP: {{ . | Quote }}
hostIPs:
- ip: {{ . | Quote }}
{{ end }}
{{ $hostNetwork := or .spec.hostNetwork false }}
{{ $uid := or .metadata.uid "" }}
{{ with PodIPWith .spec.nodeName $hostNetwork $uid .metadata.name .metadata.namespace }}
podIP: {{ . | Quote }}
podIPs:
- ip: {{ . | Quote }}
{{ end }}
"""


def _pod_running(ready: bool) -> str:
    """Running, with Ready (and ContainersReady) True at once, or False until a later stage sets them."""
    head = "{{ $now := Now }}\nphase: Running\nstartTime: {{ $now | Quote }}\n"
    return head + _readiness(ready, "$now") + _POD_RUNNING_TAIL


# The held pod turns Ready: the conditions and container statuses again (a status patch from a template
# merges lists of conditions by type, but all of them are written so no merge semantics matter).
_POD_SERVED = "{{ $now := Now }}\n{{ $started := or .status.startTime $now }}\n" + _readiness(
    True, "$started"
)


def node_stages(settings: StageSettings) -> list[dict[str, Any]]:
    ready = _stage(
        "disagg-node-ready",
        "Node",
        [{"key": _READY, "operator": "NotIn", "values": ["True"]}],
        {"statusTemplate": _NODE_STATUS},
    )
    heartbeat = _stage(
        "disagg-node-heartbeat",
        "Node",
        [{"key": _READY, "operator": "In", "values": ["True"]}],
        {"statusTemplate": _NODE_STATUS},
        delay={
            "durationMilliseconds": settings.node_heartbeat_ms,
            "jitterDurationMilliseconds": settings.node_heartbeat_ms + settings.node_heartbeat_jitter_ms,
        },
    )
    return [ready, heartbeat]


def pod_stages() -> list[dict[str, Any]]:
    pending: list[dict[str, Any]] = [
        {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
        {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
    ]
    running = _stage(
        "disagg-pod-running",
        "Pod",
        [*pending, {"key": _annotation(READY_WHEN_SERVED), "operator": "DoesNotExist"}],
        {"statusTemplate": _pod_running(ready=True)},
    )
    held = _stage(
        "disagg-pod-running-until-served",
        "Pod",
        [*pending, {"key": _annotation(READY_WHEN_SERVED), "operator": "Exists"}],
        {"statusTemplate": _pod_running(ready=False)},
    )
    served = _stage(
        "disagg-pod-served",
        "Pod",
        [
            {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
            {"key": ".status.phase", "operator": "In", "values": ["Running"]},
            {"key": _annotation(READY_WHEN_SERVED), "operator": "Exists"},
            {"key": _annotation(TWIN_ENDPOINT), "operator": "Exists"},
            {"key": _READY, "operator": "NotIn", "values": ["True"]},
        ],
        {"statusTemplate": _POD_SERVED},
    )
    deleting = {"key": ".metadata.deletionTimestamp", "operator": "Exists"}
    delete = _stage(
        "disagg-pod-delete",
        "Pod",
        [deleting, {"key": _annotation(TERMINATE_AFTER_GRACE), "operator": "DoesNotExist"}],
        {"delete": True},
    )
    delete_after_grace = _stage(
        "disagg-pod-delete-after-grace",
        "Pod",
        [deleting, {"key": _annotation(TERMINATE_AFTER_GRACE), "operator": "Exists"}],
        {"delete": True},
        # a time: kwok waits until then (pkg/apis/v1alpha1 StageDelay.DurationFrom)
        delay={"durationMilliseconds": 0, "durationFrom": {"expressionFrom": ".metadata.deletionTimestamp"}},
    )
    return [running, held, served, delete, delete_after_grace]


def kwok_config_documents(settings: StageSettings | None = None) -> list[dict[str, Any]]:
    """The documents of kwok's --config file."""
    settings = settings or StageSettings()
    return [*node_stages(settings), *pod_stages()]

"""The kwok Stages this cluster uses: what a fake kubelet does to its nodes and pods.

kwok (v0.8) refuses to start without stages. These are written for this project: a node turns Ready with the
capacity it was created with and keeps a heartbeat; a pod bound to a kwok node becomes Running and Ready at
once (with a pod IP from kwok's --cidr, or the node IP for hostNetwork pods); a pod being deleted is removed.
The Stage API and the template functions (Now, Quote, YAML, Version, NodeConditions, NodeIP,
NodeIPWith, PodIPWith) are
kwok's: https://kwok.sigs.k8s.io/docs/user/stages-configuration/
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_READY = '.status.conditions.[] | select( .type == "Ready" ) | .status'


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

_POD_RUNNING = """\
{{ $now := Now }}
phase: Running
startTime: {{ $now | Quote }}
conditions:
- type: Initialized
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
- type: ContainersReady
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
- type: Ready
  status: "True"
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
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
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
    running = _stage(
        "disagg-pod-running",
        "Pod",
        [
            {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
            {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
        ],
        {"statusTemplate": _POD_RUNNING},
    )
    delete = _stage(
        "disagg-pod-delete",
        "Pod",
        [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
        {"delete": True},
    )
    return [running, delete]


def kwok_config_documents(settings: StageSettings | None = None) -> list[dict[str, Any]]:
    """The documents of kwok's --config file."""
    settings = settings or StageSettings()
    return [*node_stages(settings), *pod_stages()]

"""The demo's scenario: what it deploys and the traffic it sends, as settings and manifests. Pure.

A vLLM + NIXL DisaggregatedDeployment of Llama-3.1-8B on one-GPU replicas, its weights on a prefilled model
cache claim (the demo plays the storage admin and provides the volume), a RatioPolicy with short windows,
and two traffic phases: short chat prompts, then long documents. Shared with the closed-loop e2e test.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from disagg.cluster.kwok_stages import READY_WHEN_SERVED


@dataclass(frozen=True)
class Phase:
    """One traffic phase: Poisson arrivals at ``rate_rps`` with these mean prompt/output lengths."""

    name: str
    duration_s: float
    rate_rps: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class DemoSettings:
    """The scenario, time-compressed so the whole demo takes about 3-5 minutes."""

    namespace: str = "disagg-demo"
    deployment: str = "chat"
    policy: str = "demo-slo"
    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    served_model: str = "llama-3.1-8b"
    engine: str = "vllm"
    connector: str = "nixl"
    gpu_type: str = "h100"
    ttft_slo_s: float = 1.0
    itl_slo_s: float = 0.05
    percentile: float = 90.0
    prefill_replicas: int = 1
    decode_replicas: int = 2
    max_replicas: int = 6
    max_gpus: int = 12
    evaluation_interval_s: int = 5  # the RatioPolicy's minimum
    metric_window_s: int = 15
    scale_down_window_s: int = 60
    scrape_interval_s: float = 2.0
    refresh_s: float = 3.0
    # the weights are on this claim (spec.model.cache, prefilled; the demo provides it); None: no cache,
    # every new replica downloads the model first
    model_cache_claim: str | None = "weights"
    # a new emulated pod loads its model for the spec's start-up estimate times this: Llama-3.1-8B read
    # from the cache, ~71 s, becomes ~5 s (downloading, ~97 s, would become ~7 s)
    startup_scale: float = 0.07
    # kwok holds the engine pods un-Ready until the live twin serves them (False: Ready at once, for a
    # deployment no twin follows)
    ready_when_served: bool = True
    decode_pre_stop_s: int = 30  # > the documents phase's worst TTFT (see deployment_manifest)
    drain_s: float = 20.0  # at most this long after a phase's last arrival for its requests to finish
    # Llama-3.1-8B on one H100 prefills ~40k tokens/s in the twin's latency model: chat needs a fraction
    # of one prefill replica, documents (60k prompt tokens/s) more than one.
    phases: tuple[Phase, ...] = (
        Phase("chat", 40.0, 5.0, 300, 64),
        Phase("documents", 150.0, 5.0, 12000, 64),
    )
    report_dir: Path = Path("reports/demo")
    operator_tick_s: float = 1.0
    pending_grace_s: float = 20.0
    # the RatioPolicy's pendingBackoffSeconds: how long a learned Pending ceiling holds before the policy
    # probes for freed capacity by asking again
    pending_backoff_s: int = 60
    # extra nodeSelector labels for the prefill pool (the e2e pins it to a small node to make pods Pending)
    prefill_node_labels: tuple[tuple[str, str], ...] = ()

    @property
    def total_s(self) -> float:
        return sum(p.duration_s for p in self.phases)

    def phase_at(self, elapsed_s: float) -> Phase:
        edge = 0.0
        for phase in self.phases:
            edge += phase.duration_s
            if elapsed_s < edge:
                return phase
        return self.phases[-1]


def ratio_policy_manifest(settings: DemoSettings) -> dict[str, Any]:
    """The demo's RatioPolicy: slo-feedback, short windows (time-compressed), active."""
    return {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "RatioPolicy",
        "metadata": {"name": settings.policy, "namespace": settings.namespace},
        "spec": {
            "slo": {
                "ttft": {"percentile": settings.percentile, "targetSeconds": settings.ttft_slo_s},
                "itl": {"percentile": settings.percentile, "targetSeconds": settings.itl_slo_s},
            },
            "algorithm": "slo-feedback",
            "mode": "active",
            "evaluationIntervalSeconds": settings.evaluation_interval_s,
            "metricWindowSeconds": settings.metric_window_s,
            "scaleUp": {"stabilizationWindowSeconds": 0, "maxStep": {"prefill": 2, "decode": 2}},
            "scaleDown": {
                "stabilizationWindowSeconds": settings.scale_down_window_s,
                "maxStep": {"prefill": 1, "decode": 1},
            },
            "tolerance": 0.1,
            "gpuBudget": {"maxGPUs": settings.max_gpus},
            "pendingBackoffSeconds": settings.pending_backoff_s,
        },
    }


def model_spec(settings: DemoSettings) -> dict[str, Any]:
    """spec.model: the Hugging Face model, cached on the demo's prefilled claim when it has one."""
    model: dict[str, Any] = {
        "name": settings.model,
        "servedName": settings.served_model,
        "source": {"huggingFace": {"id": settings.model}},
    }
    if settings.model_cache_claim is not None:
        model["cache"] = {"claimName": settings.model_cache_claim, "prefilled": True}
    return model


def tiny_deployment_manifest(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """A small vLLM + NIXL deployment of one-GPU replicas (Qwen3-0.6B, prefill 1, decode 2) with ``spec``
    keys merged over it: what the integration tests, the chaos cases and the apply bench run."""
    return {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "Qwen/Qwen3-0.6B", "source": {"huggingFace": {"id": "Qwen/Qwen3-0.6B"}}},
            "engine": {"type": "vllm"},
            "kvTransfer": {"connector": "nixl"},
            "prefill": {"replicas": 1},
            "decode": {"replicas": 2},
            **spec,
        },
    }


def deployment_manifest(settings: DemoSettings) -> dict[str, Any]:
    """The demo's DisaggregatedDeployment: vLLM + NIXL, one GPU per replica, autoscaling on."""
    node_selector = {"disagg.dev/gpu-type": settings.gpu_type}
    # kwok keeps the engine pods un-Ready until the live twin serves them (after their model loading)
    held = {"metadata": {"annotations": {READY_WHEN_SERVED: "true"}}} if settings.ready_when_served else None
    return {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedDeployment",
        "metadata": {"name": settings.deployment, "namespace": settings.namespace},
        "spec": {
            "model": model_spec(settings),
            "engine": {"type": settings.engine},
            "kvTransfer": {"connector": settings.connector},
            "prefill": {
                "replicas": settings.prefill_replicas,
                "tensorParallelSize": 1,
                "nodeSelector": {**node_selector, **dict(settings.prefill_node_labels)},
                **({"podTemplate": held} if held else {}),
            },
            "decode": {
                "replicas": settings.decode_replicas,
                "tensorParallelSize": 1,
                "nodeSelector": node_selector,
                # vllm-router picks a request's decode pod before its prefill runs and stops picking a
                # pod once it is Terminating; requests already routed to it still arrive up to one
                # (queued) prefill later, so a decode pod must keep accepting for longer than that.
                "preStopSleepSeconds": settings.decode_pre_stop_s,
                **({"podTemplate": held} if held else {}),
            },
            # Both released routers re-check a discovered pod's /health every
            # --worker-startup-check-interval seconds (default 30) before adding it; kwok marks a pod Ready
            # when the twin's engine serves, and the router should add it within a second of that.
            "router": {"replicas": 1, "args": ["--worker-startup-check-interval", "1"]},
            "autoscaling": {
                "enabled": True,
                "policyRef": {"name": settings.policy},
                "prefill": {"minReplicas": 1, "maxReplicas": settings.max_replicas},
                "decode": {"minReplicas": 1, "maxReplicas": settings.max_replicas},
                "maxGPUs": settings.max_gpus,
            },
        },
    }


def prometheus_config(
    pod_scrape: Mapping[str, Any], operator_metrics: str | None, scrape_interval_s: float
) -> dict[str, Any]:
    """prometheus.yml: the engines' pods (discovered through the API server, scraped at their own pod
    IPs, which kwok hands out of 127.0.0.0/8) and the operator."""
    interval = f"{max(1, round(scrape_interval_s))}s"
    scrape_configs: list[dict[str, Any]] = [dict(pod_scrape)]
    if operator_metrics is not None:
        scrape_configs.append(
            {"job_name": "disagg-operator", "static_configs": [{"targets": [operator_metrics]}]}
        )
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": scrape_configs,
    }


CACHE_VOLUME_SIZE = "20Gi"  # Llama-3.1-8B in bf16 is about 16 GB


def cache_volume_manifests(settings: DemoSettings) -> list[dict[str, Any]]:
    """The demo's prefilled model cache claim and a PersistentVolume reserved for it: the local control
    plane has no provisioner, and kwok runs no containers, so nothing ever reads it; the scheduler only
    needs the claim bound to place the engine pods that mount it. Empty without a cache."""
    claim = settings.model_cache_claim
    if claim is None:
        return []
    volume = f"{settings.namespace}-{claim}"[:63]
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": CACHE_VOLUME_SIZE},
                "accessModes": ["ReadOnlyMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": f"/models/{volume}"},
                "claimRef": {"namespace": settings.namespace, "name": claim},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": settings.namespace},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": {"storage": CACHE_VOLUME_SIZE}},
            },
        },
    ]


def phase_edges(settings: DemoSettings) -> list[tuple[str, float, float]]:
    """(name, start, end) of each phase, in seconds since the traffic started."""
    edges: list[tuple[str, float, float]] = []
    start = 0.0
    for phase in settings.phases:
        edges.append((phase.name, start, start + phase.duration_s))
        start += phase.duration_s
    return edges

"""Scale-up start-up in the demo: how long each added pod took from creation to Ready, against the
estimates of :mod:`disagg.perf.startup` with and without the model cache. Pure (pods come as PodInfo)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from disagg.controller.pods import PodInfo, pod_startup_s
from disagg.controller.scaling_status import CONDITION_ACTIVE
from disagg.demo.scenario import DemoSettings, deployment_manifest
from disagg.perf.latency import load_model_config
from disagg.perf.startup import DEFAULT_ASSUMPTIONS, spec_startup_delay_s


@dataclass(frozen=True)
class StartupEstimates:
    """A new replica's start-up for the demo's model, with and without the model cache, at full scale
    (disagg.perf.startup), and the demo's compression of it."""

    weight_gb: float
    cached_s: float
    downloading_s: float
    scale: float
    cached: bool  # whether the demo's deployment has the cache

    @property
    def expected_s(self) -> float:
        """The compressed model loading of the demo's own pods."""
        return (self.cached_s if self.cached else self.downloading_s) * self.scale


def startup_estimates(settings: DemoSettings, dtype: str = "bf16") -> StartupEstimates | None:
    """The estimates for the demo's deployment spec, as the live twin and the operator take them; None
    when the twin has no profile of the model."""
    spec = deployment_manifest(settings)["spec"]
    model = {k: v for k, v in spec["model"].items() if k != "cache"}
    try:
        cached = spec_startup_delay_s({**spec, "model": {**model, "cache": {"claimName": "c"}}}, dtype)
        downloading = spec_startup_delay_s({**spec, "model": model}, dtype)
        weight_gb = load_model_config(settings.model).weight_bytes(dtype) / 1e9
    except (ValueError, KeyError):
        return None
    return StartupEstimates(
        weight_gb, cached, downloading, settings.startup_scale, settings.model_cache_claim is not None
    )


@dataclass(frozen=True)
class PodStartup:
    """One engine pod that a scale-up added, and how long it took from creation to Ready."""

    name: str
    role: str
    created_at_s: float  # since the traffic started
    seconds: float


def scale_up_startups(pods: Sequence[PodInfo], since: float) -> list[PodStartup]:
    """The pods created after ``since`` (the traffic's start,
    epoch seconds: the operator's scale-ups) that turned Ready, oldest first."""
    found: list[PodStartup] = []
    for pod in pods:
        seconds = pod_startup_s(pod)
        if seconds is None or pod.created is None or pod.created < since:
            continue
        found.append(PodStartup(pod.name, pod.role, pod.created - since, seconds))
    return sorted(found, key=lambda p: (p.created_at_s, p.name))


def startup_report(
    startups: Sequence[PodStartup], estimates: StartupEstimates | None, claim: str | None
) -> list[str]:
    """What the scale-ups show about model loading: each new pod's creation-to-Ready time, and why (the
    estimates with and without the model cache)."""
    A = DEFAULT_ASSUMPTIONS
    lines = [
        f"{p.role} pod {p.name}, added at {p.created_at_s:.0f}s: Ready {p.seconds:.0f} s after its creation"
        for p in startups
    ] or ["no pod was added during the traffic (no scale-up)"]
    if estimates is None:
        return [*lines, "no start-up estimate: the twin has no profile of the model"]
    e, x = estimates, estimates.scale
    if e.cached:
        why = (
            f"why: spec.model.cache (claim {claim}): a new replica reads the model's {e.weight_gb:.0f} GB "
            f"from the cache, estimated {e.cached_s:.0f} s ({e.cached_s * x:.1f} s at this demo's x{x:g}); "
            f"without the cache every new replica downloads it first: {e.downloading_s:.0f} s "
            f"({e.downloading_s * x:.1f} s here), {e.downloading_s - e.cached_s:.0f} s more per scale-up"
        )
    else:
        why = (
            f"why: no spec.model.cache: every new replica downloads the model's {e.weight_gb:.0f} GB first, "
            f"estimated {e.downloading_s:.0f} s ({e.downloading_s * x:.1f} s at this demo's x{x:g}); "
            f"with the cache it would read them from the volume: {e.cached_s:.0f} s "
            f"({e.cached_s * x:.1f} s here)"
        )
    assumed = (
        f"(estimates: disagg.perf.startup's assumptions: Hub download {A.hub_download_gbytes_per_s:g} GB/s, "
        f"cache read {A.cache_read_gbytes_per_s:g} GB/s, engine start {A.engine_init_s:.0f} s)"
    )
    return [*lines, why, assumed]


def operator_startup(deployment: Mapping[str, Any]) -> str | None:
    """The start-up the operator's policy plans with, from the ScalingActive condition's message."""
    for condition in (deployment.get("status") or {}).get("conditions") or []:
        message = str(condition.get("message") or "")
        if condition.get("type") == CONDITION_ACTIVE and "replica start-up: " in message:
            return message.split("replica start-up: ", 1)[1]
    return None

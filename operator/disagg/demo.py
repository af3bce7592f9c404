"""``disagg demo``: the closed loop on the local control plane, time-compressed to a few minutes.

It brings up the local control plane (real etcd, kube-apiserver, controller-manager, scheduler, kwok
GPU nodes), installs the CRDs, starts the operator, a real Prometheus that discovers the engine pods
through the API server, and the live twin that plays the engines of the DisaggregatedDeployment's pods
(annotating each pod with the 127.0.0.1 endpoint Prometheus scrapes). It applies a RatioPolicy and a
DisaggregatedDeployment, drives a traffic phase change (short chat prompts, then long documents) with
the twin's load generator, shows the operator's decisions live, and writes a report with plots.

The deployment's weights are on a model cache claim (``spec.model.cache``, prefilled: the demo plays the
storage admin and provides the volume). Each new replica's model loading is the start-up the spec implies
(:mod:`disagg.perf.startup`: weights read from the cache, versus every replica downloading them first),
compressed by ``startup_scale`` like the rest of the demo; kwok holds each engine pod's Ready condition
until the twin serves it, as a readiness probe would. At the end the demo reports how long each
scale-up's new pods took from creation to Ready, against the estimates with and without the cache.

The scenario (manifests, phases, Prometheus config, sampling, report) is shared with the closed-loop
e2e test (tests/e2e/test_closed_loop.py), which asserts what the demo shows.
"""

from __future__ import annotations

import argparse
import html
import itertools
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from kubernetes.client.exceptions import ApiException

from disagg.k8s.client import APPLY_PATCH, DEPLOYMENT, DISAGG_DEPLOYMENT, MERGE_PATCH, POD, Kind, KubeApi

if TYPE_CHECKING:
    from disagg.cluster.local import ClusterInfo
    from disagg.cluster.prometheus import PrometheusProcess
    from disagg.twin.live.load import LoadReport, LoadRequest

# -------------------------------------------------------------------------------------------- scenario


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
            "pendingBackoffSeconds": 60,
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


def deployment_manifest(settings: DemoSettings) -> dict[str, Any]:
    """The demo's DisaggregatedDeployment: vLLM + NIXL, one GPU per replica, autoscaling on."""
    from disagg.cluster.kwok_stages import READY_WHEN_SERVED

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


# -------------------------------------------------------------------------------------------- samples


@dataclass(frozen=True)
class Sample:
    """What the demo shows at one moment."""

    elapsed_s: float
    phase: str
    prefill: int  # desired replicas of the prefill child Deployment
    decode: int
    prefill_ready: int
    decode_ready: int
    ttft_s: float | None  # user TTFT at the policy percentile, from Prometheus (None: no data)
    itl_s: float | None
    cause: str  # the latest evaluation's cause (status.autoscaling.lastEvaluation), e.g. NoChange
    decisions: int  # decisions (moves) recorded so far
    message: str = ""  # ... and its message


def ratio_cell(prefill: int, decode: int) -> str:
    return f"{prefill}:{decode}"


def _latency(value: float | None, slo: float, unit_scale: float, unit: str) -> str:
    if value is None:
        return f"{'-':>7} / {slo * unit_scale:.0f}{unit}"
    mark = "!" if value > slo else " "
    return f"{value * unit_scale:>6.0f}{mark} / {slo * unit_scale:.0f}{unit}"


TABLE_HEADER = (
    f"{'time':>6}  {'phase':<10} {'P:D':<5} {'ready':<6}  {'TTFT p90 / SLO':>17}  {'ITL p90 / SLO':>16}"
    "  latest evaluation"
)

MESSAGE_WIDTH = 70  # the live table's message column is cut here (the report has the whole text)


def _short(text: str, width: int = MESSAGE_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def format_row(sample: Sample, settings: DemoSettings) -> str:
    """One line of the live table, e.g. ``  42s  documents   2:2   2/2 ...``."""
    return (
        f"{sample.elapsed_s:>5.0f}s  {sample.phase:<10} {ratio_cell(sample.prefill, sample.decode):<5}"
        f" {ratio_cell(sample.prefill_ready, sample.decode_ready):<6}"
        f"  {_latency(sample.ttft_s, settings.ttft_slo_s, 1000, 'ms'):>17}"
        f"  {_latency(sample.itl_s, settings.itl_slo_s, 1000, 'ms'):>16}  {sample.cause}"
        + (f": {_short(sample.message)}" if sample.message else "")
    )


@dataclass(frozen=True)
class Outcome:
    """What the run showed, summarised from the samples (used by the report and the e2e test)."""

    start_prefill: int
    start_decode: int
    peak_prefill: int
    final_prefill: int
    final_decode: int
    breached_after_shift: bool  # TTFT went over the SLO during the documents phase
    recovered: bool  # ... and came back under it later in that phase
    attainment: float | None  # fraction of samples (with data) meeting both SLOs

    @property
    def moved_toward_prefill(self) -> bool:
        return self.peak_prefill > self.start_prefill or (
            self.final_prefill / max(self.final_decode, 1) > self.start_prefill / max(self.start_decode, 1)
        )


def summarise(samples: Sequence[Sample], settings: DemoSettings, shift_phase: str = "documents") -> Outcome:
    if not samples:
        raise ValueError("samples: the run produced no samples")
    first, last = samples[0], samples[-1]
    shifted = [s for s in samples if s.phase == shift_phase]
    breach_at = next(
        (i for i, s in enumerate(shifted) if s.ttft_s is not None and s.ttft_s > settings.ttft_slo_s), None
    )
    recovered = breach_at is not None and any(
        s.ttft_s is not None and s.ttft_s <= settings.ttft_slo_s for s in shifted[breach_at + 1 :]
    )
    measured = [(s.ttft_s, s.itl_s) for s in samples if s.ttft_s is not None and s.itl_s is not None]
    good = [1 for ttft, itl in measured if ttft <= settings.ttft_slo_s and itl <= settings.itl_slo_s]
    return Outcome(
        start_prefill=first.prefill,
        start_decode=first.decode,
        peak_prefill=max(s.prefill for s in samples),
        final_prefill=last.prefill,
        final_decode=last.decode,
        breached_after_shift=breach_at is not None,
        recovered=recovered,
        attainment=len(good) / len(measured) if measured else None,
    )


# -------------------------------------------------------------------------------------------- start-up

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
    from disagg.perf.latency import load_model_config
    from disagg.perf.startup import spec_startup_delay_s

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


def scale_up_startups(pods: Sequence[Any], since: float) -> list[PodStartup]:
    """The pods (disagg.controller.autoscaling.PodInfo) created after ``since`` (the traffic's start,
    epoch seconds: the operator's scale-ups) that turned Ready, oldest first."""
    from disagg.controller.autoscaling import pod_startup_s

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
    from disagg.perf.startup import DEFAULT_ASSUMPTIONS as A

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
    from disagg.controller.autoscaling import CONDITION_ACTIVE

    for condition in (deployment.get("status") or {}).get("conditions") or []:
        message = str(condition.get("message") or "")
        if condition.get("type") == CONDITION_ACTIVE and "replica start-up: " in message:
            return message.split("replica start-up: ", 1)[1]
    return None


# -------------------------------------------------------------------------------------------- report


def _series(
    samples: Sequence[Sample], pick: Callable[[Sample], float | None]
) -> tuple[list[float], list[float]]:
    xs: list[float] = []
    ys: list[float] = []
    for sample in samples:
        value = pick(sample)
        xs.append(sample.elapsed_s)
        ys.append(math.nan if value is None else value)
    return xs, ys


def phase_edges(settings: DemoSettings) -> list[tuple[str, float, float]]:
    edges: list[tuple[str, float, float]] = []
    start = 0.0
    for phase in settings.phases:
        edges.append((phase.name, start, start + phase.duration_s))
        start += phase.duration_s
    return edges


def plot_report(samples: Sequence[Sample], settings: DemoSettings, path: Path) -> Path:
    """TTFT and ITL vs their SLOs, and replicas per role, over time (phase changes shaded)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    ttft_ax, itl_ax, rep_ax = axes
    for name, start, end in phase_edges(settings):
        for ax in axes:
            ax.axvspan(start, end, alpha=0.08 if name == settings.phases[0].name else 0.16, color="tab:gray")
        ttft_ax.text(start + 1, 0.02, name, transform=ttft_ax.get_xaxis_transform(), va="bottom", fontsize=9)
    xs, ys = _series(samples, lambda s: s.ttft_s)
    ttft_ax.plot(xs, ys, marker=".", label=f"TTFT p{settings.percentile:.0f}")
    ttft_ax.axhline(settings.ttft_slo_s, color="tab:red", linestyle="--", label="SLO")
    ttft_ax.set_ylabel("TTFT (s)")
    ttft_ax.legend(loc="upper right", fontsize=8)
    xs, ys = _series(samples, lambda s: s.itl_s)
    itl_ax.plot(
        xs, [y * 1000 for y in ys], marker=".", color="tab:green", label=f"ITL p{settings.percentile:.0f}"
    )
    itl_ax.axhline(settings.itl_slo_s * 1000, color="tab:red", linestyle="--", label="SLO")
    itl_ax.set_ylabel("ITL (ms)")
    itl_ax.legend(loc="upper right", fontsize=8)
    for role, color in (("prefill", "tab:blue"), ("decode", "tab:orange")):
        xs, ys = _series(samples, lambda s, r=role: float(getattr(s, r)))  # type: ignore[misc]
        rep_ax.step(xs, ys, where="post", color=color, label=f"{role} desired")
        xs, ys = _series(samples, lambda s, r=role: float(getattr(s, f"{r}_ready")))  # type: ignore[misc]
        rep_ax.plot(xs, ys, linestyle=":", color=color, label=f"{role} ready")
    changes = [b for a, b in itertools.pairwise(samples) if (a.prefill, a.decode) != (b.prefill, b.decode)]
    for sample in changes:
        rep_ax.axvline(sample.elapsed_s, color="tab:purple", alpha=0.3)
        rep_ax.text(
            sample.elapsed_s,
            0.02,
            sample.cause,
            rotation=90,
            fontsize=7,
            transform=rep_ax.get_xaxis_transform(),
            va="bottom",
        )
    rep_ax.set_ylabel("replicas")
    rep_ax.set_xlabel("time since start (s)")
    rep_ax.legend(loc="upper right", fontsize=8)
    fig.suptitle(f"disagg closed loop: {settings.deployment} ({settings.engine}, {settings.connector})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(row.get(c, '')))}</td>" for c in columns) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def write_report(
    samples: Sequence[Sample],
    decisions: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    settings: DemoSettings,
    out_dir: Path,
    startup: Sequence[str] = (),
) -> list[Path]:
    """report.html (summary, plot, scale-up start-up, decisions, events), timeline.png and samples.json
    under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    png = plot_report(samples, settings, out_dir / "timeline.png")
    outcome = summarise(samples, settings)
    data = out_dir / "samples.json"
    data.write_text(
        json.dumps(
            {
                "settings": {k: str(v) for k, v in asdict(settings).items()},
                "outcome": asdict(outcome),
                "samples": [asdict(s) for s in samples],
                "decisions": list(decisions),
                "events": list(events),
                "startup": list(startup),
            },
            indent=2,
        )
    )
    attainment = "n/a" if outcome.attainment is None else f"{outcome.attainment:.0%}"
    summary: list[dict[str, Any]] = [
        {"what": "P:D at start", "value": f"{outcome.start_prefill}:{outcome.start_decode}"},
        {"what": "P:D at end", "value": f"{outcome.final_prefill}:{outcome.final_decode}"},
        {"what": "most prefill replicas", "value": outcome.peak_prefill},
        {"what": "moved toward prefill", "value": outcome.moved_toward_prefill},
        {"what": "TTFT breached after the shift", "value": outcome.breached_after_shift},
        {"what": "TTFT recovered under the SLO", "value": outcome.recovered},
        {"what": "samples meeting both SLOs", "value": attainment},
    ]
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>disagg demo report</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}}</style></head><body>
<h1>disagg closed loop: {html.escape(settings.deployment)}</h1>
<p>Phases: {
        html.escape(
            ", ".join(
                f"{p.name} {p.duration_s:.0f}s at {p.rate_rps} req/s, "
                f"{p.prompt_tokens} prompt / {p.output_tokens} output tokens"
                for p in settings.phases
            )
        )
    }.
SLOs: TTFT p{settings.percentile:.0f} &le; {settings.ttft_slo_s * 1000:.0f} ms,
ITL p{settings.percentile:.0f} &le; {settings.itl_slo_s * 1000:.0f} ms.</p>
{_table(summary, ["what", "value"])}
<h2>Timeline</h2><img src="{png.name}" alt="TTFT, ITL and replicas over time" width="100%">
<h2>Scale-up start-up (pod creation to Ready)</h2>
<ul>{"".join(f"<li>{html.escape(line)}</li>" for line in startup)}</ul>
<h2>Decisions (status.autoscaling.decisions, newest first)</h2>
{_table(decisions, ["time", "prefill", "decode", "cause", "message"])}
<h2>Events</h2>
{_table(events, ["time", "type", "reason", "message"])}
</body></html>
"""
    page_path = out_dir / "report.html"
    page_path.write_text(page)
    return [page_path, png, data]


# -------------------------------------------------------------------------------------------- live parts
# Everything below starts processes or talks to the API server, Prometheus or the twin (127.0.0.1 only).


@dataclass(frozen=True)
class RunSettings:
    """How the processes of the closed loop are started."""

    operator_metrics_port: int
    log_dir: Path
    python: str = sys.executable
    start_timeout_s: float = 120.0


def _apply_path(obj: Mapping[str, Any], plural: str) -> str:
    api_version = str(obj["apiVersion"])
    metadata = obj["metadata"]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if metadata.get("namespace"):
        base += f"/namespaces/{metadata['namespace']}"
    return f"{base}/{plural}/{metadata['name']}"


PERSISTENT_VOLUME = Kind("v1", "PersistentVolume", "persistentvolumes", namespaced=False)
PLURALS = {
    "Namespace": "namespaces",
    "RatioPolicy": "ratiopolicies",
    "DisaggregatedDeployment": "disaggregateddeployments",
    "CustomResourceDefinition": "customresourcedefinitions",
    "PersistentVolume": "persistentvolumes",
    "PersistentVolumeClaim": "persistentvolumeclaims",
}


def apply_object(kube: KubeApi, obj: Mapping[str, Any], field_manager: str = "disagg-demo") -> dict[str, Any]:
    """Server-side apply of one object of a kind in PLURALS."""
    path = _apply_path(obj, PLURALS[str(obj["kind"])])
    query = [("fieldManager", field_manager), ("force", "true")]
    return kube.request("PATCH", path, query=query, body=dict(obj), content_type=APPLY_PATCH)


def wait_until(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll ``check`` every 0.5 s until truthy (the cluster package's wait, at the demo's pace)."""
    from disagg.cluster.wait import wait_for

    return wait_for(check, timeout_s=timeout_s, interval_s=0.5, what=what)


def install_crds(kube: KubeApi, timeout_s: float = 60.0) -> list[str]:
    """Apply the generated CRDs and wait until the API server serves them (Established)."""
    from disagg.api.crd import all_crds

    names: list[str] = []
    for crd in all_crds():
        apply_object(kube, crd)
        names.append(crd["metadata"]["name"])

    def established() -> bool:
        for name in names:
            live = kube.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conditions = (live.get("status") or {}).get("conditions") or []
            if not any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
                return False
        return True

    wait_until(established, timeout_s, f"CRDs {', '.join(names)} to be Established")
    return names


def ensure_namespace(kube: KubeApi, namespace: str) -> None:
    apply_object(kube, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})

    def service_account() -> bool:  # pods are admitted once the default ServiceAccount exists
        try:
            kube.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    wait_until(service_account, 60.0, f"ServiceAccount default in {namespace}")


def _spawn(command: Sequence[str], env: Mapping[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    from disagg.cluster.local import spawn_logged

    return spawn_logged(command, log_path, env={**os.environ, **env})


def stop_process(process: subprocess.Popen[bytes] | None, timeout_s: float = 15.0) -> None:
    """SIGTERM the process group started for ``process``; SIGKILL after ``timeout_s``."""
    from disagg.cluster.local import stop_process_group

    stop_process_group(process, timeout_s)


def operator_command(settings: DemoSettings, run: RunSettings, prometheus_url: str | None) -> list[str]:
    command = [
        run.python,
        "-m",
        "disagg",
        "run",
        "--namespace",
        settings.namespace,
        "--standalone",
        "--metrics-port",
        str(run.operator_metrics_port),
        "--metrics-host",
        "127.0.0.1",
    ]
    if prometheus_url:
        command += ["--prometheus-url", prometheus_url]
    return command


def operator_env(cluster: ClusterInfo, settings: DemoSettings, prometheus_url: str | None) -> dict[str, str]:
    env = {
        "KUBECONFIG": str(cluster.kubeconfig),
        "DISAGG_AUTOSCALING_TICK_S": str(settings.operator_tick_s),
        "DISAGG_AUTOSCALING_PENDING_GRACE_S": str(settings.pending_grace_s),
    }
    if prometheus_url:
        env["DISAGG_PROMETHEUS_URL"] = prometheus_url
    return env


def twin_command(
    settings: DemoSettings, run: RunSettings, cluster: ClusterInfo, endpoints: Path
) -> list[str]:
    return [
        run.python,
        "-m",
        "disagg",
        "twin",
        "serve",
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--namespace",
        settings.namespace,
        "--deployment",
        settings.deployment,
        "--model",
        settings.served_model,
        "--startup-scale",
        str(settings.startup_scale),
        "--endpoints-file",
        str(endpoints),
    ]


def read_endpoints(endpoints: Path) -> dict[str, Any] | None:
    """The live twin's endpoints document (its pods), once it has written one."""
    try:
        document = json.loads(endpoints.read_text())
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


@dataclass
class ClosedLoop:
    """The running closed loop: Prometheus, the operator and the live twin around one deployment."""

    cluster: ClusterInfo
    settings: DemoSettings
    run: RunSettings
    kube: KubeApi
    prometheus: PrometheusProcess | None = None
    operator: subprocess.Popen[bytes] | None = None
    twin: subprocess.Popen[bytes] | None = None
    router: Any = None  # disagg.cluster.routers.RouterProcess: the released router the traffic goes through
    signals: Any = None  # disagg.metrics' Prometheus adapter, when available
    notes: list[str] = field(default_factory=list)
    pods_seen: dict[str, Any] = field(default_factory=dict)  # engine pod -> its latest PodInfo
    traffic_started: float | None = None  # epoch seconds

    @property
    def operator_metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.run.operator_metrics_port}/metrics"

    def start_prometheus(self) -> None:
        from disagg.cluster.prometheus import start_prometheus
        from disagg.metrics.relabel import engine_scrape_config

        pods = engine_scrape_config(
            job_name="engines",
            kubeconfig_file=str(self.cluster.kubeconfig),
            namespaces=[self.settings.namespace],
            scrape_interval_s=max(1, round(self.settings.scrape_interval_s)),
        )
        config = prometheus_config(
            pods, f"127.0.0.1:{self.run.operator_metrics_port}", self.settings.scrape_interval_s
        )
        self.prometheus = start_prometheus(config, self.run.log_dir / "prometheus")

    def start_operator(self) -> None:
        url = self.prometheus.url if self.prometheus else None
        self.operator = _spawn(
            operator_command(self.settings, self.run, url),
            operator_env(self.cluster, self.settings, url),
            self.run.log_dir / "operator.log",
        )

    def provide_model_cache(self) -> None:
        """The prefilled claim and its volume. A volume left Released by an earlier run's claim (same
        namespace) is made Available again for the new one (its claimRef's uid cleared)."""
        for obj in cache_volume_manifests(self.settings):
            if obj["kind"] == "PersistentVolume":
                live = self.kube.get(PERSISTENT_VOLUME, None, obj["metadata"]["name"]) or {}
                if (live.get("status") or {}).get("phase") == "Released":
                    self.kube.request(
                        "PATCH",
                        PERSISTENT_VOLUME.path(None, obj["metadata"]["name"]),
                        body={"spec": {"claimRef": {"uid": None, "resourceVersion": None}}},
                        content_type=MERGE_PATCH,
                    )
            apply_object(self.kube, obj)

    def apply_scenario(self) -> None:
        self.provide_model_cache()
        apply_object(self.kube, ratio_policy_manifest(self.settings))
        apply_object(self.kube, deployment_manifest(self.settings))

    def start_twin(self) -> None:
        endpoints = self.run.log_dir / "twin-endpoints.json"
        endpoints.unlink(missing_ok=True)
        self.twin = _spawn(
            twin_command(self.settings, self.run, self.cluster, endpoints),
            {"KUBECONFIG": str(self.cluster.kubeconfig)},
            self.run.log_dir / "twin.log",
        )

        def started() -> bool:
            if self.twin is not None and self.twin.poll() is not None:
                raise RuntimeError(f"the live twin exited: see {self.run.log_dir / 'twin.log'}")
            return read_endpoints(endpoints) is not None

        wait_until(started, self.run.start_timeout_s, "the live twin")

    def start_router(self) -> str:
        """The released router (vllm-router or sglang-router, the wheel the default image pins) with the
        command line the operator rendered for this deployment, authenticated as the router's own
        ServiceAccount; returns its URL once it routes to every initial pod."""
        from disagg.api.deployment import DisaggregatedDeployment
        from disagg.cluster.routers import RouterSettings, service_account_kubeconfig, start_router
        from disagg.k8s.client import SERVICEACCOUNT
        from disagg.render.builders import router_command

        dd = DisaggregatedDeployment.model_validate(deployment_manifest(self.settings))
        ns, account = self.settings.namespace, f"{self.settings.deployment}-router"
        wait_until(lambda: self.kube.get(SERVICEACCOUNT, ns, account), 60, "the router's ServiceAccount")
        kubeconfig = service_account_kubeconfig(
            self.cluster, ns, account, self.run.log_dir / "router.kubeconfig"
        )
        self.router = start_router(
            "vllm" if self.settings.engine == "vllm" else "sglang",
            router_command(dd),
            kubeconfig,
            self.run.log_dir,
            {"POD_NAMESPACE": ns},
            RouterSettings(tie_to_parent=True),
        )
        self.wait_serving(self.run.start_timeout_s)
        return str(self.router.url)

    def children_ready(self) -> bool:
        name, ns = self.settings.deployment, self.settings.namespace
        for role in ("prefill", "decode", "router"):
            child = self.kube.get(DEPLOYMENT, ns, f"{name}-{role}")
            if child is None:
                return False
        return True

    def role_replicas(self, role: str) -> tuple[int, int]:
        child = self.kube.get(DEPLOYMENT, self.settings.namespace, f"{self.settings.deployment}-{role}") or {}
        desired = int((child.get("spec") or {}).get("replicas") or 0)
        ready = int((child.get("status") or {}).get("readyReplicas") or 0)
        return desired, ready

    def deployment(self) -> dict[str, Any]:
        return self.kube.get(DISAGG_DEPLOYMENT, self.settings.namespace, self.settings.deployment) or {}

    def decisions(self) -> list[dict[str, Any]]:
        auto = (self.deployment().get("status") or {}).get("autoscaling") or {}
        return list(auto.get("decisions") or [])

    def latest_evaluation(self) -> tuple[dict[str, Any], int]:
        """status.autoscaling.lastEvaluation (the newest decision before the first one is written there)
        and how many decisions are recorded."""
        auto = (self.deployment().get("status") or {}).get("autoscaling") or {}
        decisions = list(auto.get("decisions") or [])
        latest = auto.get("lastEvaluation") or (decisions[0] if decisions else {})
        return dict(latest), len(decisions)

    def wait_serving(self, timeout_s: float) -> None:
        """Until the router routes to every initial pod (they serve after their model loading): its
        /readiness answers ``{"prefill": {"healthy": N}, "decode": {...}}`` (vllm-router 0.1.17 and
        sglang-router 0.3.2, as run by tests/e2e/test_released_router.py)."""
        import httpx

        wanted = {"prefill": self.settings.prefill_replicas, "decode": self.settings.decode_replicas}

        def serving() -> bool:
            try:
                body = self.router.get("/readiness").json()
            except (httpx.HTTPError, ValueError):
                return False
            counts = {role: int((body.get(role) or {}).get("healthy") or 0) for role in wanted}
            return all(counts[role] >= count for role, count in wanted.items())

        wait_until(serving, timeout_s, "the emulated engines to serve")

    def events(self) -> list[dict[str, Any]]:
        """Events about the deployment, oldest first."""
        query = [("fieldSelector", f"involvedObject.name={self.settings.deployment}")]
        items = self.kube.request("GET", f"/api/v1/namespaces/{self.settings.namespace}/events", query=query)
        rows = [
            {
                "time": e.get("lastTimestamp") or e.get("eventTime") or "",
                "type": e.get("type", ""),
                "reason": e.get("reason", ""),
                "message": e.get("message", ""),
            }
            for e in items.get("items") or []
        ]
        return sorted(rows, key=lambda r: str(r["time"]))

    def latencies(self) -> tuple[float | None, float | None]:
        """User TTFT and ITL at the policy percentile, read from Prometheus as the operator reads them."""
        if self.prometheus is None:
            return None, None
        ttft, itl = read_latencies(self.prometheus.url, self.settings)
        return ttft, itl

    def observe_pods(self) -> None:
        """Remember every engine pod of the deployment as last seen (a removed pod keeps its entry)."""
        from disagg.controller.autoscaling import pod_info

        selector = f"disagg.dev/deployment={self.settings.deployment}"
        for pod in self.kube.list(POD, self.settings.namespace, selector):
            info = pod_info(pod)
            if info.role in ("prefill", "decode"):
                self.pods_seen[info.name] = info

    def scale_up_startups(self) -> list[PodStartup]:
        """Each pod added after the traffic started, with its creation-to-Ready time."""
        self.observe_pods()
        since = self.traffic_started if self.traffic_started is not None else math.inf
        return scale_up_startups(list(self.pods_seen.values()), since)

    def sample(self, elapsed_s: float, phase: str | None = None) -> Sample:
        (p_desired, p_ready), (d_desired, d_ready) = (
            self.role_replicas("prefill"),
            self.role_replicas("decode"),
        )
        latest, decisions = self.latest_evaluation()
        ttft, itl = self.latencies()
        self.observe_pods()
        return Sample(
            elapsed_s=elapsed_s,
            phase=phase or self.settings.phase_at(elapsed_s).name,
            prefill=p_desired,
            decode=d_desired,
            prefill_ready=p_ready,
            decode_ready=d_ready,
            ttft_s=ttft,
            itl_s=itl,
            cause=str(latest.get("cause", "")),
            decisions=decisions,
            message=str(latest.get("message", "")),
        )

    def stop(self) -> None:
        if self.router is not None:
            self.router.stop()
        stop_process(self.twin)
        stop_process(self.operator)
        if self.prometheus is not None:
            self.prometheus.stop()


def read_latencies(prometheus_url: str, settings: DemoSettings) -> tuple[float | None, float | None]:
    """User TTFT and ITL at the policy percentile, with the operator's own PromQL and combination
    (disagg.metrics); None when Prometheus has no data for one."""
    from disagg.metrics.prometheus import PrometheusSignals, user_ttft
    from disagg.metrics.queries import QuerySet, build_queries

    every = build_queries(
        settings.engine,
        settings.namespace,
        settings.deployment,
        settings.percentile,
        settings.percentile,
        settings.metric_window_s,
    )
    wanted = ("ttft_router", "ttft_prefill_side", "ttft_decode_side", "itl")
    signals = PrometheusSignals(prometheus_url).run(
        QuerySet({k: every[k] for k in wanted if k in every.queries})
    )
    ttft = user_ttft(signals)
    itl = signals.get("itl")
    return (ttft.value if ttft.ok else None), (itl.value if itl.ok else None)


def phase_requests(phase: Phase, seed: int) -> list[LoadRequest]:
    """The phase's Poisson arrivals: those that fall within its duration."""
    from disagg.twin.live.load import poisson_requests

    count = int(phase.rate_rps * phase.duration_s * 1.5) + 10  # more than the phase can send
    every = poisson_requests(phase.rate_rps, count, phase.prompt_tokens, phase.output_tokens, seed=seed)
    return [r for r in every if r.arrival_s < phase.duration_s]


@dataclass(frozen=True)
class PhaseReport:
    """One phase's traffic: every request that arrived within the phase, and what became of it.

    ``failed`` requests got an error answer (or a broken connection); ``cut_off`` ones were still
    running when the phase's drain ran out (the load generator cancels those without a result).
    """

    phase: str
    sent: int
    load: LoadReport

    @property
    def ok(self) -> int:
        return self.load.ok

    @property
    def failed(self) -> int:
        return self.load.failed

    @property
    def cut_off(self) -> int:
        return self.sent - len(self.load.results)

    def errors(self) -> dict[str, int]:
        """Error text -> count, over the failed requests."""
        counts: dict[str, int] = {}
        for result in self.load.results:
            if not result.ok:
                counts[result.error[:80]] = counts.get(result.error[:80], 0) + 1
        return counts

    def summary(self) -> str:
        ok = self.load.ok
        text = (
            f"{self.phase}: sent {self.sent}, ok {ok}, failed {self.failed}, cut off {self.cut_off} "
            f"(still running when the drain ended) in {self.load.wall_s:.1f} s wall"
        )
        latencies = self.load.summary().split("; ", 1)[-1]  # "TTFT p50 ... (engine seconds)"
        errors = ", ".join(f"{count} x {error}" for error, count in self.errors().items())
        return f"{text}; {latencies}" + (f"; errors: {errors}" if errors else "")


def run_traffic(
    router_url: str, settings: DemoSettings, on_phase: Callable[[str], None] | None = None
) -> list[PhaseReport]:
    """Each phase's Poisson load through the released router, one after the other (blocking).

    A phase sends the requests arriving within its duration, then lets the ones in flight finish
    (at most ``drain_s``) before the next phase starts, so every request it sent is counted.
    """
    import asyncio

    from disagg.twin.live.load import LoadSettings, run_load

    reports: list[PhaseReport] = []
    for index, phase in enumerate(settings.phases):
        requests = phase_requests(phase, seed=index)
        load = LoadSettings(
            target=router_url,
            max_requests=max(1, len(requests)),
            max_duration_s=phase.duration_s + settings.drain_s,
            model=settings.served_model,
        )
        if on_phase is not None:
            on_phase(phase.name)
        reports.append(PhaseReport(phase.name, len(requests), asyncio.run(run_load(requests, load))))
    return reports


def drive(loop: ClosedLoop, out: TextIO) -> tuple[list[Sample], list[PhaseReport]]:
    """Run the traffic phases in a thread and sample/print the loop every ``refresh_s`` meanwhile."""
    import threading

    if loop.router is None:
        raise RuntimeError("the router is not up")
    settings = loop.settings
    reports: list[PhaseReport] = []
    failure: list[BaseException] = []
    current = [settings.phases[0].name]  # the phase the traffic thread is in (drains shift the edges)

    def traffic() -> None:
        try:
            reports.extend(run_traffic(str(loop.router.url), settings, on_phase=lambda p: current.append(p)))
        except BaseException as error:  # reported by the main thread
            failure.append(error)

    thread = threading.Thread(target=traffic, name="demo-traffic", daemon=True)
    samples: list[Sample] = []
    print(TABLE_HEADER, file=out, flush=True)
    started = time.monotonic()
    loop.traffic_started = time.time()
    thread.start()
    while thread.is_alive():
        sample = loop.sample(time.monotonic() - started, current[-1])
        samples.append(sample)
        print(format_row(sample, settings), file=out, flush=True)
        thread.join(timeout=settings.refresh_s)
    if failure:
        raise RuntimeError(f"traffic failed: {failure[0]}") from failure[0]
    return samples, reports


def kubectl_get(cluster: ClusterInfo, namespace: str, what: str) -> str:
    from disagg.cluster.binaries import ensure_binary

    kubectl = ensure_binary("kubectl")
    result = subprocess.run(
        [str(kubectl), "--kubeconfig", str(cluster.kubeconfig), "-n", namespace, "get", what, "-o", "wide"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return result.stdout + result.stderr


def configure(parser: argparse.ArgumentParser) -> None:
    defaults = DemoSettings()
    parser.add_argument("--keep", action="store_true", help="leave the local cluster up afterwards")
    parser.add_argument("--state-dir", type=Path, help="state directory of the local cluster")
    parser.add_argument("--namespace", default=defaults.namespace, help="namespace (default %(default)s)")
    parser.add_argument(
        "--report-dir",
        type=Path,
        default=defaults.report_dir,
        help="where the report goes (default %(default)s)",
    )
    parser.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="divide every phase's duration by this (e.g. 2 for a quicker, rougher run)",
    )
    parser.set_defaults(func=run_demo)


def _step(out: TextIO, text: str) -> None:
    print(f"==> {text}", file=out, flush=True)


def run_demo(args: argparse.Namespace) -> int:
    from disagg.cluster import LocalCluster
    from disagg.cluster.local import free_ports
    from disagg.k8s.client import load_api_client

    if not args.speed > 0:
        raise SystemExit("disagg demo: --speed must be > 0")
    base = DemoSettings()
    settings = replace(
        base,
        namespace=args.namespace,
        report_dir=args.report_dir,
        phases=tuple(replace(p, duration_s=p.duration_s / args.speed) for p in base.phases),
        startup_scale=base.startup_scale / args.speed,
    )
    out = sys.stdout
    cluster_manager = LocalCluster(state_dir=args.state_dir) if args.state_dir else LocalCluster()
    _step(out, "local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok GPU nodes)")
    already_up = cluster_manager.status().running  # a cluster the user brought up stays up
    cluster = cluster_manager.up()
    (port,) = free_ports(1)
    run = RunSettings(operator_metrics_port=port, log_dir=(settings.report_dir / "logs").resolve())
    kube = KubeApi(load_api_client(cluster.kubeconfig))
    loop = ClosedLoop(cluster, settings, run, kube)
    try:
        _step(out, f"CRDs: {', '.join(install_crds(kube))}")
        ensure_namespace(kube, settings.namespace)
        _step(out, "Prometheus, discovering the engine pods through the API server")
        loop.start_prometheus()
        _step(out, f"operator (logs: {run.log_dir / 'operator.log'}), metrics on {loop.operator_metrics_url}")
        loop.start_operator()
        cache = f", weights on claim {settings.model_cache_claim}" if settings.model_cache_claim else ""
        _step(out, f"RatioPolicy {settings.policy} and DisaggregatedDeployment {settings.deployment}{cache}")
        loop.apply_scenario()
        wait_until(loop.children_ready, run.start_timeout_s, "the deployment's children")
        print(
            kubectl_get(cluster, settings.namespace, "dd,ratiopolicies,deployments,services,pods"), file=out
        )
        _step(out, "live twin: one emulated engine per pod, listening on the pod's own IP")
        loop.start_twin()
        _step(out, "released router with the operator's command line and Kubernetes service discovery")
        _step(out, f"router serving every initial pod at {loop.start_router()}")
        phases = ", then ".join(
            f"{p.name} ({p.prompt_tokens}-token prompts) for {p.duration_s:.0f}s" for p in settings.phases
        )
        _step(out, f"traffic: {phases}")
        samples, reports = drive(loop, out)
        for report in reports:
            print(f"   {report.summary()}", file=out)
        startup = startup_report(
            loop.scale_up_startups(), startup_estimates(settings), settings.model_cache_claim
        )
        planned = operator_startup(loop.deployment())
        if planned is not None:
            startup.append(f"the operator's policy plans with: {planned}")
        _step(out, "scale-up start-up (pod creation to Ready):")
        for line in startup:
            print(f"   {line}", file=out)
        paths = write_report(samples, loop.decisions(), loop.events(), settings, settings.report_dir, startup)
        outcome = summarise(samples, settings)
        _step(
            out,
            f"P:D {outcome.start_prefill}:{outcome.start_decode} -> "
            f"{outcome.final_prefill}:{outcome.final_decode} (most prefill {outcome.peak_prefill}); "
            f"TTFT recovered: {outcome.recovered}",
        )
        _step(out, f"report: {paths[0]}")
        return 0
    finally:
        loop.stop()
        if args.keep or already_up:
            _step(out, f"cluster left up: export KUBECONFIG={cluster.kubeconfig}")
        else:
            cluster_manager.down()

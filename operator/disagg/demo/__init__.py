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

The package's modules, each one concern:

* :mod:`~disagg.demo.scenario` - settings, phases and the manifests (pure);
* :mod:`~disagg.demo.samples` - what the demo sees at each moment, and the run's outcome (pure);
* :mod:`~disagg.demo.startup` - the scale-up start-up against the estimates (pure);
* :mod:`~disagg.demo.traffic` - the phases' requests through the released router;
* :mod:`~disagg.demo.harness` - the processes of the closed loop (Prometheus, operator, twin, router);
* :mod:`~disagg.demo.live` - the live table and progress while the traffic runs;
* :mod:`~disagg.demo.report` - report.html (interactive plots) and samples.json;
* :mod:`~disagg.demo.cli` - ``disagg demo``.

The scenario, the harness, the live table and the report are shared with the closed-loop e2e test
(tests/e2e/test_closed_loop.py), which asserts what the demo shows; they are re-exported here.
"""

from disagg.demo.harness import ClosedLoop, RunSettings, apply_object, wait_until
from disagg.demo.live import drive, format_row
from disagg.demo.report import write_report
from disagg.demo.samples import Outcome, Sample, summarise
from disagg.demo.scenario import (
    DemoSettings,
    Phase,
    cache_volume_manifests,
    deployment_manifest,
    prometheus_config,
    ratio_policy_manifest,
)
from disagg.demo.startup import (
    PodStartup,
    StartupEstimates,
    operator_startup,
    scale_up_startups,
    startup_estimates,
    startup_report,
)
from disagg.demo.traffic import PhaseReport, phase_requests

__all__ = [
    "ClosedLoop",
    "DemoSettings",
    "Outcome",
    "Phase",
    "PhaseReport",
    "PodStartup",
    "RunSettings",
    "Sample",
    "StartupEstimates",
    "apply_object",
    "cache_volume_manifests",
    "deployment_manifest",
    "drive",
    "format_row",
    "operator_startup",
    "phase_requests",
    "prometheus_config",
    "ratio_policy_manifest",
    "scale_up_startups",
    "startup_estimates",
    "startup_report",
    "summarise",
    "wait_until",
    "write_report",
]

"""``disagg demo``: the closed loop on the local control plane, time-compressed to a few minutes.

The phases it prints (``==> ...``), the live table while the traffic runs, each phase's
``sent / ok / failed / cut off`` line, the scale-up start-up, the ratio's move, and where the report is.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from disagg.clicommon import EXIT_OK, refuse_stdout, usage_error
from disagg.cluster import LocalCluster
from disagg.cluster.processes import free_ports
from disagg.demo.harness import ClosedLoop, RunSettings, ensure_namespace, kubectl_get, wait_until
from disagg.demo.live import demo_console, drive
from disagg.demo.report import write_report
from disagg.demo.samples import summarise
from disagg.demo.scenario import DemoSettings
from disagg.demo.startup import operator_startup, startup_estimates, startup_report
from disagg.k8s.client import KubeApi, load_api_client
from disagg.k8s.crds import install_crds


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


def _step(console: Console, text: str) -> None:
    console.print(f"==> {text}")


def run_demo(args: argparse.Namespace) -> int:
    if not args.speed > 0:
        usage_error("disagg demo", f"--speed must be > 0, got {args.speed}")
    refuse_stdout("disagg demo", "--report-dir", args.report_dir, "the report is report.html, plots and logs")
    base = DemoSettings()
    settings = replace(
        base,
        namespace=args.namespace,
        report_dir=args.report_dir,
        phases=tuple(replace(p, duration_s=p.duration_s / args.speed) for p in base.phases),
        startup_scale=base.startup_scale / args.speed,
    )
    out = demo_console(sys.stdout)
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
        out.print(kubectl_get(cluster, settings.namespace, "dd,ratiopolicies,deployments,services,pods"))
        _step(out, "live twin: one emulated engine per pod, listening on the pod's own IP")
        loop.start_twin()
        _step(out, "released router with the operator's command line and Kubernetes service discovery")
        _step(out, f"router serving every initial pod at {loop.start_router()}")
        phases = ", then ".join(
            f"{p.name} ({p.prompt_tokens}-token prompts) for {p.duration_s:.0f}s" for p in settings.phases
        )
        _step(out, f"traffic: {phases}")
        samples, reports = drive(loop, sys.stdout)
        for report in reports:
            out.print(f"   {report.summary()}")
        startup = startup_report(
            loop.scale_up_startups(), startup_estimates(settings), settings.model_cache_claim
        )
        planned = operator_startup(loop.deployment())
        if planned is not None:
            startup.append(f"the operator's policy plans with: {planned}")
        _step(out, "scale-up start-up (pod creation to Ready):")
        for line in startup:
            out.print(f"   {line}")
        paths = write_report(samples, loop.decisions(), loop.events(), settings, settings.report_dir, startup)
        outcome = summarise(samples, settings)
        _step(
            out,
            f"P:D {outcome.start_prefill}:{outcome.start_decode} -> "
            f"{outcome.final_prefill}:{outcome.final_decode} (most prefill {outcome.peak_prefill}); "
            f"TTFT recovered: {outcome.recovered}",
        )
        _step(out, f"report: {paths[0]}")
        return EXIT_OK
    finally:
        loop.stop()
        if args.keep or already_up:
            _step(out, f"cluster left up: export KUBECONFIG={cluster.kubeconfig}")
        else:
            cluster_manager.down()

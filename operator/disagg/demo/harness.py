"""The demo's harness: the processes of the closed loop around one deployment on the local control plane.

:class:`ClosedLoop` starts and supervises a real Prometheus (discovering the engine pods through the API
server), the operator (``disagg run``), the live twin (``disagg twin serve``, one emulated engine per pod
on the pod's own IP) and the released router with the command line the operator renders, and reads what
the demo shows: replicas, the latest evaluation, decisions, Events, and TTFT/ITL from Prometheus as the
operator reads them. Everything here starts processes or talks to the API server, Prometheus or the twin
(127.0.0.1 only); every wait goes through :func:`disagg.cluster.wait.wait_for`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx
from kubernetes.client.exceptions import ApiException

from disagg.api.deployment import DisaggregatedDeployment
from disagg.cluster.binaries import ensure_binary
from disagg.cluster.layout import ClusterInfo
from disagg.cluster.processes import free_ports, spawn_logged, stop_process_group
from disagg.cluster.prometheus import PrometheusProcess, start_prometheus
from disagg.cluster.routers import RouterProcess, RouterSettings, service_account_kubeconfig, start_router
from disagg.cluster.wait import wait_for
from disagg.controller.pods import PodInfo, pod_info
from disagg.demo.samples import Sample
from disagg.demo.scenario import (
    DemoSettings,
    cache_volume_manifests,
    deployment_manifest,
    prometheus_config,
    ratio_policy_manifest,
)
from disagg.demo.startup import PodStartup, scale_up_startups
from disagg.k8s.client import (
    CRD,
    DEPLOYMENT,
    DISAGG_DEPLOYMENT,
    MERGE_PATCH,
    POD,
    PVC,
    RATIO_POLICY,
    SERVICEACCOUNT,
    Kind,
    KubeApi,
    kind_of,
    load_api_client,
)
from disagg.k8s.crds import install_crds
from disagg.metrics.prometheus import PrometheusSignals, user_ttft
from disagg.metrics.queries import QuerySet, build_queries
from disagg.metrics.relabel import engine_scrape_config
from disagg.render.builders import router_command

WAIT_INTERVAL_S = 0.5  # the demo's polling pace
STOP_TIMEOUT_S = 15.0  # SIGTERM to SIGKILL for the operator and the twin
NAMESPACE = Kind("v1", "Namespace", "namespaces", namespaced=False)
PERSISTENT_VOLUME = Kind("v1", "PersistentVolume", "persistentvolumes", namespaced=False)
# what the demo (and the e2e tests through apply_object) apply beside the operator's own kinds
DEMO_KINDS = (NAMESPACE, PERSISTENT_VOLUME, PVC, RATIO_POLICY, DISAGG_DEPLOYMENT, CRD)


@dataclass(frozen=True)
class RunSettings:
    """How the processes of the closed loop are started."""

    operator_metrics_port: int
    log_dir: Path
    python: str = sys.executable
    start_timeout_s: float = 120.0


def apply_object(kube: KubeApi, obj: Mapping[str, Any], field_manager: str = "disagg-demo") -> dict[str, Any]:
    """Server-side apply of one object of a kind in DEMO_KINDS."""
    return kube.apply(obj, field_manager, kind=kind_of(obj, DEMO_KINDS))


def wait_until(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll ``check`` until truthy (:func:`disagg.cluster.wait.wait_for` at the demo's pace)."""
    return wait_for(check, timeout_s=timeout_s, interval_s=WAIT_INTERVAL_S, what=what)


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
    router: RouterProcess | None = None  # the released router the traffic goes through
    pods_seen: dict[str, PodInfo] = field(default_factory=dict)  # engine pod -> as last seen
    traffic_started: float | None = None  # epoch seconds
    twin_args: tuple[str, ...] = ()  # more flags of `disagg twin serve`

    @property
    def operator_metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.run.operator_metrics_port}/metrics"

    def start_prometheus(self) -> None:
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
        self.operator = spawn_logged(
            operator_command(self.settings, self.run, url),
            self.run.log_dir / "operator.log",
            env={**os.environ, **operator_env(self.cluster, self.settings, url)},
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

    def deployment_object(self) -> dict[str, Any]:
        """The DisaggregatedDeployment this loop runs (the demo's; a variant loop may run another)."""
        return deployment_manifest(self.settings)

    def apply_scenario(self) -> None:
        self.provide_model_cache()
        apply_object(self.kube, ratio_policy_manifest(self.settings))
        apply_object(self.kube, self.deployment_object())

    def start_twin(self) -> None:
        endpoints = self.run.log_dir / "twin-endpoints.json"
        endpoints.unlink(missing_ok=True)
        self.twin = spawn_logged(
            [*twin_command(self.settings, self.run, self.cluster, endpoints), *self.twin_args],
            self.run.log_dir / "twin.log",
            env={**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)},
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
        dd = DisaggregatedDeployment.model_validate(self.deployment_object())
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
        return self.router.url

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
        router = self.router
        if router is None:
            raise RuntimeError("the router is not up")
        wanted = {"prefill": self.settings.prefill_replicas, "decode": self.settings.decode_replicas}

        def serving() -> bool:
            try:
                body = router.get("/readiness").json()
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
        stop_process_group(self.twin, STOP_TIMEOUT_S)
        stop_process_group(self.operator, STOP_TIMEOUT_S)
        if self.prometheus is not None:
            self.prometheus.stop()

    @contextlib.contextmanager
    def running(
        self, children: str = "the deployment's children", print_logs: bool = False
    ) -> Iterator[Self]:
        """The whole loop started in order (the CRDs, Prometheus, the operator, the scenario's objects, the
        live twin once ``children`` exist, the released router) and stopped afterwards; with
        ``print_logs`` the tails of the operator's, the twin's and the router's logs are printed then (for
        a test's report)."""
        try:
            install_crds(self.kube)
            self.start_prometheus()
            self.start_operator()
            self.apply_scenario()
            wait_until(self.children_ready, 120, children)
            self.start_twin()
            self.start_router()
            yield self
        finally:
            self.stop()
            for name in ("operator.log", "twin.log", "vllm-router.log") if print_logs else ():
                log = self.run.log_dir / name
                if log.is_file():
                    print(f"--- {name} (tail)\n{log.read_text(errors='replace')[-3000:]}")

    @classmethod
    def on(cls, cluster: ClusterInfo, settings: DemoSettings, log_dir: Path) -> Self:
        """A loop on ``cluster``: the operator's metrics on a free port, the logs under ``log_dir``."""
        (port,) = free_ports(1)
        kube = KubeApi(load_api_client(cluster.kubeconfig))
        return cls(cluster, settings, RunSettings(operator_metrics_port=port, log_dir=log_dir), kube)


def read_latencies(prometheus_url: str, settings: DemoSettings) -> tuple[float | None, float | None]:
    """User TTFT and ITL at the policy percentile, with the operator's own PromQL and combination
    (disagg.metrics); None when Prometheus has no data for one."""
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


def kubectl_get(cluster: ClusterInfo, namespace: str, what: str) -> str:
    kubectl = ensure_binary("kubectl")
    result = subprocess.run(
        [str(kubectl), "--kubeconfig", str(cluster.kubeconfig), "-n", namespace, "get", what, "-o", "wide"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return result.stdout + result.stderr

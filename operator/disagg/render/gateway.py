"""Routing through the Gateway API Inference Extension (spec.router.type: gateway-api). Pure.

Instead of the built-in router, the children are:

* an ``InferencePool`` (``inference.networking.k8s.io/v1``, the GA API of sigs.k8s.io/gateway-api-inference-
  extension) selecting the engine pods of both pools by :data:`POOL_LABEL`, its target port the engines'
  HTTP port, its endpoint picker the Service below;
* the endpoint picker (EPP): the llm-d inference scheduler (github.com/llm-d/llm-d-inference-scheduler,
  the EPP the Inference Extension's README points to since its own EPP moved to the llm-d project), as a
  Deployment, Service, ConfigMap (its EndpointPickerConfig) and ServiceAccount/Role/RoleBinding (it
  watches the pods and the InferencePool), all named ``NAME-router``: it is the router of this type;
* optionally an ``HTTPRoute`` from a user-named Gateway to the InferencePool.

How a P/D request flows (llm-d-inference-scheduler v0.7.1): the Gateway asks the EPP (Envoy ext-proc)
for an endpoint; the EPP's disagg-profile-handler runs the decode profile (pods labelled
``llm-d.ai/role: decode``) and, when the prefix-based decider finds enough uncached tokens, the prefill
profile (``llm-d.ai/role: prefill``); the disagg-headers-handler puts the chosen prefill pod's
``host:port`` in the ``x-prefiller-host-port`` header and the Gateway sends the request to the chosen
decode pod. There the llm-d routing sidecar, which holds the pool's target port, sends the prefill
request to that pod and then the decode request, with the connector's transfer parameters, to the
engine next to it (:func:`routing_sidecar`), which therefore listens :data:`GATEWAY_ENGINE_PORT_OFFSET`
ports higher on decode pods (:func:`engine_settings`).

The engine pods keep every label and annotation they have with the built-in router (the policy's
metrics come from the engines, scraped at their ``prometheus.io/port``, which names the engine's own
port on decode pods too); they gain :data:`ROLE_LABEL_LLMD` and :data:`POOL_LABEL`.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from typing import Any

import yaml

from disagg.api.deployment import GATEWAY_ENGINE_PORT_OFFSET, DisaggregatedDeployment, RoleName
from disagg.render.engines import engine_port
from disagg.render.names import Component, child_name, labels, selector_labels
from disagg.render.settings import DEFAULT_SETTINGS, RenderSettings

Obj = dict[str, Any]

# --- versions and images ----------------------------------------------------------------------------
# The InferencePool's GA API version: sigs.k8s.io/gateway-api-inference-extension v1.6.0,
# config/crd/bases/inference.networking.k8s.io_inferencepools.yaml (v1: served, storage).
INFERENCE_POOL_API_VERSION = "inference.networking.k8s.io/v1"
INFERENCE_POOL_GROUP = "inference.networking.k8s.io"
# sigs.k8s.io/gateway-api v1.6.3, config/crd/standard/gateway.networking.k8s.io_httproutes.yaml (v1).
HTTP_ROUTE_API_VERSION = "gateway.networking.k8s.io/v1"
GATEWAY_GROUP = "gateway.networking.k8s.io"
# The pinned llm-d inference scheduler release: the newest version of
# github.com/llm-d/llm-d-inference-scheduler the Go module proxy serves here (v0.7.1; v0.8.0 and later
# answer 403). Its Makefile names the images: IMAGE_REGISTRY ghcr.io/llm-d, PROJECT_NAME
# llm-d-inference-scheduler (the EPP, Dockerfile.epp) and SIDECAR_IMAGE_NAME llm-d-routing-sidecar
# (Dockerfile.sidecar, cmd/pd-sidecar), tagged with the release.
LLMD_SCHEDULER_VERSION = "v0.7.1"
EPP_IMAGE = f"ghcr.io/llm-d/llm-d-inference-scheduler:{LLMD_SCHEDULER_VERSION}"
SIDECAR_IMAGE = f"ghcr.io/llm-d/llm-d-routing-sidecar:{LLMD_SCHEDULER_VERSION}"

# --- labels -----------------------------------------------------------------------------------------
# The label the scheduler's prefill-filter and decode-filter read (llm-d-inference-scheduler v0.7.1,
# pkg/plugins/filter/roles.go: RoleLabel "llm-d.ai/role", values "prefill" and "decode").
ROLE_LABEL_LLMD = "llm-d.ai/role"
# Ours: the engine pods of one DisaggregatedDeployment's InferencePool (its selector). The pods' other
# labels are shared with the router and download pods, and matchLabels cannot say "prefill or decode".
POOL_LABEL = "disagg.dev/inference-pool"

# --- the endpoint picker ----------------------------------------------------------------------------
EPP_CONTAINER = "epp"
# Ports at their defaults (sigs.k8s.io/gateway-api-inference-extension v1.4.0, the version
# llm-d-inference-scheduler v0.7.1's go.mod requires: pkg/epp/server/options.go DefaultGrpcPort 9002,
# GRPCHealthPort 9003, MetricsPort 9090; flags --grpc-port, --grpc-health-port, --metrics-port).
EPP_GRPC_PORT = 9002
EPP_HEALTH_PORT = 9003
EPP_METRICS_PORT = 9090
# The gRPC health service its probes ask (llm-d-inference-scheduler v0.7.1,
# deploy/components/inference-gateway/deployments.yaml livenessProbe/readinessProbe grpc.service).
EPP_HEALTH_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
EPP_CONFIG_DIR = "/config"
EPP_CONFIG_KEY = "epp-config.yaml"
EPP_CONFIG_HASH_ANNOTATION = "disagg.dev/epp-config-hash"
# SGLang's metric names for the EPP's scrapers (gateway-api-inference-extension v1.4.0,
# pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go defaultEngineConfigs "sglang"; the
# flags of pkg/epp/server/options.go default to vLLM's names). SGLang has no LoRA or cache-info metric.
SGLANG_EPP_METRIC_ARGS = (
    "--total-queued-requests-metric",
    "sglang:num_queue_reqs",
    "--total-running-requests-metric",
    "sglang:num_running_reqs",
    "--kv-cache-usage-percentage-metric",
    "sglang:token_usage",
    "--lora-info-metric",
    "",
    "--cache-info-metric",
    "",
)

# --- the routing sidecar ----------------------------------------------------------------------------
SIDECAR_CONTAINER = "routing-sidecar"
SIDECAR_PORT_NAME = "pd-http"
# --kv-connector values (llm-d-inference-scheduler v0.7.1, pkg/sidecar/proxy/proxy.go
# KVConnectorNIXLV2 "nixlv2", KVConnectorSGLang "sglang"): vLLM with NIXL speaks nixlv2; SGLang's
# protocol (bootstrap host, port and room in both requests) is the same for its Mooncake and NIXL
# backends.
SIDECAR_CONNECTOR = {"vllm": "nixlv2", "sglang": "sglang"}
# pkg/sidecar/proxy/connector_sglang.go: the prefill pods' bootstrap port, default 8998.
SIDECAR_SGLANG_BOOTSTRAP_ENV = "SGLANG_BOOTSTRAP_PORT"


def enabled(dd: DisaggregatedDeployment) -> bool:
    return dd.spec.router.gateway


def _metadata(dd: DisaggregatedDeployment, name: str, component: Component = "router") -> Obj:
    return {"name": name, "namespace": dd.namespace, "labels": labels(dd.name, component)}


def epp_name(dd: DisaggregatedDeployment) -> str:
    return child_name(dd.name, "router")


def pool_name(dd: DisaggregatedDeployment) -> str:
    """The InferencePool (and HTTPRoute) of a DisaggregatedDeployment: its own name."""
    return dd.name


# ------------------------------------------------------------------------------------- engine pods


def engine_settings(dd: DisaggregatedDeployment, role: RoleName, settings: RenderSettings) -> RenderSettings:
    """The settings a pool's pods render with: on decode pods under gateway-api the engine listens
    GATEWAY_ENGINE_PORT_OFFSET ports higher, the routing sidecar taking the pool's target port (as in
    llm-d-inference-scheduler v0.7.1 deploy/components/vllm-sim-pd/deployments.yaml: sidecar --port=8000,
    --vllm-port=8200); otherwise unchanged."""
    if not enabled(dd) or role != "decode":
        return settings
    return dataclasses.replace(
        settings,
        vllm_port=settings.vllm_port + GATEWAY_ENGINE_PORT_OFFSET,
        sglang_port=settings.sglang_port + GATEWAY_ENGINE_PORT_OFFSET,
    )


def pod_labels(dd: DisaggregatedDeployment, role: RoleName) -> dict[str, str]:
    """The labels gateway-api adds to a pool's pods (none otherwise)."""
    if not enabled(dd):
        return {}
    return {ROLE_LABEL_LLMD: role, POOL_LABEL: pool_name(dd)}


def routing_sidecar(dd: DisaggregatedDeployment, settings: RenderSettings = DEFAULT_SETTINGS) -> Obj:
    """The llm-d routing sidecar of a decode pod, a native sidecar (an init container that keeps running):
    it serves the pool's target port, sends a request that carries x-prefiller-host-port to that prefill
    pod first, then to the engine beside it on the moved port (flags: llm-d-inference-scheduler v0.7.1,
    pkg/sidecar/proxy/options.go AddFlags: --port, --vllm-port, --kv-connector, --secure-proxy)."""
    target = engine_port(dd, settings)
    local = engine_port(dd, engine_settings(dd, "decode", settings))
    env: list[Obj] = []
    if dd.spec.engine.type == "sglang":
        env.append({"name": SIDECAR_SGLANG_BOOTSTRAP_ENV, "value": str(dd.spec.kv_transfer.bootstrap_port)})
    container: Obj = {
        "name": SIDECAR_CONTAINER,
        "image": dd.spec.router.gateway_settings.sidecar_image or SIDECAR_IMAGE,
        # Kubernetes native sidecar: restartPolicy Always on an init container (the layout of
        # deploy/components/vllm-sim-pd/deployments.yaml).
        "restartPolicy": "Always",
        "args": [
            f"--port={target}",
            f"--vllm-port={local}",
            f"--kv-connector={SIDECAR_CONNECTOR[dd.spec.engine.type]}",
            # Plain HTTP, as the InferencePool's appProtocol (http) says; the default (true) serves TLS
            # with a self-signed certificate.
            "--secure-proxy=false",
        ],
        "ports": [{"name": SIDECAR_PORT_NAME, "containerPort": target, "protocol": "TCP"}],
        # The sidecar answers GET /health itself (pkg/sidecar/proxy/proxy.go createRoutes).
        "readinessProbe": {"httpGet": {"path": "/health", "port": SIDECAR_PORT_NAME}, "periodSeconds": 5},
    }
    if env:
        container["env"] = env
    return container


def add_to_pod_template(
    dd: DisaggregatedDeployment, role: RoleName, template: Obj, settings: RenderSettings = DEFAULT_SETTINGS
) -> Obj:
    """``template`` (an engine pod template) with the labels and, on decode, the sidecar gateway-api adds;
    unchanged without gateway-api."""
    if not enabled(dd):
        return template
    template["metadata"]["labels"] = {**template["metadata"]["labels"], **pod_labels(dd, role)}
    if role == "decode":
        spec = template["spec"]
        spec["initContainers"] = [*spec.get("initContainers", []), routing_sidecar(dd, settings)]
    return template


# ------------------------------------------------------------------------------------ the pool


def build_inference_pool(dd: DisaggregatedDeployment, settings: RenderSettings = DEFAULT_SETTINGS) -> Obj:
    """The InferencePool over both pools' engine pods (schema: gateway-api-inference-extension v1.6.0
    inference.networking.k8s.io_inferencepools.yaml, spec.selector.matchLabels, spec.targetPorts[].number,
    spec.endpointPickerRef {kind, name, port.number, failureMode})."""
    gateway = dd.spec.router.gateway_settings
    return {
        "apiVersion": INFERENCE_POOL_API_VERSION,
        "kind": "InferencePool",
        "metadata": _metadata(dd, pool_name(dd)),
        "spec": {
            "selector": {"matchLabels": {POOL_LABEL: pool_name(dd)}},
            "targetPorts": [{"number": engine_port(dd, settings)}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": epp_name(dd),
                "port": {"number": EPP_GRPC_PORT},
                "failureMode": gateway.failure_mode,
            },
        },
    }


def build_http_route(dd: DisaggregatedDeployment) -> Obj | None:
    """The HTTPRoute from spec.router.gatewayApi.gateway to the InferencePool, or None without a gateway.
    A backendRef of kind InferencePool (group inference.networking.k8s.io) is how a Gateway reaches the
    pool (gateway-api-inference-extension v1.6.0, site-src guides; llm-d-inference-scheduler v0.7.1
    deploy/components/inference-gateway/httproutes.yaml)."""
    ref = dd.spec.router.gateway_settings.gateway
    if ref is None:
        return None
    parent: Obj = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": ref.name}
    if ref.namespace:
        parent["namespace"] = ref.namespace
    if ref.section_name:
        parent["sectionName"] = ref.section_name
    return {
        "apiVersion": HTTP_ROUTE_API_VERSION,
        "kind": "HTTPRoute",
        "metadata": _metadata(dd, pool_name(dd)),
        "spec": {
            "parentRefs": [parent],
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                    "backendRefs": [
                        {"group": INFERENCE_POOL_GROUP, "kind": "InferencePool", "name": pool_name(dd)}
                    ],
                }
            ],
        },
    }


# ------------------------------------------------------------------------------- endpoint picker


def epp_config(dd: DisaggregatedDeployment) -> Obj:
    """The EndpointPickerConfig: spec.router.gatewayApi.endpointPicker.config, else the P/D one.

    The P/D configuration of llm-d-inference-scheduler v0.7.1 (deploy/config/pd-epp-config.yaml; plugin
    types registered in pkg/plugins/register.go, and prefix-cache-scorer, queue-scorer, max-score-picker
    in gateway-api-inference-extension v1.4.0 pkg/epp/framework/plugins/scheduling): the
    disagg-profile-handler (profiles prefill and decode, its prefill decider prefix-based-pd-decider,
    which disaggregates a request with at least nonCachedTokens tokens the decode pod has not cached),
    the disagg-headers-handler (x-prefiller-host-port), the prefill-filter and decode-filter (llm-d.ai/role)
    and, per profile, prefix-cache (weight 2) and queue (weight 1) scorers and the max-score picker.
    The prepareDataPlugins feature gate lets the decider read the prefix-cache scorer's match data.
    """
    given = dd.spec.router.gateway_settings.endpoint_picker.config
    if given is not None:
        return copy.deepcopy(given)

    def profile(name: str, role_filter: str) -> Obj:
        return {
            "name": name,
            "plugins": [
                {"pluginRef": role_filter},
                {"pluginRef": "max-score-picker"},
                {"pluginRef": "prefix-cache-scorer", "weight": 2},
                {"pluginRef": "queue-scorer", "weight": 1},
            ],
        }

    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "featureGates": ["prepareDataPlugins"],
        "plugins": [
            {"type": "disagg-headers-handler"},
            # maxPrefixBlocksToMatch and lruCapacityPerServer as pd-epp-config.yaml sets them (parameter
            # names: gateway-api-inference-extension v1.4.0 .../scorer/prefix/plugin.go).
            {
                "type": "prefix-cache-scorer",
                "parameters": {"maxPrefixBlocksToMatch": 256, "lruCapacityPerServer": 31250},
            },
            {"type": "queue-scorer"},
            {"type": "prefill-filter"},
            {"type": "decode-filter"},
            {"type": "max-score-picker"},
            # pkg/plugins/profile/prefix_based_pd_decider.go: PrefixBasedPDDeciderConfig.nonCachedTokens.
            {"type": "prefix-based-pd-decider", "parameters": {"nonCachedTokens": 16}},
            # pkg/plugins/profile/disagg_profile_handler.go: parameters deciders.prefill (the profiles
            # default to "prefill" and "decode").
            {
                "type": "disagg-profile-handler",
                "parameters": {"deciders": {"prefill": "prefix-based-pd-decider"}},
            },
        ],
        "schedulingProfiles": [profile("prefill", "prefill-filter"), profile("decode", "decode-filter")],
    }


def epp_config_text(dd: DisaggregatedDeployment) -> str:
    return yaml.safe_dump(epp_config(dd), sort_keys=False)


def epp_args(dd: DisaggregatedDeployment) -> list[str]:
    """The EPP's command line (flags of gateway-api-inference-extension v1.4.0 pkg/epp/server/options.go
    AddFlags, which llm-d-inference-scheduler v0.7.1 cmd/epp runs through its runner), user args last."""
    args = [
        "--pool-name",
        pool_name(dd),
        "--pool-namespace",
        dd.namespace,
        "--pool-group",
        INFERENCE_POOL_GROUP,
        "--config-file",
        f"{EPP_CONFIG_DIR}/{EPP_CONFIG_KEY}",
        "--grpc-port",
        str(EPP_GRPC_PORT),
        "--grpc-health-port",
        str(EPP_HEALTH_PORT),
        "--metrics-port",
        str(EPP_METRICS_PORT),
    ]
    if dd.spec.engine.type == "sglang":
        args += SGLANG_EPP_METRIC_ARGS
    return [*args, *dd.spec.router.gateway_settings.endpoint_picker.args]


def build_epp_config_map(dd: DisaggregatedDeployment) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(dd, epp_name(dd)),
        "data": {EPP_CONFIG_KEY: epp_config_text(dd)},
    }


def _grpc_probe(period: int, failures: int) -> Obj:
    return {
        "grpc": {"port": EPP_HEALTH_PORT, "service": EPP_HEALTH_SERVICE},
        "periodSeconds": period,
        "failureThreshold": failures,
    }


def build_epp_deployment(dd: DisaggregatedDeployment, settings: RenderSettings = DEFAULT_SETTINGS) -> Obj:
    """The endpoint picker's Deployment (container layout: llm-d-inference-scheduler v0.7.1,
    deploy/components/inference-gateway/deployments.yaml; the image's entrypoint is the EPP,
    Dockerfile.epp ENTRYPOINT /app/epp). The router's nodeSelector, tolerations and env apply to it."""
    router = dd.spec.router
    picker = router.gateway_settings.endpoint_picker
    given = picker.resources.to_api() if picker.resources else {}
    resources = {kind: {k: str(v) for k, v in values.items()} for kind, values in given.items()}
    resources.setdefault(
        "requests", {"cpu": settings.router_cpu_request, "memory": settings.router_memory_request}
    )
    container: Obj = {
        "name": EPP_CONTAINER,
        "image": picker.image or EPP_IMAGE,
        "args": epp_args(dd),
        "ports": [
            {"name": "grpc", "containerPort": EPP_GRPC_PORT, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": EPP_METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": resources,
        "readinessProbe": _grpc_probe(5, 3),
        "livenessProbe": _grpc_probe(10, 3),
        "volumeMounts": [{"name": "config", "mountPath": EPP_CONFIG_DIR, "readOnly": True}],
    }
    if router.env:
        container["env"] = [item.to_api() for item in router.env]
    pod_spec: Obj = {
        "serviceAccountName": epp_name(dd),
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": epp_name(dd)}}],
    }
    if router.node_selector:
        pod_spec["nodeSelector"] = dict(router.node_selector)
    if router.tolerations:
        pod_spec["tolerations"] = [t.to_api() for t in router.tolerations]
    # The EPP reads its configuration once at start: a changed one rolls the pods.
    config_hash = hashlib.sha256(epp_config_text(dd).encode()).hexdigest()[:16]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(dd, epp_name(dd)),
        "spec": {
            "replicas": picker.replicas,
            "selector": {"matchLabels": selector_labels(dd.name, "router")},
            "template": {
                "metadata": {
                    "labels": labels(dd.name, "router"),
                    "annotations": {EPP_CONFIG_HASH_ANNOTATION: config_hash},
                },
                "spec": pod_spec,
            },
        },
    }


def build_epp_service(dd: DisaggregatedDeployment) -> Obj:
    """The Service the InferencePool's endpointPickerRef names (ports: llm-d-inference-scheduler v0.7.1
    deploy/components/inference-gateway/services.yaml, whose ext-proc port says appProtocol http2)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(dd, epp_name(dd)),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(dd.name, "router"),
            "ports": [
                {
                    "name": "grpc",
                    "port": EPP_GRPC_PORT,
                    "targetPort": "grpc",
                    "protocol": "TCP",
                    "appProtocol": "http2",
                },
                {"name": "metrics", "port": EPP_METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def build_epp_rbac(dd: DisaggregatedDeployment) -> list[Obj]:
    """ServiceAccount, Role and RoleBinding: the EPP reads its InferencePool and watches the pods it
    selects (llm-d-inference-scheduler v0.7.1 deploy/components/inference-gateway/rbac.yaml, less its
    v1alpha2 kinds, which the EPP uses only where their CRDs are served: gateway-api-inference-extension
    v1.4.0 pkg/epp/server/controller_config.go gvkExists, a discovery call)."""
    name = epp_name(dd)
    read = ["get", "list", "watch"]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _metadata(dd, name)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _metadata(dd, name),
            "rules": [
                {"apiGroups": [INFERENCE_POOL_GROUP], "resources": ["inferencepools"], "verbs": read},
                {"apiGroups": [""], "resources": ["pods"], "verbs": read},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _metadata(dd, name),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": dd.namespace}],
        },
    ]


def gateway_children(dd: DisaggregatedDeployment, settings: RenderSettings = DEFAULT_SETTINGS) -> list[Obj]:
    """What replaces the built-in router's RBAC and Service, in apply order (RBAC, ConfigMap, Service,
    InferencePool, HTTPRoute); :func:`build_epp_deployment` replaces its Deployment."""
    children = [
        *build_epp_rbac(dd),
        build_epp_config_map(dd),
        build_epp_service(dd),
        build_inference_pool(dd, settings),
    ]
    route = build_http_route(dd)
    if route is not None:
        children.append(route)
    return children

"""Builders of every child manifest of a DisaggregatedDeployment. Pure: spec in, dicts out.

No ownerReferences here (the k8s layer adds them) and no status. Each builder returns one manifest as a
plain dict ready for server-side apply.
"""

from __future__ import annotations

import copy
from typing import Any

from disagg.api.common import EnvVar
from disagg.api.deployment import GPU_RESOURCE, DisaggregatedDeployment, RoleName
from disagg.api.podtemplate import deep_merge
from disagg.render import gateway
from disagg.render.engines import (
    HF_CACHE_VOLUME,
    HF_HUB_CACHE_DIR,
    EngineContainer,
    engine_container,
    engine_image,
    engine_module,
    engine_port,
    hf_hub_cache_env,
    hf_token_env,
)
from disagg.render.lws import API_VERSION as LWS_API_VERSION
from disagg.render.lws import KIND as LWS_KIND
from disagg.render.lws import Member
from disagg.render.names import (
    DEPLOYMENT_LABEL,
    GROUP_ROLE_LABEL,
    ROLE_LABEL,
    Component,
    child_name,
    headless_name,
    labels,
    lws_name,
    model_download_job_name,
    selector_labels,
)
from disagg.render.routers import router_module
from disagg.render.settings import DEFAULT_SETTINGS, Probe, RenderSettings

Obj = dict[str, Any]
ENGINE_CONTAINER = "engine"
ROUTER_CONTAINER = "router"
# Multus reads a pod's secondary networks from this annotation (k8snetworkplumbingwg/multus-cni,
# docs/how-to-use.md "Launch pod with network annotation").
MULTUS_NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
# CAP_IPC_LOCK lets the RDMA transfer engine register (pin) memory without a RLIMIT_MEMLOCK limit
# (mlock(2): "privileged process (CAP_IPC_LOCK) ... not subject to the limit"); Kubernetes has no memlock
# setting of its own, so the capability is how pods get "unlimited memlock".
RDMA_CAPABILITIES = ("IPC_LOCK",)
DOWNLOAD_CONTAINER = "download"
# Annotations of the download Job saying what it downloads (its name carries only a hash of them).
MODEL_ID_ANNOTATION = "disagg.dev/model-id"
MODEL_REVISION_ANNOTATION = "disagg.dev/model-revision"
POD_NAMESPACE_ENV: Obj = {
    "name": "POD_NAMESPACE",
    "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
}


# ------------------------------------------------------------------------------------------- helpers


def _metadata(dd: DisaggregatedDeployment, name: str, component: Component) -> Obj:
    return {"name": name, "namespace": dd.namespace, "labels": labels(dd.name, component)}


def _env(items: list[EnvVar]) -> list[Obj]:
    return [item.to_api() for item in items]


def dedupe_env(env: list[Obj]) -> list[Obj]:
    """One entry per name, the last one winning (user env overrides ours), first position kept."""
    by_name: dict[str, Obj] = {}
    for item in env:
        by_name[item["name"]] = item
    seen: set[str] = set()
    result = []
    for item in env:
        if item["name"] not in seen:
            seen.add(item["name"])
            result.append(by_name[item["name"]])
    return result


def _http_probe(probe: Probe, period: int, failures: int) -> Obj:
    return {
        "httpGet": {"path": probe.path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": probe.timeout_seconds,
        "failureThreshold": failures,
    }


def _quantities(values: dict[str, Any]) -> dict[str, str]:
    """Quantities as strings, the form the API server returns (so applied and live objects compare)."""
    return {name: str(value) for name, value in values.items()}


def engine_resources(dd: DisaggregatedDeployment, role: RoleName) -> Obj:
    """The role's resources with nvidia.com/gpu = GPUs per pod (per replica on one node) in both requests
    and limits, and the RDMA device-plugin resource when spec.kvTransfer.rdma is set (extended resources
    need both): every pod of a multi-node group gets both."""
    role_spec = dd.spec.role(role)
    given = role_spec.resources.to_api() if role_spec.resources else {}
    requests = _quantities(given.get("requests", {}))
    limits = _quantities(given.get("limits", {}))
    requests[GPU_RESOURCE] = str(role_spec.gpus_per_node)
    limits[GPU_RESOURCE] = str(role_spec.gpus_per_node)
    rdma = dd.spec.kv_transfer.rdma
    if rdma is not None:
        requests[rdma.resource_name] = str(rdma.count)
        limits[rdma.resource_name] = str(rdma.count)
    return {"requests": requests, "limits": limits}


# -------------------------------------------------------------------------------------------- engines


def pod_labels(dd: DisaggregatedDeployment, role: RoleName, member: Member = "single") -> dict[str, str]:
    """Labels of a pool's pods; a LeaderWorkerSet group's say which pod is the leader."""
    if member == "single":
        return labels(dd.name, role)
    return {**labels(dd.name, role), GROUP_ROLE_LABEL: member}


def serving_selector(dd: DisaggregatedDeployment, role: RoleName) -> dict[str, str]:
    """The pods of a pool that serve HTTP: all of them, or the leaders of a multi-node pool's groups (the
    workers run no API server), which the role Services and the router select."""
    selector = selector_labels(dd.name, role)
    if dd.spec.role(role).multi_node:
        selector[GROUP_ROLE_LABEL] = "leader"
    return selector


def build_engine_pod_template(
    dd: DisaggregatedDeployment,
    role: RoleName,
    settings: RenderSettings = DEFAULT_SETTINGS,
    member: Member = "single",
) -> Obj:
    """The pod template of one pool: engine container, probes, graceful drain, /dev/shm, placement.

    ``member``: the pod of a single-node replica, or the leader or a worker of a multi-node replica's
    LeaderWorkerSet group. Every pod of a group gets the GPUs of one node, the RDMA device and network
    and the KV connector's wiring; a worker, which serves no HTTP, has no probes and is not scraped.
    """
    role_spec = dd.spec.role(role)
    given_settings = settings
    settings = gateway.engine_settings(dd, role, settings)  # gateway-api moves the decode engine's port
    module = engine_module(dd)
    probes = module.probes(settings)
    engine: EngineContainer = engine_container(dd, role, settings, member)
    port = engine.http_port
    scrape = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": "/metrics",
    }
    annotations = {**(scrape if engine.serves_http else {}), **engine.annotations}
    rdma = dd.spec.kv_transfer.rdma
    if rdma is not None and rdma.networks:
        annotations[MULTUS_NETWORKS_ANNOTATION] = rdma.networks
    container: Obj = {
        "name": ENGINE_CONTAINER,
        "image": engine_image(dd, settings),
        "command": engine.command,
        "args": engine.args,
        "env": dedupe_env([POD_NAMESPACE_ENV, *engine.env, *_env(dd.spec.engine.env), *_env(role_spec.env)]),
        "ports": engine.ports,
        "resources": engine_resources(dd, role),
    }
    if engine.serves_http:
        container["startupProbe"] = _http_probe(
            probes.startup,
            settings.startup_period_seconds,
            max(1, role_spec.startup_timeout_seconds // settings.startup_period_seconds),
        )
        container["readinessProbe"] = _http_probe(
            probes.readiness, settings.readiness_period_seconds, settings.readiness_failure_threshold
        )
        container["livenessProbe"] = _http_probe(
            probes.liveness, settings.liveness_period_seconds, settings.liveness_failure_threshold
        )
    container["lifecycle"] = {
        "preStop": {"exec": {"command": ["sleep", str(role_spec.pre_stop_sleep_seconds)]}}
    }
    container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}, *engine.volume_mounts]
    if dd.spec.engine.image_pull_policy:
        container["imagePullPolicy"] = dd.spec.engine.image_pull_policy
    if rdma is not None:
        container["securityContext"] = {"capabilities": {"add": list(RDMA_CAPABILITIES)}}
    pod_spec: Obj = {
        # Service links would inject e.g. VLLM_PORT for a Service named "vllm" and break the engine.
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": role_spec.pre_stop_sleep_seconds
        + role_spec.shutdown_timeout_seconds
        + settings.grace_margin_seconds,
        "containers": [container],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": module.shm_size(settings)}},
            *engine.volumes,
        ],
    }
    if role_spec.node_selector:
        pod_spec["nodeSelector"] = dict(role_spec.node_selector)
    if role_spec.tolerations:
        pod_spec["tolerations"] = [t.to_api() for t in role_spec.tolerations]
    if role_spec.affinity:
        pod_spec["affinity"] = copy.deepcopy(role_spec.affinity)
    template: Obj = {
        "metadata": {"labels": pod_labels(dd, role, member), "annotations": annotations},
        "spec": pod_spec,
    }
    template = gateway.add_to_pod_template(dd, role, template, given_settings)
    if role_spec.pod_template:
        template = deep_merge(template, role_spec.pod_template)
        # The selector must keep matching whatever the override did to the labels.
        template["metadata"]["labels"] = {
            **template["metadata"].get("labels", {}),
            **pod_labels(dd, role, member),
        }
    return template


def build_role_deployment(
    dd: DisaggregatedDeployment, role: RoleName, replicas: int, settings: RenderSettings = DEFAULT_SETTINGS
) -> Obj:
    role_spec = dd.spec.role(role)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(dd, child_name(dd.name, role), role),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector_labels(dd.name, role)},
            # Surge one replica rather than drop capacity during a rollout of a serving pool.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "progressDeadlineSeconds": role_spec.startup_timeout_seconds + settings.progress_margin_seconds,
            "template": build_engine_pod_template(dd, role, settings),
        },
    }


def build_role_lws(
    dd: DisaggregatedDeployment, role: RoleName, replicas: int, settings: RenderSettings = DEFAULT_SETTINGS
) -> Obj:
    """The LeaderWorkerSet of a pool whose replicas span several nodes: one group per replica, a leader
    and nodesPerReplica - 1 workers (leaderworkerset.x-k8s.io/v1, kubernetes-sigs/lws
    api/leaderworkerset/v1/leaderworkerset_types.go).

    startupPolicy LeaderCreated: the workers start with the leader, not once it is Ready, because the
    leader's engine becomes ready only when every rank of the group has joined (LeaderReady would wait
    forever). restartPolicy RecreateGroupOnPodRestart: a rank that restarts has left the group's
    collectives, so the whole group starts again. Rollouts surge one group, like the Deployments.
    """
    role_spec = dd.spec.role(role)
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": _metadata(dd, lws_name(dd.name, role), role),
        "spec": {
            "replicas": replicas,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "leaderWorkerTemplate": {
                "size": role_spec.nodes_per_replica,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": build_engine_pod_template(dd, role, settings, "leader"),
                "workerTemplate": build_engine_pod_template(dd, role, settings, "worker"),
            },
        },
    }


def build_role_workload(
    dd: DisaggregatedDeployment, role: RoleName, replicas: int, settings: RenderSettings = DEFAULT_SETTINGS
) -> Obj:
    """A pool's replicas: a Deployment of single-node replicas, or a LeaderWorkerSet of multi-node ones."""
    if dd.spec.role(role).multi_node:
        return build_role_lws(dd, role, replicas, settings)
    return build_role_deployment(dd, role, replicas, settings)


def build_prefill_deployment(
    dd: DisaggregatedDeployment, replicas: int | None = None, settings: RenderSettings = DEFAULT_SETTINGS
) -> Obj:
    count = dd.spec.prefill.replicas if replicas is None else replicas
    return build_role_workload(dd, "prefill", count, settings)


def build_decode_deployment(
    dd: DisaggregatedDeployment, replicas: int | None = None, settings: RenderSettings = DEFAULT_SETTINGS
) -> Obj:
    count = dd.spec.decode.replicas if replicas is None else replicas
    return build_role_workload(dd, "decode", count, settings)


def _service_ports(container_ports: list[Obj]) -> list[Obj]:
    return [
        {"name": p["name"], "port": p["containerPort"], "targetPort": p["name"], "protocol": "TCP"}
        for p in container_ports
    ]


def build_role_service(
    dd: DisaggregatedDeployment,
    role: RoleName,
    headless: bool = False,
    settings: RenderSettings = DEFAULT_SETTINGS,
) -> Obj:
    """``NAME-ROLE`` (ClusterIP, the engine's http port) or ``NAME-ROLE-headless`` (every engine port,
    one DNS record per ready pod, for discovery); of a multi-node pool, its groups' leaders only."""
    engine = engine_container(dd, role, settings)
    ports = engine.ports if headless else engine.ports[:1]
    spec: Obj = {"selector": serving_selector(dd, role), "ports": _service_ports(ports)}
    if headless:
        spec["clusterIP"] = "None"
    name = headless_name(dd.name, role) if headless else child_name(dd.name, role)
    return {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(dd, name, role), "spec": spec}


def build_pdb(dd: DisaggregatedDeployment, role: RoleName) -> Obj:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(dd, child_name(dd.name, role), role),
        "spec": {
            "maxUnavailable": dd.spec.role(role).max_unavailable,
            "selector": {"matchLabels": selector_labels(dd.name, role)},
        },
    }


# --------------------------------------------------------------------------------------------- router


def router_image(dd: DisaggregatedDeployment, settings: RenderSettings = DEFAULT_SETTINGS) -> str:
    """spec.router.image, else the pinned release of the router that serves the combination."""
    return dd.spec.router.image or router_module(dd).image(settings)


def _selector_args(dd: DisaggregatedDeployment, role: RoleName) -> list[str]:
    """The router's pod selector of a pool: its pods, or of a multi-node pool its groups' leaders only
    (the workers serve no HTTP; the leader serves the whole group)."""
    args = [f"{DEPLOYMENT_LABEL}={dd.name}", f"{ROLE_LABEL}={role}"]
    if dd.spec.role(role).multi_node:
        args.append(f"{GROUP_ROLE_LABEL}=leader")
    return args


def router_command(dd: DisaggregatedDeployment, settings: RenderSettings = DEFAULT_SETTINGS) -> list[str]:
    """The router's command line: PD mode with Kubernetes service discovery of both pools.

    SGLang: ``python3 -m sglang_router.launch_router --pd-disaggregation --service-discovery ...``
    (sglang_router 0.3.2 router_args.py). vLLM: ``vllm-router --vllm-pd-disaggregation --kv-connector C
    --service-discovery ...`` (vllm_router 0.1.17 router_args.py, same discovery flags). The namespace
    comes from the downward API ($(POD_NAMESPACE) is expanded by the kubelet).
    """
    router = router_module(dd)
    head = list(router.command_head)
    connector = dd.spec.kv_transfer.connector
    if connector in router.kv_connector_values:
        head += ["--kv-connector", connector]
    return [
        *head,
        "--host",
        "0.0.0.0",
        "--port",
        str(dd.spec.router.port),
        "--service-discovery",
        "--service-discovery-namespace",
        "$(POD_NAMESPACE)",
        "--service-discovery-port",
        str(engine_port(dd, settings)),
        "--prefill-selector",
        *_selector_args(dd, "prefill"),
        "--decode-selector",
        *_selector_args(dd, "decode"),
        "--prometheus-host",
        "0.0.0.0",
        "--prometheus-port",
        str(settings.router_metrics_port),
        *dd.spec.router.args,
    ]


def router_ports(dd: DisaggregatedDeployment, settings: RenderSettings = DEFAULT_SETTINGS) -> list[Obj]:
    """Router container ports: http and metrics."""
    return [
        {"name": "http", "containerPort": dd.spec.router.port, "protocol": "TCP"},
        {"name": "metrics", "containerPort": settings.router_metrics_port, "protocol": "TCP"},
    ]


def build_router_deployment(
    dd: DisaggregatedDeployment, replicas: int | None = None, settings: RenderSettings = DEFAULT_SETTINGS
) -> Obj:
    router = dd.spec.router
    given = router.resources.to_api() if router.resources else {}
    resources = {kind: _quantities(values) for kind, values in given.items()}
    resources.setdefault(
        "requests", {"cpu": settings.router_cpu_request, "memory": settings.router_memory_request}
    )
    container: Obj = {
        "name": ROUTER_CONTAINER,
        "image": router_image(dd, settings),
        "command": router_command(dd, settings),
        "env": dedupe_env([POD_NAMESPACE_ENV, *_env(router.env)]),
        "ports": router_ports(dd, settings),
        "resources": resources,
        "readinessProbe": _http_probe(settings.router_probes.readiness, 5, 3),
        "livenessProbe": _http_probe(settings.router_probes.liveness, 15, 4),
    }
    pod_spec: Obj = {
        "serviceAccountName": child_name(dd.name, "router"),
        "enableServiceLinks": False,
        "containers": [container],
    }
    if router.node_selector:
        pod_spec["nodeSelector"] = dict(router.node_selector)
    if router.tolerations:
        pod_spec["tolerations"] = [t.to_api() for t in router.tolerations]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(dd, child_name(dd.name, "router"), "router"),
        "spec": {
            "replicas": router.replicas if replicas is None else replicas,
            "selector": {"matchLabels": selector_labels(dd.name, "router")},
            "template": {
                "metadata": {
                    "labels": labels(dd.name, "router"),
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(settings.router_metrics_port),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": pod_spec,
            },
        },
    }


def build_router_service(dd: DisaggregatedDeployment, settings: RenderSettings = DEFAULT_SETTINGS) -> Obj:
    ports = [
        {
            "name": p["name"],
            "port": dd.spec.router.port if p["name"] == "http" else p["containerPort"],
            "targetPort": p["name"],
            "protocol": "TCP",
        }
        for p in router_ports(dd, settings)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(dd, child_name(dd.name, "router"), "router"),
        "spec": {
            "type": dd.spec.router.service_type,
            "selector": selector_labels(dd.name, "router"),
            "ports": ports,
        },
    }


def build_router_rbac(dd: DisaggregatedDeployment) -> list[Obj]:
    """ServiceAccount, Role and RoleBinding that let the router list and watch the pools' pods."""
    name = child_name(dd.name, "router")
    service_account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(dd, name, "router"),
    }
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(dd, name, "router"),
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(dd, name, "router"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": dd.namespace}],
    }
    return [service_account, role, binding]


# ---------------------------------------------------------------------------------------- model cache


def build_model_cache_pvc(dd: DisaggregatedDeployment) -> Obj | None:
    """The PersistentVolumeClaim of spec.model.cache when spec.model.cache.create asks the operator to
    create it; None otherwise (no cache, or the claim is the user's)."""
    cache = dd.spec.model.cache
    if cache is None or cache.create is None:
        return None
    spec: Obj = {
        "accessModes": [cache.create.access_mode],
        "resources": {"requests": {"storage": cache.create.size}},
        "volumeMode": "Filesystem",
    }
    if cache.create.storage_class_name:
        spec["storageClassName"] = cache.create.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(dd, cache.claim_name, "model-cache"),
        "spec": spec,
    }


def download_command(dd: DisaggregatedDeployment) -> list[str]:
    """``hf download REPO_ID [--revision R] --cache-dir DIR``: huggingface_hub's CLI (the ``hf`` console
    script of huggingface_hub 1.31.0, the version vLLM 0.33.0 and transformers 5.19.0 (SGLang 0.5.23)
    require at least; cli/download.py declares ``repo_id``, ``--revision`` and ``--cache-dir``). Files
    already in the cache are not downloaded again, so a retried pod resumes."""
    source = dd.spec.model.source.hugging_face
    assert source is not None  # the API allows spec.model.cache only with a huggingFace source
    command = ["hf", "download", source.id]
    if source.revision:
        command += ["--revision", source.revision]
    return [*command, "--cache-dir", HF_HUB_CACHE_DIR]


def build_model_download_job(
    dd: DisaggregatedDeployment, settings: RenderSettings = DEFAULT_SETTINGS
) -> Obj | None:
    """The Job that fills spec.model.cache's claim once per (model id, revision); None without a cache or
    when the claim is prefilled.

    It runs the engine image (which ships huggingface_hub and its ``hf`` CLI) with the claim mounted
    read-write at the Hugging Face cache (HF_HUB_CACHE), so the engines find the files where
    huggingface_hub looks for them. No ttlSecondsAfterFinished: the Job stays, finished, so the operator
    keeps reading its outcome (a ttl would delete it and the next reconcile would download again).
    """
    cache = dd.spec.model.cache
    source = dd.spec.model.source.hugging_face
    if cache is None or cache.prefilled or source is None:
        return None
    name = model_download_job_name(dd.name, source.id, source.revision)
    annotations = {MODEL_ID_ANNOTATION: source.id}
    if source.revision:
        annotations[MODEL_REVISION_ANNOTATION] = source.revision
    container: Obj = {
        "name": DOWNLOAD_CONTAINER,
        "image": engine_image(dd, settings),
        "command": download_command(dd),
        "env": [hf_hub_cache_env(), *hf_token_env(dd)],
        "resources": {
            "requests": {
                "cpu": settings.model_download_cpu_request,
                "memory": settings.model_download_memory_request,
            }
        },
        "volumeMounts": [{"name": HF_CACHE_VOLUME, "mountPath": HF_HUB_CACHE_DIR}],
    }
    if dd.spec.engine.image_pull_policy:
        container["imagePullPolicy"] = dd.spec.engine.image_pull_policy
    metadata = _metadata(dd, name, "model-cache")
    metadata["annotations"] = annotations
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": settings.model_download_backoff_limit,
            "activeDeadlineSeconds": settings.model_download_deadline_seconds,
            "template": {
                "metadata": {"labels": labels(dd.name, "model-cache"), "annotations": dict(annotations)},
                "spec": {
                    "restartPolicy": "Never",
                    "enableServiceLinks": False,
                    "containers": [container],
                    "volumes": [
                        {"name": HF_CACHE_VOLUME, "persistentVolumeClaim": {"claimName": cache.claim_name}}
                    ],
                },
            },
        },
    }

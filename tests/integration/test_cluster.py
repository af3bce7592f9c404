"""The local control plane behaves like a real cluster: scheduling against GPU capacity on kwok nodes,
garbage collection, RBAC for ServiceAccounts, real versions for kubectl and helm, server-side dry runs."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from disagg.cluster.binaries import Versions, ensure_binary
from disagg.cluster.local import ClusterInfo, LocalCluster, NodePool, node_manifest
from disagg.cluster.wait import wait_for

GPU = "nvidia.com/gpu"


@pytest.fixture
def private_gpu_node(k8s_api: Any) -> Iterator[tuple[str, str]]:
    """A kwok node with 2 GPUs of a type no other test uses, tainted so only this test's pods land there."""
    gpu_type = f"t{uuid.uuid4().hex[:8]}"
    pool = NodePool(gpu_type=gpu_type, product="NVIDIA-TEST", count=1, gpus_per_node=2)
    manifest = node_manifest(pool, 0)
    manifest["spec"]["taints"] = [{"key": "disagg.dev/test-node", "value": gpu_type, "effect": "NoSchedule"}]
    core = client.CoreV1Api(k8s_api)
    core.create_node(manifest)
    name = manifest["metadata"]["name"]
    try:
        yield name, gpu_type
    finally:
        core.delete_node(name)


def _gpu_deployment(name: str, gpu_type: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"disagg.dev/gpu-type": gpu_type},
                    "tolerations": [{"key": "disagg.dev/test-node", "operator": "Equal", "value": gpu_type}],
                    "containers": [
                        {
                            "name": "engine",
                            "image": "vllm/vllm-openai:latest",
                            "resources": {"limits": {GPU: "1"}, "requests": {GPU: "1"}},
                        }
                    ],
                },
            },
        },
    }


def _pods(core: client.CoreV1Api, namespace: str, app: str) -> list[client.V1Pod]:
    items: list[client.V1Pod] = core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
    return items


def _condition(pod: client.V1Pod, kind: str) -> client.V1PodCondition | None:
    for cond in pod.status.conditions or []:
        if cond.type == kind:
            return cond
    return None


def _running_ready(pod: client.V1Pod) -> bool:
    ready = _condition(pod, "Ready")
    return pod.status.phase == "Running" and ready is not None and ready.status == "True"


def test_gpu_pods_run_on_their_gpu_type_then_pend_when_it_is_used_up(
    k8s_api: Any, namespace: str, private_gpu_node: tuple[str, str]
) -> None:
    node_name, gpu_type = private_gpu_node
    core = client.CoreV1Api(k8s_api)
    apps = client.AppsV1Api(k8s_api)
    apps.create_namespaced_deployment(namespace, _gpu_deployment("engine", gpu_type, replicas=2))

    def two_running() -> list[client.V1Pod]:
        pods = _pods(core, namespace, "engine")
        return pods if len(pods) == 2 and all(_running_ready(p) for p in pods) else []

    pods = wait_for(two_running, what="2 GPU pods Running and Ready")
    assert {p.spec.node_name for p in pods} == {node_name}
    assert all(p.spec.containers[0].resources.requests[GPU] == "1" for p in pods)

    # the node has 2 GPUs of this type: a third replica cannot be placed anywhere
    apps.patch_namespaced_deployment_scale(namespace=namespace, name="engine", body={"spec": {"replicas": 3}})

    def unschedulable_pod() -> client.V1Pod | None:
        for pod in _pods(core, namespace, "engine"):
            cond = _condition(pod, "PodScheduled")
            if cond is not None and cond.status == "False" and cond.reason == "Unschedulable":
                return pod
        return None

    pending = wait_for(unschedulable_pod, what="a third GPU pod reported Unschedulable")
    assert pending.status.phase == "Pending"
    assert pending.spec.node_name is None
    message = _condition(pending, "PodScheduled").message  # type: ignore[union-attr]
    assert GPU in message, message
    running = [p for p in _pods(core, namespace, "engine") if _running_ready(p)]
    assert len(running) == 2


def test_default_nodes_are_ready_with_gpu_labels_and_capacity(cluster: ClusterInfo, k8s_api: Any) -> None:
    core = client.CoreV1Api(k8s_api)
    nodes = {n.metadata.name: n for n in core.list_node(label_selector="type=kwok").items}
    expected = LocalCluster(state_dir=cluster.state_dir).expected_node_names()
    assert set(expected) <= set(nodes)
    h100 = nodes["kwok-h100-0"]
    assert h100.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert h100.metadata.labels["disagg.dev/gpu-type"] == "h100"
    assert h100.status.allocatable[GPU] == "8"
    assert nodes["kwok-l40s-1"].metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-L40S"
    for name in expected:
        ready = [c for c in nodes[name].status.conditions if c.type == "Ready"]
        assert ready and ready[0].status == "True", name


def test_owned_object_is_garbage_collected_with_its_owner(k8s_api: Any, namespace: str) -> None:
    core = client.CoreV1Api(k8s_api)
    owner = core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"), data={"k": "v"})
    )
    ref = client.V1OwnerReference(api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid)
    core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="child", owner_references=[ref]))
    )
    core.delete_namespaced_config_map("owner", namespace, propagation_policy="Background")

    def child_gone() -> bool:
        try:
            core.read_namespaced_config_map("child", namespace)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    assert wait_for(child_gone, what="the garbage collector to delete the owned ConfigMap")


def test_rbac_denies_a_service_account_what_its_role_does_not_grant(
    cluster: ClusterInfo, k8s_api: Any, namespace: str
) -> None:
    core = client.CoreV1Api(k8s_api)
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="reader"))
    )
    rbac.create_namespaced_role(
        namespace,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="pod-reader"),
            rules=[client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["get", "list"])],
        ),
    )
    rbac.create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="reader-can-read-pods"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="pod-reader"),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="reader", namespace=namespace)],
        ),
    )
    token = core.create_namespaced_service_account_token(
        "reader", namespace, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    ).status.token

    config = client.Configuration()
    config.host = cluster.server
    config.ssl_ca_cert = str(cluster.ca_cert)
    config.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(config) as sa_api:
        sa_core = client.CoreV1Api(sa_api)
        assert sa_core.list_namespaced_pod(namespace).items == []
        with pytest.raises(ApiException) as denied:
            sa_core.create_namespaced_config_map(
                namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="x"))
            )
        assert denied.value.status == 403
        assert f"system:serviceaccount:{namespace}:reader" in str(denied.value.body)
        with pytest.raises(ApiException) as other_namespace:
            sa_core.list_namespaced_pod("default")
        assert other_namespace.value.status == 403


def _tool_env(tmp_path: Path, kubeconfig: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "KUBECONFIG": str(kubeconfig),
            "HELM_CACHE_HOME": str(tmp_path / "helm-cache"),
            "HELM_CONFIG_HOME": str(tmp_path / "helm-config"),
            "HELM_DATA_HOME": str(tmp_path / "helm-data"),
        }
    )
    return env


def test_kubectl_and_helm_report_the_real_versions(cluster: ClusterInfo, tmp_path: Path) -> None:
    env = _tool_env(tmp_path, cluster.kubeconfig)
    kubectl = ensure_binary("kubectl")
    out = subprocess.run(
        [str(kubectl), "version", "-o", "json"], env=env, capture_output=True, text=True, check=True
    )
    versions = json.loads(out.stdout)
    expected = Versions().kubernetes
    assert versions["serverVersion"]["gitVersion"] == expected
    assert versions["clientVersion"]["gitVersion"] == expected
    minor = expected.split(".")[1]
    assert versions["serverVersion"]["major"] == "1" and versions["serverVersion"]["minor"] == minor

    helm = ensure_binary("helm")
    out = subprocess.run([str(helm), "version"], env=env, capture_output=True, text=True, check=True)
    assert f'Version:"{Versions().helm}"' in out.stdout, out.stdout
    assert 'GitTreeState:"clean"' in out.stdout, out.stdout


TINY_CHART = {
    "Chart.yaml": "apiVersion: v2\nname: tiny\nversion: 0.1.0\n",
    "values.yaml": "greeting: hello\n",
    "templates/configmap.yaml": (
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-info\n"
        "data:\n  greeting: {{ .Values.greeting | quote }}\n"
        "  kubeVersion: {{ .Capabilities.KubeVersion.Version | quote }}\n"
    ),
    "templates/deployment.yaml": (
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {{ .Release.Name }}-web\nspec:\n"
        "  replicas: 1\n  selector:\n    matchLabels: {app: web}\n  template:\n    metadata:\n"
        "      labels: {app: web}\n    spec:\n      containers:\n      - name: web\n        image: nginx\n"
    ),
}


def test_helm_template_piped_to_kubectl_server_side_dry_run(
    cluster: ClusterInfo, namespace: str, tmp_path: Path, k8s_api: Any
) -> None:
    chart = tmp_path / "tiny"
    for rel, text in TINY_CHART.items():
        (chart / rel).parent.mkdir(parents=True, exist_ok=True)
        (chart / rel).write_text(text)
    env = _tool_env(tmp_path, cluster.kubeconfig)
    # --validate makes helm read the capabilities of the live server instead of its built-in defaults
    rendered = subprocess.run(
        [str(ensure_binary("helm")), "template", "demo", str(chart), "--namespace", namespace, "--validate"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f'kubeVersion: "{Versions().kubernetes}"' in rendered
    # offline, helm templates for the Kubernetes minor its build was stamped with (its client-go's)
    offline = subprocess.run(
        [str(ensure_binary("helm")), "template", "demo", str(chart)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    minor = Versions().kubernetes.split(".")[1]
    assert f'kubeVersion: "v1.{minor}.0"' in offline
    applied = subprocess.run(
        [
            str(ensure_binary("kubectl")),
            "apply",
            "--dry-run=server",
            "-n",
            namespace,
            "-f",
            "-",
            "-o",
            "name",
        ],
        input=rendered,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert applied.returncode == 0, applied.stderr
    assert set(applied.stdout.split()) == {"configmap/demo-info", "deployment.apps/demo-web"}
    # a server-side dry run persists nothing
    assert (
        client.CoreV1Api(k8s_api)
        .list_namespaced_config_map(namespace, field_selector="metadata.name=demo-info")
        .items
        == []
    )
    # and the server really validates: an invalid object is rejected by the apiserver
    bad = rendered.replace("replicas: 1", "replicas: -1")
    rejected = subprocess.run(
        [str(ensure_binary("kubectl")), "apply", "--dry-run=server", "-n", namespace, "-f", "-"],
        input=bad,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert rejected.returncode != 0
    assert "spec.replicas" in rejected.stderr

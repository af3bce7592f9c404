"""spec.router.type gateway-api against the real CRDs: the Gateway API Inference Extension's InferencePool
(inference.networking.k8s.io/v1) and the Gateway API's HTTPRoute, installed from their pinned Go modules
(disagg.cluster.gateway). Every object rendered for a vLLM + NIXL and an SGLang example passes a
server-side dry run with strict field validation, and the real schemas refuse what they should."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg.api.deployment import DisaggregatedDeployment
from disagg.cluster import gateway, lws
from disagg.cluster.local import ClusterInfo, LocalCluster
from disagg.cluster.wait import wait_for
from disagg.render import effective_replicas, render_children

ROOT = Path(__file__).resolve().parents[2]
Obj = dict[str, Any]
GATEWAY = {"name": "inference-gateway", "namespace": "gateways", "sectionName": "http"}


@pytest.fixture(scope="module")
def gateway_crds(local_cluster: LocalCluster, cluster: ClusterInfo) -> Iterator[list[str]]:
    """The pinned releases' CRDs, applied (again: `cluster up` installs them too) and Established."""
    with local_cluster.client(cluster) as client:
        names = gateway.install(client)
        assert wait_for(lambda: lws.established(client, names), 60, what="the gateway CRDs Established")
    yield names


def _dd(example: str, namespace: str) -> DisaggregatedDeployment:
    doc = yaml.safe_load((ROOT / "examples" / example).read_text())
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["router"] = {"type": "gateway-api", "gatewayApi": {"gateway": dict(GATEWAY)}}
    return DisaggregatedDeployment.model_validate(doc)


def _dry_run(k8s_api: Any, namespace: str, obj: Obj) -> None:
    """Create ``obj`` with dryRun=All and strict field validation; ApiException when refused."""
    from kubernetes.dynamic import DynamicClient

    dynamic = DynamicClient(k8s_api)
    resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    resource.create(
        body=obj, namespace=namespace, query_params=[("dryRun", "All"), ("fieldValidation", "Strict")]
    )


def _refusal(k8s_api: Any, namespace: str, obj: Obj) -> str:
    from kubernetes.client.rest import ApiException

    try:
        _dry_run(k8s_api, namespace, obj)
    except ApiException as exc:
        assert exc.status in (400, 422), exc.body
        return str(json.loads(exc.body).get("message", exc.body))
    pytest.fail(f"the API server accepted {obj['kind']} {json.dumps(obj)[:300]}")


@pytest.mark.parametrize("example", ["vllm-nixl.yaml", "sglang-nixl.yaml", "vllm-nixl-gateway.yaml"])
def test_every_rendered_object_passes_a_server_side_dry_run(
    gateway_crds: list[str], crds: list[str], k8s_api: Any, namespace: str, example: str
) -> None:
    from kubernetes.client.rest import ApiException

    dd = _dd(example, namespace)
    # the DisaggregatedDeployment itself, against the generated CRD's schema and CEL rules
    _dry_run(k8s_api, namespace, dd.to_api())
    children = render_children(dd, effective_replicas(dd))
    kinds = [child["kind"] for child in children]
    assert kinds.count("InferencePool") == 1 and kinds.count("HTTPRoute") == 1
    for child in children:
        try:
            _dry_run(k8s_api, namespace, child)
        except ApiException as exc:
            pytest.fail(f"{child['kind']}/{child['metadata']['name']} rejected: {exc.body}")


def test_the_real_crds_refuse_what_their_schemas_forbid(
    gateway_crds: list[str], k8s_api: Any, namespace: str
) -> None:
    dd = _dd("vllm-nixl.yaml", namespace)
    children = render_children(dd, effective_replicas(dd))
    pool = next(child for child in children if child["kind"] == "InferencePool")
    route = next(child for child in children if child["kind"] == "HTTPRoute")

    # endpointPickerRef of kind Service needs a port (the v1 CRD's CEL rule)
    no_port = copy.deepcopy(pool)
    del no_port["spec"]["endpointPickerRef"]["port"]
    assert "port is required when kind is 'Service'" in _refusal(k8s_api, namespace, no_port)

    # the v1alpha2 shape (targetPortNumber) is not the GA schema: strict validation names the field
    alpha = copy.deepcopy(pool)
    alpha["spec"]["targetPortNumber"] = alpha["spec"].pop("targetPorts")[0]["number"]
    message = _refusal(k8s_api, namespace, alpha)
    assert "targetPortNumber" in message or "targetPorts" in message

    # a target port outside 1..65535
    bad_port = copy.deepcopy(pool)
    bad_port["spec"]["targetPorts"] = [{"number": 70000}]
    assert "targetPorts" in _refusal(k8s_api, namespace, bad_port)

    # the HTTPRoute's parentRef sectionName must be a DNS-1123 name (Gateway API SectionName)
    bad_route = copy.deepcopy(route)
    bad_route["spec"]["parentRefs"][0]["sectionName"] = "Not A Section"
    assert "sectionName" in _refusal(k8s_api, namespace, bad_route)


def test_the_generated_crd_refuses_gateway_settings_with_the_builtin_router(
    crds: list[str], k8s_api: Any, namespace: str
) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "vllm-nixl-gateway.yaml").read_text())
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["router"]["type"] = "builtin"
    message = _refusal(k8s_api, namespace, doc)
    assert "spec.router.gatewayApi is set but spec.router.type is builtin" in message

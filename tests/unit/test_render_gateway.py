"""spec.router.type gateway-api: the InferencePool, the llm-d endpoint picker, the routing sidecar in the
decode pods and the optional HTTPRoute replace the built-in router (disagg.render.gateway)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg.api.deployment import DisaggregatedDeployment
from disagg.render import effective_replicas, render_children
from disagg.render import gateway as gw
from disagg.render.names import ROLE_LABEL

ROOT = Path(__file__).resolve().parents[2]
Obj = dict[str, Any]


def example(name: str, router: Obj | None = None) -> DisaggregatedDeployment:
    doc = yaml.safe_load((ROOT / "examples" / name).read_text())
    if router is not None:
        doc["spec"]["router"] = router
    return DisaggregatedDeployment.model_validate(doc)


def gateway_dd(name: str = "vllm-nixl.yaml", **settings: Any) -> DisaggregatedDeployment:
    router: Obj = {"type": "gateway-api"}
    if settings:
        router["gatewayApi"] = settings
    return example(name, router)


def children(dd: DisaggregatedDeployment) -> list[Obj]:
    return render_children(dd, effective_replicas(dd))


def one(objs: list[Obj], kind: str, name_suffix: str = "") -> Obj:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, (kind, name_suffix, [o["metadata"]["name"] for o in found])
    return found[0]


def pool_template(objs: list[Obj], role: str) -> Obj:
    template: Obj = one(objs, "Deployment", f"-{role}")["spec"]["template"]
    return template


def engine(template: Obj) -> Obj:
    container: Obj = template["spec"]["containers"][0]
    assert container["name"] == "engine"
    return container


def test_builtin_is_the_default_and_renders_no_gateway_objects() -> None:
    dd = example("vllm-nixl.yaml")
    assert dd.spec.router.type == "builtin"
    objs = children(dd)
    kinds = {o["kind"] for o in objs}
    assert "InferencePool" not in kinds and "HTTPRoute" not in kinds and "ConfigMap" not in kinds
    router = one(objs, "Deployment", "-router")["spec"]["template"]["spec"]["containers"][0]
    assert router["name"] == "router" and router["image"].startswith("vllm/vllm-router:")
    for role in ("prefill", "decode"):
        template = pool_template(objs, role)
        assert gw.ROLE_LABEL_LLMD not in template["metadata"]["labels"]
        assert "initContainers" not in template["spec"]


def test_gateway_api_replaces_the_builtin_router_with_the_endpoint_picker() -> None:
    objs = children(gateway_dd())
    images = [
        c["image"]
        for o in objs
        if o["kind"] == "Deployment"
        for c in o["spec"]["template"]["spec"]["containers"]
    ]
    assert not [image for image in images if "router" in image and "llm-d" not in image]
    epp = one(objs, "Deployment", "-router")["spec"]["template"]["spec"]
    assert epp["containers"][0]["image"] == gw.EPP_IMAGE
    assert epp["serviceAccountName"] == gw.epp_name(gateway_dd())
    assert [o["kind"] for o in objs if o["metadata"]["name"].endswith("-router")].count("Service") == 1
    kinds = [o["kind"] for o in objs]
    # what pods reference comes before the Deployments; one InferencePool, no HTTPRoute without a gateway
    assert kinds.index("ConfigMap") < kinds.index("Deployment")
    assert kinds.count("InferencePool") == 1 and "HTTPRoute" not in kinds


def test_the_inference_pool_selects_both_pools_and_names_the_endpoint_picker_service() -> None:
    dd = gateway_dd()
    objs = children(dd)
    pool = one(objs, "InferencePool")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["metadata"]["name"] == dd.name
    selector = pool["spec"]["selector"]["matchLabels"]
    selected = [
        o["metadata"]["name"]
        for o in objs
        if o["kind"] == "Deployment"
        and selector.items() <= o["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert sorted(selected) == [f"{dd.name}-decode", f"{dd.name}-prefill"]
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]  # vLLM's port: prefill engines, decode sidecars
    ref = pool["spec"]["endpointPickerRef"]
    service = one(objs, "Service", "-router")
    assert ref["kind"] == "Service" and ref["name"] == service["metadata"]["name"]
    assert ref["port"]["number"] in [p["port"] for p in service["spec"]["ports"]]
    assert ref["failureMode"] == "FailClose"
    epp_pod = one(objs, "Deployment", "-router")["spec"]["template"]
    assert service["spec"]["selector"].items() <= epp_pod["metadata"]["labels"].items()
    assert ref["port"]["number"] in [p["containerPort"] for p in epp_pod["spec"]["containers"][0]["ports"]]


def test_decode_pods_get_the_routing_sidecar_on_the_target_port_and_the_engine_moves_up() -> None:
    dd = gateway_dd()
    objs = children(dd)
    decode = pool_template(objs, "decode")
    (sidecar,) = decode["spec"]["initContainers"]
    assert sidecar["name"] == gw.SIDECAR_CONTAINER and sidecar["restartPolicy"] == "Always"
    assert sidecar["image"] == gw.SIDECAR_IMAGE
    assert sidecar["args"] == [
        "--port=8000",
        "--vllm-port=8200",
        "--kv-connector=nixlv2",
        "--secure-proxy=false",
    ]
    assert [p["containerPort"] for p in sidecar["ports"]] == [8000]
    container = engine(decode)
    args = container["args"]
    assert args[args.index("--port") + 1] == "8200"
    assert container["ports"][0] == {"name": "http", "containerPort": 8200, "protocol": "TCP"}
    assert container["readinessProbe"]["httpGet"]["port"] == "http"
    # every container port of the pod is distinct, by number and by name
    ports = [p for c in [*decode["spec"]["containers"], sidecar] for p in c["ports"]]
    assert len({p["containerPort"] for p in ports}) == len(ports) == len({p["name"] for p in ports})
    # prefill engines keep their port: the EPP names them as prefill targets at the pool's target port
    prefill = pool_template(objs, "prefill")
    assert "initContainers" not in prefill["spec"]
    assert engine(prefill)["ports"][0]["containerPort"] == 8000


def test_engine_pods_keep_the_labels_and_scrape_annotations_the_metrics_rely_on() -> None:
    builtin = children(example("vllm-nixl.yaml"))
    gateway = children(gateway_dd())
    for role in ("prefill", "decode"):
        before, after = pool_template(builtin, role), pool_template(gateway, role)
        assert before["metadata"]["labels"].items() < after["metadata"]["labels"].items()
        assert (
            after["metadata"]["labels"][gw.ROLE_LABEL_LLMD] == role == after["metadata"]["labels"][ROLE_LABEL]
        )
        annotations = after["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/path"] == before["metadata"]["annotations"]["prometheus.io/path"]
        # Prometheus scrapes the engine itself, on whatever port it listens
        assert annotations["prometheus.io/port"] == str(engine(after)["ports"][0]["containerPort"])


def test_role_services_still_reach_the_engines_by_port_name() -> None:
    objs = children(gateway_dd())
    decode = pool_template(objs, "decode")
    service = one(objs, "Service", "-decode")
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "http"
    assert "http" in [p["name"] for p in engine(decode)["ports"]]


def test_the_endpoint_picker_config_is_the_llm_d_pd_profile_matching_the_pod_labels() -> None:
    dd = gateway_dd()
    objs = children(dd)
    config_map = one(objs, "ConfigMap", "-router")
    config = yaml.safe_load(config_map["data"][gw.EPP_CONFIG_KEY])
    assert config["kind"] == "EndpointPickerConfig"
    types = {plugin["type"] for plugin in config["plugins"]}
    assert {"disagg-profile-handler", "disagg-headers-handler", "prefill-filter", "decode-filter"} <= types
    handler = next(p for p in config["plugins"] if p["type"] == "disagg-profile-handler")
    assert handler["parameters"]["deciders"]["prefill"] in types
    profiles = {p["name"]: [ref["pluginRef"] for ref in p["plugins"]] for p in config["schedulingProfiles"]}
    assert set(profiles) == {"prefill", "decode"}
    for name, refs in profiles.items():
        assert f"{name}-filter" in refs and "max-score-picker" in refs
        assert set(refs) <= types
    # the filters read llm-d.ai/role, which the pools' pods carry with the profile's name
    for role in ("prefill", "decode"):
        assert pool_template(objs, role)["metadata"]["labels"][gw.ROLE_LABEL_LLMD] == role
    epp = one(objs, "Deployment", "-router")["spec"]["template"]
    args = epp["spec"]["containers"][0]["args"]
    assert args[args.index("--config-file") + 1] == f"{gw.EPP_CONFIG_DIR}/{gw.EPP_CONFIG_KEY}"
    assert args[args.index("--pool-name") + 1] == dd.name
    assert args[args.index("--pool-namespace") + 1] == dd.namespace
    assert epp["spec"]["volumes"] == [
        {"name": "config", "configMap": {"name": config_map["metadata"]["name"]}}
    ]
    assert "--total-queued-requests-metric" not in args  # vLLM's metric names are the EPP's defaults


def test_a_given_endpoint_picker_config_replaces_the_rendered_one_and_rolls_the_pods() -> None:
    default = gateway_dd()
    mine = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [],
    }
    given = gateway_dd(
        endpointPicker={"config": mine, "args": ["--v", "4"], "image": "my/epp:1", "replicas": 2}
    )
    config_map = one(children(given), "ConfigMap")
    assert yaml.safe_load(config_map["data"][gw.EPP_CONFIG_KEY]) == mine
    deployment = one(children(given), "Deployment", "-router")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "my/epp:1" and container["args"][-2:] == ["--v", "4"]
    assert deployment["spec"]["replicas"] == 2

    def config_hash(dd: DisaggregatedDeployment) -> str:
        template = one(children(dd), "Deployment", "-router")["spec"]["template"]
        return str(template["metadata"]["annotations"][gw.EPP_CONFIG_HASH_ANNOTATION])

    assert config_hash(default) != config_hash(given)
    assert config_hash(default) == config_hash(gateway_dd())


def test_sglang_gets_the_sglang_sidecar_protocol_and_metric_names() -> None:
    dd = gateway_dd("sglang-mooncake.yaml")
    objs = children(dd)
    sidecar = pool_template(objs, "decode")["spec"]["initContainers"][0]
    assert sidecar["args"][:3] == ["--port=30000", "--vllm-port=30200", "--kv-connector=sglang"]
    assert sidecar["env"] == [
        {"name": "SGLANG_BOOTSTRAP_PORT", "value": str(dd.spec.kv_transfer.bootstrap_port)}
    ]
    assert one(objs, "InferencePool")["spec"]["targetPorts"] == [{"number": 30000}]
    args = one(objs, "Deployment", "-router")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--total-queued-requests-metric") + 1] == "sglang:num_queue_reqs"
    assert args[args.index("--kv-cache-usage-percentage-metric") + 1] == "sglang:token_usage"


def test_the_http_route_is_rendered_only_for_a_named_gateway() -> None:
    assert gw.build_http_route(gateway_dd()) is None
    dd = gateway_dd(gateway={"name": "inference-gateway", "namespace": "gateways", "sectionName": "http"})
    route = one(children(dd), "HTTPRoute")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["spec"]["parentRefs"] == [
        {
            "group": "gateway.networking.k8s.io",
            "kind": "Gateway",
            "name": "inference-gateway",
            "namespace": "gateways",
            "sectionName": "http",
        }
    ]
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": dd.name}
    ]
    plain = gateway_dd(gateway={"name": "inference-gateway"})
    assert one(children(plain), "HTTPRoute")["spec"]["parentRefs"][0].keys() == {"group", "kind", "name"}


def test_the_endpoint_picker_may_read_its_pool_and_watch_the_pods() -> None:
    dd = gateway_dd()
    objs = children(dd)
    role = one(objs, "Role", "-router")
    grants = {
        (group, resource): rule["verbs"]
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert grants == {
        ("inference.networking.k8s.io", "inferencepools"): ["get", "list", "watch"],
        ("", "pods"): ["get", "list", "watch"],
    }
    binding = one(objs, "RoleBinding", "-router")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": gw.epp_name(dd), "namespace": dd.namespace}
    ]


def test_the_router_pod_settings_apply_to_the_endpoint_picker() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "vllm-nixl.yaml").read_text())
    doc["spec"]["router"] = {
        "type": "gateway-api",
        "nodeSelector": {"pool": "cpu"},
        "tolerations": [{"key": "cpu-only", "operator": "Exists"}],
        "env": [{"name": "LOG_LEVEL", "value": "debug"}],
    }
    dd = DisaggregatedDeployment.model_validate(doc)
    pod = one(children(dd), "Deployment", "-router")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "cpu"}
    assert pod["tolerations"] == [{"key": "cpu-only", "operator": "Exists"}]
    assert pod["containers"][0]["env"] == [{"name": "LOG_LEVEL", "value": "debug"}]


@pytest.mark.parametrize(
    ("router", "message"),
    [
        ({"gatewayApi": {}}, "spec.router.gatewayApi is set but spec.router.type is builtin"),
        ({"type": "gateway-api", "image": "x/y:1"}, "spec.router.image is the built-in router's image"),
        (
            {"type": "gateway-api", "gatewayApi": {"gateway": {"name": "g", "namespace": "Not_A_Namespace"}}},
            "namespace",
        ),
    ],
)
def test_combinations_that_make_no_sense_are_refused(router: Obj, message: str) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "vllm-nixl.yaml").read_text())
    doc["spec"]["router"] = copy.deepcopy(router)
    with pytest.raises(ValueError, match=message):
        DisaggregatedDeployment.model_validate(doc)


def test_the_status_names_no_router_url_under_gateway_api() -> None:
    from disagg.controller.reconcile import router_endpoint

    def endpoint(dd: DisaggregatedDeployment) -> str | None:
        return router_endpoint({(o["kind"], o["metadata"]["name"]): o for o in children(dd)})

    builtin = example("vllm-nixl.yaml")
    assert endpoint(builtin) == f"http://{builtin.name}-router.default.svc:8000"
    assert endpoint(gateway_dd()) is None  # the router Service is the endpoint picker's gRPC

"""The generated CRDs on the real API server: every example accepted, every invalid spec rejected naming its
field (the same table the models are checked against, tests/golden/invalid_specs.yaml), defaults applied,
and engine.type immutable. Creates use dryRun=All except where an update needs a stored object."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg.api.k8sschema import AFFINITY, affinity_schema, structural_schema
from disagg.k8s.client import DISAGG_DEPLOYMENT, KubeApi

ROOT = Path(__file__).resolve().parents[2]
TABLE = yaml.safe_load((ROOT / "tests" / "golden" / "invalid_specs.yaml").read_text())
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
GROUP, VERSION, PLURAL = DISAGG_DEPLOYMENT.resource


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def custom_api(k8s_api: Any) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(k8s_api)


def create(k8s_api: Any, namespace: str, body: dict[str, Any], dry_run: bool = True) -> dict[str, Any]:
    kwargs = {"dry_run": "All"} if dry_run else {}
    result: dict[str, Any] = custom_api(k8s_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body, **kwargs
    )
    return result


def rejection(k8s_api: Any, namespace: str, body: dict[str, Any]) -> str:
    """The API server's message for a create it must refuse."""
    from kubernetes.client.rest import ApiException

    try:
        create(k8s_api, namespace, body)
    except ApiException as exc:
        assert exc.status == 422, f"expected 422 Invalid, got {exc.status}: {exc.body}"
        return str(json.loads(exc.body).get("message", exc.body))
    pytest.fail(f"the API server accepted an invalid object: {json.dumps(body)}")


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_is_accepted(crds: list[str], k8s_api: Any, namespace: str, example: Path) -> None:
    body = yaml.safe_load(example.read_text())
    created = create(k8s_api, namespace, body)
    assert created["metadata"]["name"] == body["metadata"]["name"]
    assert created["spec"]["engine"]["type"] == body["spec"]["engine"]["type"]


@pytest.mark.parametrize("mode", ["active", "advisory"])
def test_autoscaling_mode_is_stored_per_deployment(
    crds: list[str], k8s_api: Any, namespace: str, mode: str
) -> None:
    body = merge_patch(
        TABLE["base"], {"spec": {"autoscaling": {"policyRef": {"name": "chat"}, "mode": mode}}}
    )
    assert create(k8s_api, namespace, body)["spec"]["autoscaling"]["mode"] == mode
    unset = create(k8s_api, namespace, TABLE["base"])
    assert "mode" not in (unset["spec"].get("autoscaling") or {})  # no default: the policy's mode applies


@pytest.mark.parametrize("case", TABLE["cases"], ids=lambda c: c["name"])
def test_invalid_spec_is_rejected_naming_the_field(
    crds: list[str], k8s_api: Any, namespace: str, case: dict[str, Any]
) -> None:
    message = rejection(k8s_api, namespace, merge_patch(TABLE["base"], case["patch"]))
    for expected in case["expect"]:
        assert expected in message, (
            f"{case['name']}: {expected!r} not in the API server's message {message!r}"
        )


def test_the_vendored_affinity_schema_is_the_api_servers_own(crds: list[str], kube: KubeApi) -> None:
    """The CRD's affinity schema (disagg/api/schemas/affinity.json) is what the pinned kube-apiserver
    publishes for core/v1 Affinity, references inlined: a Kubernetes upgrade that changes it fails here."""
    openapi = kube.request("GET", "/openapi/v3/api/v1")
    assert structural_schema(openapi, AFFINITY) == affinity_schema()


@pytest.mark.parametrize(
    ("affinity", "field"),
    [
        (  # operator "Exist" (not Exists): an enum of Kubernetes' schema
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "Exist"}]}]
                    }
                }
            },
            "spec.prefill.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution."
            "nodeSelectorTerms[0].matchExpressions[0].operator",
        ),
        (  # a weight that is not an integer, and a term without its required topologyKey
            {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": "high", "podAffinityTerm": {"labelSelector": {"matchLabels": {"a": "b"}}}}
                    ]
                }
            },
            "spec.prefill.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]",
        ),
    ],
    ids=["operator-exist", "weight-and-topology-key"],
)
def test_a_malformed_affinity_is_refused_naming_the_field(
    crds: list[str], k8s_api: Any, namespace: str, affinity: dict[str, Any], field: str
) -> None:
    message = rejection(
        k8s_api, namespace, merge_patch(TABLE["base"], {"spec": {"prefill": {"affinity": affinity}}})
    )
    assert field in message, message


def test_a_well_formed_affinity_is_stored_as_given(crds: list[str], k8s_api: Any, namespace: str) -> None:
    affinity = {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 50,
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": {"disagg.dev/role": "decode"}},
                        "topologyKey": "kubernetes.io/hostname",
                    },
                }
            ]
        }
    }
    body = merge_patch(TABLE["base"], {"spec": {"common": {"affinity": affinity}}})
    assert create(k8s_api, namespace, body)["spec"]["common"]["affinity"] == affinity


def test_api_server_applies_the_defaults(crds: list[str], k8s_api: Any, namespace: str) -> None:
    body = merge_patch(TABLE["base"], {"spec": {"prefill": None, "decode": None}})
    spec = create(k8s_api, namespace, body)["spec"]
    assert spec["prefill"]["replicas"] == 1 and spec["decode"]["tensorParallelSize"] == 1
    assert spec["kvTransfer"]["loadFailurePolicy"] == "recompute"
    assert spec["kvTransfer"]["sideChannelPort"] == 5600
    assert (spec["router"]["port"], spec["router"]["serviceType"]) == (8000, "ClusterIP")


def test_engine_type_is_immutable(crds: list[str], k8s_api: Any, namespace: str) -> None:
    from kubernetes.client.rest import ApiException

    create(k8s_api, namespace, TABLE["base"], dry_run=False)
    name = TABLE["base"]["metadata"]["name"]
    patch = {"spec": {"engine": {"type": "sglang"}, "kvTransfer": {"connector": "mooncake"}}}
    with pytest.raises(ApiException) as info:
        custom_api(k8s_api).patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)
    assert info.value.status == 422
    assert "spec.engine.type is immutable" in json.loads(info.value.body)["message"]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_rendered_children_are_accepted_by_the_api_server(
    k8s_api: Any, namespace: str, example: Path
) -> None:
    """What `disagg render` prints passes the API server's own validation (dry run, strict field checks)."""
    from kubernetes.client.rest import ApiException
    from kubernetes.dynamic import DynamicClient

    from disagg.api.deployment import DisaggregatedDeployment
    from disagg.render import effective_replicas, render_children

    doc = yaml.safe_load(example.read_text())
    doc["metadata"]["namespace"] = namespace
    dd = DisaggregatedDeployment.model_validate(doc)
    dynamic = DynamicClient(k8s_api)
    children = render_children(dd, effective_replicas(dd))
    for child in children:
        resource = dynamic.resources.get(api_version=child["apiVersion"], kind=child["kind"])
        try:
            resource.create(
                body=child,
                namespace=namespace,
                query_params=[("dryRun", "All"), ("fieldValidation", "Strict")],
            )
        except ApiException as exc:
            pytest.fail(f"{child['kind']}/{child['metadata']['name']} rejected: {exc.body}")
    assert {c["kind"] for c in children} >= {"Deployment", "Service", "PodDisruptionBudget", "Role"}


def test_kubectl_explain_documents_the_fields(crds: list[str], kubeconfig: Path) -> None:
    import subprocess

    from disagg.cluster.binaries import ensure_binary
    from disagg.cluster.wait import wait_for

    kubectl = ensure_binary("kubectl")

    def explain() -> subprocess.CompletedProcess[str] | None:
        result = subprocess.run(
            [str(kubectl), "--kubeconfig", str(kubeconfig), "explain", "dd.spec.decode"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return result if result.returncode == 0 else None

    # The API server publishes a new CRD's OpenAPI document a little after the CRD is Established.
    result = wait_for(explain, timeout_s=90, interval_s=1, what="kubectl explain dd.spec.decode")
    expected = (
        "The decode pool (merged over spec.common).",
        "tensorParallelSize",
        "GPUs per replica",
        "shutdownTimeoutSeconds",
        "parallelism",
    )
    for text in expected:
        assert text in result.stdout, f"{text!r} missing from kubectl explain:\n{result.stdout}"


def test_kubectl_get_shows_the_printer_columns(
    crds: list[str], k8s_api: Any, kubeconfig: Path, namespace: str
) -> None:
    import subprocess

    from disagg.api.deployment import RoleStatus, format_ratio
    from disagg.cluster.binaries import ensure_binary

    body = yaml.safe_load((ROOT / "examples" / "sglang-nixl.yaml").read_text())
    name = body["metadata"]["name"]
    create(k8s_api, namespace, body, dry_run=False)
    status = {
        "status": {
            "prefill": RoleStatus.of(desired=3, replicas=3, ready=2).to_api(),
            "decode": RoleStatus.of(desired=1, replicas=1, ready=1).to_api(),
            "ratio": format_ratio(3, 1),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "Starting",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        }
    }
    custom_api(k8s_api).patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, status)
    result = subprocess.run(
        [
            str(ensure_binary("kubectl")),
            "--kubeconfig",
            str(kubeconfig),
            "get",
            "dd",
            "-n",
            namespace,
            "--no-headers",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[:7] == [name, "sglang", "nixl", "2/3", "1/1", "3:1", "False"], result.stdout

"""The CRDs generated from the models: structural, documented, with the columns and rules the API promises."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from disagg.api.crd import CrdGenerationError, CrdSpec, all_crds, crd_for, deployment_crd_spec, to_structural
from disagg.api.quantity import QUANTITY_PATTERN
from disagg.cli import main


def dd_crd() -> dict[str, Any]:
    return crd_for(deployment_crd_spec())


def dd_schema() -> dict[str, Any]:
    schema: dict[str, Any] = dd_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}[*]")


def test_names_scope_and_status_subresource() -> None:
    crd = dd_crd()
    assert crd["metadata"]["name"] == "disaggregateddeployments.disagg.dev"
    names = crd["spec"]["names"]
    assert (names["kind"], names["shortNames"]) == ("DisaggregatedDeployment", ["dd", "disagg"])
    version = crd["spec"]["versions"][0]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"  # HPA/KEDA
    assert crd["spec"]["scope"] == "Namespaced"


def test_printer_columns() -> None:
    columns = {c["name"]: c["jsonPath"] for c in dd_crd()["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns == {
        "Engine": ".spec.engine.type",
        "Connector": ".spec.kvTransfer.connector",
        "Prefill": ".status.prefill.display",
        "Decode": ".status.decode.display",
        "Ratio": ".status.ratio",
        "Ready": '.status.conditions[?(@.type=="Ready")].status',
        "Age": ".metadata.creationTimestamp",
    }


def test_schema_is_structural_and_every_field_is_described() -> None:
    for path, node in walk(dd_schema()):
        assert "$ref" not in node and "anyOf" not in node and "title" not in node, path
        assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{path} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path
        # metadata's schema belongs to the API server, which refuses anything but its type
        if path.count(".") >= 1 and not path.endswith(("[]", "[*]")) and path != ".metadata":
            assert node.get("description"), f"{path} has no description (kubectl explain would be empty)"
        assert node.get("default", 0) is not None, f"{path} has a null default"


def test_defaults_and_enums_reach_the_schema() -> None:
    spec = dd_schema()["properties"]["spec"]["properties"]
    assert spec["engine"]["properties"]["type"]["enum"] == ["vllm", "sglang"]
    assert spec["kvTransfer"]["properties"]["connector"]["enum"] == [
        "nixl",
        "mooncake",
        "lmcache",
        "p2p-nccl",
    ]
    assert spec["kvTransfer"]["properties"]["loadFailurePolicy"]["default"] == "recompute"
    assert spec["prefill"]["default"] == {} and spec["prefill"]["properties"]["replicas"]["default"] == 1
    assert spec["router"]["properties"]["port"]["default"] == 8000
    assert spec["autoscaling"]["properties"]["maxGPUs"]["type"] == "integer"
    # typed, so a toleration the pods would be refused for (operator "Exist") is refused at admission
    toleration = spec["prefill"]["properties"]["tolerations"]["items"]
    assert toleration["properties"]["operator"]["enum"] == ["Exists", "Equal"]
    assert "x-kubernetes-preserve-unknown-fields" not in toleration
    assert spec["prefill"]["properties"]["podTemplate"]["x-kubernetes-preserve-unknown-fields"] is True
    limits = spec["prefill"]["properties"]["resources"]["properties"]["limits"]
    assert limits["additionalProperties"] == {
        "x-kubernetes-int-or-string": True,
        "pattern": QUANTITY_PATTERN,  # "256GB" refused at admission, naming the field
    }


def test_cel_rules_cover_the_cross_field_constraints() -> None:
    rules = [rule for _, node in walk(dd_schema()) for rule in node.get("x-kubernetes-validations", [])]
    messages = " ".join(r["message"] for r in rules)
    for needle in (
        "spec.kvTransfer.connector: lmcache with vllm: no released router injects LMCache's disagg_spec",
        "spec.kvTransfer.connector: mooncake with vllm: vllm-router 0.1.17 queries Mooncake bootstrap",
        "spec.kvTransfer.connector: p2p-nccl with vllm: vLLM 0.33.0 no longer ships P2pNcclConnector",
        "spec.kvTransfer.connector: lmcache with sglang",
        "spec.kvTransfer.connector: p2p-nccl with sglang",
        "resources.limits['nvidia.com/gpu'] must equal tensorParallelSize",
        "resources.requests['nvidia.com/gpu'] must equal tensorParallelSize",
        "spec.prefill.replicas must lie within",
        "spec.decode.replicas must lie within",
        "minReplicas must not exceed maxReplicas",
        "set exactly one of huggingFace or pvc",
        "policyRef is required",
        "maxGPUs is below",
        "spec.engine.type is immutable",
        "metadata.name must be at most 46",
        "parallelism.dataParallelAttention needs parallelism.data > 1",
        "parallelism.expert with parallelism.data > 1 needs parallelism.dataParallelAttention",
        "tensorParallelSize and parallelism.tensor differ",
        "parallelism.expert must equal parallelism.tensor x parallelism.data",
        "tensor x pipeline x data must equal gpusPerNode x nodesPerReplica",
        "or with parallelism its gpusPerNode (GPUs per pod)",
        "spec.prefill.parallelism.data must be a multiple of nodesPerReplica with vllm",
        "spec.decode.parallelism: with sglang, data > 1 on several nodes needs dataParallelAttention",
    ):
        assert needle in messages, needle
    assert all(r["rule"] and r["message"] for r in rules)


def test_lists_and_strings_have_size_bounds_for_cel_cost() -> None:
    for path, node in walk(dd_schema()):
        if node.get("type") == "array" and not path.startswith(".status"):
            assert "maxItems" in node, f"{path} needs maxItems"
        if node.get("type") == "string" and "enum" not in node and path.startswith(".spec"):
            assert "maxLength" in node or "pattern" in node, f"{path} needs maxLength"


def test_all_crds_includes_ratio_policy_when_its_module_exports_a_spec() -> None:
    kinds = [crd["spec"]["names"]["kind"] for crd in all_crds()]
    assert kinds[0] == "DisaggregatedDeployment"
    from importlib.util import find_spec

    if find_spec("disagg.api.ratiopolicy") is not None:
        assert "RatioPolicy" in kinds


def test_crd_for_is_generic_over_models() -> None:
    class WidgetSpec(BaseModel):
        size: int = Field(default=3, description="How big.")

    class Widget(BaseModel):
        spec: WidgetSpec = Field(description="Desired.")

    crd = crd_for(
        CrdSpec(model=Widget, kind="Widget", plural="widgets", singular="widget", short_names=("wd",))
    )
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["properties"]["spec"]["properties"]["size"] == {
        "default": 3,
        "description": "How big.",
        "type": "integer",
    }
    assert crd["metadata"]["name"] == "widgets.disagg.dev"


def test_untyped_union_is_refused_naming_the_field() -> None:
    node = {"properties": {"x": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}, "type": "object"}
    with pytest.raises(CrdGenerationError, match=r"Thing\.x"):
        to_structural(node, {}, "Thing")


def test_crds_check_names_stale_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crds", "--out", str(tmp_path), "--check"]) == 1
    assert "disagg.dev_disaggregateddeployments.yaml" in capsys.readouterr().err
    assert main(["crds", "--out", str(tmp_path)]) == 0
    assert main(["crds", "--out", str(tmp_path), "--check"]) == 0
    target = tmp_path / "disagg.dev_disaggregateddeployments.yaml"
    target.write_text(target.read_text() + "# edited\n")
    assert main(["crds", "--out", str(tmp_path), "--check"]) == 1
    assert str(target) in capsys.readouterr().err

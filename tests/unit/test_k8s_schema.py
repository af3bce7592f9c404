"""Kubernetes' schemas inlined for the CRDs (disagg.api.k8sschema); the vendored copy is checked against
the live kube-apiserver in tests/integration/test_crd_validation.py."""

from __future__ import annotations

from typing import Any

import pytest

from disagg.api.crd import all_crds
from disagg.api.k8sschema import MAX_ITEMS, MAX_STRING_LENGTH, affinity_schema, structural_schema

DOC: dict[str, Any] = {
    "components": {
        "schemas": {
            "Outer": {
                "description": "An outer thing, e.g. a wrapper. Anything after the first sentence is cut.",
                "type": "object",
                "required": ["inner"],
                "properties": {
                    "inner": {
                        "description": "The field's own words.\n\nPossible values: many.",
                        "allOf": [{"$ref": "#/components/schemas/Inner"}],
                    },
                    "terms": {
                        "type": "array",
                        "items": {"$ref": "#/components/schemas/Inner"},
                        "x-kubernetes-list-type": "atomic",
                    },
                    "labels": {"type": "object", "additionalProperties": {"type": "string", "default": ""}},
                },
            },
            "Inner": {
                "type": "object",
                "description": "Required. Words of the type. More.",
                "properties": {"op": {"type": "string", "default": "", "enum": ["In", "NotIn"]}},
                "x-kubernetes-map-type": "atomic",
                "x-kubernetes-patch-strategy": "merge",
            },
            "Loop": {"type": "object", "properties": {"next": {"$ref": "#/components/schemas/Loop"}}},
        }
    }
}


def test_references_are_inlined_and_only_what_a_crd_takes_is_kept() -> None:
    inner = {"type": "object", "properties": {"op": {"type": "string", "enum": ["In", "NotIn"]}}}
    inner["x-kubernetes-map-type"] = "atomic"
    inner["description"] = "Required. Words of the type."
    assert structural_schema(DOC, "Outer") == {
        "type": "object",
        "description": "An outer thing, e.g. a wrapper.",
        "required": ["inner"],
        "properties": {
            "inner": {**inner, "description": "The field's own words."},
            "terms": {
                "type": "array",
                "items": inner,
                "x-kubernetes-list-type": "atomic",
                "maxItems": MAX_ITEMS,
            },
            "labels": {
                "type": "object",
                "additionalProperties": {"type": "string", "maxLength": MAX_STRING_LENGTH},
            },
        },
    }


def test_a_cycle_is_refused_rather_than_inlined_forever() -> None:
    with pytest.raises(ValueError, match="Loop -> Loop"):
        structural_schema(DOC, "Loop")


def test_every_affinity_field_of_the_crd_carries_kubernetes_schema() -> None:
    schema = affinity_schema()
    assert set(schema["properties"]) == {"nodeAffinity", "podAffinity", "podAntiAffinity"}
    found: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("affinity"), dict):
                found.append(node["affinity"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    (deployment,) = [c for c in all_crds() if c["spec"]["names"]["kind"] == "DisaggregatedDeployment"]
    walk(deployment)
    assert len(found) == 3  # common, prefill, decode
    type_schema = {k: v for k, v in schema.items() if k != "description"}
    for affinity in found:  # each field keeps its own description, and Kubernetes' schema below it
        assert affinity["description"] != schema["description"]
        assert {k: v for k, v in affinity.items() if k != "description"} == type_schema

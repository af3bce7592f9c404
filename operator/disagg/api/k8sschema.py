"""Kubernetes' own schemas for the Kubernetes-shaped fields of the CRDs (``affinity``), so the API server
validates them at admission instead of keeping whatever is given.

The schema is vendored in ``schemas/affinity.json``, made by :func:`structural_schema` from the OpenAPI v3
document the pinned kube-apiserver serves at ``/openapi/v3/api/v1`` (``disagg.cluster`` starts it; an
integration test checks the vendored copy against the live one). A CRD schema must be structural and
self-contained: references are inlined; each description is cut to its first sentence (``kubectl explain``
has something to show, and the whole texts would add ~25 KB per field to the CRD); defaults are dropped
(they are the zero values the API server fills in the child where they matter). Kubernetes leaves lists
and strings unbounded; here they get bounds (:data:`MAX_ITEMS`, :data:`MAX_STRING_LENGTH`) so the CRD's
CEL rules stay within the API server's cost budget, whatever rule comes to read them.

    python -m disagg.api.k8sschema OPENAPI.json io.k8s.api.core.v1.Affinity > schemas/affinity.json

Pure: dicts in, dicts out; the file is read with the package.
"""

from __future__ import annotations

import json
import re
import sys
from functools import cache
from importlib import resources
from typing import Any

AFFINITY = "io.k8s.api.core.v1.Affinity"
# The most items of any list in an inlined schema: more terms, expressions or values than a scheduler
# rule is written with (Kubernetes sets no limit).
MAX_ITEMS = 64
# The longest string: a qualified label key (a 253-character DNS prefix, '/', a 63-character name), which
# also bounds label values (63), namespace names (63) and node names (253).
MAX_STRING_LENGTH = 253 + 1 + 63
# Where a description's first sentence ends: a full stop before a capital or the end of the paragraph
# ("e.g. co-locate" does not end one).
SENTENCE_END = re.compile(r"(?<=\.)\s+(?=[A-Z`])")
# What a structural CRD schema may carry of what the OpenAPI document says (the rest: descriptions,
# defaults, x-kubernetes-patch-* strategic-merge hints, which CRDs do not support).
KEPT = frozenset(
    {
        "type",
        "format",
        "enum",
        "required",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
        "x-kubernetes-int-or-string",
    }
)


def structural_schema(openapi: dict[str, Any], name: str) -> dict[str, Any]:
    """The schema ``name`` of an OpenAPI v3 document with every reference inlined (raises on a cycle)."""
    schemas = openapi["components"]["schemas"]

    def resolve(node: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
        if "$ref" in node or "allOf" in node:
            (ref,) = [node["$ref"]] if "$ref" in node else [part["$ref"] for part in node["allOf"]]
            target = ref.rsplit("/", 1)[-1]
            if target in path:
                raise ValueError(f"{' -> '.join((*path, target))}: a cycle cannot be inlined")
            inlined = resolve(schemas[target], (*path, target))
            if node.get("description"):  # the field's own words over its type's
                inlined["description"] = first_sentence(node["description"])
            return inlined
        out = {k: v for k, v in node.items() if k in KEPT}
        if node.get("description"):
            out["description"] = first_sentence(node["description"])
        if out.get("type") == "array":
            out["maxItems"] = MAX_ITEMS
        if out.get("type") == "string" and "enum" not in out:
            out["maxLength"] = MAX_STRING_LENGTH
        if "properties" in node:
            out["properties"] = {k: resolve(v, path) for k, v in node["properties"].items()}
        if "items" in node:
            out["items"] = resolve(node["items"], path)
        if isinstance(node.get("additionalProperties"), dict):
            out["additionalProperties"] = resolve(node["additionalProperties"], path)
        return out

    return resolve(schemas[name], (name,))


def first_sentence(text: str) -> str:
    """The first sentence of a description's first paragraph (two where the first is only "Required.")."""
    paragraph = text.strip().split("\n\n", 1)[0]
    sentences = SENTENCE_END.split(paragraph, 2)
    keep = 2 if sentences[0] == "Required." else 1
    return " ".join(sentences[:keep]).strip()


@cache
def affinity_schema() -> dict[str, Any]:
    """The vendored structural schema of a pod's ``affinity`` (Kubernetes' ``core/v1 Affinity``)."""
    text = resources.files("disagg.api").joinpath("schemas/affinity.json").read_text(encoding="utf-8")
    document: dict[str, Any] = json.loads(text)
    schema: dict[str, Any] = document["schema"]
    return schema


def main(argv: list[str] | None = None) -> int:
    """Print ``{"source": ..., "schema": ...}`` for the vendored file from a saved OpenAPI document."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m disagg.api.k8sschema OPENAPI.json SCHEMA_NAME", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as handle:
        openapi = json.load(handle)
    document = {
        "source": (
            f"{args[1]} from kube-apiserver {openapi.get('info', {}).get('version', '?')}'s "
            "/openapi/v3/api/v1, made by disagg.api.k8sschema"
        ),
        "schema": structural_schema(openapi, args[1]),
    }
    print(json.dumps(document, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The chart's static parts, without helm: CRDs in sync, values vs schema, kopf peering CRDs, dashboard.

Rendering, linting and installing the chart are in tests/integration/test_chart.py (they need helm and
the API server).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kopf._cogs.structs import references

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "disagg-operator"
PEERING_FILE = "kopf-peering.yaml"
DASHBOARD = CHART / "dashboards" / "disagg-overview.json"
_SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def _operator_series() -> set[str]:
    """Every series the operator's registry exports (reconciler and autoscaling loop metrics)."""
    from prometheus_client import CollectorRegistry

    from disagg.controller.metrics import AutoscalingMetrics, create_metrics

    registry = CollectorRegistry()
    create_metrics(registry)
    AutoscalingMetrics.create(registry)
    return {f"{m.name}{suffix}" for m in registry.collect() for suffix in _SUFFIXES.get(m.type, ("",))}


def test_chart_crds_are_identical_to_the_generated_ones() -> None:
    generated = {p.name: p.read_bytes() for p in sorted((REPO / "crds").glob("*.yaml"))}
    assert generated, "crds/ is empty: run `disagg crds`"
    in_chart = {p.name: p.read_bytes() for p in sorted((CHART / "crds").glob("*.yaml"))}
    stale = sorted(name for name, content in generated.items() if in_chart.get(name) != content)
    assert not stale, f"chart crds/ differs from crds/ for {stale}: run `sh charts/sync-crds.sh`"
    extra = sorted(set(in_chart) - set(generated) - {PEERING_FILE})
    assert not extra, f"chart crds/ has files that crds/ does not: {extra}"


CRD_CHART = REPO / "charts" / "disagg-crds"
# What charts/sync-crds.sh inserts after each top-level `metadata:` of the CRDs it copies into the
# disagg-crds chart's templates.
KEEP_POLICY = [
    "  {{- if .Values.keep }}",
    "  annotations:",
    "    helm.sh/resource-policy: keep",
    "  {{- end }}",
]


def _crd_sources() -> dict[str, Path]:
    """What the disagg-crds chart carries: the generated CRDs and kopf's peering CRDs."""
    sources = {p.name: p for p in sorted((REPO / "crds").glob("*.yaml"))}
    sources[PEERING_FILE] = CHART / "crds" / PEERING_FILE
    return sources


def _without_keep_policy(lines: list[str]) -> tuple[list[str], int]:
    """``lines`` less the KEEP_POLICY blocks following a top-level ``metadata:``; how many there were."""
    kept: list[str] = []
    removed, index = 0, 0
    while index < len(lines):
        kept.append(lines[index])
        if lines[index] == "metadata:" and lines[index + 1 : index + 1 + len(KEEP_POLICY)] == KEEP_POLICY:
            index += len(KEEP_POLICY)
            removed += 1
        index += 1
    return kept, removed


def test_crd_chart_templates_are_the_crds_with_the_keep_policy() -> None:
    """charts/disagg-crds/templates/ is crds/ (and kopf's peering CRDs), each CRD's metadata gaining only
    helm.sh/resource-policy: keep (value keep); tests/integration/test_chart.py renders them with helm."""
    sources = _crd_sources()
    templates = {p.name: p for p in sorted((CRD_CHART / "templates").glob("*.yaml"))}
    assert sorted(templates) == sorted(sources), "run `sh charts/sync-crds.sh`"
    for name, source in sources.items():
        header, *body = templates[name].read_text().splitlines()
        assert header.startswith("# Copied by charts/sync-crds.sh from "), name
        plain, inserted = _without_keep_policy(body)
        assert plain == source.read_text().splitlines(), f"{name} is stale: run `sh charts/sync-crds.sh`"
        docs = [d for d in yaml.safe_load_all(source.read_text()) if d]
        assert inserted == len(docs) >= 1, name  # every CRD of the file, once
        # The inserted block is metadata's only `annotations`, and nothing else reads as a template action.
        assert all("annotations" not in d["metadata"] for d in docs), name
        assert "{{" not in source.read_text(), name


def test_the_charts_are_released_together_at_the_operators_version() -> None:
    from disagg import __version__

    operator = yaml.safe_load((CHART / "Chart.yaml").read_text())
    crds = yaml.safe_load((CRD_CHART / "Chart.yaml").read_text())
    assert crds["name"] == "disagg-crds"
    assert operator["version"] == crds["version"]
    assert operator["kubeVersion"] == crds["kubeVersion"]
    # appVersion is the operator image's tag the chart defaults to (image.tag empty)
    assert operator["appVersion"] == crds["appVersion"] == __version__


def test_crd_chart_values_are_declared_and_keep_by_default() -> None:
    values = yaml.safe_load((CRD_CHART / "values.yaml").read_text())
    schema = json.loads((CRD_CHART / "values.schema.json").read_text())
    assert values == {"keep": True}
    assert set(values) == set(schema["properties"]) and schema["additionalProperties"] is False
    assert "README.md.gotmpl" in (CRD_CHART / ".helmignore").read_text().split()


def _peering_crds() -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((CHART / "crds" / PEERING_FILE).read_text()) if d]
    return {d["spec"]["names"]["kind"]: d for d in docs}


@pytest.mark.parametrize(
    ("kind", "scope", "selector"),
    [
        ("ClusterKopfPeering", "Cluster", references.CLUSTER_PEERINGS_K),
        ("KopfPeering", "Namespaced", references.NAMESPACED_PEERINGS_K),
    ],
)
def test_peering_crds_are_the_ones_kopf_looks_for(
    kind: str, scope: str, selector: references.Selector
) -> None:
    crd = _peering_crds()[kind]
    assert crd["spec"]["group"] == selector.group
    assert crd["spec"]["names"]["plural"] == selector.any_name
    assert crd["spec"]["scope"] == scope
    assert crd["metadata"]["name"] == f"{selector.any_name}.{selector.group}"
    version = crd["spec"]["versions"][0]
    assert version["name"] == selector.version and version["served"] and version["storage"]
    # kopf keeps the keep-alives of every replica under status, keyed by identity.
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert status["x-kubernetes-preserve-unknown-fields"] is True


def _undeclared(values: Any, schema: dict[str, Any], defs: dict[str, Any], path: str) -> list[str]:
    """Keys in ``values`` the schema does not declare (where the schema closes an object)."""
    if "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[1]]
    if not isinstance(values, dict) or "properties" not in schema:
        return []
    found = []
    for key, value in values.items():
        sub = schema["properties"].get(key)
        if sub is None:
            if schema.get("additionalProperties") is False:
                found.append(f"{path}{key}")
            continue
        found.extend(_undeclared(value, sub, defs, f"{path}{key}."))
    return found


def _schema() -> dict[str, Any]:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert isinstance(schema, dict)
    return schema


def _values() -> dict[str, Any]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert isinstance(values, dict)
    return values


def test_every_default_value_is_declared_in_the_schema() -> None:
    schema = _schema()
    assert _undeclared(_values(), schema, schema["definitions"], "") == []


def test_defaults_are_the_secure_highly_available_ones() -> None:
    values = _values()
    assert values["replicaCount"] >= 2 and values["peering"]["enabled"]
    assert values["podSecurityContext"]["runAsNonRoot"] is True
    assert values["podSecurityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    container = values["securityContext"]
    assert container["readOnlyRootFilesystem"] is True
    assert container["allowPrivilegeEscalation"] is False
    assert container["capabilities"]["drop"] == ["ALL"]
    assert values["resources"]["requests"] and values["resources"]["limits"]


def test_schema_enums_hold_the_defaults() -> None:
    props = _schema()["properties"]
    values = _values()
    assert values["watch"]["scope"] in props["watch"]["properties"]["scope"]["enum"]
    assert values["logLevel"] in props["logLevel"]["enum"]
    assert values["image"]["pullPolicy"] in props["image"]["properties"]["pullPolicy"]["enum"]


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs: list[str] = []
    for panel in dashboard["panels"]:
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        exprs.extend(t["expr"] for t in panel["targets"])
    return exprs


def test_dashboard_plots_latency_against_slo_replicas_and_decisions() -> None:
    titles = {p["title"] for p in json.loads(DASHBOARD.read_text())["panels"]}
    assert {
        "TTFT vs SLO",
        "ITL vs SLO",
        "Replicas per role: desired vs current",
        "Decisions by reason",
    } <= titles
    # Metric names are followed by a selector or a range; label names (disagg_deployment) are not.
    series = {m for e in _dashboard_exprs() for m in re.findall(r"\b(disagg_[a-z_]+)(?=[{\[])", e)}
    exported = _operator_series()
    assert {"disagg_decisions_total", "disagg_desired_replicas", "disagg_current_replicas"} <= series
    assert series <= exported, f"the operator does not export {sorted(series - exported)}"


def test_dashboard_selects_engine_series_by_the_policys_target_labels() -> None:
    from disagg.metrics.queries import TARGET_LABELS

    engine_exprs = [e for e in _dashboard_exprs() if "vllm:" in e]
    assert engine_exprs
    for expr in engine_exprs:
        assert f"{TARGET_LABELS.deployment}=~" in expr, expr
        assert f"{TARGET_LABELS.namespace}=~" in expr, expr


def test_dashboard_engine_metrics_are_the_ones_the_engines_export() -> None:
    # The emulated engines (disagg.twin.live) export the real vLLM/SGLang names; the dashboard must match.
    exposition = (REPO / "operator" / "disagg" / "twin" / "live" / "exposition.py").read_text()
    names = {m for e in _dashboard_exprs() for m in re.findall(r"\b((?:vllm|sglang):[a-z_]+)", e)}
    assert names
    for name in names:
        base = name.removesuffix("_bucket")
        assert f'"{base}"' in exposition, f"{base} is not exported by the engines"


def test_chart_policies_are_identical_to_the_library() -> None:
    library = {p.name: p.read_bytes() for p in sorted((REPO / "policies").glob("*.yaml"))}
    in_chart = {p.name: p.read_bytes() for p in sorted((CHART / "policies").glob("*.yaml"))}
    assert library and in_chart == library, (
        "chart policies/ differs from policies/: run `sh charts/sync-policies.sh`"
    )


def test_policy_names_in_the_schema_are_the_librarys() -> None:
    names = _schema()["properties"]["policies"]["properties"]["names"]["items"]["enum"]
    library = sorted(
        yaml.safe_load(p.read_text())["metadata"]["name"] for p in (CHART / "policies").glob("*.yaml")
    )
    assert names == library
    assert _values()["policies"] == {"enabled": False, "names": [], "namespaces": []}  # opt-in


def test_notes_and_readme_point_at_nothing_a_chart_user_lacks() -> None:
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    readme = (CHART / "README.md").read_text()
    for text in (notes, readme):
        assert not re.search(r"(?<![\w-])(policies|examples)/[\w.-]*\.yaml", text), "a repository path"
        assert "-f crds/" not in text
    assert "README.md.gotmpl" in (CHART / ".helmignore").read_text().split()


RULE_TEMPLATE = CHART / "templates" / "prometheusrule.yaml"


def test_prometheus_rule_alerts_on_series_and_conditions_the_operator_exports() -> None:
    """Every disagg_* series the PrometheusRule's PromQL reads is exported by the operator, and every
    condition it selects is one the autoscaling loop sets (promtool checks the PromQL itself, in
    tests/integration/test_chart.py)."""
    from disagg.controller.metrics import CONDITIONS, SLOS

    text = RULE_TEMPLATE.read_text()
    series = set(re.findall(r"\b(disagg_[a-z_]+)\{", text))
    assert series == {"disagg_slo_latency_seconds", "disagg_slo_target_seconds", "disagg_condition"}
    exported = _operator_series()
    assert series <= exported, f"the operator does not export {sorted(series - exported)}"
    assert set(re.findall(r'condition="(\w+)"', text)) <= set(CONDITIONS)
    assert set(SLOS) == {"ttft", "itl"}
    alerts = re.findall(r"- alert: (\w+)", text)
    assert alerts == [
        "DisaggSLOBreach",
        "DisaggScalingLimited",
        "DisaggMetricsUnavailable",
        "DisaggOperatorDown",
    ]


def test_prometheus_rule_is_gated_like_the_service_monitor() -> None:
    """Rendered with metrics.enabled, its own enabled flag (on by default, as the ServiceMonitor's) and
    only where the cluster serves the Prometheus Operator's API; every alert has a `for` and a severity."""
    values = _values()["monitoring"]
    rule = values["prometheusRule"]
    assert rule["enabled"] is values["serviceMonitor"]["enabled"] is True
    gate = next(line for line in RULE_TEMPLATE.read_text().splitlines() if line.startswith("{{- if "))
    assert ".Values.metrics.enabled" in gate and "$rule.enabled" in gate
    assert '.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PrometheusRule"' in gate
    duration = re.compile(_schema()["definitions"]["alert"]["properties"]["for"]["pattern"])
    assert set(rule["alerts"]) == {"sloBreach", "scalingLimited", "metricsUnavailable", "operatorDown"}
    for name, alert in rule["alerts"].items():
        assert duration.fullmatch(alert["for"]), name
        assert alert["severity"] in ("warning", "critical"), name
    assert rule["alerts"]["operatorDown"]["severity"] == "critical"

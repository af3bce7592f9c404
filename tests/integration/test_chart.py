"""The Helm chart against the real API server of the local control plane.

- ``helm lint``; ``helm template`` for several values combinations, each accepted by the API server with
  ``kubectl apply --dry-run=server`` (the ServiceMonitor, PodMonitor and PrometheusRule against the
  Prometheus Operator's real CRDs, which the local control plane installs); bad values fail at template
  time naming the field (values.schema.json).
- The PrometheusRule's PromQL passes Prometheus' own ``promtool check rules``, and ``promtool test rules``
  shows each alert fires on the series the operator exports, after its ``for``, for this release only.
- ``helm install``; then the operator process runs with the chart's ServiceAccount identity (a kubeconfig
  built from a TokenRequest token) and reconciles an example end to end under the chart's RBAC, and is
  denied what it should not do. ``helm upgrade`` and ``helm uninstall`` leave no orphaned objects.
- Two operator processes with kopf peering: only one acts; when it dies the other takes over within the
  peering lifetime.

kwok fakes the chart's operator pods (they never run the image), so the operator runs here as a process
with exactly the identity and permissions the chart gives those pods.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

from disagg.api.deployment import DisaggregatedDeployment
from disagg.cluster.binaries import Versions, ensure_binary
from disagg.cluster.local import ClusterInfo, ClusterSettings, LocalCluster, free_ports
from disagg.cluster.processes import spawn_logged, stop_process_group
from disagg.cluster.wait import WaitTimeout, wait_for
from disagg.k8s.client import DISAGG_DEPLOYMENT
from disagg.metrics.queries import TARGET_LABELS

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "disagg-operator"
CRD_CHART = REPO / "charts" / "disagg-crds"
POLICIES = REPO / "policies"
DD_GROUP, DD_VERSION, DD_PLURAL = DISAGG_DEPLOYMENT.resource
# What the chart's monitoring objects need the cluster to serve (helm template --api-versions).
PROMETHEUS_OPERATOR_APIS = tuple(
    f"monitoring.coreos.com/v1/{kind}" for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule")
)
# Short peering lifetime so the failover test waits seconds, not a minute (kopf's default is 60 s).
PEERING_LIFETIME_S = 10
RECONCILE_TIMEOUT_S = 90.0
# What kopf logs when an operator starts acting (kopf/_core/engines/peering.py, process_peering_event).
RESUMED = "Resuming operations after the pause"


# ------------------------------------------------------------------------------------------ tools


@dataclass(frozen=True)
class Tools:
    helm: Path
    kubectl: Path
    env: dict[str, str]  # KUBECONFIG plus helm's own dirs under a temporary directory

    def helm_run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run([str(self.helm), *args], self.env, check)

    def kubectl_run(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return _run([str(self.kubectl), *args], self.env, check, stdin)


def _run(
    cmd: Sequence[str], env: dict[str, str], check: bool, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(cmd), env=env, input=stdin, capture_output=True, text=True, timeout=300)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="module")
def helm_only(tmp_path_factory: pytest.TempPathFactory) -> Tools:
    """helm and kubectl with helm's own dirs under a temporary directory, and no cluster."""
    home = tmp_path_factory.mktemp("helm-home")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "KUBECONFIG": str(home / "no-cluster.kubeconfig"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    return Tools(helm=ensure_binary("helm"), kubectl=ensure_binary("kubectl"), env=env)


@pytest.fixture(scope="module")
def tools(helm_only: Tools, kubeconfig: Path) -> Tools:
    """The same tools against the local control plane."""
    return Tools(
        helm=helm_only.helm, kubectl=helm_only.kubectl, env={**helm_only.env, "KUBECONFIG": str(kubeconfig)}
    )


@pytest.fixture(scope="module")
def chart_crds(tools: Tools) -> list[str]:
    """The chart's CRDs (disagg.dev and kopf's peering), really applied, as `helm install` would."""
    tools.kubectl_run("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    names = [
        doc["metadata"]["name"]
        for path in sorted((CHART / "crds").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]
    tools.kubectl_run("wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{n}" for n in names])
    return names


def _values_file(tmp_path: Path, values: dict[str, Any], name: str = "values.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(values))
    return path


def _render(
    tools: Tools,
    tmp_path: Path,
    release: str,
    namespace: str,
    values: dict[str, Any],
    api_versions: Sequence[str] = (),
) -> list[dict[str, Any]]:
    args = ["template", release, str(CHART), "-n", namespace, "-f", str(_values_file(tmp_path, values))]
    for api_version in api_versions:
        args += ["--api-versions", api_version]
    out = tools.helm_run(*args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _kinds(docs: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], []).append(doc)
    return by_kind


def _dry_run(tools: Tools, docs: Sequence[dict[str, Any]]) -> str:
    """`kubectl apply --dry-run=server`: every object, in the namespace the chart gave it."""
    assert all(d["metadata"].get("namespace") or d["kind"].startswith("Cluster") for d in docs), docs
    stream = yaml.safe_dump_all(list(docs))
    return tools.kubectl_run("apply", "--dry-run=server", "-f", "-", stdin=stream).stdout


@pytest.fixture
def extra_namespace(k8s_api: Any) -> Iterator[str]:
    core = client.CoreV1Api(k8s_api)
    name = f"chart-extra-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        with contextlib.suppress(ApiException):
            core.delete_namespace(name)


def _release() -> str:
    return f"dd{uuid.uuid4().hex[:6]}"


def _fullname(release: str) -> str:
    return f"{release}-disagg-operator"


# ------------------------------------------------------------------------------ lint and template


def test_helm_lint_passes_for_each_scope(helm_only: Tools, tmp_path: Path) -> None:
    helm_only.helm_run("lint", "--strict", str(CHART))
    namespaced = _values_file(
        tmp_path, {"watch": {"scope": "namespaces", "namespaces": ["team-a", "team-b"]}}
    )
    helm_only.helm_run("lint", "--strict", str(CHART), "-f", str(namespaced))


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"replicaCount": 0}, "replicaCount"),
        ({"watch": {"scope": "everywhere"}}, "scope"),
        ({"watch": {"scope": "namespaces"}}, "namespaces"),
        ({"watch": {"scope": "namespaces", "namespaces": ["Not_A_Namespace"]}}, "namespaces"),
        ({"securityContext": {"runAsNonRoot": False}}, "runAsNonRoot"),
        ({"securityContext": {"allowPrivilegeEscalation": True}}, "allowPrivilegeEscalation"),
        ({"image": {"repository": "disagg/operator", "pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"peering": {"lifetime": 1}}, "lifetime"),
        ({"replicas": 2}, "replicas"),
        ({"prometheus": {"bearerTokenSecret": {"name": "t", "value": "inline"}}}, "value"),
        ({"monitoring": {"prometheusRule": {"alerts": {"sloBreach": {"for": "ten minutes"}}}}}, "for"),
        ({"monitoring": {"prometheusRule": {"alerts": {"operatorDown": {"severity": ""}}}}}, "severity"),
    ],
    ids=lambda v: json.dumps(v, separators=(",", ":")) if isinstance(v, dict) else v,
)
def test_bad_values_fail_naming_the_field(
    helm_only: Tools, tmp_path: Path, values: dict[str, Any], field: str
) -> None:
    result = helm_only.helm_run(
        "template", "bad", str(CHART), "-f", str(_values_file(tmp_path, values)), check=False
    )
    assert result.returncode != 0, f"helm accepted bad values {values}:\n{result.stdout[:2000]}"
    assert field in result.stderr, result.stderr


def _operator_deployment(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = _kinds(docs)["Deployment"]
    return deployment


def test_default_render_is_secure_and_highly_available(helm_only: Tools, tmp_path: Path) -> None:
    docs = _render(helm_only, tmp_path, "rel", "disagg-system", {})
    deployment = _operator_deployment(docs)
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert deployment["spec"]["replicas"] == 2
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert container["livenessProbe"]["httpGet"]["port"] == "healthz"
    assert container["readinessProbe"]["httpGet"]["port"] == "healthz"
    assert container["resources"]["limits"] and container["resources"]["requests"]
    assert "--all-namespaces" in container["args"]
    assert "--peering=rel-disagg-operator" in container["args"]
    kinds = _kinds(docs)
    assert [p["metadata"]["name"] for p in kinds["ClusterKopfPeering"]] == ["rel-disagg-operator"]
    assert kinds["PodDisruptionBudget"][0]["spec"]["minAvailable"] == 1
    assert "ServiceMonitor" not in kinds, "rendered without the Prometheus Operator's API"
    dashboard = json.loads(kinds["ConfigMap"][0]["data"]["disagg-overview.json"])
    assert dashboard["uid"] == "disagg-overview"


def test_prometheus_tls_token_and_headers_come_from_secrets_and_values(
    helm_only: Tools, tmp_path: Path
) -> None:
    prometheus = {
        "url": "https://prometheus.monitoring.svc:9090",
        "tls": {"caConfigMap": {"name": "prom-ca", "key": "bundle.pem"}},
        "bearerTokenSecret": {"name": "prom-token", "key": "token"},
        "headers": {"X-Scope-OrgID": "team-a"},
    }
    deployment = _operator_deployment(_render(helm_only, tmp_path, "rel", "ns", {"prometheus": prometheus}))
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DISAGG_PROMETHEUS_CA_FILE"] == "/etc/disagg/prometheus/ca/bundle.pem"
    assert env["DISAGG_PROMETHEUS_BEARER_TOKEN_FILE"] == "/etc/disagg/prometheus/token/token"
    assert json.loads(env["DISAGG_PROMETHEUS_HEADERS"]) == {"X-Scope-OrgID": "team-a"}
    assert "DISAGG_PROMETHEUS_INSECURE_SKIP_VERIFY" not in env  # verification stays on
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["prometheus-token"]["secret"]["secretName"] == "prom-token"
    assert volumes["prometheus-ca"]["configMap"]["name"] == "prom-ca"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["prometheus-token"]["readOnly"] and mounts["prometheus-ca"]["readOnly"]
    # the defaults: nothing mounted, verification on
    default = _operator_deployment(_render(helm_only, tmp_path, "rel", "ns", {}))["spec"]["template"]["spec"]
    assert [v["name"] for v in default["volumes"]] == ["tmp"]
    assert not [e for e in default["containers"][0]["env"] if "PROMETHEUS" in e["name"]]


@pytest.mark.parametrize("scope", ["cluster", "namespaces"])
def test_rbac_grants_no_wildcards_secrets_nodes_or_escalation(
    helm_only: Tools, tmp_path: Path, scope: str
) -> None:
    values: dict[str, Any] = {
        "watch": {"scope": scope, "namespaces": ["team-a"] if scope == "namespaces" else []}
    }
    docs = _render(helm_only, tmp_path, "rel", "disagg-system", values)
    rules = [rule for doc in docs if doc["kind"] in ("ClusterRole", "Role") for rule in doc["rules"]]
    assert rules
    for rule in rules:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
        assert not {"secrets", "nodes"} & set(rule["resources"]), rule
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule
    if scope == "namespaces":
        # Cluster-wide, only what kopf must read: CRDs and namespaces; everything else per namespace.
        (cluster_role,) = _kinds(docs)["ClusterRole"]
        granted = {r for rule in cluster_role["rules"] for r in rule["resources"]}
        assert granted == {"customresourcedefinitions", "namespaces"}
        assert all(set(rule["verbs"]) <= {"get", "list", "watch"} for rule in cluster_role["rules"])


COMBINATIONS: dict[str, dict[str, Any]] = {
    "cluster-scope-defaults": {},
    "namespaced-scope": {"watch": {"scope": "namespaces"}},  # namespaces filled in by the test
    "single-replica-standalone": {
        "replicaCount": 1,
        "peering": {"enabled": False},
        "metrics": {"enabled": False},
        "monitoring": {"dashboard": {"enabled": False}},
    },
    "bring-your-own-rbac": {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "ops"}},
    "prometheus-operator": {"monitoring": {"serviceMonitor": {"labels": {"release": "kube-prometheus"}}}},
    "policy-library": {"policies": {"enabled": True}},  # namespaces filled in by the test
}


@pytest.mark.parametrize("combination", list(COMBINATIONS))
def test_template_is_accepted_by_the_api_server(
    tools: Tools,
    chart_crds: list[str],
    namespace: str,
    extra_namespace: str,
    tmp_path: Path,
    combination: str,
) -> None:
    values = json.loads(json.dumps(COMBINATIONS[combination]))
    if combination == "namespaced-scope":
        values["watch"]["namespaces"] = [namespace, extra_namespace]
    if combination == "policy-library":
        values["policies"]["namespaces"] = [namespace, extra_namespace]
    api_versions = PROMETHEUS_OPERATOR_APIS if combination == "prometheus-operator" else ()
    release = _release()
    docs = _render(tools, tmp_path, release, namespace, values, api_versions)
    kinds = _kinds(docs)

    if combination == "namespaced-scope":
        roles = kinds["Role"]
        assert sorted(r["metadata"]["namespace"] for r in roles) == sorted([namespace, extra_namespace])
        assert sorted(p["metadata"]["namespace"] for p in kinds["KopfPeering"]) == sorted(
            [namespace, extra_namespace]
        )
        assert "ClusterKopfPeering" not in kinds
    if combination == "single-replica-standalone":
        args = _operator_deployment(docs)["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--standalone" in args
        assert not {"PodDisruptionBudget", "ClusterKopfPeering", "Service", "ConfigMap"} & set(kinds)
    if combination == "bring-your-own-rbac":
        assert not {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"} & set(kinds)
        assert _operator_deployment(docs)["spec"]["template"]["spec"]["serviceAccountName"] == "ops"
    if combination == "prometheus-operator":
        (monitor,) = kinds["ServiceMonitor"]
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
        (pod_monitor,) = kinds["PodMonitor"]
        endpoint = pod_monitor["spec"]["podMetricsEndpoints"][0]
        assert endpoint["port"] == "http"
        # The same target labels the ratio policy's Prometheus queries select on.
        targets = {r["sourceLabels"][0]: r["targetLabel"] for r in endpoint["relabelings"]}
        assert targets["__meta_kubernetes_pod_label_disagg_dev_deployment"] == TARGET_LABELS.deployment
        assert targets["__meta_kubernetes_pod_label_disagg_dev_role"] == TARGET_LABELS.role
        assert pod_monitor["spec"]["selector"]["matchLabels"] == {
            "app.kubernetes.io/managed-by": "disagg-operator"
        }
        (rule,) = kinds["PrometheusRule"]
        assert len(rule["spec"]["groups"][0]["rules"]) == 4
        # The real CRD's schema is enforced: an alert whose `for` is no Prometheus duration is refused.
        broken = json.loads(json.dumps(rule))
        broken["spec"]["groups"][0]["rules"][0]["for"] = "ten minutes"
        refused = tools.kubectl_run(
            "apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(broken), check=False
        )
        assert refused.returncode != 0 and "spec.groups[0].rules[0].for" in refused.stderr, refused.stderr

    if combination == "policy-library":
        library = {
            doc["metadata"]["name"]: doc["spec"]
            for path in sorted(POLICIES.glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text())
            if doc
        }
        policies = kinds["RatioPolicy"]
        assert sorted((p["metadata"]["namespace"], p["metadata"]["name"]) for p in policies) == sorted(
            (ns, name) for ns in (namespace, extra_namespace) for name in library
        )
        assert all(p["spec"] == library[p["metadata"]["name"]] for p in policies)  # the library, unchanged

    # Everything, the monitoring objects against the Prometheus Operator's CRDs the local cluster serves.
    accepted = _dry_run(tools, docs)
    for doc in docs:
        assert f"{doc['metadata']['name']} created (server dry run)" in accepted, accepted


def test_policy_library_subset_and_default_namespaces(helm_only: Tools, tmp_path: Path) -> None:
    values = {"policies": {"enabled": True, "names": ["chat"]}}
    docs = _render(helm_only, tmp_path, "rel", "ops", values)
    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in _kinds(docs)["RatioPolicy"]] == [
        ("ops", "chat")
    ]
    values["watch"] = {"scope": "namespaces", "namespaces": ["a", "b"]}
    docs = _render(helm_only, tmp_path, "rel", "ops", values)
    assert sorted(p["metadata"]["namespace"] for p in _kinds(docs)["RatioPolicy"]) == ["a", "b"]
    assert "RatioPolicy" not in _kinds(_render(helm_only, tmp_path, "rel", "ops", {}))  # opt-in


@pytest.mark.parametrize(
    ("values", "served", "rendered"),
    [
        ({}, True, True),
        ({}, False, False),
        ({"monitoring": {"prometheusRule": {"enabled": False}}}, True, False),
        ({"metrics": {"enabled": False}}, True, False),  # nothing to alert on: no ServiceMonitor either
    ],
    ids=["defaults", "no-prometheus-operator-api", "disabled", "no-metrics"],
)
def test_prometheus_rule_is_gated_like_the_service_monitor(
    helm_only: Tools, tmp_path: Path, values: dict[str, Any], served: bool, rendered: bool
) -> None:
    apis = PROMETHEUS_OPERATOR_APIS if served else ()
    kinds = _kinds(_render(helm_only, tmp_path, "rel", "ops", values, apis))
    assert ("PrometheusRule" in kinds) is rendered
    assert ("ServiceMonitor" in kinds) is (served and values.get("metrics", {}).get("enabled", True))
    if rendered:
        (rule,) = kinds["PrometheusRule"]
        assert rule["metadata"]["namespace"] == "ops"
        # it selects the series the ServiceMonitor scrapes: job is that Service's name
        (service,) = kinds["Service"]
        for alert in rule["spec"]["groups"][0]["rules"]:
            assert f'job="{service["metadata"]["name"]}", namespace="ops"' in alert["expr"], alert


def _promtool(helm_only: Tools, *args: str) -> subprocess.CompletedProcess[str]:
    """promtool of the Prometheus the project builds (disagg.cluster.binaries)."""
    return _run([str(ensure_binary("promtool")), *args], helm_only.env, check=False)


def _series(name: str, job: str, values: str, **labels: str) -> dict[str, str]:
    selector = ",".join(f'{k}="{v}"' for k, v in {"job": job, "namespace": "ops", **labels}.items())
    return {"series": f"{name}{{{selector}}}", "values": values}


def test_prometheus_rule_passes_promtool_and_its_alerts_fire(helm_only: Tools, tmp_path: Path) -> None:
    """The rendered PrometheusRule's spec is a Prometheus rule file: `promtool check rules` accepts it, and
    `promtool test rules` shows each alert firing on the operator's series after its `for` (not before),
    for this release's operator only."""
    values = {"monitoring": {"prometheusRule": {"alerts": {"operatorDown": {"for": "4m"}}}}}
    (rule,) = _kinds(_render(helm_only, tmp_path, "rel", "ops", values, PROMETHEUS_OPERATOR_APIS))[
        "PrometheusRule"
    ]
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule["spec"]))  # PrometheusRule.spec is the rule file's format
    checked = _promtool(helm_only, "check", "rules", "--lint=all", "--lint-fatal", str(rules))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 4 rules found" in checked.stdout, checked.stdout

    job, other = "rel-disagg-operator-metrics", "other-disagg-operator-metrics"
    input_series = [
        # chat: TTFT 2 s against a 1 s target from the start; ITL within its target
        _series("disagg_slo_latency_seconds", job, "2x30", deployment="chat", slo="ttft"),
        _series("disagg_slo_target_seconds", job, "1x30", deployment="chat", slo="ttft"),
        _series("disagg_slo_latency_seconds", job, "0.02x30", deployment="chat", slo="itl"),
        _series("disagg_slo_target_seconds", job, "0.05x30", deployment="chat", slo="itl"),
        # chat: limited from minute 5; its metrics available throughout
        _series("disagg_condition", job, "0x4 1x26", deployment="chat", condition="ScalingLimited"),
        _series("disagg_condition", job, "1x30", deployment="chat", condition="MetricsAvailable"),
        # rag: no metrics from the start
        _series("disagg_condition", job, "0x30", deployment="rag", condition="MetricsAvailable"),
        # another release's operator: never this release's alerts
        _series("disagg_condition", other, "0x30", deployment="x", condition="MetricsAvailable"),
        _series("up", other, "1x30", pod="o-0"),
        # this release's two operator replicas: from minute 11 one is down, the other gone
        _series("up", job, "1x10 0x20", pod="a-0"),
        _series("up", job, "1x10 stale", pod="a-1"),  # its pod gone: a staleness marker
    ]

    def alert(labels: dict[str, str], summary: str, description: str) -> dict[str, Any]:
        return {"exp_labels": labels, "exp_annotations": {"summary": summary, "description": description}}

    breach = alert(
        {"severity": "warning", "deployment": "chat", "slo": "ttft"},
        "chat: ttft over its SLO target",
        "ttft of DisaggregatedDeployment chat is 2s at the policy percentile, over its target, for 10m; "
        "see its status.autoscaling.decisions for what the policy did about it.",
    )
    limited = alert(
        {"severity": "warning", "deployment": "chat"},
        "chat: scaling limited",
        "DisaggregatedDeployment chat has had ScalingLimited=True for 15m: the replicas its policy wants "
        "cannot be had (see the condition message: Pending pods, bounds or GPU budget).",
    )
    no_metrics = alert(
        {"severity": "warning", "deployment": "rag"},
        "rag: autoscaling has no metrics",
        "DisaggregatedDeployment rag has had MetricsAvailable=False for 10m: its policy cannot read "
        "TTFT/ITL from Prometheus and holds replicas.",
    )
    down = alert(
        {"severity": "critical"},
        "the disagg operator in ops is down",
        "No replica of rel-disagg-operator-metrics in ops has been up in Prometheus for 4m: nothing "
        "reconciles or autoscales DisaggregatedDeployments.",
    )
    cases = [
        ("DisaggSLOBreach", "9m", []),  # over target, but not for 10 minutes yet
        ("DisaggSLOBreach", "11m", [breach]),
        ("DisaggScalingLimited", "18m", []),
        ("DisaggScalingLimited", "21m", [limited]),
        ("DisaggMetricsUnavailable", "9m", []),
        ("DisaggMetricsUnavailable", "11m", [no_metrics]),
        ("DisaggOperatorDown", "10m", []),
        ("DisaggOperatorDown", "14m", []),
        ("DisaggOperatorDown", "16m", [down]),
    ]
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": input_series,
                "alert_rule_test": [
                    {"eval_time": at, "alertname": name, "exp_alerts": expected}
                    for name, at, expected in cases
                ],
            }
        ],
    }
    test_file = tmp_path / "rules_test.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    tested = _promtool(helm_only, "test", "rules", str(test_file))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def _notes(tools: Tools, tmp_path: Path, values: dict[str, Any]) -> str:
    """NOTES.txt as `helm install` prints it: rendered as a template of a copy of the chart (helm
    template leaves NOTES.txt out, and helm install --dry-run needs a cluster)."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    notes = chart / "templates" / "NOTES.txt"
    (chart / "templates" / "_notes.tpl").write_text(
        '{{- define "notes" }}' + notes.read_text() + "{{- end }}"
    )
    notes.unlink()
    (chart / "templates" / "notes.yaml").write_text('notes: |\n{{ include "notes" . | indent 2 }}\n')
    args = ["template", "rel", str(chart), "-n", "ops", "--show-only", "templates/notes.yaml"]
    out = tools.helm_run(*args, "-f", str(_values_file(tmp_path, values))).stdout
    return str(yaml.safe_load(out)["notes"])


@pytest.mark.parametrize("policies", [False, True])
def test_notes_need_no_repository_and_their_deployment_is_valid(
    helm_only: Tools, tmp_path: Path, policies: bool
) -> None:
    text = _notes(helm_only, tmp_path, {"policies": {"enabled": policies}})
    assert "policies/" not in text and "examples/" not in text and "-f crds/" not in text
    assert ("--set policies.enabled=true" in text) is not policies
    assert ("kubectl get ratiopolicies -n ops" in text) is policies
    heredoc = text.split("<<'EOF'\n", 1)[1].split("\n     EOF", 1)[0]
    dd = DisaggregatedDeployment.model_validate(yaml.safe_load(textwrap.dedent(heredoc)))
    assert dd.spec.autoscaling is not None and dd.spec.autoscaling.policy_ref is not None
    assert (POLICIES / f"{dd.spec.autoscaling.policy_ref.name}.yaml").is_file()


@pytest.mark.parametrize("chart", [CHART, CRD_CHART], ids=lambda c: c.name)
def test_readme_values_table_is_helm_docs_output(helm_only: Tools, chart: Path) -> None:
    """Each chart's README.md is what helm-docs generates from its README.md.gotmpl, Chart.yaml and
    values.yaml's comments (regenerate: make chart-docs)."""
    helm_docs = ensure_binary("helm-docs")
    result = _run(
        [
            str(helm_docs),
            "--dry-run",
            "--chart-search-root",
            str(chart),
            "--template-files",
            "README.md.gotmpl",
        ],
        helm_only.env,
        True,
    )
    assert result.stdout.strip() == (chart / "README.md").read_text().strip(), "stale README: make chart-docs"
    table_row = {CHART: "| policies.enabled | bool | `false` |", CRD_CHART: "| keep | bool | `true` |"}[chart]
    assert table_row in result.stdout


def test_library_policies_are_accepted_by_the_api_server(
    tools: Tools, chart_crds: list[str], namespace: str
) -> None:
    for path in sorted(POLICIES.glob("*.yaml")):
        out = tools.kubectl_run("apply", "--dry-run=server", "-n", namespace, "-f", str(path)).stdout
        assert f"ratiopolicy.disagg.dev/{path.stem} created (server dry run)" in out, out


# ----------------------------------------------------------------------- install and the operator


def _sa_kubeconfig(k8s_api: Any, cluster: ClusterInfo, namespace: str, sa: str, dest: Path) -> Path:
    """A kubeconfig that authenticates as ServiceAccount ``namespace/sa`` with a TokenRequest token."""
    core = client.CoreV1Api(k8s_api)
    token = core.create_namespaced_service_account_token(
        sa,
        namespace,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
        ),
    ).status.token
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {"server": cluster.server, "certificate-authority": str(cluster.ca_cert)},
            }
        ],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": sa, "context": {"cluster": "local", "user": sa, "namespace": namespace}}],
        "current-context": sa,
    }
    dest.write_text(yaml.safe_dump(config))
    dest.chmod(0o600)
    return dest


def _sa_api(cluster: ClusterInfo, sa_kubeconfig: Path) -> client.ApiClient:
    from kubernetes import config as k8s_config

    return k8s_config.new_client_from_config(config_file=str(sa_kubeconfig))


def operator_args(namespaces: Sequence[str], peering: str | None, priority: int) -> list[str]:
    """`disagg run` flags, as the chart's Deployment passes them (templates/_helpers.tpl, disagg.args)."""
    args = [f"--namespace={ns}" for ns in namespaces]
    if peering is None:
        args.append("--standalone")
    else:
        args += [
            f"--peering={peering}",
            f"--peering-lifetime={PEERING_LIFETIME_S}",
            f"--peering-priority={priority}",
        ]
    return [*args, "--log-level=INFO"]


def _reconciles(metrics_port: int) -> float | None:
    """Reconciles this operator process has run (its own metrics), or None while it does not serve them."""
    try:
        text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5.0).text
    except httpx.HTTPError:
        return None
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "disagg_operator_reconciles_total"
    )


@dataclass
class OperatorProcess:
    proc: subprocess.Popen[bytes]
    log: Path
    metrics_port: int

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def reconciles(self) -> float | None:
        return _reconciles(self.metrics_port)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@contextlib.contextmanager
def running_operator(
    kubeconfig: Path, args: Sequence[str], log: Path, identity: str
) -> Iterator[OperatorProcess]:
    """`disagg run ARGS` authenticated by ``kubeconfig``, with its probe and metrics on localhost."""
    health_port, metrics_port = free_ports(2)  # held together: two distinct ports
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(log.parent),
        "KUBECONFIG": str(kubeconfig),
        "POD_ID": identity,  # kopf's identity in the peering object, as in the chart's pods
        "PYTHONUNBUFFERED": "1",
    }
    command = [
        sys.executable,
        "-m",
        "disagg",
        "run",
        *args,
        f"--liveness-endpoint=http://127.0.0.1:{health_port}/healthz",
        f"--metrics-port={metrics_port}",
        "--metrics-host=127.0.0.1",
    ]
    with log.open("wb") as handle:
        proc = subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=log.parent)
        op = OperatorProcess(proc, log, metrics_port)
        try:
            wait_for(
                lambda: op.reconciles() is not None or proc.poll() is not None,
                timeout_s=60,
                what=f"operator {identity} serving its metrics",
            )
            assert proc.poll() is None, f"operator {identity} exited:\n{op.text()[-3000:]}"
            yield op
        finally:
            op.stop()


def example_dd(name: str) -> dict[str, Any]:
    """A small vLLM + NIXL DisaggregatedDeployment (validated against the model before use)."""
    obj: dict[str, Any] = {
        "apiVersion": f"{DD_GROUP}/{DD_VERSION}",
        "kind": "DisaggregatedDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {
                "name": "llama-3.1-8b",
                "source": {"huggingFace": {"id": "meta-llama/Llama-3.1-8B-Instruct"}},
            },
            "engine": {"type": "vllm"},
            "kvTransfer": {"connector": "nixl"},
            "prefill": {"replicas": 1},
            "decode": {"replicas": 2},
        },
    }
    DisaggregatedDeployment.model_validate(obj)
    return obj


def _deployment_replicas(apps: client.AppsV1Api, namespace: str, name: str) -> int | None:
    try:
        replicas: int = apps.read_namespaced_deployment(name, namespace).spec.replicas
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return replicas


def _children_reconciled(apps: client.AppsV1Api, namespace: str, dd: str, decode: int) -> bool:
    prefill = _deployment_replicas(apps, namespace, f"{dd}-prefill")
    router = _deployment_replicas(apps, namespace, f"{dd}-router")
    return (
        prefill == 1
        and router is not None
        and _deployment_replicas(apps, namespace, f"{dd}-decode") == decode
    )


@pytest.fixture
def releases(tools: Tools, namespace: str) -> Iterator[list[str]]:
    """Releases a test installs into ``namespace``; uninstalled before the namespace goes, so their
    cluster-scoped objects (ClusterRole, ClusterRoleBinding, ClusterKopfPeering) go too."""
    installed: list[str] = []
    try:
        yield installed
    finally:
        for release in installed:
            tools.helm_run("uninstall", release, "-n", namespace, "--ignore-not-found", "--wait", check=False)


def _helm_install(
    tools: Tools, tmp_path: Path, releases: list[str], namespace: str, values: dict[str, Any]
) -> str:
    release = _release()
    releases.append(release)
    tools.helm_run(
        "install",
        release,
        str(CHART),
        "-n",
        namespace,
        "-f",
        str(_values_file(tmp_path, values, f"{release}.yaml")),
    )
    return release


def _access(api: client.ApiClient, verb: str, resource: str, namespace: str | None, group: str = "") -> bool:
    review = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                verb=verb, resource=resource, namespace=namespace, group=group
            )
        )
    )
    allowed: bool = client.AuthorizationV1Api(api).create_self_subject_access_review(review).status.allowed
    return allowed


def test_install_then_operator_reconciles_under_the_charts_rbac(
    tools: Tools,
    chart_crds: list[str],
    cluster: ClusterInfo,
    k8s_api: Any,
    namespace: str,
    extra_namespace: str,
    tmp_path: Path,
    releases: list[str],
) -> None:
    # The operator lives in `namespace` and serves only `extra_namespace` (where users deploy models).
    served = extra_namespace
    release = _helm_install(
        tools, tmp_path, releases, namespace, {"watch": {"scope": "namespaces", "namespaces": [served]}}
    )
    sa_config = _sa_kubeconfig(
        k8s_api, cluster, namespace, _fullname(release), tmp_path / "operator.kubeconfig"
    )

    with _sa_api(cluster, sa_config) as sa_api:
        # What the operator may do where it serves, and what it may not do anywhere.
        assert _access(sa_api, "create", "deployments", served, "apps")
        assert _access(sa_api, "patch", "disaggregateddeployments/status", served, DD_GROUP)
        assert _access(sa_api, "patch", "pods", served)
        assert _access(sa_api, "create", "roles", served, "rbac.authorization.k8s.io")
        assert not _access(sa_api, "create", "deployments", namespace, "apps"), "outside its namespaces"
        assert not _access(sa_api, "get", "secrets", served)
        assert not _access(sa_api, "list", "secrets", None)
        assert not _access(sa_api, "delete", "nodes", None)
        assert not _access(sa_api, "escalate", "roles", served, "rbac.authorization.k8s.io")
        assert not _access(sa_api, "bind", "roles", served, "rbac.authorization.k8s.io")
        assert not _access(sa_api, "delete", "pods", served)
        # ... and the API server really refuses it.
        core = client.CoreV1Api(sa_api)
        for call in (
            lambda: core.list_namespaced_secret("default"),
            lambda: core.list_namespaced_secret(served),
            lambda: core.delete_node("does-not-matter"),
        ):
            with pytest.raises(ApiException) as denied:
                call()
            assert denied.value.status == 403

    args = operator_args([served], _fullname(release), priority=1)
    with running_operator(sa_config, args, tmp_path / "operator.log", "op-solo") as op:
        custom = client.CustomObjectsApi(k8s_api)
        custom.create_namespaced_custom_object(DD_GROUP, DD_VERSION, served, DD_PLURAL, example_dd("demo"))
        apps = client.AppsV1Api(k8s_api)
        wait_for(
            lambda: _children_reconciled(apps, served, "demo", decode=2),
            timeout_s=RECONCILE_TIMEOUT_S,
            what=f"children of demo reconciled by the operator under RBAC; log:\n{op.text()[-3000:]}",
        )
        custom.patch_namespaced_custom_object(
            DD_GROUP, DD_VERSION, served, DD_PLURAL, "demo", {"spec": {"decode": {"replicas": 3}}}
        )
        wait_for(
            lambda: _children_reconciled(apps, served, "demo", decode=3),
            timeout_s=RECONCILE_TIMEOUT_S,
            what=f"decode scaled to 3 by the operator; log:\n{op.text()[-3000:]}",
        )
        router_sa = client.CoreV1Api(k8s_api).read_namespaced_service_account("demo-router", served)
        assert router_sa.metadata.owner_references[0].kind == "DisaggregatedDeployment"
        dd = custom.get_namespaced_custom_object(DD_GROUP, DD_VERSION, served, DD_PLURAL, "demo")
        assert dd.get("status", {}).get("conditions"), f"no status written under RBAC: {dd.get('status')}"

        # A shipped example (vLLM + NIXL, Llama-70B, a Hugging Face token Secret it never reads) under a
        # library policy: its children appear and the autoscaling loop evaluates the policy, all under RBAC.
        tools.kubectl_run("apply", "-n", served, "-f", str(POLICIES / "chat.yaml"))
        example = yaml.safe_load((REPO / "examples" / "vllm-nixl.yaml").read_text())
        assert example["spec"]["autoscaling"]["policyRef"] == {"name": "chat"}  # as shipped
        DisaggregatedDeployment.model_validate(example)
        name = example["metadata"]["name"]
        custom.create_namespaced_custom_object(DD_GROUP, DD_VERSION, served, DD_PLURAL, example)

        def evaluated() -> dict[str, Any] | None:
            obj = custom.get_namespaced_custom_object(DD_GROUP, DD_VERSION, served, DD_PLURAL, name)
            auto: dict[str, Any] | None = (obj.get("status") or {}).get("autoscaling")
            return auto if auto and auto.get("policy") == "chat" and auto.get("lastEvaluationTime") else None

        auto = wait_for(
            evaluated,
            timeout_s=RECONCILE_TIMEOUT_S,
            what=f"policy chat evaluated for {name}; log:\n{op.text()[-3000:]}",
        )
        assert auto["mode"] == "active"
        for role in ("prefill", "decode", "router"):
            assert _deployment_replicas(apps, served, f"{name}-{role}") is not None, role

        assert op.proc.poll() is None, op.text()[-3000:]
        assert "forbidden" not in op.text().lower(), op.text()[-3000:]
        assert (op.reconciles() or 0) >= 2


def _labelled(k8s_api: Any, release: str, namespaces: Sequence[str]) -> list[str]:
    """Every object of the kinds the chart creates that carries this release's instance label."""
    selector = f"app.kubernetes.io/instance={release}"
    core, apps, rbac = (
        client.CoreV1Api(k8s_api),
        client.AppsV1Api(k8s_api),
        client.RbacAuthorizationV1Api(k8s_api),
    )
    policy, custom = client.PolicyV1Api(k8s_api), client.CustomObjectsApi(k8s_api)
    found: list[str] = []
    found += [f"ClusterRole/{o.metadata.name}" for o in rbac.list_cluster_role(label_selector=selector).items]
    found += [
        f"ClusterRoleBinding/{o.metadata.name}"
        for o in rbac.list_cluster_role_binding(label_selector=selector).items
    ]
    found += [
        f"ClusterKopfPeering/{o['metadata']['name']}"
        for o in custom.list_cluster_custom_object(
            "kopf.dev", "v1", "clusterkopfpeerings", label_selector=selector
        )["items"]
    ]
    for ns in namespaces:
        listings = {
            "Deployment": apps.list_namespaced_deployment(ns, label_selector=selector).items,
            "ServiceAccount": core.list_namespaced_service_account(ns, label_selector=selector).items,
            "Service": core.list_namespaced_service(ns, label_selector=selector).items,
            "ConfigMap": core.list_namespaced_config_map(ns, label_selector=selector).items,
            "Role": rbac.list_namespaced_role(ns, label_selector=selector).items,
            "RoleBinding": rbac.list_namespaced_role_binding(ns, label_selector=selector).items,
            "PodDisruptionBudget": policy.list_namespaced_pod_disruption_budget(
                ns, label_selector=selector
            ).items,
        }
        for kind, items in listings.items():
            found += [f"{kind}/{ns}/{o.metadata.name}" for o in items]
        found += [
            f"KopfPeering/{ns}/{o['metadata']['name']}"
            for o in custom.list_namespaced_custom_object(
                "kopf.dev", "v1", ns, "kopfpeerings", label_selector=selector
            )["items"]
        ]
        # The Prometheus Operator's kinds (their CRDs are installed by the local control plane)
        for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
            found += [
                f"{kind}/{ns}/{o['metadata']['name']}"
                for o in custom.list_namespaced_custom_object(
                    "monitoring.coreos.com", "v1", ns, f"{kind.lower()}s", label_selector=selector
                )["items"]
            ]
    return sorted(found)


def test_upgrade_and_uninstall_leave_no_orphans(
    tools: Tools,
    chart_crds: list[str],
    k8s_api: Any,
    namespace: str,
    extra_namespace: str,
    tmp_path: Path,
    releases: list[str],
) -> None:
    both = {"watch": {"scope": "namespaces", "namespaces": [namespace, extra_namespace]}}
    release = _helm_install(tools, tmp_path, releases, namespace, both)
    installed = _labelled(k8s_api, release, [namespace, extra_namespace])
    assert f"Role/{extra_namespace}/{_fullname(release)}" in installed
    assert f"KopfPeering/{extra_namespace}/{_fullname(release)}" in installed
    assert f"ConfigMap/{namespace}/{_fullname(release)}-dashboard" in installed
    # The cluster serves monitoring.coreos.com/v1, so helm created the monitoring objects for real.
    for kind, suffix in (("ServiceMonitor", ""), ("PodMonitor", "-engines"), ("PrometheusRule", "")):
        assert f"{kind}/{namespace}/{_fullname(release)}{suffix}" in installed, installed

    # Narrow the watched namespaces, drop the dashboard and the alerts: what is no longer rendered must go.
    narrower = {
        "watch": {"scope": "namespaces", "namespaces": [namespace]},
        "monitoring": {"dashboard": {"enabled": False}, "prometheusRule": {"enabled": False}},
    }
    tools.helm_run(
        "upgrade",
        release,
        str(CHART),
        "-n",
        namespace,
        "-f",
        str(_values_file(tmp_path, narrower, "up.yaml")),
    )
    upgraded = _labelled(k8s_api, release, [namespace, extra_namespace])
    assert not [o for o in upgraded if f"/{extra_namespace}/" in o], upgraded
    assert f"ConfigMap/{namespace}/{_fullname(release)}-dashboard" not in upgraded
    assert f"PrometheusRule/{namespace}/{_fullname(release)}" not in upgraded
    assert f"Role/{namespace}/{_fullname(release)}" in upgraded

    # Switch to cluster scope: namespaced Roles give way to one ClusterRole with every rule.
    tools.helm_run("upgrade", release, str(CHART), "-n", namespace, "--set", "watch.scope=cluster")
    cluster_scoped = _labelled(k8s_api, release, [namespace, extra_namespace])
    assert not [o for o in cluster_scoped if o.startswith(("Role/", "RoleBinding/", "KopfPeering/"))], (
        cluster_scoped
    )
    assert f"ClusterKopfPeering/{_fullname(release)}" in cluster_scoped

    tools.helm_run("uninstall", release, "-n", namespace, "--wait")
    assert _labelled(k8s_api, release, [namespace, extra_namespace]) == []
    # helm keeps CRDs from crds/ on uninstall, as documented.
    crds = client.ApiextensionsV1Api(k8s_api)
    for name in chart_crds:
        crds.read_custom_resource_definition(name)


# -------------------------------------------------------------------------------------- peering


def _peering_status(k8s_api: Any, namespace: str, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(k8s_api).get_namespaced_custom_object(
        "kopf.dev", "v1", namespace, "kopfpeerings", name
    )
    status: dict[str, Any] = obj.get("status") or {}
    return status


def test_two_operators_only_one_acts_and_the_standby_takes_over(
    tools: Tools,
    chart_crds: list[str],
    cluster: ClusterInfo,
    k8s_api: Any,
    namespace: str,
    extra_namespace: str,
    tmp_path: Path,
    releases: list[str],
) -> None:
    served = extra_namespace
    release = _helm_install(
        tools,
        tmp_path,
        releases,
        namespace,
        {
            "watch": {"scope": "namespaces", "namespaces": [served]},
            "peering": {"lifetime": PEERING_LIFETIME_S},
        },
    )
    peering = _fullname(release)
    sa_config = _sa_kubeconfig(k8s_api, cluster, namespace, peering, tmp_path / "operator.kubeconfig")
    custom, apps = client.CustomObjectsApi(k8s_api), client.AppsV1Api(k8s_api)

    leader_args = operator_args([served], peering, priority=200)
    standby_args = operator_args([served], peering, priority=100)
    with contextlib.ExitStack() as stack:
        # kopf starts every operator paused until it has seen the peering object: the leader, alone,
        # resumes; the standby, started next, sees a higher priority and stays paused.
        leader = stack.enter_context(
            running_operator(sa_config, leader_args, tmp_path / "leader.log", "op-leader")
        )
        wait_for(
            lambda: RESUMED in leader.text(),
            timeout_s=60,
            what=f"the leader resuming; log:\n{leader.text()[-2000:]}",
        )
        standby = stack.enter_context(
            running_operator(sa_config, standby_args, tmp_path / "standby.log", "op-standby")
        )
        wait_for(
            lambda: {"op-leader", "op-standby"} <= set(_peering_status(k8s_api, served, peering)),
            timeout_s=60,
            what=f"both operators' keep-alives in KopfPeering {served}/{peering}",
        )
        status = _peering_status(k8s_api, served, peering)
        assert status["op-leader"]["priority"] > status["op-standby"]["priority"]

        custom.create_namespaced_custom_object(DD_GROUP, DD_VERSION, served, DD_PLURAL, example_dd("ha"))
        wait_for(
            lambda: _children_reconciled(apps, served, "ha", decode=2),
            timeout_s=RECONCILE_TIMEOUT_S,
            what=f"children of ha reconciled by the leader; log:\n{leader.text()[-3000:]}",
        )
        # Only one acts: every reconcile so far ran in the leader (each process counts its own; the
        # counter moves when the handler returns, just after the children it applied are visible).
        wait_for(lambda: (leader.reconciles() or 0) >= 1, timeout_s=30, what="the leader's reconcile count")
        assert standby.reconciles() == 0, f"the paused standby reconciled; log:\n{standby.text()[-3000:]}"
        assert RESUMED not in standby.text(), standby.text()[-3000:]

        # The leader dies without saying goodbye (as on a node loss): the standby resumes once its
        # keep-alive expires, and handles the next change.
        leader.stop(signal.SIGKILL)
        wait_for(
            lambda: RESUMED in standby.text(),
            timeout_s=PEERING_LIFETIME_S + 30,
            what=f"the standby taking over within the peering lifetime; log:\n{standby.text()[-2000:]}",
        )
        custom.patch_namespaced_custom_object(
            DD_GROUP, DD_VERSION, served, DD_PLURAL, "ha", {"spec": {"decode": {"replicas": 3}}}
        )
        wait_for(
            lambda: _children_reconciled(apps, served, "ha", decode=3),
            timeout_s=RECONCILE_TIMEOUT_S,
            what=f"decode scaled to 3 by the former standby; log:\n{standby.text()[-3000:]}",
        )
        wait_for(
            lambda: (standby.reconciles() or 0) >= 1, timeout_s=30, what="the former standby's reconciles"
        )


# --------------------------------------------------------- CRD upgrades, packaged charts, an OCI registry

# The previous chart version, built from git. Nothing was published before the disagg-crds chart existed,
# so the previous version is the repository at 4ea945b^ (the parent of "spec.common: settings both pools
# inherit", whose CRDs lack spec.common) made a disagg-crds chart by the same charts/sync-crds.sh, tagged
# 0.1.0 in its Chart.yaml (the operator chart's version then).
PREVIOUS_COMMIT = "49b7214fb9f10353c6e08259ff78526e8a22abe6"
PREVIOUS_VERSION = "0.1.0"
NEW_FIELD = "common"  # DisaggregatedDeployment spec.common, added by 4ea945b
DD_CRD = f"{DD_PLURAL}.{DD_GROUP}"
CHART_CRDS = (DD_CRD, f"ratiopolicies.{DD_GROUP}", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev")


def _chart_version(chart: Path) -> str:
    return str(yaml.safe_load((chart / "Chart.yaml").read_text())["version"])


def _git(*args: str) -> bytes:
    result = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, timeout=60, check=False)
    assert result.returncode == 0, (
        f"git {' '.join(args)} failed; the test builds the previous chart version from the repository's "
        f"history, which a shallow clone lacks:\n{result.stderr.decode(errors='replace')}"
    )
    return result.stdout


def _previous_crd_chart(root: Path) -> Path:
    """The disagg-crds chart at PREVIOUS_VERSION: PREVIOUS_COMMIT's CRDs (crds/ and the operator chart's
    kopf-peering.yaml) made templates by charts/sync-crds.sh, in this chart's frame."""
    (root / "crds").mkdir(parents=True)
    for path in _git("ls-tree", "--name-only", PREVIOUS_COMMIT, "crds/").decode().split():
        (root / path).write_bytes(_git("show", f"{PREVIOUS_COMMIT}:{path}"))
    peering = Path("charts/disagg-operator/crds/kopf-peering.yaml")
    (root / peering.parent).mkdir(parents=True)
    (root / peering).write_bytes(_git("show", f"{PREVIOUS_COMMIT}:{peering}"))
    shutil.copy(REPO / "charts" / "sync-crds.sh", root / "charts" / "sync-crds.sh")
    chart = root / "charts" / "disagg-crds"
    shutil.copytree(CRD_CHART, chart, ignore=shutil.ignore_patterns("templates"))
    chart_yaml = chart / "Chart.yaml"
    text = chart_yaml.read_text()
    chart_yaml.write_text(
        text.replace(f"\nversion: {_chart_version(CRD_CHART)}\n", f"\nversion: {PREVIOUS_VERSION}\n")
    )
    _run(
        ["sh", str(root / "charts" / "sync-crds.sh")], {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, True
    )
    assert _chart_version(chart) == PREVIOUS_VERSION
    return chart


@pytest.mark.parametrize("keep", [True, False])
def test_crd_chart_renders_the_crds_as_generated(helm_only: Tools, keep: bool) -> None:
    """disagg-crds renders every CRD exactly as generated (crds/ and kopf's peering CRDs), plus
    helm.sh/resource-policy: keep unless keep=false."""
    helm_only.helm_run("lint", "--strict", str(CRD_CHART))
    out = helm_only.helm_run("template", "crds", str(CRD_CHART), "--set", f"keep={str(keep).lower()}").stdout
    rendered = {doc["metadata"]["name"]: doc for doc in yaml.safe_load_all(out) if doc}
    sources = [*sorted((REPO / "crds").glob("*.yaml")), CHART / "crds" / "kopf-peering.yaml"]
    generated = [doc for path in sources for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert sorted(rendered) == sorted(doc["metadata"]["name"] for doc in generated)
    for doc in generated:
        expected = json.loads(json.dumps(doc))
        if keep:
            expected["metadata"]["annotations"] = {"helm.sh/resource-policy": "keep"}
        assert rendered[doc["metadata"]["name"]] == expected, doc["metadata"]["name"]


def _package(tools: Tools, chart: Path, dest: Path) -> Path:
    """`helm package CHART`: the .tgz it wrote."""
    out = tools.helm_run("package", str(chart), "--destination", str(dest)).stdout
    path = Path(out.strip().rsplit(": ", 1)[1])  # "Successfully packaged chart and saved it to: PATH"
    assert path.is_file() and path.parent == dest, out
    return path


def _release_chart(tools: Tools, release: str, namespace: str) -> str:
    """The chart (NAME-VERSION) a release runs, as `helm list` reports it."""
    listed = json.loads(tools.helm_run("list", "-n", namespace, "-o", "json").stdout)
    (entry,) = [r for r in listed if r["name"] == release]
    return str(entry["chart"])


def _dd_spec_schema(tools: Tools) -> dict[str, Any]:
    """The spec properties of the DisaggregatedDeployment CRD as the API server stores it."""
    crd = json.loads(tools.kubectl_run("get", "crd", DD_CRD, "-o", "json").stdout)
    (version,) = crd["spec"]["versions"]
    properties: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    return properties


def _get_dd(tools: Tools, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(
        tools.kubectl_run("get", "dd", name, "-n", namespace, "-o", "json").stdout
    )
    return obj


@pytest.fixture
def fresh_tools(helm_only: Tools, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tools]:
    """helm and kubectl against a control plane of the test's own, where no disagg CRD exists yet: the
    session cluster's CRDs are current and every other test uses them, so the previous version's cannot be
    installed there. No nodes: only the API server's part is tested."""
    fresh = LocalCluster(
        state_dir=tmp_path_factory.mktemp("fresh-cluster"),
        nodes=(),
        settings=ClusterSettings(tie_to_parent=True),
    )
    try:
        info = fresh.up()
        yield Tools(
            helm=helm_only.helm,
            kubectl=helm_only.kubectl,
            env={**helm_only.env, "KUBECONFIG": str(info.kubeconfig)},
        )
    finally:
        fresh.down(keep_state=True)  # logs stay in pytest's temporary directory


def test_crd_chart_upgrade_from_the_previous_version_adds_the_new_field(
    fresh_tools: Tools, tmp_path: Path
) -> None:
    """Install the previous disagg-crds chart version from its package, keep an object of it, `helm upgrade`
    to the current package: the API server stores the new field's schema, the object survives, and the new
    field, refused before, is accepted and stored; `helm uninstall` leaves the CRDs and the object."""
    tools, ns, release = fresh_tools, "default", "disagg-crds"
    packages = tmp_path / "packages"
    previous = _package(tools, _previous_crd_chart(tmp_path / "previous"), packages)
    current = _package(tools, CRD_CHART, packages)
    version = _chart_version(CRD_CHART)
    assert (previous.name, current.name) == (
        f"disagg-crds-{PREVIOUS_VERSION}.tgz",
        f"disagg-crds-{version}.tgz",
    )

    tools.helm_run("install", release, str(previous), "-n", ns, "--wait")
    tools.kubectl_run(
        "wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{n}" for n in CHART_CRDS]
    )
    assert _release_chart(tools, release, ns) == f"disagg-crds-{PREVIOUS_VERSION}"
    assert NEW_FIELD not in _dd_spec_schema(tools)
    # An object of the previous version; one that sets the new field is refused (kubectl apply validates
    # fields strictly on the server).
    survivor = example_dd("survivor")
    tools.kubectl_run("apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(survivor))
    uid = _get_dd(tools, ns, "survivor")["metadata"]["uid"]
    common = {"nodeSelector": {"pool": "a"}}
    with_common = yaml.safe_dump({**survivor, "spec": {**survivor["spec"], NEW_FIELD: common}})
    refused = tools.kubectl_run("apply", "-n", ns, "-f", "-", stdin=with_common, check=False)
    assert refused.returncode != 0 and f'unknown field "spec.{NEW_FIELD}"' in refused.stderr, refused

    tools.helm_run("upgrade", release, str(current), "-n", ns, "--wait")
    assert _release_chart(tools, release, ns) == f"disagg-crds-{version}"
    assert NEW_FIELD in _dd_spec_schema(tools)

    # The API server serves the new schema a moment after the CRD update: applied until it is accepted.
    last: list[subprocess.CompletedProcess[str]] = []

    def stored() -> dict[str, Any] | None:
        last[:] = [tools.kubectl_run("apply", "-n", ns, "-f", "-", stdin=with_common, check=False)]
        return _get_dd(tools, ns, "survivor") if last[0].returncode == 0 else None

    try:
        upgraded = wait_for(stored, timeout_s=60, what="spec.common accepted after the upgrade")
    except WaitTimeout as timeout:
        raise AssertionError(f"{timeout}; the last kubectl apply: {last}") from timeout
    assert upgraded["spec"][NEW_FIELD] == common  # stored, not pruned
    assert upgraded["metadata"]["uid"] == uid  # the same object, not a re-created one
    assert upgraded["spec"]["decode"]["replicas"] == 2 and upgraded["spec"]["engine"]["type"] == "vllm"

    tools.helm_run("uninstall", release, "-n", ns, "--wait")
    for name in CHART_CRDS:  # helm.sh/resource-policy: keep
        tools.kubectl_run("get", "crd", name)
    assert _get_dd(tools, ns, "survivor")["metadata"]["uid"] == uid


@pytest.fixture(scope="module")
def oci_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The CNCF distribution registry (built by disagg.cluster.binaries) on 127.0.0.1, plain HTTP, storing
    under a temporary directory; its HOST:PORT."""
    binary = ensure_binary("registry")
    # the pinned release, stamped as distribution's Makefile does (disagg.cluster.binaries)
    stamp = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30, check=True)
    assert stamp.stdout.split()[1:] == ["github.com/distribution/distribution/v3", Versions().registry]
    root = tmp_path_factory.mktemp("oci-registry")
    (port,) = free_ports(1)
    # distribution's configuration (cmd/registry/config-dev.yml of v3.1.2, reduced): filesystem storage
    config = {
        "version": 0.1,
        "log": {"level": "info"},
        "storage": {"filesystem": {"rootdirectory": str(root / "data")}},
        "http": {"addr": f"127.0.0.1:{port}"},
    }
    (root / "config.yml").write_text(yaml.safe_dump(config))
    log = root / "registry.log"
    # no OpenTelemetry exporter (distribution v3 traces through autoexport, which reads this variable)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root), "OTEL_TRACES_EXPORTER": "none"}
    proc = spawn_logged([str(binary), "serve", str(root / "config.yml")], log, env=env, tie_to_parent=True)
    try:

        def serving() -> bool:
            assert proc.poll() is None, f"the registry exited:\n{log.read_text(errors='replace')[-3000:]}"
            try:
                return httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(serving, timeout_s=60, what="the registry answering /v2/")
        yield f"127.0.0.1:{port}"
    finally:
        stop_process_group(proc)


def test_packaged_charts_push_to_an_oci_registry_and_install_from_it(
    tools: Tools,
    chart_crds: list[str],
    oci_registry: str,
    k8s_api: Any,
    namespace: str,
    tmp_path: Path,
    releases: list[str],
) -> None:
    """`helm package` both charts, `helm push` them to a local OCI registry, and install from there: the
    CRD chart adopting the CRDs the cluster has (as the operator chart's crds/ leaves them: owned by no
    release), the operator chart from its .tgz, then upgraded from the registry."""
    version = _chart_version(CHART)
    assert _chart_version(CRD_CHART) == version
    packages = tmp_path / "packages"
    tgz = {chart.name: _package(tools, chart, packages) for chart in (CRD_CHART, CHART)}
    repo = f"oci://{oci_registry}/charts"
    for name, path in tgz.items():
        pushed = tools.helm_run("push", str(path), repo, "--plain-http")
        assert f"Pushed: {oci_registry}/charts/{name}:{version}" in pushed.stdout + pushed.stderr
    for name, path in tgz.items():  # the registry serves the package, byte for byte
        pulled = tmp_path / "pulled" / name
        pulled.mkdir(parents=True)
        tools.helm_run(
            "pull", f"{repo}/{name}", "--version", version, "--plain-http", "--destination", str(pulled)
        )
        assert (pulled / path.name).read_bytes() == path.read_bytes()

    crd_release = _release()
    releases.append(crd_release)
    oci = ("--version", version, "--plain-http", "-n", namespace)
    tools.helm_run("install", crd_release, f"{repo}/disagg-crds", *oci, "--take-ownership")
    assert _release_chart(tools, crd_release, namespace) == f"disagg-crds-{version}"
    for name in chart_crds:
        annotations = json.loads(tools.kubectl_run("get", "crd", name, "-o", "json").stdout)["metadata"][
            "annotations"
        ]
        assert annotations["meta.helm.sh/release-name"] == crd_release, name
        assert annotations["helm.sh/resource-policy"] == "keep", name

    release = _release()
    releases.append(release)
    values = _values_file(tmp_path, {"watch": {"scope": "namespaces", "namespaces": [namespace]}}, "oci.yaml")
    tools.helm_run("install", release, str(tgz[CHART.name]), "-n", namespace, "-f", str(values))
    tools.helm_run(
        "upgrade", release, f"{repo}/disagg-operator", *oci, "--reuse-values", "--set", "replicaCount=3"
    )
    listed = {r["name"]: r for r in json.loads(tools.helm_run("list", "-n", namespace, "-o", "json").stdout)}
    assert listed[release]["chart"] == f"disagg-operator-{version}"
    assert str(listed[release]["revision"]) == "2"
    deployment = client.AppsV1Api(k8s_api).read_namespaced_deployment(_fullname(release), namespace)
    assert deployment.spec.replicas == 3  # the upgrade from the registry took effect
    assert deployment.metadata.labels["helm.sh/chart"] == f"disagg-operator-{version}"

"""Property tests: any valid DisaggregatedDeployment renders manifests that keep Kubernetes' structural rules.

Checked on every child: names are DNS labels of at most 63 characters, labels are valid keys and values,
container port names are unique IANA service names and numbers unique, env names unique, GPU requests
equal the role's tensor-parallel size, replicas follow effective_replicas and lie within the bounds,
selectors (Deployment, Service, PDB) match the pod labels, Service targetPorts name container ports,
and the grace period covers preStop plus the drain timeout.
"""

from __future__ import annotations

import re
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from disagg.api.deployment import DisaggregatedDeployment
from disagg.api.support import SUPPORT_MATRIX
from disagg.render import effective_replicas, render_children

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
IANA_SVC_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9]([a-z0-9-]*[a-z0-9])?$")

names = st.from_regex(r"\A[a-z]([-a-z0-9]{0,44}[a-z0-9])?\Z")
ACCEPTED = tuple(sorted((c.engine, c.connector) for c in SUPPORT_MATRIX if c.accepted))


@st.composite
def deployments(draw: st.DrawFn) -> DisaggregatedDeployment:
    engine, connector = draw(st.sampled_from(ACCEPTED))
    roles: dict[str, Any] = {}
    for role in ("prefill", "decode"):
        tp = draw(st.sampled_from([1, 2, 4, 8]))
        resources: dict[str, Any] = {"requests": {"cpu": str(draw(st.integers(1, 64)))}}
        if draw(st.booleans()):
            resources["limits"] = {"nvidia.com/gpu": draw(st.sampled_from([tp, str(tp)]))}
        roles[role] = {
            "replicas": draw(st.integers(0, 12)),
            "tensorParallelSize": tp,
            "resources": resources,
            "shutdownTimeoutSeconds": draw(st.integers(0, 600)),
            "preStopSleepSeconds": draw(st.integers(0, 30)),
            "env": [{"name": "EXTRA", "value": "1"}] if draw(st.booleans()) else [],
        }
    spec: dict[str, Any] = {
        "model": {
            "name": "m",
            "source": draw(
                st.sampled_from(
                    [
                        {"huggingFace": {"id": "org/model", "tokenSecretRef": {"name": "hf"}}},
                        {"pvc": {"claimName": "weights", "path": "m"}},
                    ]
                )
            ),
        },
        "engine": {"type": engine},
        "kvTransfer": {
            "connector": connector,
            "rdmaDevice": draw(st.sampled_from([None, "mlx5_0"])),
            "bootstrapPort": draw(st.integers(1024, 65535)),
            "sideChannelPort": draw(st.integers(1024, 65535)),
            "rdma": draw(
                st.sampled_from(
                    [None, {}, {"resourceName": "rdma/hca_shared_devices_a", "networks": "ns/ib"}]
                )
            ),
        },
        **roles,
        "router": {"replicas": draw(st.integers(0, 3)), "port": draw(st.integers(1, 65535))},
    }
    spec["kvTransfer"] = {k: v for k, v in spec["kvTransfer"].items() if v is not None}
    status: dict[str, Any] | None = None
    if draw(st.booleans()):
        bounds = {}
        for role in ("prefill", "decode"):
            low = draw(st.integers(0, roles[role]["replicas"]))
            high = draw(st.integers(roles[role]["replicas"], 16))
            bounds[role] = {"minReplicas": low, "maxReplicas": high}
        spec["autoscaling"] = {"enabled": True, "policyRef": {"name": "p"}, **bounds}
        status = {
            "autoscaling": {
                "mode": draw(st.sampled_from(["active", "advisory"])),
                "desiredReplicas": {"prefill": draw(st.integers(0, 20)), "decode": draw(st.integers(0, 20))},
            }
        }
    doc: dict[str, Any] = {"metadata": {"name": draw(names), "namespace": "ns"}, "spec": spec}
    if status:
        doc["status"] = status
    try:
        return DisaggregatedDeployment.model_validate(doc)
    except ValidationError:
        assume(False)  # e.g. two ports drawn equal: the model refuses it, as it should
        raise


def check_labels(labels: dict[str, str]) -> None:
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        assert not prefix or (len(prefix) <= 253 and DNS1123_SUBDOMAIN.match(prefix)), key
        assert len(name) <= 63 and LABEL_NAME.match(name), key
        assert len(value) <= 63 and LABEL_VALUE.match(value), f"{key}={value}"


def check_pod(dd: DisaggregatedDeployment, deployment: dict[str, Any]) -> None:
    template = deployment["spec"]["template"]
    check_labels(template["metadata"]["labels"])
    assert deployment["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    for container in template["spec"]["containers"]:
        port_names = [p["name"] for p in container.get("ports", [])]
        port_numbers = [p["containerPort"] for p in container.get("ports", [])]
        assert len(port_names) == len(set(port_names)) and len(port_numbers) == len(set(port_numbers))
        assert all(len(n) <= 15 and IANA_SVC_NAME.match(n) for n in port_names), port_names
        assert all(1 <= n <= 65535 for n in port_numbers)
        env_names = [e["name"] for e in container.get("env", [])]
        assert len(env_names) == len(set(env_names)), env_names
    role = template["metadata"]["labels"]["disagg.dev/role"]
    if role in ("prefill", "decode"):
        role_spec = dd.spec.role(role)
        engine = template["spec"]["containers"][0]
        tp = str(role_spec.tensor_parallel_size)
        assert (
            engine["resources"]["requests"]["nvidia.com/gpu"]
            == engine["resources"]["limits"]["nvidia.com/gpu"]
            == tp
        )
        grace = template["spec"]["terminationGracePeriodSeconds"]
        assert grace >= role_spec.pre_stop_sleep_seconds + role_spec.shutdown_timeout_seconds


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deployments())
def test_any_valid_spec_renders_structurally_valid_manifests(dd: DisaggregatedDeployment) -> None:
    replicas = effective_replicas(dd)
    children = render_children(dd, replicas)
    keys = [(c["kind"], c["metadata"]["name"]) for c in children]
    assert len(keys) == len(set(keys)), "duplicate child"
    pods: dict[str, dict[str, str]] = {}
    container_ports: dict[str, set[str]] = {}
    for child in children:
        name = child["metadata"]["name"]
        assert len(name) <= 63 and DNS1035.match(name), name
        check_labels(child["metadata"]["labels"])
        if child["kind"] == "Deployment":
            check_pod(dd, child)
            role = child["spec"]["template"]["metadata"]["labels"]["disagg.dev/role"]
            pods[role] = child["spec"]["template"]["metadata"]["labels"]
            container_ports[role] = {
                p["name"] for p in child["spec"]["template"]["spec"]["containers"][0]["ports"]
            }
            if role in replicas:
                assert child["spec"]["replicas"] == replicas[role]
                bounds = dd.spec.autoscaling.bounds(role) if dd.spec.autoscaling else None  # type: ignore[arg-type]
                if bounds is not None:
                    assert bounds.min_replicas <= child["spec"]["replicas"] <= bounds.max_replicas
    for child in children:
        if child["kind"] in ("Service", "PodDisruptionBudget"):
            selector = child["spec"]["selector"]
            selector = selector.get("matchLabels", selector)
            role = selector["disagg.dev/role"]
            assert selector.items() <= pods[role].items(), child["metadata"]["name"]
        if child["kind"] == "Service":
            role = child["spec"]["selector"]["disagg.dev/role"]
            for port in child["spec"]["ports"]:
                assert port["targetPort"] in container_ports[role], (child["metadata"]["name"], port)

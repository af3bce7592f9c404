"""Hostile and broken input against the real API server (issue 13, item 7).

Hypothesis mutates valid DisaggregatedDeployments (the examples) and RatioPolicies (the policy library's
chat policy): wrong types, numbers at and past their bounds, huge strings, unicode and emoji, quantities
such as ``256GB``, tolerations with operator ``Exist``, parallelism that does not divide, and input that
tries to take what the operator owns (a second ``--kv-transfer-config``, also spelled the ways vLLM's
argument parser reads it, an ``HF_TOKEN`` env, a podTemplate volume named ``dshm``). Every object must
end one of three ways:

- the API server refuses it (422/400) with a message naming the field (``spec.`` or ``metadata.``);
- the operator refuses it: :func:`disagg.controller.reconcile.validate` or ``render`` returns a Problem
  (the object's ``Degraded`` condition) whose message names the field;
- every rendered child passes a server-side dry run with strict field validation, and what the operator
  owns is still the operator's (one ``--kv-transfer-config``, ``HF_TOKEN`` only from a secretKeyRef, one
  ``dshm`` volume, an emptyDir in memory).

Any other exception is a bug. RatioPolicies end refused naming the field, or accepted: the model reads the
stored object and the policy decides from it without an exception. Dry runs only (``dryRun=All``): nothing
is stored, so the examples are independent; 2 x 40 examples take about 20 s on 2 cores.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disagg.api.deployment import DisaggregatedDeployment
from disagg.api.ratiopolicy import RatioPolicy
from disagg.controller.reconcile import render, validate
from disagg.k8s.client import DISAGG_DEPLOYMENT, RATIO_POLICY
from disagg.policy import Measured, Observation, PolicyState, RoleObservation, decide
from disagg.policy.bounds import bounds_for

ROOT = Path(__file__).resolve().parents[2]
BASES = {
    name: yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
    for name in ("vllm-nixl", "sglang-mooncake", "sglang-nixl", "vllm-nixl-gateway")
}
POLICY_BASE = yaml.safe_load((ROOT / "policies" / "chat.yaml").read_text())
EXAMPLES = 40
# Deterministic (CI reruns the same examples), bounded, and no health check a fixture or a slow API
# server trips; the project's profile (tests/conftest.py) already has no deadline.
HOSTILE = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

Path_ = tuple[str, ...]
Mutation = tuple[Path_, Any]
DELETE = object()  # a mutation that removes the field

# ------------------------------------------------------------------------------------------- values

WRONG_TYPES = st.sampled_from(["1", "one", 1.5, True, None, [], {}, [1], {"a": 1}])
HUGE = st.sampled_from(["a" * 63, "a" * 64, "a" * 253, "a" * 254, "a" * 1025, "a" * 5000, "x" * 40000])
UNICODE = st.sampled_from(
    ["🦙", "llama-🦙", "Ünïcödé", "名前", "a b", " leading", "trailing ", "", "\t", "a\nb", "..", "../x"]
)
TEXT = st.text(min_size=0, max_size=24)
STRINGS = st.one_of(HUGE, UNICODE, TEXT, WRONG_TYPES)
NUMBERS = st.sampled_from(
    [
        *(-1, 0, 1, 2, 3, 5, 7, 8, 59, 60, 64, 65, 100, 101, 1000, 1001, 1023, 1024, 2000, 2001, 3600),
        *(3601, 5600, 8000, 8998, 29000, 30000, 65535, 65536, 86400, 86401, 10_000_000, 10_000_001),
        *(2**31, 2**53, 2**63 - 1),
    ]
)
INTS = st.one_of(NUMBERS, st.integers(-(2**40), 2**40), WRONG_TYPES)
QUANTITIES = st.sampled_from(
    [
        *("256GB", "1Gi", "1gi", "64Gi", "0.5", "500m", "-1", "-1Gi", "1e3", "1e999", "8", 8, 0, -4, 1.5),
        *("", "🦙", "1.2.3", "0x10", "+1", ".5", "5.", "Gi", "2E", "1Ei", "99999999999999999999"),
    ]
)
RESOURCE_NAMES = st.sampled_from(
    ["cpu", "memory", "ephemeral-storage", "nvidia.com/gpu", "example.com/foo", "foo", "🦙", "hugepages-2Mi"]
)
LABEL_KEYS = st.sampled_from(["nvidia.com/gpu.product", "zone", "a/b/c", "🦙", "-bad", "x" * 64, ""])
LABEL_VALUES = st.sampled_from(["NVIDIA-H100-80GB-HBM3", "", "a b", "🦙", "x" * 64, "-bad", "ok.value_1"])
TOLERATIONS = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "key": st.sampled_from(["nvidia.com/gpu", "", "🦙", "a b", "dedicated"]),
            "operator": st.sampled_from(["Exists", "Equal", "Exist", "exists", "", "Lt"]),
            "value": st.sampled_from(["present", "", "🦙", "x" * 64]),
            "effect": st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute", "Never", ""]),
            "tolerationSeconds": st.sampled_from([0, 30, -1, "30"]),
        },
    ),
    max_size=3,
)
OWNED_ARGS = st.sampled_from(
    [
        ["--kv-transfer-config", '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'],
        ['--kv-transfer-config={"kv_connector":"X"}'],
        ['--kv_transfer_config={"kv_connector":"X"}'],
        ["--kv_transfer_config", '{"kv_connector":"X"}'],
        ["--kv-transfer-config.kv_connector=X"],
        ["--kv-transfer-config.kv_role", "kv_both"],
        ["--port", "9000"],
        ["--port=9000"],
        ["--tensor_parallel_size=4"],
        ["--served_model_name", "other"],
        ["-tp", "2"],
        ["--tp-size=2"],
        ["--disaggregation-mode", "null"],
        ["--host", "0.0.0.0"],
        ["--enable-prefix-caching"],
        ["--max-num-seqs", "🦙"],
        ["--portal"],
        ["a" * 4096],
        ["a" * 4097],
        ["x"] * 129,
    ]
)
ENV_ITEMS = st.sampled_from(
    [
        {"name": "HF_TOKEN", "value": "hf_plaintext"},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "other", "key": "token"}}},
        {"name": "POD_NAMESPACE", "value": "elsewhere"},
        {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": "1"},
        {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "value": "0.0.0.0"},
        {"name": "NCCL_DEBUG", "value": "INFO"},
        {"name": "EMOJI", "value": "🦙"},
        {"name": "🦙", "value": "x"},
        {"name": "1BAD", "value": "x"},
        {"name": "BOTH", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "BIG", "value": "x" * 32769},
        {"name": "NOVALUE"},
        {"value": "nameless"},
    ]
)
POD_TEMPLATES = st.sampled_from(
    [
        {"spec": {"volumes": [{"name": "dshm", "hostPath": {"path": "/dev/shm"}}]}},
        {"spec": {"volumes": [{"name": "model", "emptyDir": {}}]}},
        {"spec": {"volumes": [{"name": "scratch", "emptyDir": {}}]}},
        {"spec": {"containers": [{"name": "engine", "env": [{"name": "HF_TOKEN", "value": "hf_x"}]}]}},
        {"spec": {"containers": [{"name": "engine", "env": [{"name": "EXTRA", "value": "1"}]}]}},
        {"metadata": {"labels": {"team": "infer"}}},
        {"metadata": {"annotations": {"note": "🦙"}}},
        {"spec": {"priorityClassName": "high"}},
    ]
)
PARALLELISM = st.fixed_dictionaries(
    {},
    optional={
        "tensor": st.sampled_from([0, 1, 2, 3, 4, 8, 65]),
        "pipeline": st.sampled_from([1, 2, 3]),
        "data": st.sampled_from([1, 2, 3, 4, 16]),
        "expert": st.sampled_from([1, 2, 4, 8, 16]),
        "dataParallelAttention": st.booleans(),
        "nodesPerReplica": st.sampled_from([1, 2, 3]),
        "gpusPerNode": st.sampled_from([1, 2, 3, 4, 8]),
    },
)

# --------------------------------------------------------------------------------- DD mutations

ROLES = ("prefill", "decode")
POOLS = (*ROLES, "common")
ROLE_INT_FIELDS = (
    "replicas",
    "tensorParallelSize",
    "shutdownTimeoutSeconds",
    "preStopSleepSeconds",
    "startupTimeoutSeconds",
    "maxUnavailable",
)
INT_FIELDS: tuple[Path_, ...] = (
    *(("spec", r, f) for r in ROLES for f in ROLE_INT_FIELDS),
    ("spec", "kvTransfer", "bootstrapPort"),
    ("spec", "kvTransfer", "sideChannelPort"),
    ("spec", "router", "port"),
    ("spec", "router", "replicas"),
    ("spec", "model", "maxModelLen"),
    ("spec", "replicas"),
    ("spec", "autoscaling", "maxGPUs"),
    ("spec", "autoscaling", "prefill", "minReplicas"),
    ("spec", "autoscaling", "decode", "maxReplicas"),
    ("spec", "kvTransfer", "rdma", "count"),
)
STRING_FIELDS: tuple[Path_, ...] = (
    ("metadata", "name"),
    ("spec", "model", "name"),
    ("spec", "model", "servedName"),
    ("spec", "model", "quantization"),
    ("spec", "model", "dtype"),
    ("spec", "model", "source", "huggingFace", "id"),
    ("spec", "model", "source", "huggingFace", "revision"),
    ("spec", "model", "source", "huggingFace", "tokenSecretRef", "name"),
    ("spec", "model", "source", "huggingFace", "tokenSecretRef", "key"),
    ("spec", "model", "cache", "claimName"),
    ("spec", "model", "cache", "create", "size"),
    ("spec", "model", "cache", "create", "storageClassName"),
    ("spec", "engine", "type"),
    ("spec", "engine", "image"),
    ("spec", "engine", "imagePullPolicy"),
    ("spec", "kvTransfer", "connector"),
    ("spec", "kvTransfer", "rdmaDevice"),
    ("spec", "kvTransfer", "bufferSize"),
    ("spec", "kvTransfer", "loadFailurePolicy"),
    ("spec", "kvTransfer", "rdma", "resourceName"),
    ("spec", "kvTransfer", "rdma", "networks"),
    ("spec", "router", "image"),
    ("spec", "router", "serviceType"),
    ("spec", "router", "type"),
    ("spec", "autoscaling", "policyRef", "name"),
    ("spec", "autoscaling", "mode"),
)
ARG_FIELDS: tuple[Path_, ...] = (("spec", "engine", "args"), *(("spec", r, "args") for r in ROLES))
ENV_FIELDS: tuple[Path_, ...] = (("spec", "engine", "env"), *(("spec", p, "env") for p in POOLS))


def _at(paths: tuple[Path_, ...], values: st.SearchStrategy[Any]) -> st.SearchStrategy[Mutation]:
    return st.tuples(st.sampled_from(paths), values)


MUTATION: st.SearchStrategy[Mutation] = st.one_of(
    _at(INT_FIELDS, INTS),
    _at(STRING_FIELDS, STRINGS),
    _at(ARG_FIELDS, OWNED_ARGS),
    _at(ENV_FIELDS, st.lists(ENV_ITEMS, min_size=1, max_size=2)),
    _at(tuple(("spec", p, "podTemplate") for p in POOLS), POD_TEMPLATES),
    _at(tuple(("spec", p, "tolerations") for p in (*POOLS, "router")), TOLERATIONS),
    _at(
        tuple(("spec", p, "nodeSelector") for p in (*POOLS, "router")),
        st.dictionaries(LABEL_KEYS, LABEL_VALUES, min_size=1, max_size=2),
    ),
    _at(
        tuple(("spec", r, "resources", k) for r in ROLES for k in ("requests", "limits")),
        st.dictionaries(RESOURCE_NAMES, QUANTITIES, min_size=1, max_size=2),
    ),
    _at(tuple(("spec", r, "parallelism") for r in ROLES), PARALLELISM),
    _at(
        (("spec", "model", "source", "huggingFace"), ("spec", "model", "cache"), ("spec", "autoscaling")),
        st.just(DELETE),
    ),
    _at((("spec", "model", "source", "pvc"),), st.just({"claimName": "weights", "path": "a/../../etc"})),
    _at(
        (("spec", "autoscaling"),),
        st.sampled_from(
            [
                {"enabled": True},
                {"enabled": True, "policyRef": {"name": "chat"}, "mode": "passive"},
                {"prefill": {"minReplicas": 5, "maxReplicas": 2}},
                {"decode": {"minReplicas": 0, "maxReplicas": 1000}, "maxGPUs": 1},
            ]
        ),
    ),
    _at(((),), st.just({"spec": {"unknownField": 1}})),  # an unknown field: pruned or refused
)


def _set(obj: dict[str, Any], path: Path_, value: Any) -> dict[str, Any]:
    if not path:  # merge at the top
        for key, item in value.items():
            obj.setdefault(key, {}).update(item)
        return obj
    node = obj
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    if value is DELETE:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = copy.deepcopy(value)
    return obj


@st.composite
def deployments(draw: st.DrawFn) -> tuple[dict[str, Any], list[Mutation]]:
    base = copy.deepcopy(BASES[draw(st.sampled_from(sorted(BASES)))])
    mutations = draw(st.lists(MUTATION, min_size=0, max_size=3))
    for path, value in mutations:
        _set(base, path, value)
    return base, mutations


# --------------------------------------------------------------------------------- API server

GROUP, VERSION, DD_PLURAL = DISAGG_DEPLOYMENT.resource
RP_PLURAL = RATIO_POLICY.resource[2]


@pytest.fixture(scope="module")
def dynamic(k8s_api: Any) -> Iterator[Any]:
    from kubernetes.dynamic import DynamicClient

    yield DynamicClient(k8s_api)


def _create(
    k8s_api: Any, namespace: str, plural: str, body: dict[str, Any]
) -> tuple[dict[str, Any] | None, str]:
    """Dry-run create of a custom object: (the object as the API server would store it, "") or
    (None, the API server's message) when it refuses it (422/400)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        created = client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, plural, body, dry_run="All"
        )
    except ApiException as exc:
        assert exc.status in (400, 422), f"expected 400/422, got {exc.status}: {exc.body}"
        try:
            return None, str(json.loads(exc.body).get("message", exc.body))
        except ValueError:
            return None, str(exc.body)
    return created, ""


def _dry_run_child(dynamic: Any, namespace: str, child: dict[str, Any]) -> str | None:
    """None when the API server accepts ``child`` (dryRun=All, fieldValidation=Strict), else its message."""
    from kubernetes.client.rest import ApiException

    resource = dynamic.resources.get(api_version=child["apiVersion"], kind=child["kind"])
    try:
        resource.create(
            body=child, namespace=namespace, query_params=[("dryRun", "All"), ("fieldValidation", "Strict")]
        )
    except ApiException as exc:
        return f"{exc.status}: {exc.body}"
    return None


def _names_a_field(message: str) -> bool:
    """Whether a refusal names the field: its path (spec.prefill.replicas), or for a value the API server
    can't decode at all, e.g. metadata.name: {}, the Go field (ObjectMeta.name)."""
    return any(part in message for part in ("spec.", "metadata.", "spec:", "ObjectMeta."))


# ----------------------------------------------------------------------------- owned fields


def _pod_specs(child: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = child.get("spec") or {}
    template = spec.get("template") or {}
    if "spec" in template:
        yield template["spec"]
    lws = spec.get("leaderWorkerTemplate") or {}
    for key in ("leaderTemplate", "workerTemplate"):
        if "spec" in (lws.get(key) or {}):
            yield lws[key]["spec"]


def _flag(arg: str) -> str:
    """The option ``arg`` sets as vLLM's argument parser reads it: ``--a_b.c=v`` sets ``--a-b``."""
    if not arg.startswith("--"):
        return arg
    return arg.split("=", 1)[0].split(".", 1)[0].replace("_", "-")


def _owned_problems(children: list[dict[str, Any]], engine: str) -> list[str]:
    problems = []
    for child in children:
        where = f"{child['kind']}/{child['metadata']['name']}"
        for pod in _pod_specs(child):
            for container in [*pod.get("containers", []), *pod.get("initContainers", [])]:
                tokens = [_flag(str(a)) for a in [*container.get("command", []), *container.get("args", [])]]
                for env in container.get("env", []):
                    if env.get("name") == "HF_TOKEN" and "secretKeyRef" not in (env.get("valueFrom") or {}):
                        problems.append(f"{where} {container['name']}: HF_TOKEN not from a secretKeyRef")
                if sum(e.get("name") == "HF_TOKEN" for e in container.get("env", [])) > 1:
                    problems.append(f"{where} {container['name']}: HF_TOKEN twice")
                if container.get("name") != "engine":
                    continue
                if engine == "vllm" and tokens.count("--kv-transfer-config") != 1:
                    problems.append(f"{where}: --kv-transfer-config {tokens.count('--kv-transfer-config')}x")
                if engine == "sglang" and tokens.count("--disaggregation-transfer-backend") != 1:
                    problems.append(f"{where}: --disaggregation-transfer-backend not exactly once")
            if any(c.get("name") == "engine" for c in pod.get("containers", [])):
                dshm = [v for v in pod.get("volumes", []) if v.get("name") == "dshm"]
                if len(dshm) != 1 or (dshm[0].get("emptyDir") or {}).get("medium") != "Memory":
                    problems.append(f"{where}: dshm volumes {dshm}")
    return problems


# ------------------------------------------------------------------------------------ the tests


@HOSTILE
@given(case=deployments())
def test_hostile_deployment_is_refused_naming_the_field_or_renders_children_the_api_server_accepts(
    crds: list[str], k8s_api: Any, dynamic: Any, namespace: str, case: tuple[dict[str, Any], list[Mutation]]
) -> None:
    body, mutations = case
    shown = f"mutations {mutations!r}"[:2000]
    stored, refusal = _create(k8s_api, namespace, DD_PLURAL, body)
    if stored is None:
        assert _names_a_field(refusal), f"the API server's refusal names no field: {refusal!r}; {shown}"
        return
    dd, problem = validate(stored)
    if problem is None:
        assert dd is not None
        children, _, problem = render(dd)
    if problem is not None:
        assert problem.reason in ("InvalidSpec", "RenderFailed"), problem
        assert _names_a_field(problem.message), (
            f"{problem.reason}: {problem.message!r} names no field; {shown}"
        )
        return
    assert dd is not None
    bounds_for(dd)  # what the autoscaler reads from the spec: no exception
    for child in children:
        refused = _dry_run_child(dynamic, namespace, child)
        assert refused is None, (
            f"{child['kind']}/{child['metadata']['name']} refused by the API server: {refused}\n{shown}\n"
            f"{json.dumps(child, indent=1)[:6000]}"
        )
    problems = _owned_problems(children, dd.spec.engine.type)
    assert not problems, f"user input took what the operator owns: {problems}; {shown}"


# ---------------------------------------------------------------------------------- RatioPolicy

FLOATS = st.sampled_from([0, 0.0, -0.1, 1e-9, 0.05, 0.5, 1, 1.0, 99.99, 100, 100.1, 1e308, "0.5", "NaN"])
POLICY_FLOAT_FIELDS: tuple[Path_, ...] = (
    ("spec", "slo", "ttft", "percentile"),
    ("spec", "slo", "ttft", "targetSeconds"),
    ("spec", "slo", "itl", "percentile"),
    ("spec", "slo", "itl", "targetSeconds"),
    ("spec", "tolerance"),
    ("spec", "feedback", "kvUsageHigh"),
    ("spec", "feedback", "targetUtilization"),
    ("spec", "modelBased", "targetUtilization"),
    ("spec", "modelBased", "correctionSmoothing"),
)
POLICY_INT_FIELDS: tuple[Path_, ...] = (
    ("spec", "evaluationIntervalSeconds"),
    ("spec", "metricWindowSeconds"),
    ("spec", "pendingBackoffSeconds"),
    ("spec", "scaleUp", "stabilizationWindowSeconds"),
    ("spec", "scaleDown", "stabilizationWindowSeconds"),
    ("spec", "scaleUp", "maxStep", "prefill"),
    ("spec", "scaleDown", "maxStep", "decode"),
    ("spec", "gpuBudget", "maxGPUs"),
    ("spec", "fixedRatio", "prefill"),
    ("spec", "fixedRatio", "decode"),
    ("spec", "modelBased", "lookaheadSeconds"),
    ("spec", "modelBased", "prefillTokenBudget"),
    ("spec", "modelBased", "tensorParallel", "prefill"),
)
POLICY_STRING_FIELDS: tuple[Path_, ...] = (
    ("metadata", "name"),
    ("spec", "algorithm"),
    ("spec", "mode"),
    ("spec", "modelBased", "model"),
    ("spec", "modelBased", "gpu"),
    ("spec", "modelBased", "dtype"),
)
ENUM_WORDS = st.sampled_from(["fixed-ratio", "model-based", "slo-feedback", "advisory", "Active"])
POLICY_MUTATION: st.SearchStrategy[Mutation] = st.one_of(
    _at(POLICY_FLOAT_FIELDS, st.one_of(FLOATS, WRONG_TYPES)),
    _at(POLICY_INT_FIELDS, INTS),
    _at(POLICY_STRING_FIELDS, st.one_of(STRINGS, ENUM_WORDS)),
    _at((("spec", "fixedRatio"), ("spec", "slo"), ("spec", "scaleDown")), st.just(DELETE)),
)


@st.composite
def policies(draw: st.DrawFn) -> tuple[dict[str, Any], list[Mutation]]:
    base = copy.deepcopy(POLICY_BASE)
    mutations = draw(st.lists(POLICY_MUTATION, min_size=0, max_size=3))
    for path, value in mutations:
        _set(base, path, value)
    return base, mutations


def _observation(now: float) -> Observation:
    return Observation(
        time=now,
        prefill=RoleObservation(replicas=2, ready=2, queue_time=Measured.of(0.3)),
        decode=RoleObservation(replicas=1, ready=1, kv_usage=Measured.of(0.95), running=Measured.of(40.0)),
        ttft=Measured.of(2.5),
        itl=Measured.of(0.02),
        request_rate=Measured.of(6.0),
        prompt_tokens_mean=Measured.of(3000.0),
        prompt_tokens_p90=Measured.of(8000.0),
        output_tokens_mean=Measured.of(300.0),
    )


@HOSTILE
@given(case=policies())
def test_hostile_ratio_policy_is_refused_naming_the_field_or_decides(
    crds: list[str], k8s_api: Any, namespace: str, case: tuple[dict[str, Any], list[Mutation]]
) -> None:
    body, mutations = case
    stored, refusal = _create(k8s_api, namespace, RP_PLURAL, body)
    if stored is None:
        assert _names_a_field(refusal), f"the API server's refusal names no field: {refusal!r}; {mutations!r}"
        return
    policy = RatioPolicy.model_validate(stored).spec  # the operator's reading: accepted means readable
    dd = DisaggregatedDeployment.model_validate(BASES["vllm-nixl"])
    now = 1_000_000.0
    decision, _ = decide(_observation(now), policy, PolicyState(), now, bounds_for(dd))
    assert decision.prefill >= 1 and decision.decode >= 1

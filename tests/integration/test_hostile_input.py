"""Hostile and broken input against the real API server (issue 13, item 7).

Hypothesis mutates valid DisaggregatedDeployments (the examples, from the tables of values and fields in
disagg.chaos.hostile, which the chaos case ``hostile-input`` applies to a running operator) and
RatioPolicies (the policy library's chat policy): wrong types, numbers at and past their bounds, huge
strings, unicode and emoji, quantities such as ``256GB``, tolerations with operator ``Exist``,
parallelism that does not divide, and input that tries to take what the operator owns (a second
``--kv-transfer-config``, also spelled the ways vLLM's argument parser reads it, an ``HF_TOKEN`` env, a
podTemplate volume named ``dshm``). Every object must end one of three ways:

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
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disagg.api.deployment import DisaggregatedDeployment
from disagg.api.ratiopolicy import RatioPolicy
from disagg.chaos import hostile
from disagg.chaos.hostile import (
    BASE_EXAMPLES,
    DELETE,
    Mutation,
    base_deployment,
    owned_field_problems,
    set_path,
)
from disagg.chaos.hostile import FieldPath as Path_
from disagg.controller.reconcile import render, validate
from disagg.k8s.client import DISAGG_DEPLOYMENT, RATIO_POLICY
from disagg.policy import Measured, Observation, PolicyState, RoleObservation, decide
from disagg.policy.bounds import bounds_for

ROOT = Path(__file__).resolve().parents[2]
BASES = {name: base_deployment(name) for name in BASE_EXAMPLES}
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

# ---------------------------------------------------------------- values (the tables of disagg.chaos.hostile)

WRONG_TYPES = st.sampled_from(hostile.WRONG_TYPES)
TEXT = st.text(min_size=0, max_size=24)
STRINGS = st.one_of(st.sampled_from(hostile.HUGE), st.sampled_from(hostile.UNICODE), TEXT, WRONG_TYPES)
INTS = st.one_of(st.sampled_from(hostile.NUMBERS), st.integers(-(2**40), 2**40), WRONG_TYPES)


def _optional(table: Mapping[str, Sequence[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional={k: st.sampled_from(list(v)) for k, v in table.items()})


def _at(paths: tuple[Path_, ...], values: st.SearchStrategy[Any]) -> st.SearchStrategy[Mutation]:
    return st.tuples(st.sampled_from(paths), values)


MUTATION: st.SearchStrategy[Mutation] = st.one_of(
    _at(hostile.INT_FIELDS, INTS),
    _at(hostile.STRING_FIELDS, STRINGS),
    _at(hostile.ARG_FIELDS, st.sampled_from(hostile.OWNED_ARGS)),
    _at(hostile.ENV_FIELDS, st.lists(st.sampled_from(hostile.ENV_ITEMS), min_size=1, max_size=2)),
    _at(hostile.POD_TEMPLATE_FIELDS, st.sampled_from(hostile.POD_TEMPLATES)),
    _at(hostile.TOLERATION_FIELDS, st.lists(_optional(hostile.TOLERATION_VALUES), max_size=3)),
    _at(
        hostile.NODE_SELECTOR_FIELDS,
        st.dictionaries(
            st.sampled_from(hostile.LABEL_KEYS), st.sampled_from(hostile.LABEL_VALUES), min_size=1, max_size=2
        ),
    ),
    _at(
        hostile.RESOURCE_FIELDS,
        st.dictionaries(
            st.sampled_from(hostile.RESOURCE_NAMES),
            st.sampled_from(hostile.QUANTITIES),
            min_size=1,
            max_size=2,
        ),
    ),
    _at(hostile.PARALLELISM_FIELDS, _optional(hostile.PARALLELISM_VALUES)),
    _at(hostile.REMOVABLE_FIELDS, st.just(DELETE)),
    _at((hostile.PVC_SOURCE_FIELD,), st.just(hostile.PVC_ESCAPE)),
    _at((hostile.AUTOSCALING_FIELD,), st.sampled_from(hostile.AUTOSCALING_VARIANTS)),
    _at((hostile.TOP,), st.just(hostile.UNKNOWN_FIELD)),
)
_set = set_path


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
    problems = owned_field_problems(children, dd.spec.engine.type)
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
    ("spec", "maxReversalsPerHour"),
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

"""Pieces shared by the disagg.dev models: the camelCase base model, conditions, resources, free-form objects.

Pure: pydantic only. Kubernetes objects are plain dicts: ``affinity`` with Kubernetes' own schema in the
CRD (the API server validates it at admission), tolerations with a schema of their own, and a
pod-template override and env ``valueFrom`` free-form (``x-kubernetes-preserve-unknown-fields``;
Kubernetes' PodTemplateSpec schema requires ``spec.containers``, which a partial override leaves out),
checked where they land: the operator's own validation, and the API server on the rendered children.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel

from disagg.api.k8sschema import affinity_schema
from disagg.api.quantity import QUANTITY_HELP, QUANTITY_PATTERN, is_quantity, quantity_value

API_GROUP = "disagg.dev"
API_VERSION = "v1alpha1"
GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"

# Bounds that keep CEL rule costs within the API server's budget (every list and string that a rule may
# touch needs a maximum size) and match Kubernetes' own limits where one exists.
MAX_NAME_LENGTH = 253
MAX_ARGS = 128
MAX_ARG_LENGTH = 4096
MAX_ENV = 128
MAX_MAP_ENTRIES = 64
MAX_LIST_ITEMS = 64
MAX_CONDITIONS = 16

FREE_FORM_OBJECT: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}

FreeFormObject = Annotated[dict[str, Any], WithJsonSchema(FREE_FORM_OBJECT)]
"""Any JSON object, kept as given (CRD: ``x-kubernetes-preserve-unknown-fields``)."""

Affinity = Annotated[dict[str, Any], WithJsonSchema(affinity_schema())]
"""A pod's affinity in Kubernetes' form, which the API server validates with Kubernetes' own schema
(:mod:`disagg.api.k8sschema`); the operator passes it through as given."""

FreeFormList = Annotated[
    list[dict[str, Any]],
    WithJsonSchema({"type": "array", "maxItems": MAX_LIST_ITEMS, "items": FREE_FORM_OBJECT}),
]
"""A list of JSON objects kept as given (e.g. tolerations)."""


def _quantity(value: int | str) -> int | str:
    if not is_quantity(value):
        raise ValueError(f"{value!r} is not {QUANTITY_HELP}")
    return value


# An int or a string matching resource.Quantity's grammar (OpenAPI applies a pattern to strings only):
# the API server rejects e.g. "256GB" at admission, naming the field, instead of the child apply failing.
QUANTITY_SCHEMA: dict[str, Any] = {"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}

Quantity = Annotated[int | str, AfterValidator(_quantity), WithJsonSchema(QUANTITY_SCHEMA)]
"""A Kubernetes resource quantity: an integer or a string like ``"64Gi"`` or ``"500m"``."""

# Label keys and values as the API server checks them in a pod's nodeSelector (k8s.io/apimachinery
# pkg/util/validation: IsQualifiedName, a DNS-1123 subdomain prefix of at most 253 characters and a name of
# at most 63; IsValidLabelValue, at most 63): a nodeSelector the pod would be refused for is refused here,
# naming the field, instead of every apply of the pool failing.
LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY_PATTERN = rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{LABEL_NAME}$"
LABEL_VALUE_PATTERN = rf"^({LABEL_NAME})?$"
LABEL_KEY_HELP = (
    "a label key: an optional DNS subdomain prefix of at most 253 characters and '/', then a name of at "
    "most 63 alphanumerics, '-', '_' or '.' that starts and ends with an alphanumeric"
)
LABEL_VALUE_HELP = (
    "a label value: empty, or at most 63 alphanumerics, '-', '_' or '.' that starts and ends with an "
    "alphanumeric"
)
_LABEL_KEY_RE = re.compile(LABEL_KEY_PATTERN)
_LABEL_VALUE_RE = re.compile(LABEL_VALUE_PATTERN)


def label_key_problem(key: str) -> str | None:
    if _LABEL_KEY_RE.match(key) is None or len(key.rpartition("/")[0]) > MAX_NAME_LENGTH:
        return f"{key!r} is not {LABEL_KEY_HELP}"
    return None


def _labels(value: dict[str, str]) -> dict[str, str]:
    for key, item in value.items():
        problem = label_key_problem(key)
        if problem is not None:
            raise ValueError(problem)
        if _LABEL_VALUE_RE.match(item) is None:
            raise ValueError(f"{key}: {item!r} is not {LABEL_VALUE_HELP}")
    return value


StringMap = Annotated[
    dict[str, str],
    AfterValidator(_labels),
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": MAX_MAP_ENTRIES,
            "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE_PATTERN},
            "x-kubernetes-validations": [
                {
                    "rule": f"self.all(k, k.matches('{LABEL_KEY_PATTERN}'))",
                    "message": f"every key must be {LABEL_KEY_HELP}",
                }
            ],
        }
    ),
]
"""A map of label keys to label values (node selectors), checked as the API server checks a pod's."""

QuantityMap = Annotated[
    dict[str, Quantity],
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": MAX_MAP_ENTRIES,
            "additionalProperties": QUANTITY_SCHEMA,
        }
    ),
]


class ApiModel(BaseModel):
    """Base of every API model: camelCase on the wire, snake_case in Python, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
    )

    def to_api(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase keys, unset optionals left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class EnvVar(ApiModel):
    """One environment variable of a container, as in a Kubernetes container's ``env``."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(has(self.value) && has(self.valueFrom))",
                    "message": "env: value and valueFrom are mutually exclusive",
                    "fieldPath": ".valueFrom",
                }
            ]
        }
    )

    name: str = Field(
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$",
        description="Name of the environment variable.",
    )
    value: str | None = Field(
        default=None, max_length=32768, description="Literal value; mutually exclusive with valueFrom."
    )
    value_from: FreeFormObject | None = Field(
        default=None,
        description="Source of the value (secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef), "
        "as in a Kubernetes EnvVarSource.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"env {self.name}: value and valueFrom are mutually exclusive")
        return self


EnvList = Annotated[list[EnvVar], Field(max_length=MAX_ENV)]
ArgList = Annotated[list[Annotated[str, Field(max_length=MAX_ARG_LENGTH)]], Field(max_length=MAX_ARGS)]


class ResourceRequirements(ApiModel):
    """Compute resources of a container, as in Kubernetes ``resources``.

    The GPU count per replica (``nvidia.com/gpu``) is derived from the role's parallelism; if you give
    it here it must equal that count.
    """

    requests: QuantityMap | None = Field(
        default=None, description="Minimum resources required, e.g. {cpu: 8, memory: 64Gi}."
    )
    limits: QuantityMap | None = Field(
        default=None, description="Maximum resources allowed, e.g. {memory: 128Gi, nvidia.com/gpu: 8}."
    )

    @model_validator(mode="after")
    def _container_rules(self) -> Self:
        problem = resources_problem(self.requests or {}, self.limits or {})
        if problem is not None:
            raise ValueError(problem)
        return self


# A container's resources as the API server checks them (k8s.io/kubernetes pkg/apis/core/validation,
# ValidateContainerResourceRequirements): the CRD keeps any quantity map, so a container the pods would be
# refused for is refused by the model (the operator sets Degraded, InvalidSpec, naming the field) instead
# of every apply of the pool failing. The GPU count is the operator's to pair (it sets both).
STANDARD_CONTAINER_RESOURCES = ("cpu", "memory", "ephemeral-storage")
HUGEPAGES_PREFIX = "hugepages-"
OPERATOR_PAIRED_RESOURCES = ("nvidia.com/gpu",)


def _native(name: str) -> bool:
    return "/" not in name or name.startswith("kubernetes.io/")


def resources_problem(requests: Mapping[str, int | str], limits: Mapping[str, int | str]) -> str | None:
    """Why the API server would refuse a container with these requests and limits, or None."""
    for kind, values in (("requests", requests), ("limits", limits)):
        for name, value in values.items():
            where = f"{kind}[{name!r}]"
            huge = name.startswith(HUGEPAGES_PREFIX)
            if huge:
                size = name.removeprefix(HUGEPAGES_PREFIX)
                try:
                    page = quantity_value(size)
                except ValueError:
                    return f"{where}: {size!r} is no page size"
                if page <= 0 or quantity_value(value) % page != 0:
                    return f"{where}: {value} is not a positive whole multiple of {size}"
            elif not _native(name):
                if label_key_problem(name) is not None or name.startswith("requests."):
                    return f"{where}: not a resource name (a fully qualified name such as nvidia.com/gpu)"
                if quantity_value(value) != int(quantity_value(value)):
                    return f"{where}: {value} must be a whole number ({name} is an extended resource)"
            elif name not in STANDARD_CONTAINER_RESOURCES:
                return (
                    f"{where}: not a container resource ({', '.join(STANDARD_CONTAINER_RESOURCES)}, "
                    f"{HUGEPAGES_PREFIX}<page size> or a fully qualified name such as nvidia.com/gpu)"
                )
    names = {*requests, *limits}
    if any(n.startswith(HUGEPAGES_PREFIX) for n in names) and not names & {"cpu", "memory"}:
        return f"{HUGEPAGES_PREFIX}<page size> needs a cpu or memory request or limit as well"
    for name, request in requests.items():
        overcommit = _native(name) and not name.startswith(HUGEPAGES_PREFIX)
        if name not in limits:
            if not overcommit and name not in OPERATOR_PAIRED_RESOURCES:
                return (
                    f"limits[{name!r}] must be set: {name} can't be overcommitted (set it equal to requests)"
                )
            continue
        want, have = quantity_value(request), quantity_value(limits[name])
        if not overcommit and want != have and name not in OPERATOR_PAIRED_RESOURCES:
            return f"requests[{name!r}] ({request}) must equal limits[{name!r}] ({limits[name]})"
        if want > have:
            return f"requests[{name!r}] ({request}) must not exceed limits[{name!r}] ({limits[name]})"
    return None


class LocalObjectReference(ApiModel):
    """A reference to an object by name in the same namespace."""

    name: str = Field(min_length=1, max_length=MAX_NAME_LENGTH, description="Name of the referenced object.")


# What a pod's env secretKeyRef must name (k8s.io/kubernetes pkg/apis/core/validation,
# validateSecretKeySelector): a Secret's name (a DNS-1123 subdomain) and a key (IsConfigMapKey).
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
CONFIG_MAP_KEY = r"^[-._a-zA-Z0-9]+$"


class SecretKeyRef(ApiModel):
    """A key of a Secret in the same namespace."""

    name: str = Field(
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        pattern=DNS1123_SUBDOMAIN,
        description="Name of the Secret (a DNS-1123 subdomain).",
    )
    key: str = Field(
        default="token",
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        pattern=CONFIG_MAP_KEY,
        description="Key within the Secret (alphanumerics, '-', '_' or '.').",
    )


# A pod's tolerations as the API server checks them (k8s.io/kubernetes pkg/apis/core/validation,
# ValidateTolerations): each rule below is one of its checks, so a toleration the pods would be refused
# for is refused at admission, naming the field, instead of every apply of the pool failing.
TOLERATION_EMPTY_KEY = "operator must be Exists when key is empty (which tolerates every taint)"
TOLERATION_SECONDS = "tolerationSeconds needs effect NoExecute"
TOLERATION_EXISTS_VALUE = "value must be empty when operator is Exists"


class Toleration(ApiModel):
    """A pod toleration (Kubernetes form)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.key) && self.key != '') || (has(self.operator) && "
                    "self.operator == 'Exists')",
                    "message": TOLERATION_EMPTY_KEY,
                    "fieldPath": ".operator",
                },
                {
                    "rule": "!has(self.tolerationSeconds) || "
                    "(has(self.effect) && self.effect == 'NoExecute')",
                    "message": TOLERATION_SECONDS,
                    "fieldPath": ".effect",
                },
                {
                    "rule": "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || "
                    "self.value == ''",
                    "message": TOLERATION_EXISTS_VALUE,
                    "fieldPath": ".value",
                },
            ]
        }
    )

    key: str | None = Field(
        default=None,
        max_length=317,
        pattern=rf"({LABEL_KEY_PATTERN})|^$",
        description="Taint key the toleration applies to (a label key); empty with operator Exists: all.",
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Exists or Equal (default Equal)."
    )
    value: str | None = Field(
        default=None,
        max_length=63,
        pattern=LABEL_VALUE_PATTERN,
        description="Taint value to match with operator Equal (a label value).",
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute", ""] | None = Field(
        default=None, description="Taint effect to match (empty: all effects)."
    )
    toleration_seconds: int | None = Field(
        default=None,
        ge=-(2**63),
        le=2**63 - 1,
        description="With effect NoExecute: how long the pod stays bound after the taint appears.",
    )

    @model_validator(mode="after")
    def _kubernetes_rules(self) -> Self:
        if not self.key and self.operator != "Exists":
            raise ValueError(TOLERATION_EMPTY_KEY)
        if self.key and label_key_problem(self.key) is not None:
            raise ValueError(f"key {label_key_problem(self.key)}")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError(TOLERATION_SECONDS)
        if self.operator == "Exists" and self.value:
            raise ValueError(TOLERATION_EXISTS_VALUE)
        return self


TolerationList = Annotated[list[Toleration], Field(max_length=MAX_LIST_ITEMS)]


# Source: metav1.Condition in k8s.io/apimachinery/pkg/apis/meta/v1/types.go,
# ``+kubebuilder:validation:MaxLength=32768`` on Message: the most a condition message may hold.
MAX_CONDITION_MESSAGE = 32768

ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(ApiModel):
    """One aspect of the object's current state, following the Kubernetes condition conventions
    (metav1.Condition)."""

    type: str = Field(
        min_length=1,
        max_length=316,
        description="Type of condition in CamelCase, e.g. Ready, Progressing, Degraded.",
    )
    status: ConditionStatus = Field(description="Status of the condition: True, False or Unknown.")
    reason: str = Field(
        default="",
        max_length=1024,
        description="Programmatic identifier (CamelCase) of the reason for the last transition.",
    )
    message: str = Field(
        default="",
        max_length=MAX_CONDITION_MESSAGE,
        description="Human-readable details about the last transition.",
    )
    last_transition_time: str = Field(
        description="When the condition last changed status (RFC 3339).",
        json_schema_extra={"format": "date-time"},
    )
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="The metadata.generation the condition was set for.",
    )


Moment = datetime | float
"""A point in time: an aware datetime, or seconds since the epoch."""


def rfc3339(moment: Moment | None = None) -> str:
    """A timestamp as Kubernetes writes them: UTC, seconds precision, trailing Z (now when None)."""
    if moment is None:
        value = datetime.now(UTC)
    elif isinstance(moment, datetime):
        value = moment.astimezone(UTC)
    else:
        value = datetime.fromtimestamp(moment, tz=UTC)
    return value.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(value: object) -> float | None:
    """Seconds since the epoch of an RFC 3339 timestamp; None when absent or unparseable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def shorten(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, marked with an ellipsis when cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def condition_status(value: bool | ConditionStatus) -> ConditionStatus:
    """A condition's status from a bool (True/False) or the API's own spelling."""
    if isinstance(value, bool):
        return "True" if value else "False"
    return value


def set_condition(
    conditions: Sequence[Condition],
    type_: str,
    status: bool | ConditionStatus,
    reason: str,
    message: str,
    observed_generation: int | None = None,
    now: Moment | None = None,
) -> list[Condition]:
    """Return ``conditions`` with ``type_`` set in place (appended when new); lastTransitionTime changes
    only when the status does. The message is cut to what the API allows."""
    value = condition_status(status)
    result: list[Condition] = []
    found = False
    for cond in conditions:
        if cond.type != type_:
            result.append(cond)
            continue
        found = True
        result.append(_condition(type_, value, reason, message, observed_generation, now, cond))
    if not found:
        result.append(_condition(type_, value, reason, message, observed_generation, now, None))
    return result


def _condition(
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    observed_generation: int | None,
    now: Moment | None,
    previous: Condition | None,
) -> Condition:
    kept = previous is not None and previous.status == status
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=shorten(message, MAX_CONDITION_MESSAGE),
        last_transition_time=previous.last_transition_time if previous and kept else rfc3339(now),
        observed_generation=observed_generation,
    )


def set_api_condition(
    conditions: Sequence[Mapping[str, Any]],
    type_: str,
    status: bool | ConditionStatus,
    reason: str,
    message: str,
    observed_generation: int | None = None,
    now: Moment | None = None,
) -> list[dict[str, Any]]:
    """:func:`set_condition` over conditions as the API server serves them (dicts, camelCase): the
    condition ``type_`` is rebuilt as a :class:`Condition`; the others are kept exactly as they are."""
    previous = next((c for c in conditions if c.get("type") == type_), None)
    try:
        known = [Condition.model_validate(dict(previous))] if previous is not None else []
    except ValidationError:  # a garbled entry is replaced, its transition time with it
        known = []
    (updated,) = set_condition(known, type_, status, reason, message, observed_generation, now)
    entry = updated.to_api()
    result = [entry if c.get("type") == type_ else dict(c) for c in conditions]
    return result if previous is not None else [*result, entry]


def _loc_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif "[" in part or "-" in part or "function-" in part:
            continue  # pydantic's union/validator tags, not fields
        else:
            path += f".{part}" if path else part
    return path


def describe_validation_error(exc: ValidationError) -> list[str]:
    """One line per problem, each naming the field by its API path (camelCase), e.g.
    ``spec.prefill.tensorParallelSize: Input should be greater than or equal to 1``."""
    lines = []
    for error in exc.errors():
        path = _loc_path(tuple(error["loc"]))
        message = str(error["msg"]).removeprefix("Value error, ")
        # Cross-field messages already start with the full field path; don't repeat the model's path.
        lines.append(f"{path}: {message}" if path and not message.startswith(path) else message)
    return lines

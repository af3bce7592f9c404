"""What the operator owns in an engine pod can't be taken by user input: args and env are refused at
admission (CEL, and the model for `disagg render`), a podTemplate that would replace the operator's volumes
or engine env by the model, which the operator reports as Degraded naming the field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from disagg.api.common import describe_validation_error
from disagg.api.deployment import DisaggregatedDeployment
from disagg.api.owned import (
    ARGS_MESSAGE,
    ARGS_RULES,
    OWNED_ENGINE_FLAGS,
    OWNED_FLAG_PATTERN,
    OWNED_FLAG_PATTERNS,
    owned_flag,
)
from disagg.controller.reconcile import validate

REPO = Path(__file__).resolve().parents[2]


def _deployment(**prefill: Any) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples" / "vllm-nixl.yaml").read_text())
    obj["metadata"]["namespace"] = "prod"
    obj["spec"]["prefill"].update(prefill)
    return obj


@pytest.mark.parametrize(
    ("arg", "flag"),
    [
        ("--kv-transfer-config", "--kv-transfer-config"),
        ('--kv-transfer-config={"kv_connector":"X"}', "--kv-transfer-config"),
        ("--port=9000", "--port"),
        ("-tp", "-tp"),
        # vLLM's parser reads '_' as '-' in a flag's name and a dotted key as a key inside its JSON
        ('--kv_transfer_config={"kv_connector":"X"}', "--kv-transfer-config"),
        ("--kv_transfer_config", "--kv-transfer-config"),
        ("--kv-transfer-config.kv_connector=X", "--kv-transfer-config"),
        ("--kv_transfer-config.kv_role", "--kv-transfer-config"),
        ("--tensor_parallel_size=4", "--tensor-parallel-size"),
        ("--served_model_name", "--served-model-name"),
        ("--portal", None),  # a longer flag that merely starts like an owned one
        ("--kv-transfer-configs", None),
        ("--max_num_seqs=256", None),
        ("--max-num-seqs=256", None),
        ("--host-ip", None),
        ("8000", None),
    ],
)
def test_owned_flags_are_recognised_alone_or_with_a_value(arg: str, flag: str | None) -> None:
    assert owned_flag(arg) == flag
    assert (re.match(OWNED_FLAG_PATTERN, arg) is not None) == (flag is not None)  # what CEL matches


def test_the_pattern_matches_exactly_the_owned_flags() -> None:
    for flag in OWNED_ENGINE_FLAGS:
        assert owned_flag(flag) == flag and owned_flag(f"{flag}=1") == flag, flag
        assert owned_flag(f"{flag}x") is None and owned_flag(f"x{flag}") is None, flag
        assert flag in ARGS_MESSAGE
    assert [rule["rule"] for rule in ARGS_RULES] == [
        f"self.all(a, !a.matches('{pattern}'))" for pattern in OWNED_FLAG_PATTERNS
    ]
    for near in ("-t", "--model-paths", "--tp-sizes", "--disaggregation-", "--kv", "-", "--"):
        assert owned_flag(near) is None, near


def test_a_second_kv_transfer_config_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError) as raised:
        DisaggregatedDeployment.model_validate(
            _deployment(args=["--enforce-eager", "--kv-transfer-config", "{}"])
        )
    assert describe_validation_error(raised.value) == [
        "spec.prefill.args: [1] --kv-transfer-config is set by the operator from spec.kvTransfer"
    ]


@pytest.mark.parametrize(
    ("template", "where"),
    [
        ({"spec": {"volumes": [{"name": "dshm", "hostPath": {"path": "/dev/shm"}}]}}, "spec.volumes[0]"),
        (
            {"spec": {"volumes": [{"name": "scratch", "emptyDir": {}}, {"name": "model", "emptyDir": {}}]}},
            "spec.volumes[1]",
        ),
        (
            {"spec": {"containers": [{"name": "engine", "env": [{"name": "HF_TOKEN", "value": "hf_x"}]}]}},
            "spec.containers[0].env[0]",
        ),
    ],
)
def test_a_pod_template_taking_the_operators_volumes_or_env_is_degraded(
    template: dict[str, Any], where: str
) -> None:
    dd, problem = validate(_deployment(podTemplate=template))
    assert dd is None and problem is not None
    assert problem.reason == "InvalidSpec" and not problem.transient
    assert problem.message.startswith("spec.prefill.podTemplate: ")
    assert where in problem.message and "operator" in problem.message


def test_a_pod_template_with_volumes_and_env_of_its_own_is_fine() -> None:
    template = {
        "spec": {
            "volumes": [{"name": "scratch", "emptyDir": {}}],
            "containers": [
                {"name": "engine", "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]},
                {"name": "sidecar", "image": "busybox", "env": [{"name": "HF_TOKEN", "value": "not-ours"}]},
            ],
        }
    }
    dd, problem = validate(_deployment(podTemplate=template))
    assert problem is None and dd is not None

"""The support matrix as the API enforces it: CEL rules generated per refused combination, same messages
from pydantic, and the docs table generated from it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from disagg.api.deployment import DisaggregatedDeployment, DisaggregatedDeploymentSpec
from disagg.api.support import (
    MATRIX_BEGIN,
    MATRIX_END,
    SUPPORT_MATRIX,
    accepted_connectors,
    combination,
    router_for,
    support_matrix_markdown,
    support_rules,
    with_support_matrix,
)
from disagg.cli import main


def spec_rules() -> list[dict[str, str]]:
    extra = DisaggregatedDeploymentSpec.model_config.get("json_schema_extra")
    assert isinstance(extra, dict)
    rules = extra["x-kubernetes-validations"]
    assert isinstance(rules, list)
    return rules


def test_accepted_connectors_per_engine() -> None:
    assert accepted_connectors("vllm") == ("nixl",)
    assert accepted_connectors("sglang") == ("mooncake", "nixl")
    assert router_for("vllm", "nixl") == "vllm-router"
    with pytest.raises(ValueError, match="lmcache with vllm"):
        router_for("vllm", "lmcache")


def test_one_cel_rule_per_refused_combination_is_on_the_spec() -> None:
    refused = [c for c in SUPPORT_MATRIX if not c.accepted]
    generated = support_rules()
    assert len(generated) == len(refused)
    assert all(rule in spec_rules() for rule in generated)
    for cell, rule in zip(refused, generated, strict=True):
        assert f"self.engine.type == '{cell.engine}'" in rule["rule"]
        assert f"self.kvTransfer.connector == '{cell.connector}'" in rule["rule"]
        assert rule["message"] == cell.refusal and rule["fieldPath"] == ".kvTransfer.connector"


@pytest.mark.parametrize("cell", [c for c in SUPPORT_MATRIX if not c.accepted], ids=str)
def test_pydantic_refuses_with_the_same_message(cell: object) -> None:
    from disagg.api.support import Combination

    assert isinstance(cell, Combination)
    doc = {
        "metadata": {"name": "x"},
        "spec": {
            "model": {"name": "m", "source": {"huggingFace": {"id": "org/m"}}},
            "engine": {"type": cell.engine},
            "kvTransfer": {"connector": cell.connector},
        },
    }
    with pytest.raises(ValidationError) as raised:
        DisaggregatedDeployment.model_validate(doc)
    assert cell.refusal in str(raised.value)
    assert cell.reason.split(";")[0] in cell.refusal


def test_every_refusal_names_a_way_out() -> None:
    for cell in SUPPORT_MATRIX:
        if not cell.accepted:
            assert "; use " in cell.reason, cell
            suggestion = cell.reason.rsplit("; use ", 1)[1]
            assert all(c in accepted_connectors(cell.engine) for c in suggestion.split(" or "))
        assert combination(cell.engine, cell.connector) is cell


def test_docs_block_is_replaced_and_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = tmp_path / "deployment.md"
    docs.write_text(f"# t\n\n{MATRIX_BEGIN}\nold\n{MATRIX_END}\nrest\n")
    out = tmp_path / "crds"
    assert main(["crds", "--out", str(out), "--docs", str(docs)]) == 0
    text = docs.read_text()
    assert support_matrix_markdown() in text and "old" not in text and text.endswith(f"{MATRIX_END}\nrest\n")
    assert with_support_matrix(text) == text
    assert main(["crds", "--out", str(out), "--docs", str(docs), "--check"]) == 0
    docs.write_text(text.replace("| yes |", "| no |", 1))
    assert main(["crds", "--out", str(out), "--docs", str(docs), "--check"]) == 1
    assert str(docs) in capsys.readouterr().err
    with pytest.raises(ValueError, match="support-matrix"):
        with_support_matrix("no markers")

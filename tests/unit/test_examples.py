"""Every example references only objects that ship with it (issue 16, item 5): a RatioPolicy named by
an example's spec.autoscaling.policyRef is in the policy library (policies/*.yaml) or in the example
file itself, so a first `kubectl apply` of an example never ends in PolicyNotFound."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg.api.deployment import DisaggregatedDeployment
from disagg.api.ratiopolicy import RatioPolicy

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
POLICIES = sorted((ROOT / "policies").glob("*.yaml"))


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def policy_names(docs: Iterable[dict[str, Any]]) -> set[str]:
    policies = [RatioPolicy.model_validate(d) for d in docs if d.get("kind") == "RatioPolicy"]
    return {str(policy.metadata["name"]) for policy in policies}


def missing_policies(docs: list[dict[str, Any]], shipped: set[str]) -> list[str]:
    """The RatioPolicies the file's DisaggregatedDeployments name that neither ``shipped`` nor the
    file itself holds."""
    available = shipped | policy_names(docs)
    missing = []
    for doc in docs:
        if doc.get("kind") != "DisaggregatedDeployment":
            continue
        autoscaling = DisaggregatedDeployment.model_validate(doc).spec.autoscaling
        ref = autoscaling.policy_ref if autoscaling is not None else None
        if ref is not None and ref.name not in available:
            missing.append(ref.name)
    return missing


def library() -> set[str]:
    return policy_names(doc for path in POLICIES for doc in documents(path))


def test_the_library_holds_the_policies_its_readme_lists() -> None:
    assert library() == {"chat", "rag-long-context", "code-completion", "batch-offline", "fixed-ratio"}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_referenced_policy_ships_with_the_example(example: Path) -> None:
    assert missing_policies(documents(example), library()) == [], (
        f"{example.name} names a RatioPolicy that is neither in policies/ nor in the file"
    )


def test_at_least_one_example_uses_the_library() -> None:
    referenced = {
        dd["spec"]["autoscaling"]["policyRef"]["name"]
        for path in EXAMPLES
        for dd in documents(path)
        if dd.get("kind") == "DisaggregatedDeployment" and dd["spec"].get("autoscaling", {}).get("policyRef")
    }
    assert referenced and referenced <= library()


def test_the_check_finds_an_unknown_policy_and_accepts_one_in_the_same_file() -> None:
    dd = documents(ROOT / "examples" / "vllm-nixl.yaml")[0]
    dd["spec"]["autoscaling"]["policyRef"] = {"name": "llama-70b-latency"}
    assert missing_policies([dd], library()) == ["llama-70b-latency"]
    own = documents(ROOT / "policies" / "chat.yaml")[0]
    own["metadata"]["name"] = "llama-70b-latency"
    assert missing_policies([dd, own], library()) == []

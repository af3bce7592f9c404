"""The RatioPolicy library in policies/: each manifest is a valid RatioPolicy an SRE can start from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg.api.ratiopolicy import Algorithm, RatioPolicy

POLICIES_DIR = Path(__file__).resolve().parents[2] / "policies"
EXPECTED = {"chat", "rag-long-context", "code-completion", "batch-offline", "fixed-ratio"}


def _policy_files() -> list[Path]:
    return sorted(POLICIES_DIR.glob("*.yaml"))


def _load(path: Path) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert len(docs) == 1, f"{path.name}: one RatioPolicy per file, found {len(docs)} documents"
    doc = docs[0]
    assert isinstance(doc, dict)
    return doc


def test_library_has_one_policy_per_workload() -> None:
    assert {p.stem for p in _policy_files()} == EXPECTED


@pytest.mark.parametrize("path", _policy_files(), ids=lambda p: p.stem)
def test_policy_validates_against_the_ratiopolicy_model(path: Path) -> None:
    policy = RatioPolicy.model_validate(_load(path))
    assert policy.kind == "RatioPolicy"
    assert policy.api_version == "disagg.dev/v1alpha1"
    assert policy.metadata["name"] == path.stem, "file name and metadata.name must match"
    assert "namespace" not in policy.metadata, "library policies are applied with -n <namespace>"


@pytest.mark.parametrize("path", _policy_files(), ids=lambda p: p.stem)
def test_policy_keeps_the_crd_cross_field_rules(path: Path) -> None:
    # The same rules the CRD enforces with CEL (x-kubernetes-validations on RatioPolicySpec).
    spec = RatioPolicy.model_validate(_load(path)).spec
    assert spec.metric_window_seconds >= spec.evaluation_interval_seconds
    assert spec.scale_down.stabilization_window_seconds >= spec.scale_up.stabilization_window_seconds
    if spec.algorithm is Algorithm.FIXED_RATIO:
        assert spec.fixed_ratio is not None


@pytest.mark.parametrize("path", _policy_files(), ids=lambda p: p.stem)
def test_policy_explains_when_to_use_it(path: Path) -> None:
    lines = path.read_text().splitlines()
    header = [
        line for line in lines[: lines.index("apiVersion: disagg.dev/v1alpha1")] if line.startswith("#")
    ]
    assert len(header) >= 3, f"{path.name}: needs a comment saying when to use it and what to tune"
    assert any("Tune" in line for line in header), f"{path.name}: say which fields to tune"


def test_policies_differ_where_their_workloads_differ() -> None:
    specs = {p.stem: RatioPolicy.model_validate(_load(p)).spec for p in _policy_files()}
    # Code completion needs the tightest TTFT; chat a tighter ITL than batch; batch the loosest SLO.
    assert specs["code-completion"].slo.ttft.target_seconds == min(
        s.slo.ttft.target_seconds for s in specs.values()
    )
    assert specs["chat"].slo.itl.target_seconds < specs["batch-offline"].slo.itl.target_seconds
    assert specs["batch-offline"].slo.ttft.target_seconds == max(
        s.slo.ttft.target_seconds for s in specs.values()
    )
    # Long-context RAG is prefill-heavy: it may add prefill faster than decode.
    rag = specs["rag-long-context"]
    assert rag.scale_up.max_step.prefill > rag.scale_up.max_step.decode
    assert specs["fixed-ratio"].algorithm is Algorithm.FIXED_RATIO

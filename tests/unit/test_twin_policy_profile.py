"""``disagg simulate --policy`` decides with the profile the operator would: the twin's policy bounds of a
DisaggregatedDeployment carry the same serving profile (model, GPU, each pool's replica layout, MTP) as
:func:`disagg.policy.bounds.bounds_for` of the object. Before, the twin's dropped the layouts, so the
model-based policy of a wide-EP DeepSeek deployment asked for a one-GPU DeepSeek model, which does not
fit, and fell back to slo-feedback on every evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from disagg.api.deployment import DisaggregatedDeployment
from disagg.cli import main
from disagg.policy.bounds import bounds_for
from disagg.policy.capacity import load_models
from disagg.twin.deployment import SimDeployment

EXAMPLES = Path(__file__).parents[2] / "examples"


def _deployment(path: Path) -> dict[str, object]:
    return next(
        d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "DisaggregatedDeployment"
    )


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_the_twin_decides_with_the_operators_profile(path: Path) -> None:
    dd = DisaggregatedDeployment.model_validate(_deployment(path))
    assert SimDeployment.load(path).policy_bounds().profile == bounds_for(dd).profile


def test_a_wide_ep_deployment_gets_a_latency_model_for_each_pool() -> None:
    profile = SimDeployment.load(EXAMPLES / "deepseek-r1-wideep-vllm.yaml").policy_bounds().profile
    assert profile is not None
    assert profile.layout("decode") is not None and profile.layout("decode").ep == 32  # type: ignore[union-attr]
    models = load_models(profile)  # raised "does not fit on 1 x h200" without the layouts
    assert models.decode.kv_capacity_tokens > 0 and models.prefill.kv_capacity_tokens > 0


@pytest.mark.parametrize("example", ["deepseek-r1-wideep-vllm.yaml", "deepseek-r1-wideep-sglang.yaml"])
def test_simulate_runs_each_moe_example_on_a_replay_trace_with_the_model_based_policy(
    example: str, tmp_path: Path
) -> None:
    argv = [
        "simulate",
        "--trace",
        str(EXAMPLES / "traces" / "mooncake-sample.jsonl"),
        "--deployment",
        str(EXAMPLES / example),
        "--policy",
        str(EXAMPLES.parent / "policies" / "rag-long-context.yaml"),
        "--out",
        str(tmp_path),
        "--quiet",
    ]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    codes = {r["code"] for d in summary["decisions"] for r in d["reasons"]}
    assert summary["decisions"] and "ModelUnavailable" not in codes  # the MoE model, not the fallback
    assert summary["runs"][0]["requests"] == summary["runs"][0]["finished"] > 0

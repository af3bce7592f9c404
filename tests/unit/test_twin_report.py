"""Reports of the twin and the `disagg simulate` command (small traces, seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from disagg.cli import main
from disagg.twin import html_report
from disagg.twin.report import build_report, format_table, write_html
from disagg.twin.sim import LogHistogram, PoolSpec, SimDeployment, SimResult, simulate
from disagg.twin.traffic import poisson

REPO = Path(__file__).resolve().parents[2]


def hand_made_result() -> SimResult:
    """Four requests with chosen latencies: one good, one slow TTFT, one slow ITL, one unfinished."""
    dep = SimDeployment(model="llama-3.1-8b", prefill=PoolSpec(1, 1), decode=PoolSpec(1, 1))
    nan = float("nan")
    return SimResult(
        deployment=dep,
        arrival=np.array([0.0, 1.0, 2.0, 3.0]),
        prompt=np.array([100.0, 100.0, 100.0, 100.0]),
        output=np.array([10.0, 10.0, 10.0, 10.0]),
        ttft=np.array([0.2, 2.0, 0.3, 0.4]),
        e2e=np.array([0.5, 2.3, 1.5, nan]),
        itl_mean=np.array([0.03, 0.03, 0.13, nan]),
        preemptions=np.zeros(4),
        itl_hist=LogHistogram(),
        ttft_hist=LogHistogram(),
        gpu_hours=0.5,
        duration_s=11.0,
        timeline=[],
        replicas=[(0.0, {"prefill": (1, 1), "decode": (1, 1)})],
        decisions=[],
    )


def test_goodput_needs_both_targets_and_unfinished_requests_miss() -> None:
    rep = build_report(hand_made_result(), ttft_slo_s=1.0, itl_slo_s=0.05)
    assert rep.good == 1
    assert rep.slo_attainment == pytest.approx(1 / 4)
    assert rep.ttft_attainment == pytest.approx(2 / 4)  # the unfinished one never counts
    assert rep.itl_attainment == pytest.approx(2 / 4)
    assert rep.goodput_per_gpu_hour == pytest.approx(1 / 0.5)
    assert rep.goodput_rps == pytest.approx(1 / 11.0)
    with pytest.raises(ValueError, match="ttft_slo_s"):
        build_report(hand_made_result(), 0.0, 0.05)


def test_html_report_embeds_plots(tmp_path: Path) -> None:
    dep = SimDeployment(model="llama-3.1-8b", prefill=PoolSpec(1, 1), decode=PoolSpec(1, 1))
    res = simulate(dep, poisson(3.0, 120.0, seed=1), interval_s=10.0)
    rep = res.report(1.0, 0.05)
    out = write_html(tmp_path / "r.html", [("pd", res)], [rep])
    text = out.read_text()
    assert set(html_report.figures(text)) == {"load", "latency", "attainment"}
    assert "No policy ran" in text and '<img src="data:image/png' not in text
    assert "goodput" in format_table([rep])


def write_tiny_azure(tmp_path: Path) -> Path:
    reqs = poisson(2.0, 90.0, seed=3)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for r in reqs:
        secs = 46 + r.arrival_s
        lines.append(
            f"2023-11-16 18:{int(secs // 60):02d}:{secs % 60:010.7f},{r.prompt_tokens},{r.output_tokens}"
        )
    p = tmp_path / "trace.csv"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_simulate_cli_with_dd_and_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_tiny_azure(tmp_path)
    dd = REPO / "examples" / "vllm-nixl.yaml"
    if not dd.is_file():
        pytest.skip("examples/vllm-nixl.yaml not present")
    rc = main(
        [
            "simulate",
            "--trace",
            str(trace),
            "--deployment",
            str(dd),
            "--compare",
            "colocated",
            "--out",
            str(tmp_path / "out"),
            "--quiet",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "P/D" in out and "colocated" in out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [r["mode"] for r in summary["runs"]] == ["pd", "colocated"]
    assert summary["runs"][0]["gpus"] == summary["runs"][1]["gpus"] == 16
    assert (tmp_path / "out" / "report.html").is_file()


def test_simulate_cli_runs_the_policy_in_the_loop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("disagg.policy.engine")
    trace = write_tiny_azure(tmp_path)
    dep = tmp_path / "dep.yaml"
    dep.write_text(
        "model: llama-3.1-8b\nprefill: {replicas: 1, tp: 1, max_replicas: 4}\n"
        "decode: {replicas: 1, tp: 1, max_replicas: 4}\nname: small\n"
    )
    pol = tmp_path / "policy.yaml"
    pol.write_text(
        "apiVersion: disagg.dev/v1alpha1\nkind: RatioPolicy\nmetadata: {name: p}\n"
        "spec:\n  slo:\n    ttft: {percentile: 90, targetSeconds: 0.5}\n"
        "    itl: {percentile: 90, targetSeconds: 0.04}\n"
    )
    assert (
        main(["simulate", "--trace", str(trace), "--deployment", str(dep), "--policy", str(pol), "--quiet"])
        == 0
    )
    assert "+policy" in capsys.readouterr().out


def test_simulate_cli_bad_deployment_names_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_tiny_azure(tmp_path)
    dep = tmp_path / "dep.yaml"
    dep.write_text("model: llama-3.1-8b\nprefill: {replicas: 1, tp: 3}\ndecode: {replicas: 1}\n")
    assert main(["simulate", "--trace", str(trace), "--deployment", str(dep), "--quiet"]) == 2
    assert "tp" in capsys.readouterr().err


def test_simulate_progress_off_a_terminal_is_one_line_per_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_tiny_azure(tmp_path)
    dep = tmp_path / "dep.yaml"
    # gpu named: a defaulted GPU would add a note line (tests/unit/test_twin_simulate_cli.py)
    dep.write_text(
        "model: llama-3.1-8b\ngpu: h100\nprefill: {replicas: 1, tp: 1}\ndecode: {replicas: 1, tp: 1}\n"
    )
    assert main(["simulate", "--trace", str(trace), "--deployment", str(dep), "--compare", "colocated"]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err  # captured stderr is no terminal: nothing redrawn
    lines = err.splitlines()
    assert len(lines) == 2 and all(": done in " in line and line.endswith("s wall") for line in lines)


def test_gpu_column_is_the_peak_allocated_not_the_configured_start() -> None:
    """2 x TP4 prefill + 1 x TP8 decode start at 16 GPUs; scaled to 4 prefill they use 24 (the issue's
    '16 shown when 24 were used': the column printed the configured replicas x TP)."""
    dep = SimDeployment(
        model="llama-3.1-70b",
        prefill=PoolSpec(2, 4, max_replicas=4),
        decode=PoolSpec(1, 8, max_replicas=2),
        startup_delay_s=10.0,
    )

    def grow(obs: object) -> dict[str, int]:
        return {"prefill": 4, "decode": 1}

    res = simulate(dep, poisson(2.0, 120.0, seed=2), controller=grow, interval_s=30.0)
    rep = res.report(1.0, 0.05)
    assert (rep.gpus_start, rep.gpus) == (16, 24)
    table = format_table([rep])
    assert "GPUs start" in table and "GPUs peak" in table
    static = simulate(dep, poisson(2.0, 60.0, seed=2), interval_s=30.0).report(1.0, 0.05)
    assert (static.gpus_start, static.gpus) == (16, 16)
    assert rep.gpu_hours > static.gpu_hours

"""Bad files, flags and values on the command line: one line naming the problem, a non-zero exit
(1: the input can't be used, 2: usage, as argparse), never a traceback.

Each case runs `python -m disagg` as a subprocess, so what is checked is exactly what a user sees."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "policies" / "chat.yaml"
TRACE = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
    f"2023-11-16 18:15:{s:02d}.0000000,{100 + s},{20 + s}\n" for s in range(10, 40)
)
TWIN_DEPLOYMENT = "model: llama-3.1-8b\nprefill: {replicas: 1, tp: 1}\ndecode: {replicas: 1, tp: 1}\n"


def disagg(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "disagg", *args], input=stdin, capture_output=True, timeout=120, check=False
    )
    return subprocess.CompletedProcess(
        result.args, result.returncode, result.stdout.decode(), result.stderr.decode(errors="replace")
    )


def one_clear_line(result: subprocess.CompletedProcess[str], *expected: str) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    message = lines[-1]
    for text in expected:
        assert text in message, f"{text!r} not in {message!r}"
    return message


@pytest.fixture
def latin1(tmp_path: Path) -> Path:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("metadata: {name: caf\u00e9}\n".encode("latin-1"))
    return path


def test_render_a_non_utf8_file(latin1: Path) -> None:
    result = disagg("render", "-f", str(latin1))
    assert result.returncode == 1 and result.stdout == ""
    one_clear_line(result, str(latin1), "not UTF-8", "0xe9")


def test_render_non_utf8_stdin() -> None:
    result = disagg("render", "-f", "-", stdin=b"kind: \xff\n")
    assert result.returncode == 1
    one_clear_line(result, "<stdin>", "not UTF-8")


def test_render_a_policy_passed_as_a_deployment() -> None:
    result = disagg("render", "-f", str(POLICY))
    assert result.returncode == 1
    one_clear_line(result, "kind: RatioPolicy is a policy, not a deployment")


def test_render_broken_yaml_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("spec:\n  model: [unclosed\n")
    result = disagg("render", "-f", str(path))
    assert result.returncode == 1
    one_clear_line(result, "not valid YAML", "line 3")


def test_simulate_a_policy_passed_as_the_deployment(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    result = disagg("simulate", "--trace", str(trace), "--deployment", str(POLICY), "--quiet")
    assert result.returncode == 2
    message = one_clear_line(result, "kind 'RatioPolicy'", "--policy")
    assert "__init__" not in message


def test_simulate_unknown_fields_are_named(tmp_path: Path) -> None:
    trace, dep = tmp_path / "trace.csv", tmp_path / "dep.yaml"
    trace.write_text(TRACE)
    dep.write_text(TWIN_DEPLOYMENT + "replica: 3\n")
    result = disagg("simulate", "--trace", str(trace), "--deployment", str(dep), "--quiet")
    assert result.returncode == 2
    one_clear_line(result, "unknown field(s) replica")


@pytest.mark.parametrize("flag", ["--duration", "--rate-scale", "--ttft-slo", "--itl-slo"])
@pytest.mark.parametrize("value", ["0", "-5", "nan"])
def test_simulate_refuses_a_zero_or_negative_value(tmp_path: Path, flag: str, value: str) -> None:
    trace, dep = tmp_path / "trace.csv", tmp_path / "dep.yaml"
    trace.write_text(TRACE)
    dep.write_text(TWIN_DEPLOYMENT)
    result = disagg("simulate", "--trace", str(trace), "--deployment", str(dep), flag, value, "--quiet")
    assert result.returncode == 2 and result.stdout == ""  # no table of NaN
    one_clear_line(result, flag, "> 0")


def test_simulate_a_trace_without_requests(tmp_path: Path) -> None:
    trace, dep = tmp_path / "trace.csv", tmp_path / "dep.yaml"
    trace.write_text(TRACE.splitlines()[0] + "\n")  # the header only
    dep.write_text(TWIN_DEPLOYMENT)
    result = disagg("simulate", "--trace", str(trace), "--deployment", str(dep), "--quiet")
    assert result.returncode == 2 and result.stdout == ""
    one_clear_line(result, str(trace), "no request")


def test_simulate_non_utf8_trace_and_policy(tmp_path: Path, latin1: Path) -> None:
    dep = tmp_path / "dep.yaml"
    dep.write_text(TWIN_DEPLOYMENT)
    result = disagg("simulate", "--trace", str(latin1), "--deployment", str(dep), "--quiet")
    assert result.returncode == 2
    one_clear_line(result, "not UTF-8")
    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    result = disagg("simulate", "--trace", str(trace), "--deployment", str(dep), "--policy", str(latin1))
    assert result.returncode == 2
    one_clear_line(result, str(latin1), "not UTF-8")

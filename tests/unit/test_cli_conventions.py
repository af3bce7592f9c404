"""The conventions every `disagg` subcommand shares (issue 16, item 6): `--version` from the package
metadata, `-` for stdout wherever an output path is taken, and exit codes 0 ok / 1 failure / 2 usage,
documented in every `--help`."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from disagg.api.crd import rendered_files
from disagg.cli import SUBCOMMANDS, main
from disagg.clicommon import EXIT_FAILURE, EXIT_OK, EXIT_USAGE

CORE = ("run", "crds", "render", "conformance")  # the commands the operator image runs without the extra


def exit_code(argv: list[str]) -> int:
    """main's return value, or the code argparse (or a usage check) exits with."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_FAILURE


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["--version"]) == EXIT_OK
    assert capsys.readouterr().out == f"disagg {importlib.metadata.version('disagg')}\n"


@pytest.mark.parametrize("argv", [[], ["nonsense"], ["-x"]])
def test_no_or_unknown_command_is_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(argv) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == "" and "usage: disagg" in captured.err


@pytest.mark.parametrize("command", [[], *([name] for name in SUBCOMMANDS)])
def test_every_help_documents_the_exit_codes_and_dash(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert exit_code([*command, "--help"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "exit status:" in out and "0  success" in out and "1  failure" in out and "2  usage" in out
    assert "A path of - means" in out


@pytest.mark.parametrize("command", CORE)
def test_an_unknown_flag_is_a_usage_error(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code([command, "--no-such-flag"]) == EXIT_USAGE
    assert f"disagg {command}: error:" in capsys.readouterr().err


def test_a_command_of_subcommands_given_none_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["cluster"]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == "" and "ACTION" in captured.err


def test_crds_out_dash_prints_every_crd_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert exit_code(["crds", "--out", "-"]) == EXIT_OK
    docs = [doc for doc in yaml.safe_load_all(capsys.readouterr().out) if doc]
    assert docs == [yaml.safe_load(content) for content in rendered_files().values()]
    assert {doc["kind"] for doc in docs} == {"CustomResourceDefinition"} and len(docs) == 2
    assert list(tmp_path.iterdir()) == []  # no directory named "-", no page written


@pytest.mark.parametrize("argv", [["--out", "-", "--check"], ["--docs", "-"]])
def test_crds_dash_where_stdout_means_nothing_is_a_usage_error(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert exit_code(["crds", *argv]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == "" and "disagg crds: error:" in captured.err
    assert list(tmp_path.iterdir()) == []


def test_crds_check_is_a_failure_when_stale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["crds", "--out", str(tmp_path), "--docs", str(tmp_path / "none.md"), "--check"]) == 1
    assert "stale:" in capsys.readouterr().err


def test_cluster_up_with_bad_nodes_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["cluster", "up", "--state-dir", str(tmp_path / "state"), "--nodes", "h100=lots"]
    assert exit_code(argv) == EXIT_USAGE
    assert "TYPE=COUNT" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()  # nothing started


def test_run_with_a_setting_out_of_range_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["run", "-n", "a", "--resync-interval", "-1"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("disagg run: error:") and "resync_interval_s" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "expected"),
    [(["--speed", "0"], "--speed must be > 0"), (["--report-dir", "-"], "--report-dir -: the report is")],
)
def test_demo_usage_errors_start_nothing(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert exit_code(["demo", *argv]) == EXIT_USAGE
    assert expected in capsys.readouterr().err


def test_twin_load_without_load_is_usage_and_an_unreadable_trace_a_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = ["twin", "load", "--target", "http://127.0.0.1:1"]
    assert exit_code(target) == EXIT_USAGE
    assert "give --trace or --rate" in capsys.readouterr().err
    assert exit_code([*target, "--rate", "0"]) == EXIT_USAGE
    assert "rate must be > 0" in capsys.readouterr().err
    assert exit_code([*target, "--trace", str(tmp_path / "missing.csv")]) == EXIT_FAILURE
    assert "missing.csv" in capsys.readouterr().err


def test_twin_endpoints_file_dash_prints_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    from disagg.twin.live import cli as twin_cli

    server = SimpleNamespace(endpoint="http://127.0.0.2:8000")
    pool: Any = SimpleNamespace(
        pods={"p-0": SimpleNamespace(spec=SimpleNamespace(role="prefill"), state="serving", server=server)}
    )

    async def keep_briefly() -> None:
        task = asyncio.ensure_future(twin_cli._keep_endpoints_file(Path("-"), pool, "http://127.0.0.1:9"))
        await asyncio.sleep(3 * twin_cli.ENDPOINTS_FILE_REFRESH_S)
        task.cancel()

    asyncio.run(keep_briefly())
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1  # unchanged: printed once
    assert json.loads(lines[0]) == {
        "pods": {"p-0": {"role": "prefill", "state": "serving", "endpoint": "http://127.0.0.2:8000"}},
        "proxy": "http://127.0.0.1:9",
    }
    assert not Path("-").exists()

"""`disagg render -f FILE`: multi-document YAML out, stdin with -, clear field-naming errors and exit 1."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from disagg.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "sglang-nixl.yaml"


def test_renders_an_example_as_multi_document_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "-f", str(EXAMPLE)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = [d["kind"] for d in docs]
    assert (
        kinds.count("Deployment") == 3
        and kinds.count("Service") == 5
        and kinds.count("PodDisruptionBudget") == 2
    )
    assert all(d["metadata"]["namespace"] == "default" for d in docs)


def test_reads_stdin_and_applies_namespace(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(EXAMPLE.read_text()))
    assert main(["render", "-f", "-", "-n", "serving"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert {d["metadata"]["namespace"] for d in docs} == {"serving"}


def test_several_documents_render_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    second = yaml.safe_load(EXAMPLE.read_text())
    second["metadata"]["name"] = "other"
    path = tmp_path / "two.yaml"
    path.write_text(EXAMPLE.read_text() + "\n---\n" + yaml.safe_dump(second))
    assert main(["render", "-f", str(path)]) == 0
    names = {d["metadata"]["name"] for d in yaml.safe_load_all(capsys.readouterr().out)}
    assert {"llama-8b-sglang-nixl-router", "other-router"} <= names


def test_invalid_file_names_the_field_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["kvTransfer"]["connector"] = "lmcache"
    doc["spec"]["decode"]["tensorParallelSize"] = 0
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["render", "-f", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert str(path) in captured.err and "spec.decode.tensorParallelSize" in captured.err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: [", "not valid YAML"),
        ("", "no YAML document"),
        ("- 1\n", "not a mapping"),
        ("kind: Deployment\nmetadata: {name: x}\n", "kind: expected DisaggregatedDeployment"),
        ("kind: DisaggregatedDeployment\nmetadata: {}\nspec: {}\n", "metadata.name: required"),
    ],
)
def test_malformed_input_is_explained(
    text: str, expected: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert main(["render", "-f", "-"]) == 1
    assert expected in capsys.readouterr().err


def test_missing_file_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "-f", str(tmp_path / "nope.yaml")]) == 1
    assert "cannot read" in capsys.readouterr().err

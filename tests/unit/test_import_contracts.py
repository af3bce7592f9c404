"""The layout's import boundaries: the import-linter contracts of pyproject.toml ([tool.importlinter]).

`make lint` runs `lint-imports`; this test runs it too, so `make test` and `make unit` enforce the layers
(controller > k8s | metrics | twin > policy | render > perf > api), the operator's independence from the
twin and its extra's libraries, and the pure packages' freedom from kopf, Kubernetes and the network.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "disagg"
ENTRY_POINTS = {"__init__", "__main__"}


def _contracts() -> list[dict[str, Any]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts: list[dict[str, Any]] = config["contracts"]
    return contracts


def _contract(kind: str, name_part: str) -> dict[str, Any]:
    (contract,) = [c for c in _contracts() if c["type"] == kind and name_part in c["name"]]
    return contract


def test_import_contracts_hold() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {len(_contracts())} kept, 0 broken." in result.stdout


def test_every_top_level_package_is_layered_or_kept_away_from_the_operator() -> None:
    """A new package (or top-level module) has to take a place: in the layers, or among the glue the
    operator may not import; otherwise no contract would say anything about it."""
    layered = {name.strip() for layer in _contract("layers", "layers")["layers"] for name in layer.split("|")}
    kept_away = set(_contract("forbidden", "the operator imports neither")["forbidden_modules"])
    top_level = {
        f"disagg.{path.stem if path.is_file() else path.name}"
        for path in PACKAGE.iterdir()
        if (path.suffix == ".py" and path.stem not in ENTRY_POINTS) or (path / "__init__.py").is_file()
    }
    assert "disagg.policy" in top_level  # the listing sees the tree
    assert top_level - layered - kept_away == set()


def test_every_layer_below_the_controller_is_pure() -> None:
    """The packages below the controller, except the I/O layer (k8s, metrics), are the pure ones."""
    layered = [
        name.strip() for layer in _contract("layers", "layers")["layers"][1:] for name in layer.split("|")
    ]
    sources = set(_contract("forbidden", "pure packages")["source_modules"])
    io_layer = {"disagg.k8s", "disagg.metrics"}
    assert {name for name in layered if name not in io_layer} <= sources

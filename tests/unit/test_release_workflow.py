""".github/workflows/release.yaml without GitHub Actions: it is never run here (no runner, no registry
credentials), so its shell steps that need neither run in a scratch copy of the repository's files, and
every file, chart and version it names is checked against the repository.

The helm package / push / install it does is exercised against a local OCI registry in
tests/integration/test_chart.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg import __version__
from disagg.cluster.binaries import Versions

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "release.yaml"
CHARTS = ("disagg-crds", "disagg-operator")


def _workflow() -> dict[Any, Any]:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(workflow, dict)
    return workflow


def _steps() -> list[dict[str, Any]]:
    (job,) = _workflow()["jobs"].values()
    steps: list[dict[str, Any]] = job["steps"]
    return steps


def _step(name: str) -> dict[str, Any]:
    (step,) = [s for s in _steps() if s.get("name") == name]
    return step


def _uses(action: str) -> dict[str, Any]:
    (step,) = [s for s in _steps() if str(s.get("uses", "")).startswith(f"{action}@")]
    return step


def _chart(name: str) -> dict[str, Any]:
    chart = yaml.safe_load((REPO / "charts" / name / "Chart.yaml").read_text())
    assert isinstance(chart, dict)
    return chart


def _run_step(name: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The step's `run` script under bash, as GitHub's runner runs it, with ``env`` added."""
    return subprocess.run(
        ["bash", "-e", "-c", _step(name)["run"]],
        cwd=cwd,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _outputs(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def test_a_version_tag_triggers_it_with_the_permissions_to_push_packages() -> None:
    workflow = _workflow()
    # PyYAML reads the key `on` as the boolean True (YAML 1.1); GitHub reads it as "on".
    trigger = workflow.get("on", workflow.get(True))
    assert trigger == {"push": {"tags": ["v*"]}}
    assert workflow["permissions"] == {"contents": "read", "packages": "write"}


def test_the_version_step_accepts_the_repositorys_tag_and_names_image_and_charts(tmp_path: Path) -> None:
    output = tmp_path / "output"
    env = {"GITHUB_REF_NAME": f"v{__version__}", "GITHUB_OUTPUT": str(output)}
    result = _run_step("Versions", REPO, {**env, "GITHUB_REPOSITORY_OWNER": "Example-Org"})
    assert result.returncode == 0, result.stdout + result.stderr
    chart_version = _chart("disagg-operator")["version"]
    assert _outputs(output) == {
        "app": __version__,
        "chart": chart_version,
        "image": "ghcr.io/example-org/disagg-operator",  # lower case, as ghcr.io requires
        "charts": "oci://ghcr.io/example-org/charts",
    }
    assert _chart("disagg-crds")["version"] == chart_version


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        (None, "is not pyproject.toml's version"),  # a tag that is not the package's version
        ("charts/disagg-crds/Chart.yaml", "the charts' versions differ"),
    ],
)
def test_the_version_step_refuses_versions_that_disagree(
    tmp_path: Path, edit: str | None, error: str
) -> None:
    root = tmp_path / "repo"
    for name in CHARTS:
        (root / "charts" / name).mkdir(parents=True)
        shutil.copy(REPO / "charts" / name / "Chart.yaml", root / "charts" / name / "Chart.yaml")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    tag = f"v{__version__}"
    if edit is None:
        tag = "v99.0.0"
    else:
        path = root / edit
        path.write_text(re.sub(r"(?m)^version: .*$", "version: 99.0.0", path.read_text()))
    output = tmp_path / "output"
    env = {"GITHUB_REF_NAME": tag, "GITHUB_OUTPUT": str(output), "GITHUB_REPOSITORY_OWNER": "o"}
    result = _run_step("Versions", root, env)
    assert result.returncode == 1
    assert error in result.stdout, result.stdout + result.stderr
    assert not output.exists()


def test_the_published_chart_defaults_to_the_published_image(tmp_path: Path) -> None:
    values = tmp_path / "charts" / "disagg-operator" / "values.yaml"
    values.parent.mkdir(parents=True)
    shutil.copy(REPO / "charts" / "disagg-operator" / "values.yaml", values)
    image = "ghcr.io/example-org/disagg-operator"
    result = _run_step(
        "The published operator chart defaults to the published image", tmp_path, {"IMAGE": image}
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert yaml.safe_load(values.read_text())["image"]["repository"] == image
    # nothing else changed
    original = (REPO / "charts" / "disagg-operator" / "values.yaml").read_text().splitlines()
    changed = [(a, b) for a, b in zip(original, values.read_text().splitlines(), strict=True) if a != b]
    assert changed == [("  repository: disagg/operator", f"  repository: {image}")]


def test_the_image_is_built_from_the_dockerfile_and_tagged_with_the_app_version() -> None:
    build = _uses("docker/build-push-action")["with"]
    assert (REPO / build["context"] / build["file"]).is_file()
    assert build["push"] is True
    assert build["tags"] == "${{ steps.versions.outputs.image }}:${{ steps.versions.outputs.app }}"
    # ... which is what the operator chart runs by default (image.tag empty: the chart's appVersion)
    values = yaml.safe_load((REPO / "charts" / "disagg-operator" / "values.yaml").read_text())
    assert values["image"]["tag"] == ""
    assert _chart("disagg-operator")["appVersion"] == __version__
    login = _uses("docker/login-action")["with"]
    assert login["registry"] == "ghcr.io"


def test_it_uses_the_helm_the_project_tests_with_and_pushes_both_charts() -> None:
    assert _uses("azure/setup-helm")["with"]["version"] == Versions().helm
    script = _step("Package and push the charts")["run"]
    assert "helm package charts/disagg-crds charts/disagg-operator --destination dist" in script
    for name in CHARTS:
        assert f'helm push "dist/{name}-$CHART_VERSION.tgz" "$CHARTS"' in script
    sync = _step("Charts are in sync with crds/ and lint clean")["run"]
    assert "sh charts/sync-crds.sh" in sync and "git diff --exit-code -- charts/" in sync


def test_every_repository_path_it_names_exists() -> None:
    text = WORKFLOW.read_text()
    paths = set(re.findall(r"(?<![\w/$])((?:charts|tests|\.github)/[\w./-]*\w)", text))
    paths |= {"Dockerfile", "pyproject.toml"}
    assert {"charts/disagg-crds", "charts/disagg-operator", "charts/sync-crds.sh"} <= paths
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, missing

"""What the operator image runs, without a container engine: the Dockerfile's steps in a clean venv.

A fresh virtual environment (no access to the repository's .venv) installs the package from a copy of
the files the Dockerfile copies (pyproject.toml, README.md, operator/), with pip's cache, without the twin
extra; then the image's entry point `disagg run --help` and `disagg crds --check` must work there, from the
copied crds/, and a command of the twin extra says what to install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# What the Dockerfile's build stage copies; the final stage also copies crds/.
IMAGE_SOURCES = ("pyproject.toml", "README.md", "operator")

pytestmark = pytest.mark.slow


def _copy_image_sources(dest: Path) -> Path:
    src = dest / "src"
    src.mkdir()
    for name in IMAGE_SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(path, src / name)
    return src


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def image_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("image")
    src = _copy_image_sources(root)
    env_dir = root / "env"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    pip = _run(
        [str(env_dir / "bin" / "python"), "-m", "pip", "install", "--quiet", str(src)], cwd=root, timeout=600
    )
    assert pip.returncode == 0, f"pip install failed:\n{pip.stdout}\n{pip.stderr}"
    # The image runs from /opt/disagg with the CRDs beside it (COPY crds/ /opt/disagg/crds/).
    workdir = root / "opt-disagg"
    shutil.copytree(REPO / "crds", workdir / "crds")
    return env_dir


def test_installed_package_is_the_copy_not_the_repository(image_env: Path) -> None:
    where = _run(
        [str(image_env / "bin" / "python"), "-c", "import disagg, sys; print(disagg.__file__, sys.prefix)"],
        cwd=image_env,
    )
    assert where.returncode == 0, where.stderr
    module_file, prefix = where.stdout.split()
    assert Path(module_file).is_relative_to(image_env), module_file
    assert Path(prefix) == image_env
    assert not Path(module_file).is_relative_to(REPO / "operator")


def test_entrypoint_disagg_run_help(image_env: Path) -> None:
    result = _run([str(image_env / "bin" / "disagg"), "run", "--help"], cwd=image_env)
    assert result.returncode == 0, result.stderr
    assert "usage: disagg run" in result.stdout
    for flag in ("--namespace", "--all-namespaces", "--standalone", "--peering", "--liveness-endpoint"):
        assert flag in result.stdout, f"`disagg run --help` lacks {flag} (the chart passes it)"


def test_the_twin_extra_is_left_out_and_named(image_env: Path) -> None:
    missing = _run(
        [
            str(image_env / "bin" / "python"),
            "-c",
            "import importlib.util as u; print(u.find_spec('plotly'))",
        ],
        cwd=image_env,
    )
    assert missing.stdout.strip() == "None", "the core install pulled in plotly (the twin extra's)"
    result = _run([str(image_env / "bin" / "disagg"), "cluster", "--help"], cwd=image_env)  # needs httpx
    assert result.returncode == 2
    assert "pip install 'disagg[twin]'" in result.stderr


def test_crds_check_passes_against_the_shipped_crds(image_env: Path) -> None:
    workdir = image_env.parent / "opt-disagg"
    result = _run([str(image_env / "bin" / "disagg"), "crds", "--check"], cwd=workdir)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def test_crds_check_names_a_stale_file(image_env: Path, tmp_path: Path) -> None:
    crds = tmp_path / "crds"
    shutil.copytree(image_env.parent / "opt-disagg" / "crds", crds)
    victim = sorted(crds.glob("*.yaml"))[0]
    victim.write_text(victim.read_text() + "# edited by hand\n")
    result = _run([str(image_env / "bin" / "disagg"), "crds", "--check"], cwd=tmp_path)
    assert result.returncode == 1
    assert victim.name in result.stderr


def test_dockerfile_runs_the_same_steps() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["disagg", "run"]' in dockerfile
    assert "USER 65532:65532" in dockerfile
    copied = " ".join(line for line in dockerfile.splitlines() if line.startswith("COPY "))
    for name in IMAGE_SOURCES:
        assert name in copied, f"Dockerfile does not copy {name}; the test installs from the same files"
    assert "COPY crds/ /opt/disagg/crds/" in dockerfile

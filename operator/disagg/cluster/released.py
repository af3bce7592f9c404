"""The released engines and routers, at the versions the default images pin, cached under ~/.cache/disagg.

Two things are obtained from PyPI (the only registry the project may reach), once per version:

- ``ensure_wheel(package, version)``: the wheel itself (``pip download --no-deps``), under
  ``<cache>/wheels/``. Engine wheels (vLLM, SGLang) are read as zip archives, never installed: their
  argument definitions and environment variables are plain Python source, and reading them needs no torch
  and no GPU.
- ``ensure_venv(package, version)``: a virtual environment with the package and its dependencies
  installed, under ``<cache>/venvs/<package>-<version>/``. The routers (vllm-router, sglang-router) are
  Rust binaries shipped in their wheels: installed, they run here exactly as in their images.

The versions come from the default image tags in :mod:`disagg.render.settings` (one source of truth):
``vllm/vllm-openai:v0.33.0`` pins the vllm wheel 0.33.0, and so on.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import venv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from disagg.cluster.binaries import default_cache_root
from disagg.render.settings import DEFAULT_SETTINGS, RenderSettings


class ReleasedSoftwareError(RuntimeError):
    """A pinned release could not be obtained (registry unreachable, version not published)."""


@dataclass(frozen=True)
class Release:
    package: str  # the PyPI distribution name
    version: str

    @property
    def key(self) -> str:
        return f"{self.package}-{self.version}"


def image_version(image: str) -> str:
    """``"vllm/vllm-openai:v0.33.0"`` -> ``"0.33.0"`` (a tag, without a leading ``v``)."""
    _, sep, tag = image.rpartition(":")
    if not sep or "/" in tag or not tag:
        raise ReleasedSoftwareError(f"image {image!r} carries no version tag")
    return tag[1:] if tag.startswith("v") else tag


def pinned_releases(settings: RenderSettings = DEFAULT_SETTINGS) -> dict[str, Release]:
    """The PyPI release behind every default image, keyed by package name."""
    pairs = {
        "vllm": settings.vllm_image,
        "sglang": settings.sglang_image,
        "vllm-router": settings.vllm_router_image,
        "sglang-router": settings.sglang_router_image,
    }
    return {package: Release(package, image_version(image)) for package, image in pairs.items()}


@contextlib.contextmanager
def _lock(name: str) -> Iterator[None]:
    root = default_cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / f".{name}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _normalise(package: str) -> str:
    return package.replace("-", "_").lower()


def _find_wheel(directory: Path, release: Release) -> Path | None:
    prefix = f"{_normalise(release.package)}-{release.version}-"
    for path in sorted(directory.glob("*.whl")):
        if path.name.lower().startswith(prefix):
            return path
    return None


def ensure_wheel(package: str, version: str) -> Path:
    """The released wheel of ``package==version`` for this platform, downloaded once."""
    release = Release(package, version)
    directory = default_cache_root() / "wheels"
    found = _find_wheel(directory, release) if directory.is_dir() else None
    if found is not None:
        return found
    with _lock(f"wheel-{release.key}"):
        directory.mkdir(parents=True, exist_ok=True)
        found = _find_wheel(directory, release)
        if found is None:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(directory)]
            _run([*cmd, f"{package}=={version}"], f"download {package}=={version}")
            found = _find_wheel(directory, release)
        if found is None:
            raise ReleasedSoftwareError(f"pip downloaded no wheel for {package}=={version} into {directory}")
        return found


def venv_dir(package: str, version: str) -> Path:
    return default_cache_root() / "venvs" / Release(package, version).key


def ensure_venv(package: str, version: str) -> Path:
    """A virtual environment with ``package==version`` installed; returns its ``bin`` directory."""
    target = venv_dir(package, version)
    marker = target / ".installed"
    if marker.exists():
        return target / "bin"
    wheel = ensure_wheel(package, version)
    with _lock(f"venv-{package}-{version}"):
        if marker.exists():
            return target / "bin"
        venv.create(target, with_pip=True, clear=True)
        python = target / "bin" / "python"
        _run([str(python), "-m", "pip", "install", "-q", str(wheel)], f"install {wheel.name}")
        marker.write_text(f"{package}=={version}\n")
    return target / "bin"


def _run(cmd: list[str], what: str) -> None:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, timeout=900)
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or exc.stdout or "").strip()[-2000:]
        raise ReleasedSoftwareError(f"{what} failed (exit {exc.returncode}): {tail}") from exc
    except subprocess.TimeoutExpired as exc:
        raise ReleasedSoftwareError(f"{what} timed out after {exc.timeout} s") from exc

"""Which latency profiles the twin has, and one line saying so when a deployment asks for one it lacks.

A profile is a model (``disagg/perf/profiles/models.yaml``), a GPU (``gpus.yaml``) and calibrated
coefficients for a tensor-parallel size and weight dtype (``coefficients.yaml``, keys
``model/gpu/tpN/dtype``). :func:`check` loads every profile a :class:`SimDeployment` needs before the
simulation starts, so that a missing one is a :class:`ProfileError` (a ValueError) naming what exists and
how to add one, not a traceback from the middle of the simulator.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from disagg.perf.latency import (
    GpuSpec,
    ModelConfig,
    load_latency_model,
    load_profile_yaml,
    resolve_gpu_name,
    resolve_model_name,
    set_profile_overlay,
)
from disagg.perf.moe import moe_profiles, resolve_moe_model
from disagg.twin.deployment import PoolSpec, SimDeployment

MODEL_FIELDS = tuple(f for f in ModelConfig.__dataclass_fields__ if f != "name")
GPU_FIELDS = tuple(f for f in GpuSpec.__dataclass_fields__ if f != "name")
HOW_TO_ADD = (
    "to add one, put the model's architecture (from its config.json) in disagg/perf/profiles/models.yaml "
    "or the GPU's datasheet figures in gpus.yaml, then derive its coefficients with "
    "`python -m disagg.twin.calibrate`, or fit one to your own benchmark runs with `disagg twin calibrate "
    "--measurements FILE --out profile.yaml` and pass it to `disagg simulate --profile` (docs/simulate.md)"
)


class ProfileError(ValueError):
    """The twin has no latency profile for what a deployment asks for."""


@functools.cache
def available() -> tuple[tuple[str, str, int, str], ...]:
    """Every calibrated profile as (model, gpu, tp, dtype), sorted."""
    out = []
    for key in load_profile_yaml("coefficients.yaml").get("profiles", {}):
        model, gpu, tp, dtype = str(key).split("/")
        out.append((model, gpu, int(tp.removeprefix("tp")), dtype))
    return tuple(sorted(out))


def describe() -> str:
    """The profiles, one clause per model, e.g. ``llama-3.1-8b on h100 TP1/2/4/8 bf16+fp8, ...``."""
    by_model: dict[str, dict[str, dict[str, list[int]]]] = defaultdict(lambda: defaultdict(dict))
    dtypes: dict[tuple[str, str, int], list[str]] = defaultdict(list)
    for model, gpu, tp, dtype in available():
        dtypes[(model, gpu, tp)].append(dtype)
    for (model, gpu, tp), kinds in sorted(dtypes.items()):
        by_model[model][gpu].setdefault("+".join(sorted(kinds)), []).append(tp)
    clauses = []
    for model, gpus in sorted(by_model.items()):
        parts = []
        for gpu, groups in sorted(gpus.items()):
            shown = ", ".join(f"TP{'/'.join(map(str, tps))} {kind}" for kind, tps in sorted(groups.items()))
            parts.append(f"{gpu} {shown}")
        clauses.append(f"{model} on {'; '.join(parts)}")
    moe: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for model, gpu, dtype in moe_profiles():
        moe[model][gpu].append(dtype)
    for model, by_gpu in sorted(moe.items()):
        shown = "; ".join(f"{gpu} {'+'.join(sorted(kinds))}" for gpu, kinds in sorted(by_gpu.items()))
        clauses.append(f"{model} on {shown} (any TP/DP/EP)")
    return " | ".join(clauses)


def _pools(dep: SimDeployment) -> list[tuple[str, PoolSpec]]:
    pools = [("prefill", dep.prefill), ("decode", dep.decode), ("colocated", dep.colocated)]
    return [(role, pool) for role, pool in pools if pool is not None]


def check(dep: SimDeployment) -> None:
    """Load the latency model of every pool of ``dep``; a ProfileError saying what exists if one is
    missing."""
    if resolve_moe_model(dep.model) is not None:
        _check_moe(dep)
        return
    try:
        model = resolve_model_name(dep.model)
    except ValueError:
        raise _missing(f"no twin profile for model {dep.model!r}") from None
    try:
        gpu = resolve_gpu_name(dep.gpu)
    except ValueError:
        raise _missing(f"no twin profile for GPU {dep.gpu!r} (model {model})") from None
    dtype = "fp8" if dep.dtype == "fp8" else "bf16"
    for role, pool in _pools(dep):
        if (model, gpu, pool.tp, dtype) not in available():
            raise _missing(f"no twin profile for {model} on {gpu} at TP{pool.tp} {dtype} ({role} pool)")
        try:
            load_latency_model(dep.model, dep.gpu, pool.tp, dep.dtype, dep.kv_dtype)
        except ValueError as error:  # e.g. the weights do not fit on the pool's GPUs
            raise ProfileError(f"{role} pool: {' '.join(str(error).split())}") from error


def _check_moe(dep: SimDeployment) -> None:
    try:
        resolve_gpu_name(dep.gpu)
    except ValueError:
        raise _missing(f"no twin profile for GPU {dep.gpu!r} (model {dep.model})") from None
    for role, pool in _pools(dep):
        try:
            load_latency_model(
                dep.model, dep.gpu, pool.tp, dep.dtype, dep.kv_dtype, pool.parallelism(), pool.speculation()
            )
        except ValueError as error:  # no profile for the dtype/GPU, or the weights do not fit
            raise _missing(f"{role} pool: {' '.join(str(error).split())}") from error


def missing(what: str) -> ProfileError:
    """``what`` is missing, followed by the profiles there are and how to add one."""
    return ProfileError(f"{what}; profiles: {describe()}; {HOW_TO_ADD}")


_missing = missing


# --- a user's calibrated profile (``disagg twin calibrate --out``) ---------------------------------------
PROFILE_KIND = "disagg-twin-profile"
_ENTRY_TABLES = ("layers_ms", "lm_head_ms")


def validate_profile(doc: Any, where: str) -> dict[str, Any]:
    """The profile document ``disagg twin calibrate`` writes, checked against the shipped schema: a
    ProfileError naming ``where`` and the first problem otherwise."""
    if not isinstance(doc, dict) or doc.get("kind") != PROFILE_KIND:
        raise ProfileError(f"{where}: not a profile written by disagg twin calibrate (kind: {PROFILE_KIND})")
    grid = load_profile_yaml("coefficients.yaml")["m_grid"]
    if doc.get("m_grid") != grid:
        raise ProfileError(
            f"{where}: m_grid differs from the shipped profiles'; recalibrate with this version"
        )
    for section, fields in (("models", MODEL_FIELDS), ("gpus", GPU_FIELDS)):
        table = doc.get(section) or {}
        if not isinstance(table, dict):
            raise ProfileError(f"{where}: {section} must be a mapping of names to entries")
        for name, entry in table.items():
            absent = [f for f in fields if not isinstance(entry, dict) or f not in entry]
            if absent:
                raise ProfileError(f"{where}: {section}.{name} lacks {', '.join(absent)}")
    entries = doc.get("profiles")
    if not isinstance(entries, dict) or not entries:
        raise ProfileError(f"{where}: no profiles in the file")
    for key, entry in entries.items():
        parts = str(key).split("/")
        if len(parts) != 4 or not parts[2].startswith("tp") or not parts[2][2:].isdigit():
            raise ProfileError(f"{where}: profile key {key!r} is not model/gpu/tpN/dtype")
        if not isinstance(entry, dict):
            raise ProfileError(f"{where}: profiles.{key} is not a mapping")
        for table in _ENTRY_TABLES:
            values = entry.get(table)
            if not isinstance(values, list) or len(values) != len(grid):
                raise ProfileError(
                    f"{where}: profiles.{key}.{table} needs {len(grid)} values (one per m_grid)"
                )
        for pair in ("ctx_attn_ms", "gen_attn_ms"):
            if not isinstance(entry.get(pair), list) or len(entry[pair]) != 2:
                raise ProfileError(f"{where}: profiles.{key}.{pair} needs two numbers [a, c]")
        if "source" not in entry:
            raise ProfileError(f"{where}: profiles.{key} lacks source")
    return doc


def use_profile(path: str | Path) -> list[str]:
    """Lay the profile file at ``path`` over the shipped profiles for this process; the keys it adds.
    A file that cannot be read or is not a profile is a ProfileError naming it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        doc = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        problem = getattr(error, "strerror", None) or " ".join(str(error).split())
        raise ProfileError(f"{path}: cannot read the profile: {problem}") from None
    validate_profile(doc, str(path))
    set_profile_overlay(doc)
    available.cache_clear()
    return sorted(doc["profiles"])

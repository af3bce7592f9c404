"""Fit the twin's latency profile to a user's measured serving runs (``disagg twin calibrate``).

The latency model (:mod:`disagg.perf.latency`) prices a step as ``overhead_factor * kernel tables +
step_overhead``, and the simulator adds ``request_overhead`` (the front end) before a request reaches the
engine. The kernel tables come from the shipped profile for the (model, GPU, TP, dtype) when there is one,
else from the H100 entry of the same model scaled by datasheet ratios (:func:`disagg.twin.calibrate.
scaled_entry`), else from a roofline of the architecture on the GPU's datasheet (:func:`roofline_entry`).
Those three knobs are then fitted so that the twin reproduces the measured runs: each run is replayed by the
twin's own simulator (:func:`disagg.twin.sim.simulate`: a closed loop of ``concurrency`` clients, or Poisson
arrivals at ``rate``, on one colocated replica) and Levenberg-Marquardt least squares, on log-parameters,
minimises the relative errors of mean TTFT and mean TPOT, with a weak pull towards the starting values so
that a knob the runs do not constrain stays where it was.

Held-out error: each held-out run is predicted by a fit that did not see it (leave-one-out by default).
The output is a profile document (models/gpus/profiles, the schema of the shipped YAML files) that
:func:`disagg.twin.profiles.use_profile` lays over the shipped tables. Pure computation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from disagg.perf.latency import (
    DTYPE_BYTES,
    GpuSpec,
    ModelConfig,
    load_profile_yaml,
    profile_overlay,
    resolve_gpu_name,
    resolve_model_name,
    set_profile_overlay,
)
from disagg.perf.moe import resolve_moe_model
from disagg.twin import profiles
from disagg.twin.measurements import MeasuredPoint
from disagg.twin.sim import PoolSpec, SimDeployment, mean_or_inf, simulate, steady_state, whole_run
from disagg.twin.traffic import Request

PARAMS = ("overhead_factor", "step_overhead_ms", "request_overhead_ms")
# log-space bounds of each knob: a profile outside them explains the runs with something other than overhead
BOUNDS = {
    "overhead_factor": (0.2, 10.0),
    "step_overhead_ms": (0.01, 500.0),
    "request_overhead_ms": (0.01, 5000.0),
}
PRIOR_WEIGHT = 0.02  # residual per unit of log-change from the starting value (a 2% error ~ a factor e)
# finite-difference step in log-parameter space: the simulator is piecewise in time, and a closed loop's
# steady state moves in steps as prompts start or stop colliding; 0.05 steps over them (at 0.02 a fit to the
# twin's own runs stopped 8% from the knobs that made them)
LOG_STEP = 0.05
MODEL_FIELDS = ("layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab", "params_b")
GPU_FIELDS = ("product", "memory_gib", "bf16_tflops", "fp8_tflops", "hbm_tbps", "nvlink_gbps", "nic_gbit")
ALLREDUCE_LATENCY_S = (
    10e-6  # per all-reduce launch + sync, roofline only (order of NCCL's small-message time)
)


class FitError(ValueError):
    """The runs cannot be fitted: an unknown model or GPU without its description, no runs, ..."""


# --- normalising a run's setup ------------------------------------------------------------------------
def normalise_dtype(value: str | None, what: str) -> str:
    key = (value or "bf16").strip().lower()
    key = {"auto": "bf16", "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "fp8_e4m3": "fp8"}.get(
        key, key
    )
    if key not in DTYPE_BYTES:
        raise FitError(f"{what}: {value!r} is not one of {sorted(DTYPE_BYTES)}")
    return "fp8" if key == "fp8" else "bf16"


def model_name(model: str, extra_models: Mapping[str, Any]) -> str:
    """The profile name of ``model``: a shipped one (name or alias), one of ``extra_models``, else a new
    name from the Hugging Face id (``org/Name-7B`` -> ``name-7b``)."""
    try:
        return resolve_model_name(model)
    except ValueError:
        pass
    key = model.strip().lower()
    for name, spec in extra_models.items():
        if key == name or key in (str(a).lower() for a in spec.get("aliases", [])):
            return name
    return key.rsplit("/", 1)[-1]


def gpu_name(gpu: str) -> str | None:
    try:
        return resolve_gpu_name(gpu)
    except ValueError:
        return None


# --- describing what the twin does not know -------------------------------------------------------------
def model_entry_from_hf_config(config: Mapping[str, Any], alias: str | None) -> dict[str, Any]:
    """A models.yaml entry from a Hugging Face ``config.json`` (dense decoder: Llama, Qwen2, Mistral, ...).
    Parameters are counted from the shapes: attention and MLP weights per layer, embeddings and lm_head."""
    try:
        hidden = int(config["hidden_size"])
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        inter = int(config["intermediate_size"])
        vocab = int(config["vocab_size"])
        head_dim = int(config.get("head_dim") or hidden // heads)
    except (KeyError, TypeError, ValueError) as error:
        raise FitError(
            f"model config: needs hidden_size, num_hidden_layers, num_attention_heads, intermediate_size and "
            f"vocab_size (config.json fields); {error}"
        ) from None
    per_layer = hidden * head_dim * (heads + 2 * kv_heads) + heads * head_dim * hidden + 3 * hidden * inter
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    entry: dict[str, Any] = {
        "source": "config.json given to disagg twin calibrate --model-config",
        "layers": layers,
        "hidden": hidden,
        "intermediate": inter,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "vocab": vocab,
        "params_b": round((layers * per_layer + embeddings) / 1e9, 3),
    }
    if alias:
        entry["aliases"] = [alias]
    return entry


def check_gpu_entry(entry: Mapping[str, Any], what: str) -> dict[str, Any]:
    missing = [f for f in GPU_FIELDS if f not in entry]
    if missing:
        raise FitError(
            f"{what}: a GPU description needs {', '.join(GPU_FIELDS)}; missing {', '.join(missing)}"
        )
    out = {f: entry[f] for f in GPU_FIELDS}
    for f in GPU_FIELDS[1:]:
        number = out[f]
        if isinstance(number, bool) or not isinstance(number, int | float) or not number > 0:
            raise FitError(f"{what}: {f} must be a number > 0, got {number!r}")
    return out


def roofline_entry(
    mc: ModelConfig, gs: GpuSpec, tp: int, dtype: str, m_grid: Sequence[int]
) -> dict[str, Any]:
    """Kernel tables from the datasheet: each linear layer takes the longer of its FLOPs at peak TFLOPS and
    its weight bytes at peak HBM bandwidth; two ring all-reduces per layer over NVLink; causal attention's
    FLOPs at peak BF16; decode attention reads the KV at peak HBM. A lower bound, as the measured tables are:
    the fitted ``overhead_factor`` carries the achieved fraction of peak."""
    peak = (gs.fp8_tflops if dtype == "fp8" else gs.bf16_tflops) * 1e12
    hbm = gs.hbm_tbps * 1e12
    wbytes = DTYPE_BYTES[dtype]
    hd = mc.head_dim
    per_layer = (
        mc.hidden * hd * (mc.heads + 2 * mc.kv_heads)
        + mc.heads * hd * mc.hidden
        + 3 * mc.hidden * mc.intermediate
    )
    shard = per_layer / tp

    def linear_ms(m: int) -> float:
        return 1000 * mc.layers * max(2 * m * shard / peak, shard * wbytes / hbm)

    def allreduce_ms(m: int) -> float:
        if tp == 1:
            return 0.0
        nbytes = m * mc.hidden * 2
        ring = 2 * (tp - 1) / tp * nbytes / (gs.nvlink_gbps * 1e9)
        return 1000 * 2 * mc.layers * (ALLREDUCE_LATENCY_S + ring)

    def lm_head_ms(s: int) -> float:
        cols = mc.vocab / tp
        return 1000 * max(2 * s * mc.hidden * cols / peak, mc.hidden * cols * 2 / hbm)

    attn_peak = gs.bf16_tflops * 1e12
    ctx_c = 1000 * mc.layers * 2 * (mc.heads / tp) * hd / attn_peak  # QK^T and PV over the causal half
    gen_g = 1000 * mc.kv_bytes_per_token("bf16") / tp / hbm
    return {
        "source": f"ROOFLINE from datasheet figures ({gs.name}: {gs.bf16_tflops} BF16 / {gs.fp8_tflops} FP8 "
        f"TFLOPS, {gs.hbm_tbps} TB/s HBM, {gs.nvlink_gbps} GB/s NVLink)",
        "layers_ms": [round(linear_ms(m) + allreduce_ms(m), 6) for m in m_grid],
        "allreduce_ms": [round(allreduce_ms(m), 6) for m in m_grid],
        "lm_head_ms": [round(lm_head_ms(m), 6) for m in m_grid],
        "ctx_attn_ms": [0.0, ctx_c],
        "gen_attn_ms": [0.0, gen_g],
    }


# --- the profile being fitted ---------------------------------------------------------------------------
@dataclass
class Target:
    """One (model, GPU, TP, dtype) profile entry to fit, with the runs that measured it."""

    key: str
    model: str
    gpu: str
    tp: int
    dtype: str
    base: dict[str, Any]  # the kernel tables (no fitted knobs)
    base_source: str  # "shipped", "scaled", "roofline"
    start: dict[str, float]  # the knobs the shipped profile would use
    points: list[MeasuredPoint] = field(default_factory=list)


@dataclass
class Plan:
    """What to fit: new models/GPUs for the overlay, and the targets."""

    models: dict[str, Any]
    gpus: dict[str, Any]
    targets: dict[str, Target]

    def overlay(self, knobs: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, Any]:
        entries = {}
        for key, t in self.targets.items():
            entry = dict(t.base)
            entry.update((knobs or {}).get(key, t.start))
            entries[key] = entry
        return {"models": self.models, "gpus": self.gpus, "profiles": entries}


def _start_knobs(entry: Mapping[str, Any]) -> dict[str, float]:
    rt = load_profile_yaml("coefficients.yaml")["runtime"]
    return {
        "overhead_factor": float(entry.get("overhead_factor", rt["overhead_factor"])),
        "step_overhead_ms": float(entry.get("step_overhead_ms", rt["step_overhead_ms"])),
        "request_overhead_ms": float(entry.get("request_overhead_ms", rt.get("request_overhead_ms", 0.0))),
    }


def plan(
    points: Sequence[MeasuredPoint],
    model_config: Mapping[str, Any] | None = None,
    gpu_spec: Mapping[str, Any] | None = None,
) -> Plan:
    """Group the runs by profile and find each one's kernel tables. ``model_config`` (a config.json) and
    ``gpu_spec`` (GPU_FIELDS) describe a model or GPU the shipped profiles lack."""
    if not points:
        raise FitError("measurements: no runs to fit")
    shipped = load_profile_yaml("coefficients.yaml")
    grid = shipped["m_grid"]
    models: dict[str, Any] = {}
    gpus: dict[str, Any] = {}
    targets: dict[str, Target] = {}
    for p in points:
        s = p.setup
        if not s.model:
            raise FitError(f"{p.source}: the run does not name its model; pass --model")
        if not s.gpu:
            raise FitError(f"{p.source}: the run does not name its GPU; pass --gpu (e.g. h100)")
        if not s.tp:
            raise FitError(f"{p.source}: the run does not name its tensor-parallel size; pass --tp")
        if resolve_moe_model(s.model) is not None:
            raise FitError(
                f"{p.source}: {s.model} is a mixture-of-experts profile; calibrate fits dense models only"
            )
        name = model_name(s.model, models)
        try:
            resolve_model_name(name)
        except ValueError:
            if name not in models:
                if model_config is None:
                    raise profiles.missing(
                        f"{p.source}: no twin profile for model {s.model!r}; pass its config.json with "
                        "--model-config to calibrate one"
                    ) from None
                models[name] = model_entry_from_hf_config(model_config, s.model if s.model != name else None)
        gpu = gpu_name(s.gpu) or s.gpu.strip().lower()
        if gpu_name(s.gpu) is None and gpu not in gpus:
            if gpu_spec is None:
                raise profiles.missing(
                    f"{p.source}: no twin profile for GPU {s.gpu!r}; pass its datasheet figures with "
                    f"--gpu-spec ({', '.join(GPU_FIELDS)})"
                ) from None
            gpus[gpu] = check_gpu_entry(gpu_spec, "--gpu-spec")
        dtype = normalise_dtype(s.dtype, f"{p.source}: dtype")
        normalise_dtype(s.kv_dtype, f"{p.source}: kv_dtype")
        key = f"{name}/{gpu}/tp{s.tp}/{dtype}"
        if key not in targets:
            targets[key] = _target(key, name, gpu, s.tp, dtype, grid, models, gpus)
        targets[key].points.append(p)
    return Plan(models, gpus, targets)


def _target(
    key: str, name: str, gpu: str, tp: int, dtype: str, grid: Sequence[int], models: Any, gpus: Any
) -> Target:
    from disagg.twin.calibrate import scaled_entry

    coef = load_profile_yaml("coefficients.yaml")["profiles"]
    knob_names = set(PARAMS) | {"source", "calibration"}
    if key in coef:
        entry = coef[key]
        base = {k: v for k, v in entry.items() if k not in knob_names}
        return Target(
            key, name, gpu, tp, dtype, base | {"source": entry["source"]}, "shipped", _start_knobs(entry)
        )
    h100_key = f"{name}/h100/tp{tp}/{dtype}"
    gpu_table = {**load_profile_yaml("gpus.yaml")["gpus"], **gpus}
    if h100_key in coef and gpu != "h100":
        base = scaled_entry(coef[h100_key], gpu_table[gpu], gpu_table["h100"], dtype)
        return Target(key, name, gpu, tp, dtype, base, "scaled", _start_knobs({}))
    model_table = {**load_profile_yaml("models.yaml")["models"], **models}
    mc = ModelConfig(name=name, **{f: model_table[name][f] for f in MODEL_FIELDS})
    gs = GpuSpec(name=gpu, **{f: gpu_table[gpu][f] for f in GPU_FIELDS})
    return Target(
        key, name, gpu, tp, dtype, roofline_entry(mc, gs, tp, dtype, grid), "roofline", _start_knobs({})
    )


# --- predicting a run -----------------------------------------------------------------------------------
# client phases a closed-loop run's steady state is averaged over: one run's mean depends on which prompts
# collide, which makes the fit's objective jagged in the knobs; averaging smooths it
PHASES = 4


def predict(point: MeasuredPoint, profile_key: str, seed: int = 1) -> tuple[float, float]:
    """The twin's mean TTFT and mean TPOT (s) for ``point`` under the profiles in force (the overlay)."""
    s = point.setup
    model, gpu, tp, dtype = profile_key.split("/")
    dep = SimDeployment(
        model=model,
        gpu=gpu,
        dtype=dtype,
        kv_dtype=normalise_dtype(s.kv_dtype, "kv_dtype"),
        mode="colocated",
        colocated=PoolSpec(1, int(tp.removeprefix("tp"))),
    )
    isl, osl = max(1, round(s.prompt_tokens)), max(2, round(s.output_tokens))
    if s.concurrency is not None:
        # the clients' steady state as disagg.twin.fidelity reproduces published points, their phases spread
        # over the measured duration of a request (a fit reads it; it does not move with the knobs, so the
        # objective stays smooth)
        c = s.concurrency
        seeds = tuple(range(seed, seed + PHASES))
        duration_s = osl * point.observed.tpot_mean_s
        if s.start != "burst":
            return steady_state(dep, c, isl, osl, seeds, duration_s)
        # vLLM's --max-concurrency and AIPerf's --concurrency start every client at once and average every
        # request: the first round sent together, the rest at the steady state (sim.whole_run)
        return whole_run(dep, c, isl, osl, s.num_requests or max(3, 8 * c), seeds, duration_s)
    assert s.rate is not None
    n = min(s.num_requests or 200, 2000)
    gaps = np.random.default_rng(seed).exponential(1 / s.rate, n)
    reqs = [Request(float(t), isl, osl) for t in np.cumsum(gaps) - gaps[0]]
    res = simulate(dep, reqs, seed=seed)
    return mean_or_inf(res.ttft), mean_or_inf(res.itl_mean)


def with_overlay(overlay: Mapping[str, Any] | None, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` with ``overlay`` laid over the shipped profiles, then restore the overlay in force."""
    before = profile_overlay()
    set_profile_overlay(dict(overlay) if overlay else None)
    profiles.available.cache_clear()
    try:
        return fn()
    finally:
        set_profile_overlay(before)
        profiles.available.cache_clear()


# --- the fit --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PointError:
    point: MeasuredPoint
    ttft_s: float  # predicted
    tpot_s: float

    @property
    def ttft_err(self) -> float:
        return (self.ttft_s - self.point.observed.ttft_mean_s) / self.point.observed.ttft_mean_s

    @property
    def tpot_err(self) -> float:
        return (self.tpot_s - self.point.observed.tpot_mean_s) / self.point.observed.tpot_mean_s


def mean_abs(errors: Sequence[PointError]) -> tuple[float, float]:
    """Mean absolute relative error of TTFT and of TPOT (NaN for no points)."""
    if not errors:
        return math.nan, math.nan
    return (
        float(np.mean([abs(e.ttft_err) for e in errors])),
        float(np.mean([abs(e.tpot_err) for e in errors])),
    )


def evaluate(
    target: Target, plan_: Plan, knobs: Mapping[str, float], points: Sequence[MeasuredPoint]
) -> list[PointError]:
    overlay = plan_.overlay({target.key: knobs})
    return list(with_overlay(overlay, lambda: [PointError(p, *predict(p, target.key)) for p in points]))


def _to_log(knobs: Mapping[str, float], names: Sequence[str]) -> np.ndarray:
    return np.array([math.log(min(max(knobs[n], BOUNDS[n][0]), BOUNDS[n][1])) for n in names])


def _from_log(x: np.ndarray, names: Sequence[str], fixed: Mapping[str, float]) -> dict[str, float]:
    out = dict(fixed)
    for n, v in zip(names, x, strict=True):
        lo, hi = BOUNDS[n]
        out[n] = float(min(max(math.exp(v), lo), hi))
    return out


def fit_knobs(
    target: Target,
    plan_: Plan,
    points: Sequence[MeasuredPoint],
    names: Sequence[str] = PARAMS,
    start: Mapping[str, float] | None = None,
    max_iter: int = 15,
) -> dict[str, float]:
    """Levenberg-Marquardt on the log of the knobs ``names``; residuals are the relative TTFT and TPOT
    errors of ``points`` and a weak prior pulling each knob to its value in ``target.start``."""
    begin = dict(start or target.start)
    prior = _to_log(target.start, names)
    lo = np.array([math.log(BOUNDS[n][0]) for n in names])
    hi = np.array([math.log(BOUNDS[n][1]) for n in names])

    def residuals(x: np.ndarray) -> np.ndarray:
        errs = evaluate(target, plan_, _from_log(x, names, begin), points)
        r = [e.ttft_err for e in errs] + [e.tpot_err for e in errs]
        out = np.array([v if math.isfinite(v) else 1e3 for v in r] + list(PRIOR_WEIGHT * (x - prior)))
        return out

    x = _to_log(begin, names)
    r = residuals(x)
    cost = float(r @ r)
    lam = 1e-2
    for _ in range(max_iter):
        jac = np.empty((len(r), len(x)))
        for i in range(len(x)):
            step = np.zeros_like(x)
            step[i] = LOG_STEP if x[i] + LOG_STEP <= hi[i] else -LOG_STEP
            jac[:, i] = (residuals(x + step) - r) / step[i]
        a, g = jac.T @ jac, jac.T @ r
        improved = False
        while lam < 1e8:
            dx = -np.linalg.solve(a + lam * np.diag(np.diag(a) + 1e-9), g)
            x_new = np.clip(x + dx, lo, hi)
            r_new = residuals(x_new)
            cost_new = float(r_new @ r_new)
            if cost_new < cost:
                improved = cost - cost_new > 1e-6 * cost
                x, r, cost, lam = x_new, r_new, cost_new, max(lam / 3, 1e-7)
                break
            lam *= 4
        if not improved:
            break
    return _from_log(x, names, begin)


@dataclass(frozen=True)
class FitReport:
    key: str
    base_source: str
    start: dict[str, float]
    knobs: dict[str, float]
    fitted: list[PointError]  # the final profile on the runs it was fitted to
    held_out: list[PointError]  # each held-out run predicted by a fit that did not see it
    baseline: list[PointError]  # the unfitted profile (start knobs) on every run

    def summary(self) -> dict[str, Any]:
        fit_t, fit_p = mean_abs(self.fitted)
        ho_t, ho_p = mean_abs(self.held_out)
        base_t, base_p = mean_abs(self.baseline)

        def pct(v: float) -> float | None:
            return None if math.isnan(v) else round(100 * v, 1)

        return {
            "points": len(self.baseline),
            "fitted_points": len(self.fitted),
            "held_out_points": len(self.held_out),
            "fit_error_pct": {"ttft": pct(fit_t), "tpot": pct(fit_p)},
            "held_out_error_pct": {"ttft": pct(ho_t), "tpot": pct(ho_p)},
            "unfitted_error_pct": {"ttft": pct(base_t), "tpot": pct(base_p)},
        }


def holdout_split(n: int, spec: str) -> tuple[str, list[int]]:
    """``loo`` (leave-one-out), ``none``, or 1-based run numbers ``2,5`` held out of the fit."""
    key = spec.strip().lower()
    if key in ("loo", "none"):
        return key, []
    try:
        picked = sorted({int(part) for part in key.split(",") if part.strip()})
    except ValueError:
        raise FitError(f"--holdout: {spec!r} is not 'loo', 'none' or run numbers like '2,5'") from None
    if not picked or picked[0] < 1 or picked[-1] > n:
        raise FitError(f"--holdout: run numbers must be within 1..{n}, got {spec!r}")
    if len(picked) >= n:
        raise FitError("--holdout: holds out every run; leave at least one to fit")
    return "split", [i - 1 for i in picked]


def fits_needed(target: Target, holdout: str = "loo") -> int:
    """How many fits :func:`fit_target` runs for ``target``: one, plus one per run under leave-one-out."""
    mode, _ = holdout_split(len(target.points), holdout)
    return 1 + (len(target.points) if mode == "loo" and len(target.points) > 1 else 0)


def fit_target(
    target: Target,
    plan_: Plan,
    holdout: str = "loo",
    names: Sequence[str] = PARAMS,
    on_fit: Callable[[], None] | None = None,
) -> FitReport:
    """Fit ``target``'s knobs and measure the fit, the held-out runs and the unfitted profile; ``on_fit`` is
    called after each of the :func:`fits_needed` fits (a progress display)."""
    done = on_fit or (lambda: None)
    pts = target.points
    mode, held = holdout_split(len(pts), holdout)
    # two observations per run: with one run fit only the first two knobs (the overheads of a step)
    names = list(names)[: max(1, min(len(names), 2 * (len(pts) - len(held))))]
    baseline = evaluate(target, plan_, target.start, pts)
    if mode == "split":
        train = [p for i, p in enumerate(pts) if i not in held]
        knobs = fit_knobs(target, plan_, train, names)
        done()
        fitted = evaluate(target, plan_, knobs, train)
        held_out = evaluate(target, plan_, knobs, [pts[i] for i in held])
    else:
        knobs = fit_knobs(target, plan_, pts, names)
        done()
        fitted = evaluate(target, plan_, knobs, pts)
        held_out = []
        if mode == "loo" and len(pts) > 1:
            for i, p in enumerate(pts):
                rest = [q for j, q in enumerate(pts) if j != i]
                k = fit_knobs(target, plan_, rest, names, start=knobs, max_iter=8)
                done()
                held_out.extend(evaluate(target, plan_, k, [p]))
    return FitReport(target.key, target.base_source, dict(target.start), knobs, fitted, held_out, baseline)


def profile_document(plan_: Plan, reports: Mapping[str, FitReport], inputs: Sequence[str]) -> dict[str, Any]:
    """The profile file: ``m_grid``, new ``models``/``gpus``, and one coefficients entry per target with its
    fitted knobs and how well they fit."""
    entries = {}
    for key, t in plan_.targets.items():
        rep = reports[key]
        entry = dict(t.base)
        entry["source"] = (
            f"{t.base['source']}; overhead knobs fitted to measured runs by disagg twin calibrate"
        )
        entry.update({k: round(v, 4) for k, v in rep.knobs.items()})
        entry["calibration"] = {"kernel_tables": t.base_source, "measurements": list(inputs), **rep.summary()}
        entries[key] = entry
    return {
        "kind": "disagg-twin-profile",
        "m_grid": list(load_profile_yaml("coefficients.yaml")["m_grid"]),
        "models": plan_.models,
        "gpus": plan_.gpus,
        "profiles": entries,
    }

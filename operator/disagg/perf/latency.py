"""The latency model: how long one engine step takes on a (model, GPU, TP, dtype).

A step runs ``num_tokens`` tokens through the model (prefill chunks plus one token per decoding sequence):

    step = overhead_factor * (layers(num_tokens) + lm_head(num_seqs) + ctx_attn + gen_attn) + step_overhead

* ``layers(m)``: linear layers and tensor-parallel all-reduces of every layer for m tokens, tabulated from
  measured kernel times (profiles/coefficients.yaml, written by ``disagg.twin.calibrate``; each entry names
  its source) and interpolated linearly in m.
* ``ctx_attn = a + c * sum(2 * chunk * prior + chunk**2)`` over the prefill chunks (causal attention work;
  equals ``sum(l**2)`` for whole prompts), ``gen_attn = a + g * sum(context)`` over decoding sequences.
* ``overhead_factor`` and ``step_overhead`` cover what the kernel tables leave out (norms, rope, sampling,
  scheduler and launch overhead); see the runtime section of coefficients.yaml.

KV capacity (``kv_capacity_tokens``, ``kv_budget_for``) is vLLM's own accounting of the GPU's memory under the
engine's flags: :mod:`disagg.perf.memory`.

Model architectures (profiles/models.yaml) and GPU specs (profiles/gpus.yaml) are data: a user adds a model
or GPU there, runs the calibration, and needs no code change. Pure: no I/O beyond reading those files.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from disagg.perf.memory import EngineMemory, KvBudget, Shapes, default_engine_memory, dense_mlp, kv_budget

if TYPE_CHECKING:
    from disagg.perf.moe import Parallelism, Speculation

PROFILES_DIR = Path(__file__).parent / "profiles"
GIB = 2**30
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True)
class ModelConfig:
    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    params_b: float

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> int:
        """K and V of every layer for one token: 2 * layers * kv_heads * head_dim * bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[kv_dtype]

    def weight_bytes(self, dtype: str) -> float:
        return self.params_b * 1e9 * DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class GpuSpec:
    name: str
    product: str
    memory_gib: float
    bf16_tflops: float
    fp8_tflops: float
    hbm_tbps: float
    nvlink_gbps: float
    nic_gbit: float
    # what cudaMemGetInfo reports as the device's total (vLLM's total_memory), where a log gives it; 0: the
    # datasheet memory_gib
    total_memory_gib: float = 0.0

    @property
    def total_memory_bytes(self) -> float:
        return (self.total_memory_gib or self.memory_gib) * GIB


@dataclass(frozen=True)
class Link:
    """A KV-transfer path between a prefill and a decode replica: fixed setup latency + bytes / bandwidth."""

    name: str
    bandwidth_bytes_per_s: float
    setup_s: float

    def transfer_time_s(self, nbytes: float) -> float:
        return self.setup_s + nbytes / self.bandwidth_bytes_per_s


# Setup latency of one KV transfer (connector handshake, RDMA registration lookup, completion notification).
# Assumption of the twin (order of a millisecond, as NIXL/UCX RDMA round trips are tens of microseconds plus
# Python-side bookkeeping in vLLM's NixlConnector); configurable per simulation.
DEFAULT_KV_SETUP_S = 0.002


@dataclass(frozen=True)
class Runtime:
    overhead_factor: float
    step_overhead_s: float
    request_overhead_s: float


class LatencyModel:
    """Step times for one replica (a TP group) of a model on a GPU type. Immutable after construction."""

    def __init__(
        self,
        model: ModelConfig,
        gpu: GpuSpec,
        tp: int,
        dtype: str,
        coefficients: dict[str, Any],
        m_grid: Sequence[int],
        runtime: Runtime,
        kv_dtype: str = "bf16",
        memory: EngineMemory | None = None,
    ) -> None:
        self.model = model
        self.gpu = gpu
        self.tp = tp
        self.dtype = dtype
        self.kv_dtype = kv_dtype
        self.runtime = runtime
        self.source: str = coefficients["source"]
        # Entries from measured whole forward passes already include norms/rope/activations (factor 1.0).
        f = float(coefficients.get("overhead_factor", runtime.overhead_factor))
        self.overhead_factor = f
        self._grid = [float(m) for m in m_grid]
        self._layers = [f * x / 1000 for x in coefficients["layers_ms"]]
        allreduce = coefficients.get("allreduce_ms")
        self._allreduce = None if allreduce is None else [f * x / 1000 for x in allreduce]
        self._lm_head = [f * x / 1000 for x in coefficients["lm_head_ms"]]
        attn = coefficients
        if kv_dtype == "fp8":
            if "kv_fp8" not in coefficients:
                raise ValueError(
                    f"kv_dtype: no FP8 KV-cache attention table for {model.name} on {gpu.name} tp{tp}"
                )
            attn = coefficients["kv_fp8"]
        elif kv_dtype != "bf16":
            raise ValueError(f"kv_dtype: {kv_dtype!r} is not 'bf16' or 'fp8'")
        self._ctx_a = float(f * attn["ctx_attn_ms"][0] / 1000)
        self._ctx_c = float(f * attn["ctx_attn_ms"][1] / 1000)
        self._gen_a = float(f * attn["gen_attn_ms"][0] / 1000)
        self._gen_g = float(f * attn["gen_attn_ms"][1] / 1000)
        self._fixed = runtime.step_overhead_s
        self.kv_bytes_per_token = model.kv_bytes_per_token(kv_dtype)
        # what vllm serve runs with on this GPU without memory flags; ``memory``: the engine's own flags
        self.default_memory = default_engine_memory(gpu.total_memory_bytes / GIB, gpu.name)
        self.memory = memory or self.default_memory
        self.kv_budget = self.kv_budget_for(self.memory)
        self.kv_capacity_tokens = self.kv_budget.tokens

    def __repr__(self) -> str:
        return f"LatencyModel({self.model.name}, {self.gpu.name}, tp={self.tp}, {self.dtype})"

    # --- building blocks -------------------------------------------------------------------------
    def _interp(self, table: list[float], x: float) -> float:
        grid = self._grid
        if x <= grid[0]:
            return table[0] if x > 0 else 0.0
        if x >= grid[-1]:
            return table[-1] * x / grid[-1]
        i = bisect.bisect_right(grid, x)
        x0, x1 = grid[i - 1], grid[i]
        return table[i - 1] + (table[i] - table[i - 1]) * (x - x0) / (x1 - x0)

    def kv_budget_for(self, memory: EngineMemory) -> KvBudget:
        """One GPU's KV budget under these engine flags (:mod:`disagg.perf.memory`, vLLM's accounting); its
        ``tokens`` are the replica's KV capacity (every GPU of the TP group holds its heads of each token)."""
        m = self.model
        heads_per_gpu = math.ceil(m.kv_heads / self.tp)  # vLLM replicates KV heads when tp > kv_heads
        per_gpu_token = self.kv_bytes_per_token * heads_per_gpu / m.kv_heads
        shapes = Shapes(hidden=m.hidden, mlp=dense_mlp(m.intermediate, self.tp), vocab=m.vocab)
        budget = kv_budget(
            self.gpu.total_memory_bytes, m.weight_bytes(self.dtype) / self.tp, per_gpu_token, shapes, memory
        )
        if budget.blocks <= 0:
            raise ValueError(
                f"{m.name} {self.dtype} does not fit on {self.tp} x {self.gpu.name}: {budget.describe()}"
            )
        return budget

    def kv_capacity_for(self, memory: EngineMemory) -> int:
        """The replica's KV tokens under these engine flags (e.g. a pool's --gpu-memory-utilization)."""
        return self.kv_budget_for(memory).tokens

    # --- the contract --------------------------------------------------------------------------------
    def step_time_s(
        self,
        num_tokens: int,
        num_seqs: int,
        prefill_attn_work: float = 0.0,
        decode_seqs: int = 0,
        decode_context_tokens: int = 0,
    ) -> float:
        """One engine step. ``prefill_attn_work`` = sum(2*chunk*prior + chunk**2) over prefill chunks."""
        if num_tokens <= 0:
            return 0.0
        t = self._interp(self._layers, num_tokens) + self._interp(self._lm_head, num_seqs)
        if prefill_attn_work > 0:
            t += self._ctx_a + self._ctx_c * prefill_attn_work
        if decode_seqs > 0:
            t += self._gen_a + self._gen_g * decode_context_tokens
        return t + self._fixed

    def shard_forward_time_s(
        self, num_tokens: int, prefill_attn_work: float = 0.0, decode_context_tokens: int = 0
    ) -> float:
        """One TP shard's forward pass without all-reduce, lm_head, sampling or scheduler overhead: the
        quantity bench/gpu/measure_llama_forward.py measures, for comparing the model with a GPU."""
        if num_tokens <= 0:
            return 0.0
        t = self._interp(self._layers, num_tokens)
        if self._allreduce is not None:
            t -= self._interp(self._allreduce, num_tokens)
        elif self.tp > 1:
            raise ValueError(f"{self!r}: profile has no allreduce_ms to separate the all-reduce")
        if prefill_attn_work > 0:
            t += self._ctx_a + self._ctx_c * prefill_attn_work
        if decode_context_tokens > 0:
            t += self._gen_a + self._gen_g * decode_context_tokens
        return t

    def prefill_time_s(self, prompt_lens: Sequence[int]) -> float:
        """One step that prefills these whole prompts together."""
        total = sum(prompt_lens)
        work = float(sum(n * n for n in prompt_lens))
        return self.step_time_s(total, len(prompt_lens), prefill_attn_work=work)

    def decode_step_time_s(self, batch_size: int, total_context_tokens: int) -> float:
        """One decode step of ``batch_size`` sequences holding ``total_context_tokens`` in KV."""
        return self.step_time_s(batch_size, batch_size, 0.0, batch_size, total_context_tokens)

    def mixed_step_time_s(
        self, prefill_tokens: int, decode_batch: int, total_context_tokens: int, prefill_prior_tokens: int = 0
    ) -> float:
        """A chunked-prefill step: one prefill chunk (after ``prefill_prior_tokens``) plus decodes."""
        work = float(2 * prefill_tokens * prefill_prior_tokens + prefill_tokens * prefill_tokens)
        seqs = decode_batch + (1 if prefill_tokens else 0)
        return self.step_time_s(prefill_tokens + decode_batch, seqs, work, decode_batch, total_context_tokens)

    def decode_steps_time_s(self, batch_size: int, total_context_tokens: int, steps: int) -> float:
        """k identical-shape decode steps; the context grows by batch_size per step (closed form)."""
        if steps <= 0:
            return 0.0
        first = self.decode_step_time_s(batch_size, total_context_tokens)
        return steps * first + self._gen_g * batch_size * steps * (steps - 1) / 2

    def decode_step_slope_s(self, batch_size: int) -> float:
        """Increase of the decode step time per step at a fixed batch (context grows by batch_size)."""
        return self._gen_g * batch_size

    def kv_transfer_time_s(
        self, tokens: int, link: Link | str = "nic", setup_s: float | None = None
    ) -> float:
        """Moving a prompt's KV from a prefill to a decode replica over ``link``."""
        lk = self.link(link) if isinstance(link, str) else link
        if setup_s is not None:
            lk = Link(lk.name, lk.bandwidth_bytes_per_s, setup_s)
        return lk.transfer_time_s(tokens * self.kv_bytes_per_token)

    def link(self, name: str) -> Link:
        """Named links: ``nic`` (a NIC per GPU, the TP group's NICs in parallel) or ``nvlink`` (same node)."""
        if name == "nic":
            return Link("nic", self.gpu.nic_gbit * 1e9 / 8 * self.tp, DEFAULT_KV_SETUP_S)
        if name == "nvlink":
            return Link("nvlink", self.gpu.nvlink_gbps * 1e9 * self.tp, DEFAULT_KV_SETUP_S)
        raise ValueError(f"link: unknown link {name!r} (expected 'nic' or 'nvlink', or pass a Link)")


@functools.cache
def _shipped_yaml(name: str) -> Any:
    return yaml.safe_load((PROFILES_DIR / name).read_text())


# A user's calibrated profile (``disagg twin calibrate --out``, loaded by ``disagg simulate --profile``):
# {"models": {...}, "gpus": {...}, "profiles": {...}} laid over the shipped tables for this process.
_overlay: dict[str, Any] = {}
_OVERLAID = {"models.yaml": "models", "gpus.yaml": "gpus", "coefficients.yaml": "profiles"}


@functools.cache
def load_profile_yaml(name: str) -> Any:
    """One of the profile tables (models.yaml, gpus.yaml, coefficients.yaml), read once per process, with
    the entries of the profile overlay (:func:`set_profile_overlay`) added or replacing shipped ones."""
    shipped = _shipped_yaml(name)
    section = _OVERLAID.get(name)
    extra = _overlay.get(section or "", {}) if section else {}
    if not extra:
        return shipped
    merged = dict(shipped)
    merged[section] = {**shipped.get(section, {}), **extra}
    return merged


def profile_overlay() -> dict[str, Any] | None:
    """The profile overlay in force (a copy), None when only the shipped tables are."""
    return {k: dict(v) for k, v in _overlay.items()} if _overlay else None


def set_profile_overlay(overlay: dict[str, Any] | None) -> None:
    """Lay a calibrated profile's models, GPUs and coefficient entries over the shipped tables (``None``
    removes it). The shipped files are not touched; cached latency models are dropped."""
    global _overlay
    _overlay = {k: dict(overlay.get(k) or {}) for k in ("models", "gpus", "profiles")} if overlay else {}
    load_profile_yaml.cache_clear()
    load_latency_model.cache_clear()


def _model_table() -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = load_profile_yaml("models.yaml")["models"]
    return table


def resolve_model_name(model: str) -> str:
    """Canonical profile name for a model name or Hugging Face id (case-insensitive)."""
    key = model.strip().lower()
    for name, spec in _model_table().items():
        if key == name or key in (a.lower() for a in spec.get("aliases", [])):
            return name
    known = sorted(_model_table())
    raise ValueError(f"model: no twin profile for {model!r}; known models: {known} (add one to models.yaml)")


def resolve_gpu_name(gpu: str) -> str:
    key = gpu.strip().lower()
    gpus: dict[str, dict[str, Any]] = load_profile_yaml("gpus.yaml")["gpus"]
    for name, spec in gpus.items():
        if key in (name, str(spec.get("product", "")).lower()):
            return name
    raise ValueError(f"gpu: no twin profile for {gpu!r}; known GPUs: {sorted(gpus)} (add one to gpus.yaml)")


def load_model_config(model: str) -> ModelConfig:
    name = resolve_model_name(model)
    spec = _model_table()[name]
    fields = {f: spec[f] for f in ModelConfig.__dataclass_fields__ if f != "name"}
    return ModelConfig(name=name, **fields)


def load_gpu_spec(gpu: str) -> GpuSpec:
    name = resolve_gpu_name(gpu)
    spec = load_profile_yaml("gpus.yaml")["gpus"][name]
    fields = {f: spec[f] for f in GpuSpec.__dataclass_fields__ if f != "name" and f in spec}
    return GpuSpec(name=name, **fields)


@functools.cache
def load_latency_model(
    model: str,
    gpu: str,
    tp: int,
    dtype: str = "bf16",
    kv_dtype: str = "bf16",
    parallelism: Parallelism | None = None,
    speculation: Speculation | None = None,
) -> LatencyModel:
    """The latency model for (model, gpu, tp, dtype), e.g. ``("llama-3.1-70b", "h100", 4, "fp8")``.

    ``kv_dtype="fp8"`` models vLLM's ``--kv-cache-dtype fp8``: half the KV bytes per token (capacity,
    transfer) and the FP8-KV attention kernels, where the profile has them (H100 kernel tables).
    Models of profiles/moe_models.yaml (MoE, MLA, dense Qwen3) get a :class:`disagg.perf.moe.MoeLatencyModel`
    under ``parallelism`` (default: ``tp`` GPUs of tensor parallelism); the dense Llama profiles take
    tensor parallelism only."""
    from disagg.perf import moe

    if moe.resolve_moe_model(model) is not None:
        par = parallelism if parallelism is not None else moe.Parallelism(tp=tp)
        return moe.load_moe_latency_model(model, gpu, dtype, kv_dtype, par, speculation)
    if speculation is not None:
        raise ValueError(f"speculative decoding: the twin models MTP speculation only, and {model} has none")
    if parallelism is not None and (parallelism.dp, parallelism.ep) != (1, 1):
        raise ValueError(f"parallelism: {model} is dense; the twin models only tensor parallelism for it")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype: {dtype!r} is not one of {sorted(DTYPE_BYTES)}")
    mc = load_model_config(model)
    gs = load_gpu_spec(gpu)
    coef = load_profile_yaml("coefficients.yaml")
    key = f"{mc.name}/{gs.name}/tp{tp}/{'fp8' if dtype == 'fp8' else 'bf16'}"
    entry = coef["profiles"].get(key)
    if entry is None:
        have = sorted(k for k in coef["profiles"] if k.startswith(f"{mc.name}/{gs.name}/"))
        raise ValueError(f"tp/dtype: no calibrated profile {key!r}; available: {have}")
    rt = coef["runtime"]
    # an entry may carry its own step and request overheads (a profile calibrated from measured runs)
    runtime = Runtime(
        overhead_factor=float(rt["overhead_factor"]),
        step_overhead_s=float(entry.get("step_overhead_ms", rt["step_overhead_ms"])) / 1000,
        request_overhead_s=float(entry.get("request_overhead_ms", rt.get("request_overhead_ms", 0.0))) / 1000,
    )
    return LatencyModel(mc, gs, tp, dtype, entry, coef["m_grid"], runtime, kv_dtype)

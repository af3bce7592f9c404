"""Derive the MoE/MLA latency model's per-layer coefficients from the aiconfigurator kernel tables and write
disagg/perf/profiles/moe_coefficients.yaml (read by :mod:`disagg.perf.moe`; the runtime never reads parquet).

Run ``python -m disagg.twin.calibrate_moe [--calibration ../shared/calibration]``; the output is reproducible
from the inputs. For every model of profiles/moe_models.yaml, every GPU in ``GPUS`` and every weight dtype the
tables cover, one entry ``model/gpu/dtype`` holds per-layer times (ms) for ONE GPU of a replica:

* ``gemm``: attention projections (GQA: qkv + o), dense FFN (gate_up + down), shared experts, router and
  lm_head, each tabulated on ``m_grid`` tokens per GPU for attention-TP sizes 1/2/4/8, from
  ``gemm_vllm_0.24.0_gemm_perf.parquet`` (``gemm_dtype``: bfloat16, fp8_block for FP8 weights, nvfp4 for FP4
  weights on B200; bilinear in (n, k) as :class:`disagg.twin.calibrate.GemmTable`).
* ``attn`` per KV dtype and attention-TP: MLA models from ``mla_vllm_0.24.0_mla_{context,generation}_module``
  (the whole MLA block incl. its projections; the fastest kernel source per shape), fitted per layer as
  ``ctx = a + b*tokens + c*sum(l^2)`` and ``gen = a + b*batch + g*sum(context)``; GQA models from the
  context/generation attention tables (fits of :mod:`disagg.twin.calibrate`: ``a + c*sum(l^2)``,
  ``a + g*sum(context)``).
* ``allreduce``: one all-reduce of ``m * hidden`` bf16 elements (``comm_vllm_0.24.0_custom_allreduce``,
  ``vllm_graph``) per attention-TP size.
* ``moe``: routed experts of one MoE layer on one GPU, by the layer's global token count (tokens of all
  data-parallel ranks, aiconfigurator's convention), from ``moe_vllm_0.24.0_moe_perf`` (``distribution ==
  balanced``; the fastest kernel source per point) per (moe_tp, moe_ep); for DeepSeek's shape also
  ``moe_wideep`` from SGLang's DeepEP/DeepGEMM tables (``moe_sglang_0.5.10_wideep_{context,generation}``,
  ``uniform``): ``normal`` (prefill, contiguous layout) and ``ll`` (decode, masked layout) per EP size;
  their ``num_tokens`` is tokens per rank x EP (collector/sglang/collect_wideep_deepep_moe.py).
* ``deepep``: DeepEP dispatch + combine of one layer on one node (``comm_sglang_0.5.12_wideep_deepep_{normal,
  ll}``; normal at DeepEP's default 20 SMs) by tokens per rank, for the model's (hidden, top-k, experts) or
  the nearest measured shape scaled by bytes per token. The tables hold one node only; more nodes are
  modelled in :mod:`disagg.perf.moe` (remote bytes over the NIC).

H800 has no tables: its entries are H100's with the NVLink-bound collectives (custom all-reduce, NCCL,
DeepEP's one-node all-to-all) slowed by the NVLink ratio 900/400 above each table's latency floor
(:func:`slow_links`); dense models also get TP16 attention/GEMM tables and ``nccl_ms`` (intra-node
reduce-scatter/all-gather from ``comm_nccl_2.27.3_nccl_perf``) for a tensor-parallel group over two nodes.

The sums leave out norms, rope, activations and CPU overhead like the dense profiles; the runtime section of
coefficients.yaml (``overhead_factor``, ``step_overhead_ms``) applies to both.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from disagg.perf.latency import PROFILES_DIR, load_gpu_spec
from disagg.perf.moe import MoeArch, load_moe_archs
from disagg.twin.calibrate import (
    DEFAULT_CALIBRATION,
    M_GRID,
    AllReduceTable,
    GemmTable,
    _read_parquet,
    fit_context_attention,
    fit_generation_attention,
)

GPUS: dict[str, str] = {"h100": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm", "h800": "h100_sxm"}
# GPUs with no tables of their own: H800 is H100 with NVLink cut from 900 to 400 GB/s (gpus.yaml), so its
# entries are H100's with every NVLink-bound collective slowed by the NVLink ratio (:func:`slow_links`)
NVLINK_OF: dict[str, str] = {"h800": "h100"}
ATTN_TPS: tuple[int, ...] = (1, 2, 4, 8)
# tensor parallelism beyond one node, for dense models only (a MoE model spans nodes by expert parallelism)
MULTINODE_TPS: tuple[int, ...] = (16,)
# NCCL collectives (reduce-scatter and all-gather inside a node, for a tensor-parallel group spanning nodes)
# by GPUs per node; H200 has no NCCL table: its NVSwitch fabric is H100's (NVLink 4, 900 GB/s, gpus.yaml)
NCCL_GPUS: tuple[int, ...] = (2, 4, 8)
NCCL_FOLDER = {"h200": "h100_sxm"}
DTYPES: tuple[str, ...] = ("bf16", "fp8", "fp4")
# DeepEP's normal kernels run on Buffer.num_sms = 20 SMs by default (deepseek-ai/DeepEP deep_ep/buffer.py).
DEEPEP_NORMAL_SMS = 20
GEMM_DTYPE = {"bf16": "bfloat16", "fp8": "fp8_block", "fp4": "nvfp4"}


class Tables:
    """The parquet tables of one GPU, read once."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._cache: dict[str, Any] = {}

    def rows(self, name: str) -> list[dict[str, Any]]:
        if name not in self._cache:
            self._cache[name] = _read_parquet(self.base / f"{name}.parquet")
        rows: list[dict[str, Any]] = self._cache[name]
        return rows

    def gemm(self, dtype: str) -> GemmTable | None:
        key = f"gemm:{dtype}"
        if key not in self._cache:
            rows = [r for r in self.rows("gemm_vllm_0.24.0_gemm_perf") if r["gemm_dtype"] == dtype]
            self._cache[key] = GemmTable(rows) if rows else None
        table: GemmTable | None = self._cache[key]
        return table


def _gemm_grid(gemm: GemmTable, n: int, k: int) -> list[float]:
    if n <= 0 or k <= 0:
        return [0.0 for _ in M_GRID]
    return [round(gemm.latency(m, n, k), 6) for m in M_GRID]


def _sum(*grids: list[float]) -> list[float]:
    return [round(sum(vals), 6) for vals in zip(*grids, strict=True)]


def expert_dtype(arch: MoeArch, dtype: str, gpu: str) -> str | None:
    """The MoE table's ``moe_dtype`` for these weights, or None where the tables have no such kernel."""
    if dtype == "bf16":
        return "bfloat16"
    if dtype == "fp8":
        return "fp8_block"
    if arch.name == "gpt-oss-120b":
        return "w4a16_mxfp4"  # gpt-oss ships MXFP4 experts; the tables measure vLLM's MXFP4 kernels
    return "nvfp4" if gpu == "b200" else None


def dense_gemm_dtype(arch: MoeArch, dtype: str, gpu: str) -> str | None:
    """``gemm_dtype`` of the attention/dense/shared GEMMs: FP8 checkpoints quantize every linear layer
    (block-scaled); FP4 checkpoints of MoE models quantize the experts only (gpt-oss: the rest is BF16), a
    dense model's FP4 is NVFP4 on B200 (the only GPU with FP4 tensor cores here)."""
    if dtype == "fp4":
        if arch.routed_experts:
            return "bfloat16"
        return "nvfp4" if gpu == "b200" else None
    return GEMM_DTYPE[dtype]


def attn_tps(arch: MoeArch) -> tuple[int, ...]:
    """The attention TP sizes tabulated for ``arch``: 1-8 within a node, 16 (two nodes) for dense models."""
    return ATTN_TPS if arch.routed_experts else ATTN_TPS + MULTINODE_TPS


def gemm_grids(arch: MoeArch, gemm: GemmTable, lm_gemm: GemmTable) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for tp in attn_tps(arch):
        heads = max(1, arch.heads // tp)
        kvh = max(1, arch.kv_heads // tp)
        if arch.attention == "gqa":
            attn = _sum(
                _gemm_grid(gemm, (heads + 2 * kvh) * arch.head_dim, arch.hidden),
                _gemm_grid(gemm, arch.hidden, heads * arch.head_dim),
            )
        else:
            attn = [0.0 for _ in M_GRID]  # the MLA module tables include the projections
        dense = _sum(
            _gemm_grid(gemm, 2 * arch.intermediate // tp, arch.hidden),
            _gemm_grid(gemm, arch.hidden, arch.intermediate // tp),
        )
        shared_inter = arch.shared_experts * arch.moe_intermediate // tp
        shared = _sum(
            _gemm_grid(gemm, 2 * shared_inter, arch.hidden), _gemm_grid(gemm, arch.hidden, shared_inter)
        )
        out[f"tp{tp}"] = {
            "attn_linear_ms": attn,
            "dense_ffn_ms": dense,
            "shared_ffn_ms": shared,
            "lm_head_ms": _gemm_grid(lm_gemm, arch.vocab // tp, arch.hidden),
        }
    out["router_ms"] = _gemm_grid(lm_gemm, arch.routed_experts, arch.hidden)
    return out


def _fit3(pts: list[tuple[float, float, float]]) -> list[float]:
    """y = a + b*x1 + c*x2 by relative least squares, coefficients clamped at 0."""
    if not pts:
        raise ValueError("no calibration rows match this attention shape")
    x1 = np.array([p[0] for p in pts])
    x2 = np.array([p[1] for p in pts])
    y = np.array([p[2] for p in pts])
    w = 1.0 / y
    design = np.stack([np.ones_like(x1), x1, x2], axis=1) * w[:, None]
    coef, *_ = np.linalg.lstsq(design, y * w, rcond=None)
    return [max(float(c), 0.0) for c in coef]


def _fastest(rows: Iterable[dict[str, Any]], key: tuple[str, ...]) -> list[dict[str, Any]]:
    """One row per ``key`` values: the fastest kernel source (an engine picks its best backend)."""
    best: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        k = tuple(r[f] for f in key)
        if k not in best or r["latency"] < best[k]["latency"]:
            best[k] = r
    return list(best.values())


def mla_fits(t: Tables, arch: MoeArch, gemm_type: str, kv: str) -> dict[str, Any] | None:
    kv_name = "bfloat16" if kv == "bf16" else "fp8"
    out: dict[str, Any] = {}
    for name, phase in (("mla_context_module", "ctx"), ("mla_generation_module", "gen")):
        rows = [
            r
            for r in t.rows(f"mla_vllm_0.24.0_{name}_perf")
            if r["model"] == arch.table_model
            and r["gemm_type"] == gemm_type
            and r["kv_cache_dtype"] == kv_name
        ]
        if not rows:
            return None
        for tp in ATTN_TPS:
            heads = max(1, arch.heads // tp)
            mine = _fastest((r for r in rows if r["num_heads"] == heads), ("batch_size", "isl", "step"))
            if phase == "ctx":
                pts = [
                    (r["batch_size"] * r["isl"], r["batch_size"] * r["isl"] ** 2, r["latency"]) for r in mine
                ]
            else:
                pts = [(r["batch_size"], r["batch_size"] * r["step"], r["latency"]) for r in mine]
            out.setdefault(f"tp{tp}", {})[f"{phase}_ms"] = _fit3(pts)
    return out


def gqa_fits(t: Tables, arch: MoeArch, kv: str) -> dict[str, Any]:
    kv_name = "bfloat16" if kv == "bf16" else "fp8"
    ctx_rows = t.rows("attention_vllm_0.24.0_context_attention_perf")
    gen_rows = t.rows("attention_vllm_0.24.0_generation_attention_perf")
    out: dict[str, Any] = {}
    for tp in attn_tps(arch):
        heads, kvh = max(1, arch.heads // tp), max(1, arch.kv_heads // tp)
        try:
            ca, cc = fit_context_attention(ctx_rows, heads, kvh, arch.head_dim, kv_name)
            ga, gg = fit_generation_attention(gen_rows, heads, kvh, arch.head_dim, kv_name)
        except ValueError:
            continue  # a shape the tables lack (Llama-405B's 128 heads on one GPU, which it does not fit)
        out[f"tp{tp}"] = {"ctx_ms": [ca, 0.0, cc], "gen_ms": [ga, 0.0, gg]}
    return out


def allreduce_grids(t: Tables, hidden: int) -> dict[str, list[float]]:
    ar = AllReduceTable(t.rows("comm_vllm_0.24.0_custom_allreduce_perf"))
    return {f"tp{tp}": [round(ar.latency(tp, m * hidden), 6) for m in M_GRID] for tp in ATTN_TPS}


class NcclTable:
    """NCCL collective times (ms) by GPUs and message elements (``comm_nccl_2.27.3_nccl_perf``, fp16; its
    ``message_size`` counts elements as the custom all-reduce table's does: both give 1.09 ms for a 2^27
    element all-reduce over 8 H100s); log-interpolated, proportional beyond the largest message."""

    def __init__(self, rows: Iterable[dict[str, Any]], op: str) -> None:
        by: dict[int, dict[int, float]] = defaultdict(dict)
        for r in rows:
            if r["op_name"] == op and r["nccl_dtype"] == "half":
                g, size = int(r["num_gpus"]), int(r["message_size"])
                by[g][size] = min(float(r["latency"]), by[g].get(size, float("inf")))
        self._tables = {g: sorted(v.items()) for g, v in by.items()}

    def latency(self, gpus: int, elements: int) -> float:
        sizes, lats = zip(*self._tables[gpus], strict=True)
        if elements >= sizes[-1]:
            return float(lats[-1] * elements / sizes[-1])
        return float(np.interp(np.log(max(elements, 1)), np.log(sizes), lats))


def nccl_grids(t: Tables, hidden: int) -> dict[str, Any]:
    """Reduce-scatter and all-gather of ``m * hidden`` bf16 elements inside one node of g GPUs: the
    intra-node halves of a hierarchical all-reduce over several nodes (:mod:`disagg.perf.moe` adds the
    inter-node ring over the NICs between them)."""
    rows = t.rows("comm_nccl_2.27.3_nccl_perf")
    out: dict[str, Any] = {}
    for op in ("reduce_scatter", "all_gather"):
        table = NcclTable(rows, op)
        out[op] = {f"g{g}": [round(table.latency(g, m * hidden), 6) for m in M_GRID] for g in NCCL_GPUS}
    return out


def _token_table(points: Iterable[tuple[int, float]]) -> dict[str, list[float]]:
    by: dict[int, float] = {}
    for tok, ms in points:
        by[tok] = min(ms, by.get(tok, float("inf")))
    toks = sorted(by)
    return {"tokens": [float(x) for x in toks], "ms": [round(by[x], 6) for x in toks]}


def moe_tables(t: Tables, arch: MoeArch, moe_dtype: str) -> dict[str, Any]:
    shape = (arch.hidden, arch.moe_intermediate, arch.experts_per_token, arch.routed_experts)
    rows = [
        r
        for r in t.rows("moe_vllm_0.24.0_moe_perf")
        if (r["hidden_size"], r["inter_size"], r["topk"], r["num_experts"]) == shape
        and r["moe_dtype"] == moe_dtype
        and r["distribution"] == "balanced"
    ]
    by: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        by[f"tp{r['moe_tp_size']}ep{r['moe_ep_size']}"].append((r["num_tokens"], float(r["latency"])))
    return {k: _token_table(v) for k, v in sorted(by.items())}


def wideep_tables(t: Tables, arch: MoeArch, moe_dtype: str) -> dict[str, Any] | None:
    shape = (arch.hidden, arch.moe_intermediate, arch.experts_per_token, arch.routed_experts)
    out: dict[str, Any] = {}
    for name, mode in (("context", "normal"), ("generation", "ll")):
        rows = [
            r
            for r in t.rows(f"moe_sglang_0.5.10_wideep_{name}_moe_perf")
            if (r["hidden_size"], r["inter_size"], r["topk"], r["num_experts"]) == shape
            and r["moe_dtype"] == moe_dtype
            and r["distribution"] == "uniform"
        ]
        by: dict[int, list[tuple[int, float]]] = defaultdict(list)
        for r in rows:
            by[int(r["moe_ep_size"])].append((r["num_tokens"], float(r["latency"])))
        for ep, pts in sorted(by.items()):
            out.setdefault(f"ep{ep}", {})[mode] = _token_table(pts)
    return out or None


def deepep_tables(t: Tables, arch: MoeArch) -> dict[str, Any]:
    """One node's dispatch + combine (ms) by tokens per rank, normal and low-latency."""
    want = (arch.hidden, arch.experts_per_token, arch.routed_experts)
    ll = t.rows("comm_sglang_0.5.12_wideep_deepep_ll_perf")
    normal = [
        r
        for r in t.rows("comm_sglang_0.5.12_wideep_deepep_normal_perf")
        if r["dispatch_sms"] == DEEPEP_NORMAL_SMS
    ]
    shapes = {(r["hidden_size"], r["num_topk"], r["num_experts"]) for r in ll} & {
        (r["hidden_size"], r["num_topk"], r["num_experts"]) for r in normal
    }
    # the measured shape with the same expert count and the closest bytes per token (hidden x top-k)
    shape = (
        want
        if want in shapes
        else min(shapes, key=lambda s: (s[2] != want[2], abs(s[0] * s[1] - want[0] * want[1])))
    )
    scale = (want[0] * want[1]) / (shape[0] * shape[1])  # equivalent tokens carry the same bytes
    ll_pts = [
        (r["num_token"], (r["dispatch_avg_t_us"] + r["combine_avg_t_us"]) / 1000)
        for r in ll
        if (r["hidden_size"], r["num_topk"], r["num_experts"]) == shape and r["node_num"] == 1
    ]
    nm_pts = [
        (
            r["num_token"],
            (
                r["dispatch_transmit_us"]
                + r["dispatch_notify_us"]
                + r["combine_transmit_us"]
                + r["combine_notify_us"]
            )
            / 1000,
        )
        for r in normal
        if (r["hidden_size"], r["num_topk"], r["num_experts"]) == shape and r["node_num"] == 1
    ]

    def table(pts: list[tuple[int, float]]) -> dict[str, list[float]]:
        tab = _token_table(pts)
        return {"tokens": [round(x / scale, 3) for x in tab["tokens"]], "ms": tab["ms"]}

    return {"measured_shape": list(shape), "normal": table(nm_pts), "ll": table(ll_pts)}


def entry(
    t: Tables, arch: MoeArch, gpu: str, dtype: str, nccl: Tables | None = None
) -> dict[str, Any] | None:
    gemm_dtype = dense_gemm_dtype(arch, dtype, gpu)
    gemm = t.gemm(gemm_dtype) if gemm_dtype else None
    lm_gemm = t.gemm("bfloat16")
    if gemm is None or lm_gemm is None:
        return None
    out: dict[str, Any] = {
        "source": f"aiconfigurator/{GPUS[gpu]} kernel tables (vLLM 0.24 GEMM {gemm_dtype}, attention/MLA, "
        "MoE, custom all-reduce; SGLang wide-EP MoE and DeepEP); see disagg.twin.calibrate_moe",
        "gemm": gemm_grids(arch, gemm, lm_gemm),
        "allreduce_ms": allreduce_grids(t, arch.hidden),
        "attn": {},
    }
    if not arch.routed_experts and nccl is not None:
        out["nccl_ms"] = nccl_grids(nccl, arch.hidden)
    for kv in ("bf16", "fp8"):
        if arch.attention == "mla":
            fits = mla_fits(t, arch, GEMM_DTYPE[dtype] if dtype != "fp4" else "nvfp4", kv)
            if fits is None and dtype == "fp4":
                fits = mla_fits(t, arch, "bfloat16", kv)
        else:
            fits = gqa_fits(t, arch, kv)
        if fits is not None:
            out["attn"][kv] = fits
    if not out["attn"]:
        return None
    if arch.routed_experts:
        moe_dtype = expert_dtype(arch, dtype, gpu)
        if moe_dtype is None:
            return None
        moe = moe_tables(t, arch, moe_dtype)
        if not moe:
            return None
        out["expert_dtype"] = moe_dtype
        out["moe"] = moe
        wide = wideep_tables(t, arch, moe_dtype)
        if wide:
            out["moe_wideep"] = wide
        out["deepep"] = deepep_tables(t, arch)
    return out


def _slow(grid: list[float], ratio: float) -> list[float]:
    """A collective's times with its bandwidth divided by ``ratio``: the part above the table's latency floor
    (its fastest nonzero point, launch and synchronisation) stretches, the floor does not."""
    floor = min((x for x in grid if x > 0), default=0.0)
    return [round(floor + (x - floor) * ratio, 6) if x > 0 else 0.0 for x in grid]


def slow_links(e: dict[str, Any], ratio: float, gpu: str, like: str) -> dict[str, Any]:
    """Entry ``e`` of GPU ``like`` for ``gpu`` whose NVLink is ``ratio`` times slower: the custom all-reduce,
    the intra-node NCCL collectives and DeepEP's one-node dispatch/combine (all NVLink-bound) slowed; GEMMs,
    attention and MoE kernels as measured (same SMs, HBM and clocks). The NIC part of multi-node collectives
    comes from gpus.yaml at run time."""
    out = dict(e)
    out["source"] = f"{e['source']}; {gpu}: the {like} tables with NVLink-bound collectives x{ratio:.2f}"
    out["allreduce_ms"] = {k: _slow(v, ratio) for k, v in e["allreduce_ms"].items()}
    if "nccl_ms" in e:
        out["nccl_ms"] = {op: {k: _slow(v, ratio) for k, v in g.items()} for op, g in e["nccl_ms"].items()}
    if "deepep" in e:
        dep = dict(e["deepep"])
        for mode in ("normal", "ll"):
            dep[mode] = {"tokens": e["deepep"][mode]["tokens"], "ms": _slow(e["deepep"][mode]["ms"], ratio)}
        out["deepep"] = dep
    return out


def calibrate(cal: Path) -> dict[str, Any]:
    archs = load_moe_archs()
    entries: dict[str, Any] = {}
    for gpu, folder in GPUS.items():
        if gpu in NVLINK_OF:
            like = NVLINK_OF[gpu]
            ratio = load_gpu_spec(like).nvlink_gbps / load_gpu_spec(gpu).nvlink_gbps
            for key in [k for k in entries if k.split("/")[1] == like]:
                name, _, dtype = key.split("/")
                entries[f"{name}/{gpu}/{dtype}"] = slow_links(entries[key], ratio, gpu, like)
            continue
        t = Tables(cal / "aiconfigurator" / folder)
        nccl = Tables(cal / "aiconfigurator" / NCCL_FOLDER.get(gpu, folder))
        for name, arch in archs.items():
            for dtype in DTYPES:
                e = entry(t, arch, gpu, dtype, nccl)
                if e is not None:
                    entries[f"{name}/{gpu}/{dtype}"] = e
    return {"m_grid": list(M_GRID), "profiles": entries}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calibration", type=Path, default=DEFAULT_CALIBRATION)
    parser.add_argument("--out", type=Path, default=PROFILES_DIR / "moe_coefficients.yaml")
    args = parser.parse_args(argv)
    data = calibrate(args.calibration.resolve())
    header = (
        "# GENERATED by `python -m disagg.twin.calibrate_moe` from ../shared/calibration; do not edit.\n"
        "# Units: ms per layer on one GPU of a replica. gemm.*: on m_grid tokens per GPU; attn fits\n"
        "# [a, b, c]: ctx a + b*tokens + c*sum(l^2), gen a + b*batch + g*sum(context);\n"
        "# moe/moe_wideep/deepep: ms by tokens.\n"
    )
    args.out.write_text(header + yaml.safe_dump(data, sort_keys=False, width=120, default_flow_style=None))
    print(f"wrote {len(data['profiles'])} profiles to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

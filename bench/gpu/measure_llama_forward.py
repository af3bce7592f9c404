"""Measure Llama-shaped forward passes on a real GPU, for the twin's latency model.

Runs on a machine with a CUDA GPU and PyTorch (the lent device machine), never in CI. Weights are random
(no download): step time depends on tensor shapes, not values. Per-GPU work of a tensor-parallel shard is
measured by giving one GPU 1/TP of the heads and of the MLP width; the all-reduce is not included (the
twin adds it from the NCCL tables in ../shared/calibration).

Each layer: RMSNorm, fused QKV GEMM, rotary embedding (elementwise), attention with grouped KV heads
(torch scaled_dot_product_attention, flash backend for bf16), output GEMM, RMSNorm, fused gate/up GEMM,
SiLU*mul, down GEMM. Decode steps run under CUDA graphs, as vLLM does, so Python launch overhead is not
measured; the dense KV cache is shared by all layers (same bytes read per layer as a per-layer cache).

Writes a CSV: model,gpu,tp,phase,batch,tokens,context,ms  (prefill: batch sequences of `tokens` each;
decode: `batch` sequences each attending to `context` tokens).

Usage: python bench/gpu/measure_llama_forward.py --out DIR [--quick]
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int


# Architecture numbers from the models' published config.json (meta-llama/Llama-3.1-8B, -70B).
LLAMA_31_8B = Shape("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336)
LLAMA_31_70B = Shape("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672)


class Shard:
    """One GPU's share of a Llama model at tensor-parallel degree tp (random bf16 weights)."""

    def __init__(self, shape: Shape, tp: int, device: str) -> None:
        self.shape = shape
        self.tp = tp
        self.h = shape.heads // tp
        self.kvh = max(1, shape.kv_heads // tp)
        self.d = shape.head_dim
        self.inter = shape.intermediate // tp
        dt = torch.bfloat16
        std = 0.02
        q_out = (self.h + 2 * self.kvh) * self.d
        self.layers = []
        for _ in range(shape.layers):
            self.layers.append(
                {
                    "qkv": torch.randn(q_out, shape.hidden, device=device, dtype=dt) * std,
                    "o": torch.randn(shape.hidden, self.h * self.d, device=device, dtype=dt) * std,
                    "gate_up": torch.randn(2 * self.inter, shape.hidden, device=device, dtype=dt) * std,
                    "down": torch.randn(shape.hidden, self.inter, device=device, dtype=dt) * std,
                    "n1": torch.ones(shape.hidden, device=device, dtype=dt),
                    "n2": torch.ones(shape.hidden, device=device, dtype=dt),
                }
            )

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def prefill(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: (B, L, hidden); causal self-attention over the prompt."""
        b, seq, _ = x.shape
        for w in self.layers:
            hn = F.rms_norm(x, (x.shape[-1],), w["n1"])
            qkv = hn @ w["qkv"].t()
            q, k, v = qkv.split([self.h * self.d, self.kvh * self.d, self.kvh * self.d], dim=-1)
            q = self._rope(q.view(b, seq, self.h, self.d), cos, sin).transpose(1, 2)
            k = self._rope(k.view(b, seq, self.kvh, self.d), cos, sin).transpose(1, 2)
            v = v.view(b, seq, self.kvh, self.d).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + a.transpose(1, 2).reshape(b, seq, self.h * self.d) @ w["o"].t()
            hn = F.rms_norm(x, (x.shape[-1],), w["n2"])
            g, u = (hn @ w["gate_up"].t()).chunk(2, dim=-1)
            x = x + (F.silu(g) * u) @ w["down"].t()
        return x

    def decode(
        self,
        x: torch.Tensor,
        kcache: torch.Tensor,
        vcache: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        """x: (B, 1, hidden); attends to a (B, kvh, C, d) cache (new K/V computed, not stored)."""
        b = x.shape[0]
        for w in self.layers:
            hn = F.rms_norm(x, (x.shape[-1],), w["n1"])
            qkv = hn @ w["qkv"].t()
            q, k, _v = qkv.split([self.h * self.d, self.kvh * self.d, self.kvh * self.d], dim=-1)
            q = self._rope(q.view(b, 1, self.h, self.d), cos, sin).transpose(1, 2)
            _ = self._rope(k.view(b, 1, self.kvh, self.d), cos, sin)
            a = F.scaled_dot_product_attention(q, kcache, vcache, enable_gqa=True)
            x = x + a.transpose(1, 2).reshape(b, 1, self.h * self.d) @ w["o"].t()
            hn = F.rms_norm(x, (x.shape[-1],), w["n2"])
            g, u = (hn @ w["gate_up"].t()).chunk(2, dim=-1)
            x = x + (F.silu(g) * u) @ w["down"].t()
        return x


def rope_tables(seq: int, d: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
    ang = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    return (
        ang.cos().to(torch.bfloat16)[None, :, None, :],
        ang.sin().to(torch.bfloat16)[None, :, None, :],
    )


def time_ms(fn, reps: int) -> float:  # type: ignore[no-untyped-def]
    """Median of `reps` timings with CUDA events, after two warm-ups."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    samples.sort()
    return samples[len(samples) // 2]


def measure(shard: Shard, writer: csv.writer, gpu: str, prefill_lens, decode_grid, reps: int) -> None:  # type: ignore[no-untyped-def,type-arg]
    s = shard.shape
    dev = "cuda"
    with torch.inference_mode():
        for seq in prefill_lens:
            x = torch.randn(1, seq, s.hidden, device=dev, dtype=torch.bfloat16) * 0.1
            cos, sin = rope_tables(seq, s.head_dim, dev)
            ms = time_ms(lambda x=x, cos=cos, sin=sin: shard.prefill(x, cos, sin), reps)
            writer.writerow([s.name, gpu, shard.tp, "prefill", 1, seq, seq, f"{ms:.4f}"])
            print(f"{s.name} tp{shard.tp} prefill L={seq}: {ms:.2f} ms", flush=True)
            del x
        for batch, ctx in decode_grid:
            kv_bytes = 2 * batch * shard.kvh * ctx * s.head_dim * 2
            if kv_bytes > 40e9:
                continue
            kc = torch.randn(batch, shard.kvh, ctx, s.head_dim, device=dev, dtype=torch.bfloat16) * 0.1
            vc = torch.randn_like(kc)
            x = torch.randn(batch, 1, s.hidden, device=dev, dtype=torch.bfloat16) * 0.1
            cos, sin = rope_tables(1, s.head_dim, dev)
            # capture one decode step in a CUDA graph (what vLLM does for decode batches)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    shard.decode(x, kc, vc, cos, sin)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                shard.decode(x, kc, vc, cos, sin)
            ms = time_ms(graph.replay, reps)
            writer.writerow([s.name, gpu, shard.tp, "decode", batch, batch, ctx, f"{ms:.4f}"])
            print(f"{s.name} tp{shard.tp} decode B={batch} C={ctx}: {ms:.3f} ms", flush=True)
            del kc, vc, x, graph
            torch.cuda.empty_cache()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--quick", action="store_true", help="tiny grid, to check the script runs")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name(0)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "llama_forward.csv"
    t0 = time.time()
    if args.quick:
        configs = [(LLAMA_31_8B, 1)]
        prefill_lens = [128, 1024]
        decode_grid = [(1, 512), (32, 2048)]
        reps = 3
    else:
        configs = [(LLAMA_31_8B, 1), (LLAMA_31_70B, 8), (LLAMA_31_70B, 4)]
        prefill_lens = [128, 256, 512, 1024, 2048, 4096, 8192, 16384]
        decode_grid = [(b, c) for b in (1, 8, 32, 64, 128, 256) for c in (512, 2048, 8192)]
        reps = 7
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "gpu", "tp", "phase", "batch", "tokens", "context", "ms"])
        for shape, tp in configs:
            shard = Shard(shape, tp, "cuda")
            measure(shard, w, gpu, prefill_lens, decode_grid, reps)
            f.flush()
            del shard
            torch.cuda.empty_cache()
    meta = args.out / "meta.txt"
    meta.write_text(
        f"gpu={gpu}\ntorch={torch.__version__}\ncuda={torch.version.cuda}\n"
        f"date={time.strftime('%Y-%m-%d')}\nwall_s={time.time() - t0:.1f}\n"
        f"sdpa_flash={torch.backends.cuda.flash_sdp_enabled()}\n"
    )
    print(f"wrote {path} in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Which calibrated latency model a simulated pod runs, and loading it from the twin core."""

from __future__ import annotations

from dataclasses import dataclass

from disagg.perf.latency import LatencyModel, load_latency_model
from disagg.perf.moe import Parallelism, Speculation


@dataclass(frozen=True)
class LatencyChoice:
    """Which calibrated model a simulated pod runs: model name, GPU type, tensor-parallel size (a replica's
    GPUs), dtype, and for a MoE model's replica beyond plain tensor parallelism (data-parallel attention,
    expert parallelism, several nodes) its :class:`Parallelism`."""

    model: str
    gpu: str
    tp: int
    dtype: str = "bf16"
    parallelism: Parallelism | None = None
    speculation: Speculation | None = None  # MTP speculative decoding its engine flags ask for

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must be a non-empty model name")
        if not self.gpu:
            raise ValueError("gpu must be a non-empty GPU type (e.g. h100, l40s)")
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1, got {self.tp}")


def load_step_latency(choice: LatencyChoice) -> LatencyModel:
    """The twin core's calibrated latency model for ``choice`` (its ValueError names unknown models)."""
    return load_latency_model(
        choice.model,
        choice.gpu,
        choice.tp,
        choice.dtype,
        parallelism=choice.parallelism,
        speculation=choice.speculation,
    )

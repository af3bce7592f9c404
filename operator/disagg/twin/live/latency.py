"""What the live engine needs from the twin's latency model, and how it picks one.

The live engine paces itself with the step times of ``disagg.twin.latency`` (the calibrated model owned
by the twin core); it only depends on the small protocol below, so the engine and its tests stay
independent of how the model is calibrated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class StepLatency(Protocol):
    """Step times (seconds) of one replica: the subset of ``disagg.twin.latency.LatencyModel`` used here."""

    def prefill_time_s(self, prompt_lens: Sequence[int]) -> float: ...

    def decode_step_time_s(self, batch_size: int, total_context_tokens: int) -> float: ...

    def mixed_step_time_s(
        self, prefill_tokens: int, decode_batch: int, total_context_tokens: int
    ) -> float: ...

    def kv_transfer_time_s(self, tokens: int, link: Any) -> float: ...


@dataclass(frozen=True)
class LatencyChoice:
    """Which calibrated model a simulated pod runs: model name, GPU type, tensor-parallel size, dtype."""

    model: str
    gpu: str
    tp: int
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must be a non-empty model name")
        if not self.gpu:
            raise ValueError("gpu must be a non-empty GPU type (e.g. h100, l40s)")
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1, got {self.tp}")


def load_step_latency(choice: LatencyChoice) -> Any:
    """The twin core's calibrated latency model for ``choice`` (raises its error for unknown models)."""
    from disagg.twin.latency import load_latency_model

    return load_latency_model(choice.model, choice.gpu, choice.tp, choice.dtype)


def kv_capacity_tokens(model: Any) -> int:
    """KV capacity of one replica in tokens, whether the model exposes it as attribute or method."""
    value = model.kv_capacity_tokens
    return int(value() if callable(value) else value)

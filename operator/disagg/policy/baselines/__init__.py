"""Baseline autoscalers to compare the ratio policy against, as their sources have them today.

Each is a pure step function ``(observation, state, now, settings[, models]) -> (targets | None, state)``
over the same :class:`~disagg.policy.types.Observation` the ratio policy gets, so the twin replays them
identically. ``targets`` maps a role to its new replica count (only the roles that change).

NVIDIA Dynamo's planner has four ``optimization_target`` values (PlannerConfig,
``components/src/dynamo/planner/config/planner_config.py`` in ai-dynamo/dynamo; Planner Guide v1.2.0 to
v1.7.0, https://docs.nvidia.com/dynamo/v1.7.0/knowledge-base/modular-components/planner/planner-guide):
``throughput`` (the default), ``latency`` and ``load`` force load-based scaling on and throughput-based
scaling off; ``sla`` runs throughput-based scaling (``enable_throughput_scaling``, default true) and/or
SLA load-based scaling (``enable_load_scaling``, default false). So the baselines here are:

* :func:`dynamo_load_step`: the load-based "easy mode", ``optimization_target: throughput`` (Dynamo's
  default; also ``latency`` and ``load``).
* :func:`dynamo_sla_load_step`: ``optimization_target: sla`` with ``enable_load_scaling: true``
  (optionally also throughput-based scaling, which then only sets a replica floor).
* :func:`dynamo_throughput_step`: ``optimization_target: sla`` with its defaults (throughput-based
  scaling only), the correction-factor algorithm of the v0.9 to v1.1 Planner Design docs.
* :func:`apa_step`: AIBrix's APA with its released defaults, per role independently.
* :func:`best_static_split` (in bench/policy_goodput.py, since it needs the simulator): the fixed
  P:D split chosen in hindsight per trace.

Where Dynamo reads per-engine ForwardPassMetrics (FPM) and AIBrix scrapes each pod, these read pool
figures, so a per-engine value is the pool figure divided by the ready replicas (the router balancing
engines evenly); "any engine above" / "all engines below" become the mean engine above / below.

The Dynamo planner's modes live in :mod:`disagg.policy.baselines.dynamo`, AIBrix's APA in
:mod:`disagg.policy.baselines.aibrix`; this package names them all.
"""

from __future__ import annotations

from disagg.policy.baselines.aibrix import ApaSettings, ApaState, apa_desired, apa_step
from disagg.policy.baselines.common import Targets
from disagg.policy.baselines.dynamo import (
    DynamoLoadSettings,
    DynamoLoadState,
    DynamoSettings,
    DynamoSlaLoadSettings,
    DynamoSlaLoadState,
    DynamoState,
    decode_throughput_per_gpu,
    dynamo_load_step,
    dynamo_sla_load_step,
    dynamo_throughput_step,
    estimate_next_ttft,
    prefill_throughput_per_gpu,
)

# One line per contender for a results table: algorithm, mode and the version it follows.
SOURCES: dict[str, str] = {
    "dynamo-throughput": (
        "Dynamo planner, optimization_target=sla, throughput-based scaling (its default mode for sla); "
        "correction-factor algorithm of the Planner Design docs v0.9-v1.1"
    ),
    "dynamo-load": (
        "Dynamo planner, optimization_target=throughput (the default since v1.0.2): load-based +/-1 on "
        "static thresholds (core/load_scaling.py; Planner Guide v1.0.2-v1.7.0)"
    ),
    "dynamo-sla-load": (
        "Dynamo planner, optimization_target=sla with enable_load_scaling: per-engine TTFT/ITL estimates, "
        "+/-1 with consolidation check (core/load_scaling.py, ai-dynamo/dynamo main, v1.7 era)"
    ),
    "aibrix-apa": (
        "AIBrix APA, released defaults: 180 s metric window, up/down tolerance 0.1, x2 up / halve down at "
        "most, no scale-up cooldown, 300 s scale-down cooldown window (vllm-project/aibrix main)"
    ),
}

__all__ = [
    "SOURCES",
    "ApaSettings",
    "ApaState",
    "DynamoLoadSettings",
    "DynamoLoadState",
    "DynamoSettings",
    "DynamoSlaLoadSettings",
    "DynamoSlaLoadState",
    "DynamoState",
    "Targets",
    "apa_desired",
    "apa_step",
    "decode_throughput_per_gpu",
    "dynamo_load_step",
    "dynamo_sla_load_step",
    "dynamo_throughput_step",
    "estimate_next_ttft",
    "prefill_throughput_per_gpu",
]

"""Pure ratio policy: observation -> decision, with reasons.

``decide(observation, policy, state, now, bounds) -> (Decision, PolicyState)``; the types are in
:mod:`disagg.policy.types`, the RatioPolicy spec in :mod:`disagg.api.ratiopolicy`.
"""

from disagg.policy.engine import decide
from disagg.policy.types import (
    Bounds,
    Decision,
    Measured,
    Observation,
    PolicyState,
    Reason,
    RoleBounds,
    RoleObservation,
    ServingProfile,
    SignalState,
)

__all__ = [
    "Bounds",
    "Decision",
    "Measured",
    "Observation",
    "PolicyState",
    "Reason",
    "RoleBounds",
    "RoleObservation",
    "ServingProfile",
    "SignalState",
    "decide",
]

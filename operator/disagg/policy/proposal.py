"""What an algorithm proposes for each pool before the common machinery (bounds, stabilisation, caps,
budget, Pending ceiling) shapes it into a decision. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from disagg.policy.types import Reason, Role


@dataclass(frozen=True)
class RoleProposal:
    """An algorithm's wish for one pool.

    ``replicas`` None means hold where you are (the signals it needs are missing: fail-static).
    ``breached`` says the pool's SLO share is being violated now (the GPU budget favours it).
    """

    replicas: int | None
    reasons: tuple[Reason, ...] = ()
    breached: bool = False


@dataclass(frozen=True)
class Proposal:
    prefill: RoleProposal
    decode: RoleProposal
    correction: dict[str, float] = field(default_factory=dict)  # model-based: updated correction factors
    slo_spend: float | None = None  # model-based: the updated error-budget spend (None: not tracked)
    # model-based: arrivals outran the prefill pool this evaluation (its queue grew to a real share of
    # the TTFT target at two evaluations running): the engine remembers when, see PolicyState
    prefill_fell_behind: bool = False
    # model-based: this evaluation's prefill-side breach came with work well above the hour's usual level
    # (a peak): the engine remembers the work, see PolicyState.prefill_peaks
    prefill_peak: bool = False

    def role(self, role: Role) -> RoleProposal:
        return self.prefill if role == "prefill" else self.decode


HOLD = RoleProposal(None)

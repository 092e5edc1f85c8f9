"""When a commit takes a local-copy snapshot: a pure decision over numbers the keeper measured.

Owns the rule that keeps the local copy off the critical path. A save has two parts: the snapshot (a
copy of the committed bytes into the free slot, or an enqueued device-to-host copy), paid by the step
that commits, and the rest (hashing the snapshot, publishing the pointer), done by the background
writer while the next steps compute. A commit takes a snapshot only when the writer is free (the step
never waits for it) and when the last save's cost (the snapshot's block plus the writer's work, counted
as the steps' own: on a host without a spare core it is), spread over the steps since the last
snapshot, stays within the budget (a fraction of the step time); at most `max_lag` revisions after the last snapshot
it takes one whatever the budget says, if the writer is free.

Invariant: the decision depends only on its arguments (no clock, no I/O), so the same numbers give the
same answer; the lag it allows is bounded by `max_lag` plus the revisions one background save spans.
"""

from __future__ import annotations

from dataclasses import dataclass

SAVE, CADENCE, BUSY, BUDGET = "save", "cadence", "busy", "budget"


@dataclass(frozen=True)
class SavePolicy:
    """How often a commit may snapshot the state for the local copy."""

    every: int = 1          # at most one snapshot per `every` revisions
    budget: float = 0.05    # the snapshots' share of the step time (0.05: the step rate stays >= 0.95x)
    max_lag: int = 64       # revisions after the last snapshot at which one is taken whatever its cost

    def __post_init__(self) -> None:
        if self.every < 1 or self.max_lag < 1 or not self.budget > 0:
            raise ValueError(f"SavePolicy(every={self.every}, budget={self.budget}, max_lag={self.max_lag}): "
                             "every and max_lag must be >= 1 and budget > 0 (a fraction of the step time)")


def decide(policy: SavePolicy, revision: int, snapshotted: int, writer_busy: bool, step_s: float,
           save_s: float) -> str:
    """Whether the commit of `revision` takes a snapshot: SAVE, or the reason it does not.

    Args:
        policy: the cadence, budget and lag bound.
        revision: the revision just committed.
        snapshotted: the revision of the last snapshot taken (0: none yet).
        writer_busy: the background writer is still finishing an earlier snapshot.
        step_s: the mean seconds per step lately, snapshots excluded (0: not measured yet).
        save_s: the seconds the last save cost: its snapshot's block plus the writer's work (0: none yet).

    Returns:
        SAVE; CADENCE (fewer than `every` revisions since the last snapshot); BUSY (the writer is not
        free: the step does not wait for it); BUDGET (the save would cost more than the budget allows).
    """
    since = revision - snapshotted
    if since < policy.every:
        return CADENCE
    if writer_busy:
        return BUSY
    if since >= policy.max_lag or save_s <= policy.budget * since * step_s:
        return SAVE
    return BUDGET

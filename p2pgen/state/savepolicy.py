"""When a commit takes a local-copy snapshot: a pure decision over numbers the keeper measured.

Owns the rule that keeps the local copy off the critical path. A save has two parts: the snapshot (a
copy of the committed bytes into the free slot, or an enqueued device-to-host copy), paid by the step
that commits, and the rest (hashing the snapshot, publishing the pointer), done by the background
writer while the next steps compute. A commit takes a snapshot only when the writer is free (the step
never waits for it), and only at revisions that are multiples of a *period*: the smallest `every` times
a power of two of revisions over which the last save's cost (the snapshot's block plus the writer's work, counted as
the steps' own: on a host without a spare core it is) stays within the budget (a fraction of the step
time). At most `max_lag` revisions after the last snapshot it takes one whatever the budget says, if
the writer is free.

Why multiples of a power of two: the members of a generation step in lock-step (every step waits on its collectives),
so a save that slows one member slows the whole step. Saves at revisions chosen by each member alone
would each cost the job a slow step, N members N times the budget; at multiples of a power of two, the
members with the same figures save in the same steps and pay once, and a member whose saves cost more
saves at a subset of the revisions of one whose cost less (the periods divide each other).

Invariant: the decision depends only on its arguments (no clock, no I/O), so the same numbers give the
same answer on every member; the lag it allows is bounded by `max_lag` plus the revisions one
background save spans.
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
        free: the step does not wait for it); BUDGET (not a revision of the period `save_period` gives,
        or less than half a period since the last snapshot).
    """
    since = revision - snapshotted
    if since < policy.every:
        return CADENCE
    if writer_busy:
        return BUSY
    if since >= policy.max_lag:
        return SAVE
    period = save_period(policy, step_s, save_s)
    if period <= policy.max_lag and revision % period == 0 and 2 * since >= period:
        return SAVE
    return BUDGET


def save_period(policy: SavePolicy, step_s: float, save_s: float) -> int:
    """The revisions between two snapshots: the smallest `policy.every` times a power of two over which a
    save costing `save_s` stays within `policy.budget` of steps of `step_s` seconds (`every` while nothing
    is measured); past `policy.max_lag` it stops doubling (the save is then forced every `max_lag` revisions).

    Args:
        policy: the cadence and the budget.
        step_s: the mean seconds per step lately (0: not measured yet).
        save_s: the seconds the last save cost (0: none yet).
    """
    period = policy.every
    needed = save_s / policy.budget / step_s if step_s > 0 and save_s > 0 else 0.0     # inf when it overflows
    while period < needed and period <= policy.max_lag:     # past max_lag the forced saves take over
        period *= 2
    return period

"""Who contributes to an outer step of semi-synchronous training (DiLoCo): the pure rule, no tensors.

One committed revision is one outer step. Before it, each member runs a *round* of local inner steps whose
data is a function of (revision, rank, world, inner index), with the rank and world of the generation in
which the member *started* the round (the round's data is bound then, even if the generation changes
before the round is synchronized). A member therefore holds at most one started round for the revision it
is at: `Round(revision, generation)`.

At the start of outer step r in generation G every member offers the generation its round for r was bound
in (`NOT_STARTED` when it holds none), and the MAX of the offers is agreed by an all-reduce. Then
(`plan_outer_step`):
- nobody holds a round for r (agreed is NOT_STARTED): everyone starts one now, bound to G, and contributes;
- a member whose round for r was bound in the agreed generation contributes it as it is: inner progress
  made before a member was lost is kept, and a failed outer all-reduce is retried with the same
  pseudo-gradients;
- every other member (a joiner, a restarted application, a round bound in an older generation) contributes
  nothing this time (weight 0) and starts its inner steps with the next outer step.

Invariant: all contributors of one outer step bound their rounds in the same generation, at distinct ranks
of it, so their inner data are disjoint shards of that generation's batches: no sample is used twice inside
one outer step. The contributor count is the sum of the weights, agreed by an all-reduce, so every member
divides by the same number. A round that was bound is never re-bound for the same revision, so a member
never contributes two different pseudo-gradients to one outer step.
"""

from __future__ import annotations

from dataclasses import dataclass

NOT_STARTED = -1        # the offer of a member that holds no round for the revision


@dataclass(frozen=True)
class Round:
    """A round of inner steps for outer step `revision`, its data bound to `generation`'s rank and world."""

    revision: int
    generation: int
    rank: int
    world: int


@dataclass(frozen=True)
class OuterPlan:
    """What one member does in an outer step: `start` a round bound to this generation (then contribute it),
    `contribute` the round it holds (weight 1), or neither (weight 0)."""

    start: bool
    contribute: bool

    @property
    def weight(self) -> int:
        """This member's share of the agreed contributor count (1 or 0)."""
        return 1 if self.contribute else 0


def held_for(held: Round | None, revision: int) -> Round | None:
    """The round `held` if it is for `revision`, else None (a round for an older revision is stale: the
    outer step it was for committed without it, or the member pulled a newer state)."""
    return held if held is not None and held.revision == revision else None


def offer(held: Round | None, revision: int) -> int:
    """What a member offers at the start of outer step `revision`: the generation its round for it was
    bound in, or NOT_STARTED."""
    current = held_for(held, revision)
    return NOT_STARTED if current is None else current.generation


def plan_outer_step(held: Round | None, revision: int, agreed: int) -> OuterPlan:
    """The member's part in outer step `revision`, given the round it holds and the agreed MAX of the offers.

    Raises:
        ValueError: `agreed` is below this member's own offer (it is not the MAX of the offers).
    """
    mine = offer(held, revision)
    if agreed < mine:
        raise ValueError(f"agreed offer {agreed} is below this member's own offer {mine}: "
                         "pass the MAX of every member's offer")
    if agreed == NOT_STARTED:
        return OuterPlan(start=True, contribute=True)
    return OuterPlan(start=False, contribute=mine == agreed)

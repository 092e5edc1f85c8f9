"""Frontier election: which (revision, digest) the next generation resumes from, and who must pull.

Owns: `elect_frontier`, a pure function of the ready votes (DESIGN, protocol step 5).
Invariants kept:
- the frontier revision is the highest revision reported by a member whose quiescence is not `unknown`
  and that holds state: an empty digest means "no state" (an agent voting for an application that has
  not attached yet) and is a candidate only when no member holds any state;
- its digest is the one held by the most members at that revision; a tie goes to the smaller digest;
- every member not holding exactly the frontier is told to pull, from the holders, spread round-robin;
- members at the frontier revision with another digest are recorded as a divergence.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from p2pgen.core.model import Election, Frontier, Member, Pull, ReadyVote


def elect_frontier(members: Sequence[Member], votes: Mapping[str, ReadyVote],
                   last_certified: Frontier | None) -> Election:
    """Elect the frontier among `members` (in rank order), each of which has a vote in `votes`.

    `last_certified` is the frontier of the active generation; if no candidate reaches its revision
    the state it described is lost, and the election says so (`regressed_from`) instead of hiding it.
    """
    known = [m for m in members if votes[m.peer_id].quiescence != "unknown"]
    if not known:
        raise ValueError("frontier election needs at least one member whose quiescence is known")
    candidates = [m for m in known if votes[m.peer_id].digest] or known
    top = max(votes[m.peer_id].revision for m in candidates)
    at_top = [m for m in candidates if votes[m.peer_id].revision == top]
    counts = Counter(votes[m.peer_id].digest for m in at_top)
    digest = min(counts, key=lambda d: (-counts[d], d))
    frontier = Frontier(top, digest)

    holders = tuple(m.peer_id for m in at_top if votes[m.peer_id].digest == digest)
    divergence = tuple((m.peer_id, votes[m.peer_id].digest) for m in at_top if votes[m.peer_id].digest != digest)
    pullers = [m for m in members if m.peer_id not in holders]
    pulls = tuple(
        Pull(m.peer_id, m.incarnation, holders[i % len(holders):] + holders[:i % len(holders)])
        for i, m in enumerate(pullers)
    )
    regressed_from = last_certified.revision if last_certified and top < last_certified.revision else None
    return Election(frontier, holders, pulls, divergence, regressed_from,
                    _reason(frontier, holders, pulls, divergence, regressed_from, counts))


def _reason(frontier: Frontier, holders: tuple[str, ...], pulls: tuple[Pull, ...],
            divergence: tuple[tuple[str, str], ...], regressed_from: int | None, counts: Counter) -> str:
    parts = [f"revision {frontier.revision} is the highest reported by a quiesced member; "
             f"held by {', '.join(holders)}"]
    if divergence:
        tally = ", ".join(f"{d or '<empty>'}x{n}" for d, n in sorted(counts.items()))
        parts.append(f"DIVERGENCE at revision {frontier.revision} ({tally}): "
                     f"{', '.join(p for p, _ in divergence)} must pull")
    if pulls:
        parts.append(f"{len(pulls)} member(s) pull")
    if regressed_from is not None:
        parts.append(f"STATE LOST: no member holds certified revision {regressed_from}")
    return "; ".join(parts)

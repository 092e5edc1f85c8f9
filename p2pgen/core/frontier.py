"""Frontier election: which (revision, digest) the next generation resumes from, and who must pull.

Owns: `elect_frontier`, a pure function of the ready votes (DESIGN, protocol step 5).
Invariants kept:
- the frontier revision is the highest revision reported by a member whose quiescence is not `unknown`
  and that holds state: an empty digest means "no state" (an agent voting for an application that has
  not attached yet) and is a candidate only when no member holds any state;
- its digest is the one held by the most members at that revision; a tie goes to the smaller digest;
- every member not holding exactly the frontier is told to pull, from the holders, spread round-robin;
- members at the frontier revision with another digest are recorded as a divergence;
- a checkpoint is the frontier only when it is strictly newer than every member's live state (it is read
  from storage, a live copy is not): the members that reported it load it, the others pull from them;
  the digest reported by the most of them wins, a tie goes to the smaller digest.
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
    checkpoint = _checkpoint_election(members, known, votes, top, last_certified)
    if checkpoint is not None:
        return checkpoint
    at_top = [m for m in candidates if votes[m.peer_id].revision == top]
    counts = Counter(votes[m.peer_id].digest for m in at_top)
    digest = _most_held(counts)
    frontier = Frontier(top, digest)

    holders = tuple(m.peer_id for m in at_top if votes[m.peer_id].digest == digest)
    divergence = tuple((m.peer_id, votes[m.peer_id].digest) for m in at_top if votes[m.peer_id].digest != digest)
    pulls = _spread([m for m in members if m.peer_id not in holders], holders)
    regressed_from = last_certified.revision if last_certified and top < last_certified.revision else None
    return Election(frontier, holders, pulls, divergence, regressed_from,
                    _reason(frontier, holders, pulls, divergence, regressed_from, counts))


def _most_held(counts: Counter) -> str:
    """The digest reported most often; a tie goes to the smaller digest."""
    return min(counts, key=lambda d: (-counts[d], d))


def _spread(pullers: Sequence[Member], sources: tuple[str, ...]) -> tuple[Pull, ...]:
    """Each puller gets every source, starting at a different one (round-robin)."""
    return tuple(Pull(m.peer_id, m.incarnation, sources[i % len(sources):] + sources[:i % len(sources)])
                 for i, m in enumerate(pullers))


def _checkpoint_election(members: Sequence[Member], known: Sequence[Member], votes: Mapping[str, ReadyVote],
                         live_top: int, last_certified: Frontier | None) -> Election | None:
    """The election when a checkpoint reported by a quiesced member is newer than every live state."""
    offered = [(m, votes[m.peer_id].checkpoint) for m in known]
    refs = [(m, c) for m, c in offered if c is not None and c.digest and c.revision > live_top]
    if not refs:
        return None
    top = max(c.revision for _, c in refs)
    counts = Counter(c.digest for _, c in refs if c.revision == top)
    frontier = Frontier(top, _most_held(counts))
    loaders = tuple(m.peer_id for m, c in refs if (c.revision, c.digest) == (frontier.revision, frontier.digest))
    others = [m for m in members if m.peer_id not in loaders]
    pulls = tuple(Pull(m.peer_id, m.incarnation, (), checkpoint=True) for m in members if m.peer_id in loaders)
    pulls += _spread(others, loaders)
    regressed_from = last_certified.revision if last_certified and top < last_certified.revision else None
    reason = (f"checkpoint revision {top} is newer than every member's state (best live revision {live_top}); "
              f"{', '.join(loaders)} load it" + (f", {len(others)} member(s) pull it from them" if others else ""))
    if regressed_from is not None:
        reason += f"; STATE LOST: no member holds certified revision {regressed_from}"
    return Election(frontier, loaders, pulls, (), regressed_from, reason, source="checkpoint")


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

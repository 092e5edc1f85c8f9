"""Where the time from a fault to the survivors' first commit goes, read from the p2pgen applications' traces.

Owns one split of `to_first_commit_s` (`p2pgen bench recovery`'s step loop): for each survivor, nine phases in
the order the step loop lives them, each from the end of the previous one:

- `detect`: the fault -> the survivor retired its communicator (its collective failed or its watcher saw the
  member gone; quiescence known);
- `proof`: -> a surviving voter learnt that the Raft leader is dead and set its campaign (the agents' Raft
  trace, kind `hasten`);
- `election`: -> a new Raft leader was elected (kind `leader`);
- `leader_commit`: -> that leader committed its first entry (kind `leader_commit`: the no-op of its term);
- `proposal`: -> the survivor's `ready` vote for the generation of its next commit left (the pending generation
  without the victim reached it through its agent; a vote for a proposal abandoned meanwhile, a reform asked
  while the leader was being replaced, is part of this wait);
- `vote_commit`: -> the vote came back committed (one Raft commit through its agent);
- `activation`: -> it activated the certificate (the other votes committed and the certificate reached it);
- `connect`: -> its communicator of the new generation was built;
- `first_step`: -> its first commit in the new generation (one whole step, its boundary agreement included).

The three Raft phases come from the agents' traces (`--trace-dir`) and are 0 when the fault needed no election
(the leader lived) or the Raft traces are not given: a Raft mark counts only between the survivor's retirement
and its vote, and a mark earlier than the one before it adds 0 (the work ran in parallel).
Invariant: the phases of one survivor add up exactly to its fault -> first-commit time; a fault is split on the
survivor that committed last (the one `to_first_commit_s` measures), and skipped (None) when a step-loop event
is missing (an older trace, or a survivor that had to pull).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from p2pgen_lab.bench.table import aligned

PHASES = ("detect", "proof", "election", "leader_commit", "proposal", "vote_commit", "activation", "connect",
          "first_step")
RAFT_MARKS = ("hasten", "leader", "leader_commit")      # the Raft trace kinds of proof, election, leader_commit
Events = list[dict[str, Any]]


def _first(events: Events, peer: str, kind: str, after: float, generation: int | None = None) -> dict | None:
    return next((e for e in events if e["peer"] == peer and e["event"] == kind and e["t"] > after
                 and (generation is None or e.get("generation") == generation)), None)


def _raft_marks(raft: Events, after: float, until: float) -> list[float]:
    """When each of RAFT_MARKS first happened in (after, until], in order; a missing one is `after` (adds 0)."""
    marks, at = [], after
    for kind in RAFT_MARKS:
        hit = min((r["t"] for r in raft if r.get("kind") == kind and at < r["t"] <= until), default=None)
        at = at if hit is None else hit
        marks.append(at)
    return marks


def survivor_phases(events: Events, peer: str, t0: float, raft: Events = ()) -> dict[str, float] | None:
    """The phases (seconds) of one survivor after a fault at wall time t0; None when a step-loop event is
    missing. `raft`: the agents' Raft trace records (may be empty)."""
    retire = _first(events, peer, "retire", t0)
    commit = _first(events, peer, "commit", retire["t"]) if retire is not None else None
    if retire is None or commit is None:
        return None
    generation = commit["generation"]
    ready = _first(events, peer, "ready", retire["t"], generation)
    if ready is None or "sent" not in ready:
        return None
    active = _first(events, peer, "active", ready["t"], generation)
    connected = _first(events, peer, "connected", ready["t"], generation)
    if active is None or connected is None:
        return None
    marks = [t0, retire["t"], *_raft_marks(list(raft), retire["t"], ready["sent"]), ready["sent"], ready["t"],
             active["t"], connected["t"], commit["t"]]
    return {phase: marks[i + 1] - marks[i] for i, phase in enumerate(PHASES)}


def fault_phases(events: Events, survivors: Iterable[str], t0: float, raft: Events = ()) -> dict[str, float] | None:
    """The phases of the survivor that committed last after the fault (None if any survivor cannot be split)."""
    split = {p: survivor_phases(events, p, t0, raft) for p in survivors}
    if not split or any(v is None for v in split.values()):
        return None
    return max(split.values(), key=lambda phases: sum(phases.values()))


def summarize_phases(per_fault: list[Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """phase -> {p50, max, share}: share is the phase's p50 over the sum of the p50s."""
    if not per_fault:
        return {}
    p50 = {p: statistics.median(f[p] for f in per_fault) for p in PHASES}
    total = sum(p50.values()) or 1.0
    return {p: {"n": len(per_fault), "p50": p50[p], "max": max(f[p] for f in per_fault), "share": p50[p] / total}
            for p in PHASES}


def format_phases(title: str, summary: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Rows of a table: phase, p50 ms, max ms, share of the p50 sum."""
    if not summary:
        return [f"{title}: no fault could be split (traces without ready.sent / connected events)"]
    rows = [[title, "p50 ms", "max ms", "share"]]
    for phase in PHASES:
        s = summary[phase]
        rows.append([phase, f"{s['p50'] * 1000:.0f}", f"{s['max'] * 1000:.0f}", f"{s['share'] * 100:.0f} %"])
    return aligned(rows)

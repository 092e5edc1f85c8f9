"""Goodput of a stress run, and where the lost time goes. Pure: commits, faults and trace records in, figures out.

Goodput is the job's progress rate while faults land over its rate in a fault-free window of the same run:
progress is the highest revision committed so far (a step redone after a regression is not progress twice),
so `rate(lo, hi)` is (highest at hi - highest at lo) / (hi - lo).

Lost time, per fault kind (`lost_by_kind`), is additive and sums to the run's: the fault window is cut at every
fault; the stretch from one fault to the next belongs to the first, and loses its length minus the steps
committed in it at the calm rate (a fault the job rode over at full speed loses 0; a stretch that ran
faster than calm counts negative, so the total stays exact).

Where it goes (`reform_phases`): every generation activated in the fault window is a reform of the job,
split at the marks its continuing members (those in the generation before and in this one) left in their
traces and the agents' Raft traces, each phase from the end of the previous one, the slowest member setting
each mark (a mark earlier than the one before it adds 0):

- `detection`: the job's last commit before the reform -> the first continuing member retired the old
  generation (its collective failed, its watcher saw a member gone, or a proposal came);
- `election`: the Raft marks between that retirement and the last `ready` vote leaving (a campaign hastened
  by a dead leader's proof, a new leader, its first commit); 0 when the leader lived;
- `proposal`: -> the last continuing member's `ready` vote committed (the pending generation reached it);
- `pull`: -> the certificate was activated (the other votes: a joiner pulls the state before it votes);
- `activation`: -> the last continuing member activated it;
- `first_step`: -> the last continuing member's first commit in it, less one calm step (the step the job
  would have spent anyway).

A reform belongs to the latest fault before its first commit that targeted a peer the reform added or
removed; one that no fault explains is `other`. A kind's lost time minus its reforms' phases is
`outside_reforms`: stalls without a new generation (a pause shorter than the detector's timeout holds the
collective without changing the members) or the error of the stretch attribution.
"""

from __future__ import annotations

import statistics
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from p2pgen.progress import Commit
from p2pgen_lab.bench.table import aligned

PHASES = ("detection", "election", "proposal", "pull", "activation", "first_step")
RAFT_MARKS = ("hasten", "leader", "leader_commit")
Records = Sequence[dict[str, Any]]


@dataclass(frozen=True)
class FaultAt:
    t: float
    kind: str
    targets: tuple[str, ...]


@dataclass(frozen=True)
class Generation:
    """One activation of the job (from the agents' Raft traces): its number, members (peer, incarnation), when."""

    generation: int
    members: frozenset[tuple[str, int]]
    t: float


@dataclass
class KindLoss:
    faults: int = 0
    lost_s: float = 0.0
    reforms: list[dict[str, float]] = field(default_factory=list)

    def phase_totals(self) -> dict[str, float]:
        return {p: sum(r[p] for r in self.reforms) for p in PHASES}

    def outside_reforms(self) -> float:
        return self.lost_s - sum(self.phase_totals().values())


class Progress:
    """The highest revision committed up to any time, from the commits of a run."""

    def __init__(self, commits: Iterable[Commit]) -> None:
        self.times: list[float] = []
        self.highest: list[int] = []
        high = -1
        for c in sorted(commits, key=lambda c: c.t):
            high = max(high, c.revision)
            self.times.append(c.t)
            self.highest.append(high)

    def at(self, t: float) -> int:
        i = bisect_right(self.times, t)
        return self.highest[i - 1] if i else -1

    def rate(self, lo: float, hi: float) -> float:
        """Revisions gained per second over [lo, hi]."""
        return (self.at(hi) - self.at(lo)) / (hi - lo) if hi > lo else 0.0


def lost_by_kind(progress: Progress, faults: Sequence[FaultAt], window: tuple[float, float],
                 calm_rate: float) -> dict[str, KindLoss]:
    """kind -> faults and seconds lost in the stretches they open (see the module docstring)."""
    out: dict[str, KindLoss] = {}
    inside = sorted((f for f in faults if window[0] <= f.t < window[1]), key=lambda f: f.t)
    if not inside or calm_rate <= 0:
        return out
    out["before the first fault"] = KindLoss(0, _lost(progress, window[0], inside[0].t, calm_rate))
    for f, nxt in zip(inside, [*(g.t for g in inside[1:]), window[1]]):
        loss = out.setdefault(f.kind, KindLoss())
        loss.faults += 1
        loss.lost_s += _lost(progress, f.t, nxt, calm_rate)
    return out


def _lost(progress: Progress, lo: float, hi: float, calm_rate: float) -> float:
    return (hi - lo) - (progress.at(hi) - progress.at(lo)) / calm_rate


def generations(raft: Records) -> list[Generation]:
    """Each activated generation once (the earliest time any agent traced it), by time."""
    seen: dict[int, Generation] = {}
    for r in raft:
        if r.get("kind") == "activated" and (r["generation"] not in seen or r["t"] < seen[r["generation"]].t):
            members = frozenset((str(p), int(n)) for p, n in r["members"])
            seen[r["generation"]] = Generation(r["generation"], members, r["t"])
    return sorted(seen.values(), key=lambda g: g.t)


class EventIndex:
    """The applications' trace events by (peer, incarnation, event, generation), each list in time order."""

    def __init__(self, events: Records) -> None:
        self._by: dict[tuple, list[dict[str, Any]]] = {}
        self.first_commit: dict[int, float] = {}          # generation -> the job's first commit in it
        for e in sorted(events, key=lambda e: e["t"]):
            self._by.setdefault((e["peer"], e["incarnation"], e["event"], e.get("generation")), []).append(e)
            if e["event"] == "commit":
                self.first_commit.setdefault(e["generation"], e["t"])

    def first(self, member: tuple[str, int], event: str, generation: int) -> dict[str, Any] | None:
        hits = self._by.get((*member, event, generation))
        return hits[0] if hits else None

    def last(self, member: tuple[str, int], event: str, generation: int, until: float) -> dict[str, Any] | None:
        hits = self._by.get((*member, event, generation), [])
        i = bisect_right([e["t"] for e in hits], until)
        return hits[i - 1] if i else None


def _member_marks(index: EventIndex, member: tuple[str, int], before: int, reform: int) -> list[float] | None:
    """(retire, vote sent, vote committed, active, first commit) of one continuing member; None if one is missing."""
    commit = index.first(member, "commit", reform)
    if commit is None:
        return None
    ready = index.last(member, "ready", reform, commit["t"])
    retire = index.last(member, "retire", before, commit["t"])
    active = index.first(member, "active", reform)
    if ready is None or retire is None or active is None or "sent" not in ready:
        return None
    return [retire["t"], ready["sent"], ready["t"], active["t"], commit["t"]]


def reform_phases(index: EventIndex, raft: Records, before: Generation, reform: Generation, calm_step_s: float,
                  last_commit: float) -> dict[str, float] | None:
    """The phases (seconds) of the job's reform from `before` to `reform` (see the module docstring); None when
    no member continued or a continuing member's trace lacks a mark. `last_commit`: the job's last commit
    before the reform."""
    marks = [_member_marks(index, m, before.generation, reform.generation)
             for m in sorted(before.members & reform.members)]
    if not marks or any(m is None for m in marks):
        return None
    retired, sent, voted, active, committed = (list(column) for column in zip(*marks))
    raft_at = min(retired)
    for kind in RAFT_MARKS:
        hit = min((r["t"] for r in raft if r.get("kind") == kind and raft_at < r["t"] <= max(sent)), default=None)
        raft_at = raft_at if hit is None else hit
    points = [last_commit, min(retired), raft_at, max(voted), reform.t, max(active), max(committed) - calm_step_s]
    at, phases = points[0], {}
    for phase, t in zip(PHASES, points[1:]):
        phases[phase] = max(0.0, t - at)
        at = max(at, t)
    return phases


def _changed(before: Generation, after: Generation) -> set[str]:
    return {p for p, _ in before.members ^ after.members}


def attribute_reforms(losses: dict[str, KindLoss], events: Records, raft: Records, faults: Sequence[FaultAt],
                      progress: Progress, window: tuple[float, float], calm_rate: float) -> None:
    """Add to each kind the phases of the reforms in `window` its faults caused (see the module docstring)."""
    index, gens = EventIndex(events), generations(raft)
    election = [r for r in raft if r.get("kind") in RAFT_MARKS]
    for before, reform in zip(gens, gens[1:]):
        first = index.first_commit.get(reform.generation)
        i = bisect_left(progress.times, reform.t)
        if first is None or not window[0] <= first < window[1] or i == 0:
            continue
        phases = reform_phases(index, election, before, reform, 1.0 / calm_rate, progress.times[i - 1])
        if phases is None:
            continue
        changed = _changed(before, reform)
        cause = max((f for f in faults if f.t <= first and changed & set(f.targets)), key=lambda f: f.t, default=None)
        losses.setdefault(cause.kind if cause else "other", KindLoss()).reforms.append(phases)


@dataclass
class Goodput:
    calm_rate: float              # revisions per second without faults
    fault_rate: float             # with faults
    calm_s: float
    fault_s: float
    losses: dict[str, KindLoss]

    @property
    def ratio(self) -> float:
        return self.fault_rate / self.calm_rate if self.calm_rate > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"calm_rate": round(self.calm_rate, 3), "fault_rate": round(self.fault_rate, 3),
                "goodput": round(self.ratio, 4), "calm_s": round(self.calm_s, 2), "fault_s": round(self.fault_s, 2),
                "by_kind": {k: {"faults": v.faults, "lost_s": round(v.lost_s, 3), "reforms": len(v.reforms),
                                "phases_s": {p: round(x, 3) for p, x in v.phase_totals().items()},
                                "outside_reforms_s": round(v.outside_reforms(), 3)}
                            for k, v in self.losses.items()}}


def measure(commits: Iterable[Commit], faults: Sequence[FaultAt], calm: tuple[float, float],
            faulted: tuple[float, float], events: Records = (), raft: Records = ()) -> Goodput:
    """The run's goodput and lost time by fault kind (see the module docstring).

    Raises:
        ValueError: a window is empty or the calm window committed nothing (no rate to compare with).
    """
    if calm[1] <= calm[0] or faulted[1] <= faulted[0]:
        raise ValueError(f"empty window: calm {calm}, faults {faulted}")
    progress = Progress(commits)
    calm_rate = progress.rate(*calm)
    if calm_rate <= 0:
        raise ValueError("no step committed in the fault-free window: no rate to compare with")
    losses = lost_by_kind(progress, faults, faulted, calm_rate)
    attribute_reforms(losses, events, raft, faults, progress, faulted, calm_rate)
    return Goodput(calm_rate, progress.rate(*faulted), calm[1] - calm[0], faulted[1] - faulted[0], losses)


def format_losses(g: Goodput) -> list[str]:
    """The table of lost seconds per fault kind and the phases of its reforms (seconds, summed)."""
    rows = [["fault kind", "faults", "lost s", "share", "per fault ms", "reforms", *PHASES, "outside reforms"]]
    total = sum(v.lost_s for v in g.losses.values()) or 1.0
    for kind, v in sorted(g.losses.items(), key=lambda kv: -kv[1].lost_s):
        phases = v.phase_totals()
        rows.append([kind, str(v.faults), f"{v.lost_s:.2f}", f"{v.lost_s / total * 100:.0f} %",
                     f"{v.lost_s / v.faults * 1000:.0f}" if v.faults else "-", str(len(v.reforms)),
                     *(f"{phases[p]:.2f}" for p in PHASES), f"{v.outside_reforms():.2f}"])
    return aligned(rows)


def median_reform(g: Goodput) -> dict[str, float]:
    """The median of each phase over every reform of the run (seconds)."""
    reforms = [r for v in g.losses.values() for r in v.reforms]
    return {p: statistics.median(r[p] for r in reforms) for p in PHASES} if reforms else {}

"""The stress test's verdict from what a run left behind. Pure: records in, figures and a pass/fail out.

Inputs: the actions (faults) with their times, every committed step the applications reported
(`progress.Commit`), when a majority of the voters was up (`plan.Timeline`), the generations as
activated (from the agents' traces, else from the polled certificate history), the Raft checker's result
and each live member's final revision and digest.
Figures:
- `max_stall_s`: the longest stretch inside the observed window with no committed step while a majority
  of the voters was up (stretches where a majority was down are cut out: no progress is expected there);
- per fault, `recovery_s`: seconds until the first step that commits a revision above every revision
  committed before the fault;
- `regressions`: generations activated at a frontier below the highest revision some member had
  committed before the activation on the same branch (a declared regression starts a new one), with the
  steps lost;
- `digest_mismatches`: revisions that two members committed with different digests (equal revision
  must mean equal digest).
The run passes only if the checker found no violation and had something to compare, every fault was
followed by a committed step within RECOVERY_LIMIT_S, no two members committed one revision with two
digests, the end was reached (`settled`), and every live member ended with the same digest.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from p2pgen.progress import Commit

RECOVERY_LIMIT_S = 10.0


@dataclass(frozen=True)
class Fault:
    t: float
    kind: str
    text: str


@dataclass(frozen=True)
class Activated:
    generation: int
    revision: int
    t: float
    regressed_from: int | None = None


def max_stall(commit_times: list[float], up: list[tuple[float, float]], start: float,
              end: float) -> tuple[float, float | None]:
    """(seconds, when it began) of the longest stretch in [start, end] with a majority of the voters up
    and no commit. `commit_times` sorted."""
    best, at = 0.0, None
    for lo, hi in up:
        lo, hi = max(lo, start), min(hi, end)
        if hi <= lo:
            continue
        inside = [t for t in commit_times[bisect_right(commit_times, lo):] if t < hi]
        edges = [lo, *inside, hi]
        for a, b in zip(edges, edges[1:]):
            if b - a > best:
                best, at = b - a, a
    return best, at


def recoveries(faults: list[Fault], commits: list[Commit]) -> list[float | None]:
    """Per fault: seconds to the first commit of a revision above all revisions committed before it
    (None: there was none)."""
    times, highest = _highest_so_far(commits)
    out: list[float | None] = []
    for f in faults:
        i = bisect_right(times, f.t)
        before = highest[i - 1] if i else -1
        j = bisect_right(highest, before)        # highest only grows: the first commit above `before`
        out.append(times[j] - f.t if j < len(times) else None)
    return out


def regressions(activated: list[Activated], commits: list[Commit]) -> list[dict[str, Any]]:
    """Activations below the highest revision committed before them on the same branch of history: a declared
    regression (`regressed_from`) starts a new branch at its frontier, so the revisions it gave up, committed
    again later, are not counted twice (a silent regression on the new branch still is)."""
    timeline = sorted([(c.t, 0, c.revision, None) for c in commits] + [(a.t, 1, a.revision, a) for a in activated],
                      key=lambda e: (e[0], e[1]))
    out, highest = [], 0
    for _, _, revision, a in timeline:
        if a is None:
            highest = max(highest, revision)
            continue
        if revision < highest:
            out.append({"generation": a.generation, "revision": revision, "highest_committed": highest,
                        "steps_lost": highest - revision, "regressed_from": a.regressed_from, "t": a.t})
        if a.regressed_from is not None:
            highest = revision
    return out


def _highest_so_far(commits: Iterable[Commit]) -> tuple[list[float], list[int]]:
    """Commit times in order, and the highest revision committed up to each."""
    times, highest, high = [], [], -1
    for c in sorted(commits, key=lambda c: c.t):
        high = max(high, c.revision)
        times.append(c.t)
        highest.append(high)
    return times, highest


def digest_mismatches(commits: Iterable[Commit], rolled_back: list[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Revisions committed with two digests, except those a regression re-executed (a revision in
    (frontier, highest committed] of a regression was legitimately committed twice, maybe by another
    world size and so with other rounding: the regression itself is reported)."""
    seen: dict[int, dict[str, list[str]]] = {}
    for c in commits:
        seen.setdefault(c.revision, {}).setdefault(c.digest, []).append(f"{c.peer}#{c.incarnation}")
    redone = [(r["revision"], r["highest_committed"]) for r in rolled_back]
    return [{"revision": r, "digests": {d: sorted(set(w)) for d, w in by.items()}}
            for r, by in sorted(seen.items()) if len(by) > 1 and not any(lo < r <= hi for lo, hi in redone)]


@dataclass
class Verdict:
    violations: dict[str, int]
    checker_evidence: bool
    recovery: list[float | None]
    max_stall_s: float
    max_stall_at: float | None
    regressions: list[dict[str, Any]]
    mismatches: list[dict[str, Any]]
    final_digests: dict[str, str | None]
    settled: bool

    def failures(self, faults: list[Fault]) -> list[str]:
        """Why the run did not pass, one line per reason (empty: passed)."""
        out = [f"{n} Raft safety violation(s) of {check}" for check, n in self.violations.items() if n]
        if not self.checker_evidence:
            out.append("the Raft checker compared nothing: no two agents traced the same log index "
                       "(agents that do not write $P2PGEN_TRACE_DIR?)")
        late = [(f, r) for f, r in zip(faults, self.recovery) if r is None or r > RECOVERY_LIMIT_S]
        out += [f"no committed step within {RECOVERY_LIMIT_S:.0f} s after: {f.text}"
                + ("" if r is None else f" (next after {r:.1f} s)") for f, r in late]
        if self.mismatches:
            first = self.mismatches[0]
            out.append(f"{len(self.mismatches)} revision(s) committed with different digests by different members; "
                       f"first: revision {first['revision']}, " + "; ".join(
                           f"{d[:12]} by {', '.join(who)}" for d, who in first["digests"].items()))
        if not self.settled:
            out.append("the job did not settle at the end (every live agent's application in one generation)")
        digests = set(self.final_digests.values())
        if not self.final_digests or None in digests or len(digests) > 1:
            out.append("final digests differ or are missing: "
                       + (", ".join(f"{p}={d}" for p, d in sorted(self.final_digests.items())) or "no live member"))
        return out

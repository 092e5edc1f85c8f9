"""The checker: is a run equal to one legal serial history, and if not, what went wrong, by name.

Input: the applications' event logs (see `app.py`) and the job's certificate history. Reference: the
closed-form digests D[r] of the serial state after r steps (`model.reference_digests`).

A step application (`apply`) is legal iff its state before was D[r] and its state after is D[r+1]: the
step of revision r, applied exactly once, on top of exactly steps 0..r-1. A run passes iff every
application is legal, every contributor to a collective of generation G is a member of G's
certificate, no generation resumed below a revision that one of its own members had committed (unless
the policy recorded a rollback: a restart from a checkpoint), and every live member ends with the same
revision and digest, equal to D[final revision].

Names of the semantic failures (a run may have several; `failures` lists them by first occurrence):
- `duplicated step`: a collective mixed members at different revisions: the lower ones applied a step
  that another member had already committed, into a state that now holds it twice;
- `incarnation confusion`: the same, where a lower member resumed from state saved by an earlier
  incarnation of its peer id (an evicted process's state was used), or a process that is not a member of
  a generation's certificate contributed to one of its collectives;
- `lost committed step`: a generation resumed below a revision one of its members had committed, with no
  rollback record;
- `divergent state`: live members end with different states, or with a state that is no serial
  history (also what remains when no other cause is found for an illegal application).
- `mismatched shard version` (sharded runs): a member exposed a shard whose contents are not those of the
  shard at its own revision (after an activation, after a step, or at the end), though the rest of its
  state was serial: a shard of another revision (a stale replica used as a source, a half-copied shard) or
  of another index (another rank's shard) became visible; the evidence says which revision's shard it is;
- `misowned shard` (sharded runs): after an activation a member holds other shards than the certificate
  gives it, or the certificate leaves a shard with fewer than min(r, world) owners among its members;
- `minority progress` (added by `p2pgen chaos` from `runner.partition_findings`, not by `check`): a partitioned
  minority applied a step or elected a Raft leader while it was cut off.
An illegal application whose state before was already not serial is a consequence, not a new cause.
Not named yet: `stale completion visible` needs the delayed-stale-frame fault, which the benchmark does
not inject yet (the transport's stamp check is covered by tests/transport instead).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from p2pgen_lab.chaos.model import SHARD_R, SHARDED, reference_digests, reference_shard_digests

DUPLICATED, CONFUSION, LOST, DIVERGENT = ("duplicated step", "incarnation confusion", "lost committed step",
                                          "divergent state")
MINORITY = "minority progress"
MISMATCHED_SHARD, MISOWNED = "mismatched shard version", "misowned shard"


@dataclass
class Verdict:
    failures: list[str]                 # semantic failure names, by first occurrence
    evidence: list[str]                 # one human-readable line per finding
    injections: int
    latencies: list[float]              # seconds from each injection to the next step applied after it
    rollbacks: list[int]                # committed steps lost per injection
    steps_per_s: float | None
    final_revision: int | None
    stalled: bool = False

    @property
    def passed(self) -> bool:
        return not self.failures and not self.stalled

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "failures": self.failures, "evidence": self.evidence[:20],
                "injections": self.injections, "latencies": self.latencies, "rollbacks": self.rollbacks,
                "steps_per_s": self.steps_per_s, "final_revision": self.final_revision, "stalled": self.stalled}


class _Findings:
    def __init__(self) -> None:
        self.names: list[str] = []
        self.evidence: list[str] = []

    def add(self, name: str, text: str) -> None:
        if name not in self.names:
            self.names.append(name)
        self.evidence.append(f"{name}: {text}")


def check(events: list[dict[str, Any]], history: list[dict[str, Any]], steps: int, stalled: bool = False) -> Verdict:
    events = sorted(events, key=lambda e: e["t"])
    ref = reference_digests(max([steps] + [e["revision"] for e in events if "revision" in e]) + 2)
    found = _Findings()
    _check_applications(events, ref, found)
    _check_membership(events, history, found)
    _check_resumption(events, ref, found)
    if any("shards" in e for e in events):
        _check_shards(events, ref, reference_shard_digests(len(ref) - 1), found)
        _check_ownership(events, found)
    finals = _check_finals(events, ref, found, stalled)
    latencies, rollbacks = _recovery(events, ref)
    return Verdict(found.names, found.evidence, sum(e["event"] == "inject" for e in events), latencies, rollbacks,
                   _throughput(events), finals, stalled)


def _by_kind(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == kind]


def _legal(e: dict[str, Any], ref: list[str]) -> bool:
    r = e["revision"]
    return r + 1 < len(ref) and e["before"] == ref[r] and e["after"] == ref[r + 1]


def _check_applications(events: list[dict[str, Any]], ref: list[str], found: _Findings) -> None:
    contributions: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for c in _by_kind(events, "contribute"):
        contributions[(c["generation"], c["attempt"])].append(c)
    origin = {(s["peer"], s["incarnation"]): s for s in _by_kind(events, "start")}
    for a in _by_kind(events, "apply"):
        if _legal(a, ref) or a["revision"] >= len(ref) or a["before"] != ref[a["revision"]]:
            continue                                    # legal, or a consequence of an earlier cause
        who = f"{a['peer']}#{a['incarnation']} applying step {a['revision']} in g{a['generation']}"
        group = contributions[(a["generation"], a["attempt"])]
        revisions = sorted({c["revision"] for c in group})
        if len(revisions) > 1:
            behind = [c for c in group if c["revision"] < revisions[-1]]
            confused = [c for c in behind if origin.get((c["peer"], c["incarnation"]), {}).get("source") == "snapshot"]
            members = ", ".join(f"{c['peer']}#{c['incarnation']}@r{c['revision']}" for c in group)
            if confused:
                c = confused[0]
                found.add(CONFUSION, f"{who}: {c['peer']}#{c['incarnation']} resumed from the state of an earlier "
                                     f"incarnation of {c['peer']} and contributed step {c['revision']} ({members})")
            else:
                found.add(DUPLICATED, f"{who}: members at revisions {revisions} in one collective ({members})")
        else:
            found.add(DIVERGENT, f"{who}: the state after is not D[{a['revision'] + 1}]")


def _check_membership(events: list[dict[str, Any]], history: list[dict[str, Any]], found: _Findings) -> None:
    members = {h["generation"]: {(m["peer_id"], m["incarnation"]) for m in h["members"]} for h in history
               if h.get("outcome", "activated") == "activated"}
    for e in _by_kind(events, "activate"):
        members.setdefault(e["generation"], {tuple(m) for m in e["members"]})
    for c in _by_kind(events, "contribute"):
        if c["generation"] in members and (c["peer"], c["incarnation"]) not in members[c["generation"]]:
            found.add(CONFUSION, f"{c['peer']}#{c['incarnation']} contributed to g{c['generation']} "
                                 f"but is not in its certificate")


def _check_resumption(events: list[dict[str, Any]], ref: list[str], found: _Findings) -> None:
    """Each generation resumes at or above every revision its members had committed (I2, I5)."""
    committed: dict[tuple[str, int], int] = {}
    for e in events:
        who = (e["peer"], e["incarnation"])
        if e["event"] == "apply" and _legal(e, ref):
            committed[who] = max(committed.get(who, 0), e["revision"] + 1)
        elif e["event"] == "activate":
            held = committed.get(who, 0)
            if e["revision"] < held:
                found.add(LOST, f"{who[0]}#{who[1]} entered g{e['generation']} at revision {e['revision']} "
                                f"after committing revision {held}")


def _shard_revision(e: dict[str, Any], ref: list[str]) -> int | None:
    """The revision whose shards `e` exposes, or None when the rest of its state is not serial there (then the
    shards are a consequence of that, named `divergent state`)."""
    if e["event"] == "apply":
        return e["revision"] + 1 if _legal(e, ref) else None
    r = e["revision"]
    return r if r < len(ref) and e["digest"] == ref[r] else None


def _check_shards(events: list[dict[str, Any]], ref: list[str], shard_ref: list[tuple[str, ...]],
                  found: _Findings) -> None:
    """Every shard a member exposes after an activation, a step or at its end is the shard of its revision."""
    known = {d: (r, i) for r, row in enumerate(shard_ref) for i, d in enumerate(row)}
    named: set[tuple[str, int, str]] = set()
    for e in events:
        if e["event"] not in ("activate", "apply", "final") or "shards" not in e:
            continue
        r = _shard_revision(e, ref)
        if r is None:
            continue
        for i_text, digest in e["shards"].get(SHARDED, {}).items():
            i = int(i_text)
            if digest == shard_ref[r][i] or (e["peer"], e["incarnation"], i_text) in named:
                continue
            named.add((e["peer"], e["incarnation"], i_text))
            where = {"activate": f"after activating g{e.get('generation')}",
                     "apply": f"after applying step {e['revision']} in g{e.get('generation')}",
                     "final": "at its end"}[e["event"]]
            was = known.get(digest)
            what = (f"it is shard {was[1]} of revision {was[0]}" if was else "it is no revision's shard")
            found.add(MISMATCHED_SHARD, f"{e['peer']}#{e['incarnation']} exposes shard {SHARDED}[{i}] {where} at "
                                        f"revision {r}: {what}")


def _check_ownership(events: list[dict[str, Any]], found: _Findings) -> None:
    """After each activation a member holds exactly the shards its certificate gives it, and every shard has
    min(r, world) owners, all members of that certificate."""
    seen: set[int] = set()
    for e in _by_kind(events, "activate"):
        if "assigned" not in e:
            continue
        held = sorted(int(i) for i in e["shards"].get(SHARDED, {}))
        assigned = sorted(e["assigned"].get(SHARDED, []))
        if held != assigned:
            found.add(MISOWNED, f"{e['peer']}#{e['incarnation']} holds shards {held} after activating "
                                f"g{e['generation']}, its certificate gives it {assigned}")
        if e["generation"] in seen:
            continue
        seen.add(e["generation"])
        labels = {f"{p}#{inc}" for p, inc in e["members"]}
        for obj, index, owners in e["ownership"]:
            if obj == SHARDED and (len(owners) < min(SHARD_R, len(labels)) or not set(owners) <= labels):
                found.add(MISOWNED, f"g{e['generation']} gives {obj}[{index}] to {owners}: not min(r, world) "
                                    f"owners among its members {sorted(labels)}")


def _check_finals(events: list[dict[str, Any]], ref: list[str], found: _Findings, stalled: bool) -> int | None:
    finals = _by_kind(events, "final")
    if not finals:
        if not stalled:
            found.add(DIVERGENT, "no member finished")
        return None
    states = {(f["revision"], f["digest"]) for f in finals}
    if len(states) > 1:
        found.add(DIVERGENT, "live members end with different states: " + ", ".join(
            f"{f['peer']}#{f['incarnation']}@r{f['revision']}" for f in finals))
    for f in finals:
        if f["revision"] >= len(ref) or f["digest"] != ref[f["revision"]]:
            found.add(DIVERGENT, f"{f['peer']}#{f['incarnation']} ends at revision {f['revision']} with a state "
                                 f"that is no serial history")
    return max(f["revision"] for f in finals)


def _recovery(events: list[dict[str, Any]], ref: list[str]) -> tuple[list[float], list[int]]:
    """Per injection: seconds until the next step applied in a generation activated after it (or the next
    step at all when the fault changed no generation), and committed steps rolled back."""
    latencies, rollbacks = [], []
    applies = _by_kind(events, "apply")
    activations = _by_kind(events, "activate")
    for inj in _by_kind(events, "inject"):
        t = inj["t"]
        gen_before = max((a["generation"] for a in activations if a["t"] <= t), default=0)
        after = [a for a in applies if a["t"] > t]
        changed = [a for a in after if a["generation"] > gen_before]
        nxt = changed[0] if changed else (after[0] if after else None)
        if nxt is None:
            continue
        committed = max((a["revision"] + 1 for a in applies if a["t"] <= t and _legal(a, ref)), default=0)
        latencies.append(nxt["t"] - t)
        rollbacks.append(max(0, committed - nxt["revision"]))
    return latencies, rollbacks


def _throughput(events: list[dict[str, Any]]) -> float | None:
    """Final revision over the time from the first applied step to the last member's end."""
    applies, finals = _by_kind(events, "apply"), _by_kind(events, "final")
    if not applies or not finals:
        return None
    span = max(f["t"] for f in finals) - applies[0]["t"]
    return max(f["revision"] for f in finals) / span if span > 0 else None


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]

"""Raft safety checker over the agents' traces: was the replicated log one log, whatever the churn?

Owns: reading a trace directory (the agents write `$P2PGEN_TRACE_DIR/raft/<peer_id>-<instance>.jsonl`, one
JSON-lines file per agent process; every *.jsonl below the directory given is read) and four checks over every
record of every process, used by
tests, `p2pgen chaos` and `p2pgen stress`:
- (a) `log_matching`: two nodes that applied log index i hold the same running hash at i (Raft's log
  matching: the entries up to i are the same entries);
- (b) `one_leader_per_term`: at most one node claims leadership of a term (election safety);
- (c) `register_once`: no (peer id, incarnation) was registered by two log entries (I3: an incarnation
  is new every time);
- (d) `generation_once`: each generation number was activated by one log entry, with one member list
  (rank order included) and one frontier revision (I1).
Every check compares what *different* processes applied, so each lineage that looks consistent on its
own is still caught when it disagrees with another. Indexes and terms are compared within a Raft epoch
(`epoch` in a record; a fenced re-form, `p2pgen recover`, starts a new log), registrations and generation
numbers across all of them.
Invariant kept: the checker only reads; a malformed line never aborts it (the last line of a SIGKILLed
agent's file may be cut short: it is counted as truncated, any other bad line is listed as unreadable).
Records without a trace `kind` are skipped: the applications' own traces (`event` records) may share
the directory.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHECKS = ("log_matching", "one_leader_per_term", "register_once", "generation_once")
EXAMPLES = 5                     # concrete examples kept per check
REQUIRED: dict[str, dict[str, type | tuple[type, ...]]] = {
    "node": {"voter": bool},
    "applied": {"index": int, "hash": str},
    "leader": {"term": int},
    "register": {"index": int, "peer_id": str, "incarnation": int},
    "activated": {"index": int, "generation": int, "members": list, "revision": int},
}


@dataclass(frozen=True)
class Activation:
    """One generation as activated by one log entry (deduplicated over the nodes that applied it)."""

    generation: int
    index: int
    members: tuple[tuple[str, int], ...]
    revision: int
    regressed_from: int | None
    t: float                     # the earliest wall time any node recorded it


@dataclass
class Traces:
    """The trace records of one directory, each with `source` (file name) and `line` added."""

    records: list[dict[str, Any]] = field(default_factory=list)
    files: int = 0
    truncated: int = 0           # files whose last line was cut (a SIGKILLed agent)
    unreadable: list[str] = field(default_factory=list)    # "file:line: why", for lines that are not records

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind]


@dataclass
class CheckResult:
    counts: dict[str, int]                     # violations per check (distinct indexes / terms / identities / gens)
    examples: dict[str, list[str]]             # the first EXAMPLES violations per check, smallest key first
    checked: dict[str, int]                    # how much evidence there was (a pass over nothing is no pass)
    unreadable: list[str]

    @property
    def passed(self) -> bool:
        return not any(self.counts.values())

    @property
    def evidence(self) -> bool:
        """At least one log index was applied by two nodes: the log-matching check compared something."""
        return self.checked["indexes_compared"] > 0

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "violations": dict(self.counts), "examples": self.examples,
                "checked": dict(self.checked), "unreadable": self.unreadable[:EXAMPLES]}

    def render(self) -> str:
        c = self.checked
        lines = [f"raft trace check: {'pass' if self.passed else 'FAIL'} ({c['processes']} agent process(es), "
                 f"{c['nodes']} node(s), {c['indexes_compared']} log index(es) compared, {c['terms']} term(s) with "
                 f"a leader, {c['registrations']} registration(s), {c['generations']} generation(s))"]
        for check in CHECKS:
            verdict = "ok" if not self.counts[check] else f"{self.counts[check]} violation(s)"
            lines.append(f"  {check:<20} {verdict}")
            lines += [f"    {e}" for e in self.examples[check]]
        if not self.evidence:
            lines.append("  no log index was applied by two nodes: log matching compared nothing")
        if c["truncated"]:
            lines.append(f"  {c['truncated']} file(s) end in a cut line (an agent killed mid-write): ignored")
        lines += [f"  unreadable: {u}" for u in self.unreadable[:EXAMPLES]]
        return "\n".join(lines)


def load(directory: str | Path) -> Traces:
    """Every trace record under `directory` (*.jsonl, in subfolders too), in file order."""
    traces = Traces()
    for path in sorted(Path(directory).rglob("*.jsonl")):
        traces.files += 1
        lines = path.read_text(errors="replace").split("\n")
        last = max((n for n, line in enumerate(lines) if line.strip()), default=-1)
        for n, line in enumerate(lines):
            if not line.strip():
                continue
            record, why = _parse(line)
            if record is None and n == last and why == "not JSON":
                traces.truncated += 1
            elif record is None and why:
                traces.unreadable.append(f"{path.name}:{n + 1}: {why}")
            elif record is not None:
                traces.records.append({**record, "source": path.name, "line": n + 1})
    return traces


def _parse(line: str) -> tuple[dict[str, Any] | None, str]:
    """(record, "") for a trace record; (None, "") for another tool's record; (None, why) for a bad line."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None, "not JSON"
    if not isinstance(record, dict) or "kind" not in record:
        return None, ""
    fields = REQUIRED.get(record["kind"])
    if fields is None:
        return None, ""                           # a kind this checker does not judge
    for name, kind in {"t": (int, float), "agent": str, "instance": str, **fields}.items():
        if not isinstance(record.get(name), kind) or isinstance(record.get(name), bool) and kind is int:
            return None, f"{record['kind']} record lacks {name!r} ({getattr(kind, '__name__', 'number')})"
    if record["kind"] == "activated" and not all(
            isinstance(m, list) and len(m) == 2 and isinstance(m[0], str) and isinstance(m[1], int)
            for m in record["members"]):
        return None, "activated record's members are not [peer_id, incarnation] pairs"
    return record, ""


def check_dir(directory: str | Path) -> CheckResult:
    return check(load(directory))


def check(traces: Traces) -> CheckResult:
    found = {name: _violations(name, traces) for name in CHECKS}
    checked = {
        "processes": len({(r["agent"], r["instance"]) for r in traces.records}),
        "nodes": len({who(r) for r in traces.records}),
        "indexes_compared": sum(1 for nodes in _applied_by_index(traces).values() if len(nodes) > 1),
        "terms": len({(epoch(r), r["term"]) for r in traces.of("leader")}),
        "registrations": len({(r["peer_id"], r["incarnation"]) for r in traces.of("register")}),
        "generations": len({r["generation"] for r in traces.of("activated")}),
        "truncated": traces.truncated,
    }
    return CheckResult({n: len(v) for n, v in found.items()}, {n: v[:EXAMPLES] for n, v in found.items()}, checked,
                       traces.unreadable)


def who(record: dict[str, Any]) -> str:
    """The Raft node a record speaks for (its agent process when no node id was recorded)."""
    return record.get("node") or f"{record['agent']}/{record['instance']}"


def _violations(name: str, traces: Traces) -> list[str]:
    if name == "log_matching":
        return _log_matching(traces)
    if name == "one_leader_per_term":
        claims = _group(traces.of("leader"), lambda r: (epoch(r), r["term"]),
                        lambda r: f"{who(r)} (agent {r['agent']})")
        return _disagreements(claims, lambda key, c: f"{_at(key[0])}term {key[1]}: {len(c)} leaders, {', '.join(c)}")
    if name == "register_once":
        return _disagreements(_group(traces.of("register"), lambda r: (r["peer_id"], r["incarnation"]),
                                     lambda r: f"{_at(epoch(r))}index {r['index']}"),
                              lambda key, claims: f"{key[0]}#{key[1]} registered at {_list(claims)}")
    return _disagreements(_group(traces.of("activated"), lambda r: r["generation"], _activation_text),
                          lambda gen, claims: f"generation {gen} activated as {_list(claims)}")


def epoch(record: dict[str, Any]) -> int:
    """The Raft epoch a record belongs to (0 before any re-form; each epoch has a log of its own)."""
    return int(record.get("epoch") or 0)


def _at(e: int) -> str:
    return f"epoch {e} " if e else ""


def _log_matching(traces: Traces) -> list[str]:
    out = []
    for (e, index), by_node in sorted(_applied_by_index(traces).items()):
        hashes: dict[str, list[str]] = defaultdict(list)
        for node, h in sorted(by_node.items()):
            hashes[h].append(node)
        if len(hashes) > 1:
            out.append(f"{_at(e)}index {index}: " + "; ".join(f"hash {h[:12]} at {', '.join(nodes)}"
                                                      for h, nodes in hashes.items()))
    return out


def _applied_by_index(traces: Traces) -> dict[tuple[int, int], dict[str, str]]:
    """(epoch, index) -> {node: hash}; a node that recorded two hashes for one index is listed under both
    names. Each Raft epoch has a log of its own: indexes are compared within an epoch."""
    by_index: dict[tuple[int, int], dict[str, str]] = defaultdict(dict)
    for r in traces.of("applied"):
        node, key = who(r), (epoch(r), r["index"])
        held = by_index[key].get(node)
        if held is not None and held != r["hash"]:
            node = f"{node} (again, {r['source']}:{r['line']})"
        by_index[key][node] = r["hash"]
    return by_index


def _group(records: Iterable[dict[str, Any]], key: Any, claim: Any) -> dict[Any, dict[str, list[str]]]:
    """key -> {claim: [nodes that recorded it]}."""
    groups: dict[Any, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        nodes = groups[key(r)][claim(r)]
        if who(r) not in nodes:
            nodes.append(who(r))
    return groups


def _disagreements(groups: dict[Any, dict[str, list[str]]], text: Any) -> list[str]:
    return [text(key, claims) for key, claims in sorted(groups.items()) if len(claims) > 1]


def _list(claims: dict[str, list[str]]) -> str:
    return "; ".join(f"{claim} (seen by {', '.join(nodes[:3])}{' …' if len(nodes) > 3 else ''})"
                     for claim, nodes in claims.items())


def _activation_text(r: dict[str, Any]) -> str:
    members = " ".join(f"{p}#{n}" for p, n in r["members"])
    return f"{_at(epoch(r))}index {r['index']} [{members}] at revision {r['revision']}"


def activations(traces: Traces) -> list[Activation]:
    """Each (generation, activating entry) once, in log order; the earliest time any node recorded it."""
    seen: dict[tuple[int, int, int], Activation] = {}
    for r in traces.of("activated"):
        key = (r["generation"], epoch(r), r["index"])
        members = tuple((str(p), int(n)) for p, n in r["members"])
        if key not in seen or r["t"] < seen[key].t:
            seen[key] = Activation(r["generation"], r["index"], members, r["revision"], r.get("regressed_from"),
                                   r["t"])
    return sorted(seen.values(), key=lambda a: (a.generation, a.index))

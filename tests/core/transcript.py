"""Transcript interpreter for the generation state machine (in the etcd-io/raft `testdata` style).

A transcript is a text file of directives, each followed by the output it must produce:

    # Comment lines (and blank lines between directives) narrate what should happen and why.
    register a 1 agent=127.0.0.1:7000
    ----
    ok: registered a#1
      propose g1 (parent g0) [a#1]: a#1 joined

A directive is one line; `----` opens its expected output, which runs up to the next blank line
(or the end of the file). Output never contains a blank line. Arguments are split like a shell
(`shlex`), so `reason="no heartbeat"` is one argument.

Commands (each prints `render_outcome`: `ok: ...` or `refused: ...`, then one indented line per effect):

    configure MIN_MEMBERS [wait=S] [fresh=0|1]       (regress_wait, allow_fresh_start)
    register PEER INC [zone=ZONE] [NAME=HOST:PORT ...]
    links FROM_HOST HOST=MBITS ...                  (an agent's measured bandwidths)
    suspect reporter=R PEER INC reason="..." [kept=REV:DIGEST:LINEAGE[:COMMITTED:COMMITTED_LINEAGE]]
    leave PEER INC
    reform GEN PEER INC "reason"                   (or reason="...")
    ready GEN PEER INC QUIESCENCE r=REV digest=D [seq=N] [epoch=E] [ckpt=REV:DIGEST[:EPOCH]] [lineage=G]
                     [layout=ID:LENGTH:SHARDS:ITEMSIZE:R;...] [shards=ID:INDEX:DIGEST,...]
                     [committed=REV:G]   (what the restored copy's previous incarnation had committed)
    synced GEN PEER INC digest=D [shards=ID:INDEX:DIGEST,...]
    fallback GEN PEER INC
    kept PEER INC r=REV digest=D lineage=G [committed=REV:G] [agent=HOST:PORT]   (the local copy a dead
        incarnation left, on the host of that agent)

Every command also takes `at=T` (the command's time; it holds for later commands until the next `at=`,
starting at 0) and `term=T` / `index=I` (its Raft log position). The interpreter numbers commands like a log:
each applied command gets the next index, in the
current term (starting at 1). `term=` changes the current term from then on; `index=` sets the index
(later commands continue after it). Certificates show both.

Inspection directives:

    state            render_state of the machine
    history          one line per history entry (activated or abandoned), oldest first
    history summary  how many entries the (bounded) history holds, and its oldest and newest generation
    cycle N          helper for long histories: N times, the first member asks to reform the active
                     generation and every member votes `proved` at the current frontier (so it activates);
                     prints one summary line; any refusal on the way is an error
    cert [GEN]       the active certificate (or generation GEN's, from the history), readable, one field a line
    cert json [GEN]  the same certificate as JSON (sorted keys, indent 1)
    members GEN      the member set (rank map) of history entry GEN
    awaited          the members the pending generation waits for (`GenerationMachine.awaited`)

The interpreter itself checks, after every refused command, that nothing changed: `render_state`, the JSON
state and the JSON history must be identical before and after (DESIGN: "an invalid command changes nothing").
A violation is reported as an error in the output, so the transcript fails.

Rewriting expected output: run `P2PGEN_REWRITE=1 pytest tests/core` and the files under
`tests/core/testdata/` are rewritten with the actual output (comments and layout are kept). Only commit the
rewritten files if you understand every line of the diff: a rewritten transcript asserts whatever the code
does now, bugs included.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from p2pgen.core import (
    DEFAULT_REGRESS_WAIT,
    Certificate,
    Configure,
    Fallback,
    GenerationMachine,
    Kept,
    Leave,
    Links,
    LogPosition,
    Ready,
    Reform,
    Register,
    Suspect,
    Synced,
)
from p2pgen.core.render import (
    history_json,
    member_list,
    render_outcome,
    render_ownership,
    render_pull,
    render_shard_pull,
    render_state,
    render_topology,
    state_json,
)

SEPARATOR = "----"


@dataclass
class Directive:
    line: str                 # the directive as written
    lineno: int               # 1-based line number in the file
    expected: list[str]       # expected output lines
    comments: list[str] = field(default_factory=list)   # comment/blank lines that precede it, kept on rewrite


def parse(text: str) -> tuple[list[Directive], list[str]]:
    """Split a transcript into directives (with their expected output) and trailing comment lines."""
    lines = text.splitlines()
    directives: list[Directive] = []
    pending_comments: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.lstrip().startswith("#"):
            pending_comments.append(line)
            i += 1
            continue
        lineno = i + 1
        i += 1
        if i >= len(lines) or lines[i] != SEPARATOR:
            raise ValueError(f"line {lineno}: directive {line!r} must be followed by a {SEPARATOR!r} line")
        i += 1
        expected = []
        while i < len(lines) and lines[i].strip():
            expected.append(lines[i])
            i += 1
        i += 1   # the blank line that ends the block belongs to it
        directives.append(Directive(line, lineno, expected, pending_comments))
        pending_comments = []
    return directives, pending_comments


def check_transcript(path: Path, text: str, directives: list[Directive], outputs: list[list[str]],
                     trailing: list[str]) -> None:
    """No directive answered ERROR, and the formatted run equals the file (`P2PGEN_REWRITE=1` rewrites it)."""
    errors = [f"{d.line!r} (line {d.lineno}): {line}" for d, out in zip(directives, outputs)
              for line in out if line.startswith("ERROR")]
    assert not errors, "\n".join(errors)
    actual = format_transcript(directives, outputs, trailing)
    if os.environ.get("P2PGEN_REWRITE") == "1":
        if actual != text:
            path.write_text(actual)
        return
    assert actual == text, f"{path.name}: output differs (P2PGEN_REWRITE=1 regenerates it; review the diff)"


def format_transcript(directives: list[Directive], outputs: list[list[str]], trailing: list[str]) -> str:
    out: list[str] = []
    for d, actual in zip(directives, outputs):
        out += d.comments
        out += [d.line, SEPARATOR, *actual]
        out.append("")
    # a blank line already ends the last block; drop duplicated trailing blanks
    while trailing and not trailing[0].strip():
        trailing = trailing[1:]
    out += trailing
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out) + "\n"


class Interpreter:
    """Runs directives against one GenerationMachine and returns their output lines."""

    def __init__(self, job: str = "job") -> None:
        self.machine = GenerationMachine(job)
        self.term = 1
        self.index = 0
        self.at = 0.0
        self.log: list[tuple[object, LogPosition]] = []   # every command applied, in order (for replica checks)

    # --- argument handling -------------------------------------------------------------------------

    @staticmethod
    def _split(args: list[str]) -> tuple[list[str], dict[str, str]]:
        positional, keywords = [], {}
        for a in args:
            if "=" in a:
                k, v = a.split("=", 1)
                keywords[k] = v
            else:
                positional.append(a)
        return positional, keywords

    def _position(self, kw: dict[str, str]) -> LogPosition:
        if "term" in kw:
            self.term = int(kw.pop("term"))
        if "index" in kw:
            self.index = int(kw.pop("index"))
        else:
            self.index += 1
        return LogPosition(self.term, self.index)

    # --- commands ----------------------------------------------------------------------------------

    def _command(self, name: str, pos: list[str], kw: dict[str, str]):
        if "at" in kw:
            self.at = float(kw.pop("at"))
        at = self.at
        if name == "configure":
            (min_members,) = pos
            return Configure(int(min_members), at=at, regress_wait=float(kw.pop("wait", DEFAULT_REGRESS_WAIT)),
                             allow_fresh_start=int(kw.pop("fresh", 0)))
        if name == "register":
            peer, inc = pos
            zone = kw.pop("zone", "")
            addrs = tuple(kw.items())   # as written: the core must not depend on their order
            kw.clear()
            return Register(peer, int(inc), addrs, at=at, zone=zone)
        if name == "links":
            source, *rates = pos
            rates += [f"{k}={v}" for k, v in kw.items()]
            kw.clear()
            return Links(source, " ".join(rates), at=at)
        if name == "suspect":
            peer, inc = pos
            kept = kw.pop("kept").split(":") if "kept" in kw else ["-1", "", "0"]    # revision:digest:lineage
            committed = kept[3:5] if len(kept) > 3 else ["-1", "0"]
            return Suspect(kw.pop("reporter"), peer, int(inc), kw.pop("reason", ""), at=at, kept_revision=int(kept[0]),
                           kept_digest=kept[1], kept_lineage=int(kept[2]), kept_committed=int(committed[0]),
                           kept_committed_lineage=int(committed[1]))
        if name == "leave":
            peer, inc = pos
            return Leave(peer, int(inc), at=at)
        if name == "reform":
            gen, peer, inc, *rest = pos
            reason = kw.pop("reason", " ".join(rest))
            return Reform(int(gen), peer, int(inc), reason, at=at)
        if name == "ready":
            gen, peer, inc, quiescence = pos
            ckpt = kw.pop("ckpt", "").split(":") if "ckpt" in kw else ["-1", ""]
            committed = kw.pop("committed", "-1:0").split(":")
            return Ready(int(gen), peer, int(inc), quiescence, int(kw.pop("r")), kw.pop("digest", ""),
                         int(kw.pop("seq", 0)), at=at, epoch=int(kw.pop("epoch", 0)), ckpt_revision=int(ckpt[0]),
                         ckpt_digest=ckpt[1], ckpt_epoch=int(ckpt[2]) if len(ckpt) > 2 else 0,
                         lineage=int(kw.pop("lineage", 0)), layout=kw.pop("layout", ""), shards=kw.pop("shards", ""),
                         committed=int(committed[0]), committed_lineage=int(committed[1]))
        if name == "kept":
            peer, inc = pos
            committed = kw.pop("committed", "-1:0").split(":")
            return Kept(peer, int(inc), int(kw.pop("r")), kw.pop("digest", ""), int(kw.pop("lineage", 0)), at=at,
                        committed=int(committed[0]), committed_lineage=int(committed[1]), agent=kw.pop("agent", ""))
        if name == "fallback":
            gen, peer, inc = pos
            return Fallback(int(gen), peer, int(inc), at=at)
        if name == "synced":
            gen, peer, inc = pos
            return Synced(int(gen), peer, int(inc), kw.pop("digest", ""), at=at, shards=kw.pop("shards", ""))
        raise ValueError(f"unknown directive {name!r}")

    def _snapshot(self) -> tuple[str, str, str]:
        m = self.machine
        return (render_state(m), json.dumps(state_json(m), sort_keys=True),
                json.dumps(history_json(m), sort_keys=True))

    def run(self, line: str) -> list[str]:
        name, *args = shlex.split(line)
        pos, kw = self._split(args)
        if name == "state":
            return render_state(self.machine).splitlines()
        if name == "history":
            return self._history(summary=bool(pos) and pos[0] == "summary")
        if name == "cert":
            as_json = bool(pos) and pos[0] == "json"
            if as_json:
                pos = pos[1:]
            cert = self._certificate(int(pos[0]) if pos else None)
            if cert is None:
                return ["no certificate"]
            if as_json:
                return json.dumps(cert.to_json(), sort_keys=True, indent=1).splitlines()
            return render_certificate(cert)
        if name == "cycle":
            return self._cycle(int(pos[0]))
        if name == "awaited":
            return [f"awaited: {member_list(self.machine.awaited())}"]
        if name == "members":
            entry = next((h for h in self.machine.history if h.generation == int(pos[0])), None)
            return [member_list(entry.members) if entry else f"g{pos[0]} is not in the history"]

        position = self._position(kw)
        command = self._command(name, pos, kw)
        if kw:
            raise ValueError(f"unused arguments {sorted(kw)} in {line!r}")
        before = self._snapshot()
        outcome = self.machine.apply(command, position)
        self.log.append((command, position))
        out = render_outcome(outcome).splitlines()
        if not outcome.ok and self._snapshot() != before:
            out.append("ERROR: a refused command changed the state")
        return out

    def _apply_quiet(self, command) -> None:
        self.index += 1
        position = LogPosition(self.term, self.index)
        outcome = self.machine.apply(command, position)
        self.log.append((command, position))
        if not outcome.ok:
            raise AssertionError(f"cycle: {command} refused: {outcome.reason}")

    def _cycle(self, n: int) -> list[str]:
        """Reform and re-activate the active generation n times, every member `proved` at the frontier."""
        m = self.machine
        if m.active is None or m.pending is not None or not m.members:
            raise ValueError("cycle needs an active generation, no pending one and at least one member")
        first = m.active_generation
        for _ in range(n):
            frontier = m.active.frontier
            self._apply_quiet(Reform(m.active_generation, m.members[0].peer_id, m.members[0].incarnation, "cycle",
                                     at=self.at))
            generation = m.pending.generation
            for member in m.pending.members:
                self._apply_quiet(Ready(generation, member.peer_id, member.incarnation, "proved",
                                        frontier.revision, frontier.digest, at=self.at))
        return [f"{n} reform cycles: active g{first} -> g{m.active_generation}"]

    def _certificate(self, generation: int | None) -> Certificate | None:
        if generation is None:
            return self.machine.active
        entry = next((h for h in self.machine.history if h.generation == generation), None)
        return entry.certificate if entry else None

    def _history(self, summary: bool = False) -> list[str]:
        h = self.machine.history
        if summary:
            if not h:
                return ["no history"]
            return [f"{len(h)} entries: g{h[0].generation} .. g{h[-1].generation}"]
        lines = []
        for h in self.machine.history:
            lines.append(f"g{h.generation} {h.outcome} at={h.at:g} {member_list(h.members)}: {h.reason}")
        return lines or ["no history"]


def render_certificate(cert: Certificate) -> list[str]:
    """A readable, one-field-a-line form of a certificate (for transcripts)."""
    def pulls() -> str:
        return " ".join(render_pull(p).replace("<-", f"#{p.incarnation}<-", 1) for p in cert.pulled) or "none"
    return [
        f"job: {cert.job}",
        f"generation: g{cert.generation} (parent g{cert.parent})",
        f"reason: {cert.reason}",
        "ranks: " + " ".join(f"{i}={m.peer_id}#{m.incarnation}" for i, m in enumerate(cert.members)),
        f"frontier: r{cert.frontier.revision}:{cert.frontier.digest or '-'}",
        "quiescence: " + " ".join(f"{p}#{i}={q}" for p, i, q in cert.quiescence),
        "revisions: " + " ".join(f"{p}=r{r}" for p, r in cert.revisions),
        f"pulled: {pulls()}",
        "departed: " + (" ".join(f"{p}#{i} ({why})" for p, i, why in cert.departed) or "none"),
        f"owners: {','.join(cert.owners)} (ownership v{cert.ownership_version})",
        *([f"ownership: {render_ownership(cert.ownership)}",
           "moved: " + (" ".join(render_shard_pull(m) for m in cert.moved) or "none")]
          + [f"object {r.object_id}: revision {r.application_revision} digest {r.digest or '-'} source "
             f"{r.reconstruction_source} partition {r.old_partition or '-'} -> {r.new_partition}"
             for r in cert.objects] if cert.ownership else []),
        "divergence: " + (" ".join(f"{p}:{d or '-'}" for p, d in cert.divergence) or "none"),
        f"regressed_from: {'none' if cert.regressed_from is None else f'r{cert.regressed_from}'}",
        f"state: epoch {cert.state_epoch}, from {cert.frontier_source}"
        + (f"; {cert.recovery}" if cert.recovery else ""),
        f"collective_seq_frontier: {cert.collective_seq_frontier}",
        f"proposed_at: {cert.proposed_at:g} activated_at: {cert.activated_at:g}",
        f"raft: term {cert.raft_term} index {cert.raft_index}",
        *([f"topology: {render_topology(cert.topology)}"] if cert.topology else []),
    ]


def run_transcript(text: str, interpreter: type[Interpreter] = Interpreter
                   ) -> tuple[list[Directive], list[list[str]], list[str], Interpreter]:
    directives, trailing = parse(text)
    interp = interpreter()
    outputs = []
    for d in directives:
        try:
            outputs.append(interp.run(d.line))
        except Exception as exc:  # a broken directive is reported where it is, not as a crash
            outputs.append([f"ERROR: {type(exc).__name__}: {exc}"])
    return directives, outputs, trailing, interp

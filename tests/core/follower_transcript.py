"""Transcript interpreter for the follower (`p2pgen.core.follower`) driving the generation machine.

Extends tests/core/transcript.py: every directive of that format still works (the machine commands, `state`,
`cert`, ...), plus these, which simulate the members' application processes without processes:

    follow PEER INC [policy=certified|comm-only|restart-all] [r=REV] [digest=D] [reform_after=S] [agent_voted=1]
                     a follower for PEER#INC (its state at revision REV with digest D; default r=0, digest "");
                     agent_voted: its agent voted for it before it attached (it owes a reform)
    local PEER [running=G|none] [failed=0|1] [fenced=WHY] [switch=G|none] [closed=0|1] [stop=0|1]
                     set what the member knows of itself (kept until changed; `fenced`: the fence aborted its
                     communicator, for that reason)
    agents N         how many agents the local agents hear (for restart-all's rendezvous; default: followers)
    leader none|NAME the Raft leader the agents hear (default: raft)
    heard 0|1        whether the job is proven to hear the agents (their leases; default 1)
    lag PEER         from now on PEER's agent serves the view as it is now (a lagging agent); `catchup PEER` ends it
    decide PEER      print the action the follower chooses now, without performing it
    act PEER [fail] [lost] [corrupt] [quiescence=Q] [seq=N]
                     decide, perform the action as the Peer would, and advance the follower; prints the action,
                     the outcome of the command it submitted (if any) and the result (done / refused / later).
                     `fail`: the fetch (or the vote, reform, report: the agent) could not be done now;
                     `lost`: the command committed but its answer was lost (the agent's Raft node stopped while
                     it waited), so the follower is told "later";
                     `corrupt`: the fetch got bytes with another digest; `quiescence`/`seq`: what a retired
                     communicator proved.
    commit G         every member running generation G, not failed, commits one step (revision + 1; digest `hREV`)

The view a follower decides on is the machine's JSON (core.render.state_json, exactly what the agent serves)
parsed by `JobView.from_json`, so every transcript also checks the parsing. `at=T` applies to every directive:
it is both the wall clock (`now`) and the monotonic clock (`clock`) of the members.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from transcript import Directive, Interpreter, format_transcript, run_transcript

from p2pgen.core import Fallback, LogPosition, Ready, Reform, Synced
from p2pgen.core.follower import (
    CERTIFIED,
    Action,
    Activate,
    AskFallback,
    AskReform,
    Exit,
    Fetch,
    FetchShards,
    Follower,
    FollowerPolicy,
    Local,
    NoteHold,
    ReportSynced,
    Retire,
    RunStep,
    Stop,
    Vote,
    Wait,
)
from p2pgen.core.render import render_hold, render_outcome, render_pull, state_json
from p2pgen.core.view import JobView

RESULT = {True: "done", False: "refused", None: "later"}
POLICIES = {"certified": CERTIFIED, "comm-only": FollowerPolicy(report_state=False),
            "restart-all": FollowerPolicy(restart_on_change=True, rendezvous_s=5.0, last_call_s=0.2)}


@dataclass
class Member:
    """One simulated application process: its follower, its state and what it knows of itself."""

    follower: Follower
    revision: int = 0
    digest: str = ""
    running: int | None = None
    failed: bool = False
    fenced: str = ""                     # why the fence aborted its communicator ("": it did not)
    switch_to: int | None = None
    closed: bool = False
    at_stop: bool = False
    lagging: dict | None = None          # the view its agent keeps serving (None: the current one)
    ended: str = ""                      # why it exited or stopped
    ran: list[int] = field(default_factory=list)     # generations it activated, in order


def render_action(action: Action) -> str:
    match action:
        case RunStep(generation):
            return f"run step in g{generation}"
        case Retire(generation, reason, fence):
            return f"retire g{generation}: {reason}" + (f" (the fence: its agent {fence})" if fence else "")
        case AskReform(generation, reason):
            return f"ask reform of g{generation}: {reason}"
        case Vote(generation, quiescence, seq, report_state):
            return f"vote g{generation} {quiescence} seq={seq}" + ("" if report_state else " (no state)")
        case Fetch(generation, pull):
            return f"fetch g{generation} {render_pull(pull)}"
        case FetchShards(generation, revision, pulls):
            return f"fetch shards g{generation} r{revision} " + " ".join(f"{p.object_id}[{p.index}]" for p in pulls)
        case ReportSynced(generation):
            return f"report synced g{generation}"
        case NoteHold(generation, hold):
            return f"note hold g{generation} {render_hold(hold)}"
        case AskFallback(generation, first):
            return f"ask fallback g{generation}" + (" (first)" if first else "")
        case Activate(active):
            return f"activate g{active.generation} frontier r{active.frontier.revision}:{active.frontier.digest or '-'}"
        case Wait(reason):
            return f"wait: {reason}"
        case Exit(reason):
            return f"exit: {reason}"
        case Stop(reason):
            return f"stop: {reason}"
    raise TypeError(f"not an action: {action!r}")


class FollowerInterpreter(Interpreter):
    """The machine interpreter plus simulated members (see the module docstring)."""

    def __init__(self, job: str = "job") -> None:
        super().__init__(job)
        self.members: dict[str, Member] = {}
        self.agents: int | None = None
        self.leader: str | None = "raft"
        self.heard = True

    # --- the view and the snapshot ----------------------------------------------------------------------

    def view_json(self) -> dict:
        agents = self.agents if self.agents is not None else len(self.members)
        return {"state": state_json(self.machine),
                "raft": {"index": self.index, "leader": self.leader, "heard": self.heard,
                         "agents": [f"agent{i}" for i in range(agents)]}}

    def view_of(self, m: Member) -> JobView:
        return JobView.from_json(m.lagging if m.lagging is not None else self.view_json())

    def local_of(self, m: Member) -> Local:
        return Local(now=self.at, clock=self.at, running=m.running, failed=m.failed, fenced=m.fenced,
                     switch_to=m.switch_to, closed=m.closed, at_stop=m.at_stop)

    # --- directives -----------------------------------------------------------------------------------------

    def run(self, line: str) -> list[str]:
        name, *args = shlex.split(line)
        pos, kw = self._split(args)
        if "at" in kw and name in ("follow", "local", "decide", "act", "commit", "agents", "leader", "heard", "lag",
                                         "catchup"):
            self.at = float(kw.pop("at"))
        if name == "follow":
            return self._follow(pos, kw)
        if name == "local":
            return self._local(pos, kw)
        if name == "agents":
            self.agents = int(pos[0])
            return [f"{self.agents} agents"]
        if name == "leader":
            self.leader = None if pos[0] == "none" else pos[0]
            return [f"leader {pos[0]}"]
        if name == "heard":
            self.heard = pos[0] == "1"
            return [f"heard {pos[0]}"]
        if name == "lag":
            self.members[pos[0]].lagging = self.view_json()
            return [f"{pos[0]}'s agent serves the view of index {self.index} from now on"]
        if name == "catchup":
            self.members[pos[0]].lagging = None
            return [f"{pos[0]}'s agent serves the current view"]
        if name == "decide":
            m = self.members[pos[0]]
            return [render_action(m.follower.decide(self.view_of(m), self.local_of(m)))]
        if name == "act":
            return self._act(self.members[pos[0]], pos[1:], kw)
        if name == "commit":
            return self._commit(int(pos[0]))
        return super().run(line)

    def _follow(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        peer, inc = pos
        policy = kw.pop("policy", "certified")
        follower = Follower((peer, int(inc)), self.at, POLICIES[policy], float(kw.pop("reform_after", 1.5)))
        if kw.pop("agent_voted", "0") == "1":
            follower.owe_reform("attached after the agent voted on its behalf")
        self.members[peer] = Member(follower, int(kw.pop("r", 0)), kw.pop("digest", ""))
        self._no_leftovers(kw)
        return [f"{peer}#{inc} follows ({policy}) at r{self.members[peer].revision}"]

    def _local(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        m = self.members[pos[0]]
        opt = {"none": None}
        if "running" in kw:
            v = kw.pop("running")
            m.running = opt[v] if v in opt else int(v)
        if "switch" in kw:
            v = kw.pop("switch")
            m.switch_to = opt[v] if v in opt else int(v)
        m.failed = bool(int(kw.pop("failed", int(m.failed))))
        m.fenced = kw.pop("fenced", m.fenced)
        m.closed = bool(int(kw.pop("closed", int(m.closed))))
        m.at_stop = bool(int(kw.pop("stop", int(m.at_stop))))
        self._no_leftovers(kw)
        fenced = f" fenced={m.fenced!r}" if m.fenced else ""
        return [f"{pos[0]}: running={m.running} failed={int(m.failed)}{fenced} switch={m.switch_to} "
                f"closed={int(m.closed)} stop={int(m.at_stop)}"]

    def _commit(self, generation: int) -> list[str]:
        done = []
        for peer, m in sorted(self.members.items()):
            if m.running == generation and not m.failed and not m.ended:
                m.digest = self.next_digest(m, generation)
                m.revision += 1
                done.append(f"{peer}=r{m.revision}")
        return [f"committed in g{generation}: {' '.join(done) or 'nobody'}"]

    def next_digest(self, m: Member, generation: int) -> str:
        """The digest of `m`'s state after one more step in `generation` (transcripts: `h` + the revision)."""
        return f"h{m.revision + 1}"

    # --- acting ---------------------------------------------------------------------------------------------

    def _act(self, m: Member, flags: list[str], kw: dict[str, str]) -> list[str]:
        view = self.view_of(m)
        action = m.follower.decide(view, self.local_of(m))
        out = [render_action(action)]
        fail, lost, corrupt = "fail" in flags, "lost" in flags, "corrupt" in flags
        quiescence, seq = kw.pop("quiescence", "proved"), int(kw.pop("seq", 0))
        self._no_leftovers(kw)
        if isinstance(action, (Exit, Stop)):
            m.ended = render_action(action)
            return out
        if isinstance(action, RunStep):
            return out
        if isinstance(action, Retire):
            m.running, m.failed, m.fenced, m.switch_to = None, False, "", None
            m.follower.advance(action, True, self.at, quiescence=quiescence, collective_seq=seq)
            return out
        ok = None if fail else self._perform(m, action, view, corrupt, out)
        if lost:
            out.append("  (its answer is lost)")
            ok = None
        m.follower.advance(action, ok, self.at)
        if not isinstance(action, Wait):
            out.append("-> " + RESULT[ok])
        return out

    def _perform(self, m: Member, action: Action, view: JobView, corrupt: bool, out: list[str]) -> bool | None:
        peer, inc = m.follower.identity
        match action:
            case Vote(generation, quiescence, seq, report_state):
                revision, digest = (m.revision, m.digest) if report_state else (0, "")
                return self._submit(Ready(generation, peer, inc, quiescence, revision, digest, seq, at=self.at), out)
            case Fetch(_, pull):
                assert view.pending is not None and view.pending.frontier is not None
                frontier = view.pending.frontier
                m.revision, m.digest = frontier.revision, ("corrupt" if corrupt else frontier.digest)
                out.append(f"  holds r{m.revision}:{m.digest or '-'}" + (" (from a checkpoint)" if pull.checkpoint
                                                                          else ""))
                return True
            case FetchShards():
                return True
            case ReportSynced(generation):
                return self._submit(Synced(generation, peer, inc, m.digest, at=self.at), out)
            case AskFallback(generation, _):
                return self._submit(Fallback(generation, peer, inc, at=self.at), out)
            case AskReform(generation, reason):
                return self._submit(Reform(generation, peer, inc, reason, at=self.at), out)
            case Activate(active):
                m.running, m.failed, m.switch_to = active.generation, False, None
                m.ran.append(active.generation)
                out.append(f"  rank {active.rank_of(m.follower.identity)} of {len(active.members)} at "
                           f"r{m.revision}:{m.digest or '-'}")
                return True
            case NoteHold():
                return True
            case Wait():
                return None
        raise TypeError(f"cannot perform {action!r}")

    def _submit(self, command, out: list[str]) -> bool:
        self.index += 1
        outcome = self.machine.apply(command, LogPosition(self.term, self.index))
        self.log.append((command, LogPosition(self.term, self.index)))
        out += ["  " + line for line in render_outcome(outcome).splitlines()]
        return outcome.ok

    @staticmethod
    def _no_leftovers(kw: dict[str, str]) -> None:
        if kw:
            raise ValueError(f"unused arguments {sorted(kw)}")


def run_follower_transcript(text: str) -> tuple[list[Directive], list[list[str]], list[str], Interpreter]:
    return run_transcript(text, FollowerInterpreter)


__all__ = ["FollowerInterpreter", "format_transcript", "render_action", "run_follower_transcript"]

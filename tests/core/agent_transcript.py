"""Transcript interpreter for the agent's driver (`p2pgen.core.agentmachine`) on the generation machine.

Extends tests/core/transcript.py: every directive of that format still works (the machine commands the other
agents' members submit, `state`, `history`, ...), plus these, which simulate one agent (its application, its
standby, its Raft node and heartbeats) without processes:

    agent PEER [command=0|1] [grace=S] [max_restarts=N] [retire=S] [standby=0|1] [timeout=S] [min=N] [wait=S]
                     the agent under test, for PEER, as a new agent process (what the previous one simulated is
                     gone); command=1: it supervises an application; min: the job's minimum members, recorded by
                     its `Configure`; wait: the regression wait it records
    turn [stalled=1] a driver turn: decide, perform, advance until the machine rests; one block per action
    exits [why=TEXT] [clean=1]    the application exits, then a turn (the exit is its event)
    standby_dies [why=TEXT]       the waiting standby dies, then a turn
    boundary         the application stopped at a step boundary (a drain asked it), then a turn
    lost ADDR [instance=I] [why=TEXT] [proven=0|1]   the heartbeats lose the agent at ADDR (proven=1: a refusal
                     or a new process there, not a silence), then a turn; a silence judged while the agent has no
                     Raft node is not acted on (`p2pgen.core.heartbeats.acts_on_loss`)
    recover EPOCH SEED               `p2pgen recover` asks a re-form, then a turn
    attach           the application attached (`p2pgen.join()`)
    sigstop / sigcont             the application is stopped / continued
    standby_sigstop               the waiting standby is stopped
    heard ADDR INSTANCE / unheard ADDR   the heartbeats hear (or no longer hear) an agent
    raft up|down|lose            submits commit and answer / find no quorum / commit but the answer is lost (once)
    node none|back   the agent has no Raft node (joining, re-joining) / has one again
    leader yes|none  a Raft leader is heard or not
    voter 0|1        the agent's node is a voter
    removed [REASON] its voter applied its own removal (REASON: as the membership says it)
    refused REASON|none          the others refuse its voter (the membership can tell by itself)
    members_say out|in|unknown   what live members answer when asked whether its voter is still one
    drain [deadline=S] [wait=S]  a leave is requested now: gone within `deadline` s, hand-over at most `wait` s
    copy REV GEN | copy none     the local copy the application left on this host
    decide           the action the machine would choose now, not performed
    memory           what the agent remembers (incarnation, registration, relaunch, restarts, lost agents)

`at=T` on any directive sets the clock (wall and monotonic alike) from then on.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace

from transcript import Directive, Interpreter, format_transcript, run_transcript

from p2pgen.core import Command, Configure, Leave, LogPosition, Outcome, Ready, Register, Suspect
from p2pgen.core import agentmachine as am
from p2pgen.core.heartbeats import acts_on_loss
from p2pgen.core.render import render_outcome
from p2pgen.core.steward import Drain

RESULT = {True: "done", False: "refused", None: "later"}
AGENT_ADDR = "10.0.0.1:7000"


@dataclass
class App:
    """The simulated application process (the last one started or promoted)."""

    incarnation: int
    started: float
    attached: bool = False
    exited: bool = False
    stopped_at: float | None = None
    killed: bool = False


@dataclass
class Standby:
    started: float
    stopped: bool = False


def render_action(action: am.Action) -> str:
    match action:
        case am.Configure():
            return "configure the job's rules"
        case am.Register(incarnation):
            return f"register #{incarnation}"
        case am.Renumber(incarnation):
            return f"renumber: the agent's own member is #{incarnation}"
        case am.Launch(incarnation, kill_standby):
            return f"launch #{incarnation}" + (" (kill the stopped standby)" if kill_standby else "")
        case am.PromoteStandby(incarnation):
            return f"promote the standby to #{incarnation}"
        case am.StartStandby():
            return "start a standby"
        case am.StandbyLost(pid, why, deaths):
            return f"standby pid {pid} lost ({why}): {deaths} in a row"
        case am.VoteReady(generation, incarnation):
            return f"vote ready g{generation} for #{incarnation}"
        case am.KillApp(incarnation, why, counted, report):
            return f"kill #{incarnation}: {why}" + (" (report)" if report else "") + (" (counted)" if counted else "")
        case am.ReportDeath(incarnation, why, counted, relaunch_at):
            return f"report the death of #{incarnation}: {why}" + (" (counted)" if counted else "") + \
                f"; relaunch by {relaunch_at:g}"
        case am.Evicted(incarnation, why, renumber, kill):
            then = f"renumber #{renumber}" if renumber is not None else f"kill #{kill}" if kill is not None else \
                "already being killed"
            return f"evicted {'#' + str(incarnation) if incarnation is not None else '(registration)'}: {why}; {then}"
        case am.NoteLost(addr, instance, why):
            return f"note lost agent {addr}/{instance or '*'}: {why}"
        case am.EvictLost(suspects, forget):
            return "evict lost: suspect " + (" ".join(f"{p}#{i}" for p, i, _ in suspects) or "nobody") + \
                "; forget " + (" ".join(f"{a}/{i or '*'}" for a, i in forget) or "nothing")
        case am.AskMembership(why, _, voter):
            return f"ask live members about this voter ({why or 'no reason of its own'})" if voter else \
                "membership check (a non-voter asks nobody)"
        case am.Rejoin(why):
            return f"rejoin: {why}"
        case am.Reform(epoch, seed, gone):
            return f"re-form to epoch {epoch} seeded by {seed}" + (f" without {','.join(gone)}" if gone else "")
        case am.HandOver(why, say, where):
            return f"hand over: {why} ({where})" + ("" if say else " (said)")
        case am.StopApp(why, say):
            return f"stop the application: {why}"
        case am.AwaitApp(why, say):
            return f"await the application: {why}" + ("" if say else " (said)")
        case am.Leave(why, exit_code, app_stopping, _):
            return f"leave (exit {exit_code}{', app stopping' if app_stopping else ''}): {why}"
        case am.Wait(reason):
            return f"wait: {reason}"
    raise TypeError(f"not an action: {action!r}")


class AgentInterpreter(Interpreter):
    """The machine interpreter plus one simulated agent (see the module docstring)."""

    def __init__(self, job: str = "job") -> None:
        super().__init__(job)
        self.local: am.AgentLocal | None = None
        self.min_members, self.regress_wait = 1, 30.0
        self.actions: list[tuple[am.Action, Outcome | None]] = []    # everything performed, in order
        self.new_agent()

    def new_agent(self) -> None:
        """A fresh agent process: no application, standby, drain; its node a non-voter that hears a leader."""
        self.app: App | None = None
        self.standby: Standby | None = None
        self.pids = 100
        self.heard: dict[str, str] = {}
        self.raft = "up"
        self.node, self.leader, self.voter = True, True, False
        self.removed: str | None = None       # its voter applied its own removal (the membership's words)
        self.refused: str | None = None
        self.members_say: bool | None = None
        self.drain: Drain | None = None
        self.copy: tuple[int, int] | None = None

    @property
    def peer(self) -> str:
        assert self.local is not None, "no `agent` directive yet"
        return self.local.rules.peer_id

    # --- the view -----------------------------------------------------------------------------------------

    def view(self, event: am.Event | None = None, stalled: bool = False) -> am.AgentView:
        app = self.app
        status = None if app is None else am.AppStatus(
            app.incarnation, app.attached, self.at - app.started, app.exited,
            None if app.stopped_at is None else self.at - app.stopped_at)
        standby = None if self.standby is None else am.StandbyStatus(stopped=self.standby.stopped)
        removed_reason = self.removed or self.refused
        return am.AgentView(
            clock=self.at, wall=self.at, machine=self.machine if self.node else None, leader=self.leader,
            voter=self.voter, removed=self.removed is not None, removed_reason=removed_reason if self.voter else None,
            stalled=stalled, app=status, standby=standby, heard=tuple(sorted(self.heard.items())),
            leaving=self.drain is not None, drain=self.drain,
            local_copy=self.copy if self.drain is not None and app is not None else None, event=event)

    # --- directives -----------------------------------------------------------------------------------------

    def run(self, line: str) -> list[str]:
        name, *args = shlex.split(line)
        pos, kw = self._split(args)
        handler = getattr(self, f"_do_{name}", None)
        if handler is None:
            return super().run(line)
        if "at" in kw:
            self.at = float(kw.pop("at"))
        out = handler(pos, kw)
        if kw:
            raise ValueError(f"unused arguments {sorted(kw)}")
        return out

    def _do_agent(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        (peer,) = pos
        self.new_agent()
        self.min_members = int(kw.pop("min", 1))
        self.regress_wait = float(kw.pop("wait", 30.0))
        rules = am.AgentRules(peer, supervises=kw.pop("command", "1") == "1", configured=self.min_members <= 1,
                              attach_grace=float(kw.pop("grace", "inf")), max_restarts=int(kw.pop("max_restarts", 10)),
                              retire_wait=float(kw.pop("retire", 5.0)), standby=kw.pop("standby", "0") == "1",
                              detector_timeout=float(kw.pop("timeout", 1.5)))
        self.local = am.AgentLocal.start(rules)
        return [f"agent for {peer} ({'supervises an application' if rules.supervises else 'its own member'})"]

    def _do_turn(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        return self.turn(stalled=kw.pop("stalled", "0") == "1")

    def _do_exits(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        app = self.app
        assert app is not None and not app.exited, "no application runs"
        app.exited = True
        clean = kw.pop("clean", "0") == "1"
        return self.turn(am.AppExited(app.incarnation, kw.pop("why", "exited with code 0" if clean else "was killed"),
                                      clean))

    def _do_standby_dies(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        assert self.standby is not None, "no standby waits"
        self.standby = None
        self.pids += 1
        return self.turn(am.StandbyExited(self.pids, kw.pop("why", "was killed")))

    def _do_boundary(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        assert self.app is not None
        return self.turn(am.AppStoppedAtBoundary(self.app.incarnation))

    def _do_lost(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        instance, why, proven = kw.pop("instance", ""), kw.pop("why", "silent"), kw.pop("proven", "0") == "1"
        if not acts_on_loss(self.node, proven):
            return [f"not acted on: {pos[0]} {why} was judged while this agent has no Raft node"]
        return self.turn(am.AgentLost(pos[0], instance, why))

    def _do_recover(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        return self.turn(am.ReformAsked(int(pos[0]), pos[1]))

    def _do_attach(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        assert self.app is not None
        self.app.attached = True
        return [f"#{self.app.incarnation} attached"]

    def _do_sigstop(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        assert self.app is not None
        self.app.stopped_at = self.at
        return [f"#{self.app.incarnation} stopped"]

    def _do_sigcont(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        assert self.app is not None
        self.app.stopped_at = None
        return [f"#{self.app.incarnation} continued"]

    def _do_standby_sigstop(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        assert self.standby is not None
        self.standby.stopped = True
        return ["the standby is stopped"]

    def _do_heard(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        self.heard[pos[0]] = pos[1]
        return [f"hears {pos[0]}/{pos[1]}"]

    def _do_unheard(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        self.heard.pop(pos[0], None)
        return [f"no longer hears {pos[0]}"]

    def _do_raft(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        self.raft = pos[0]
        return [f"raft {self.raft}"]

    def _do_node(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        self.node = pos[0] == "back"
        return ["a Raft node" if self.node else "no Raft node"]

    def _do_leader(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        self.leader = pos[0] == "yes"
        return ["a leader is heard" if self.leader else "no leader heard"]

    def _do_voter(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        self.voter = pos[0] == "1"
        return ["a voter" if self.voter else "a non-voting member"]

    def _do_removed(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        self.removed = " ".join(pos) or "voter applied its own removal"
        return ["its voter applied its own removal"]

    def _do_refused(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        self.refused = None if pos[0] == "none" else " ".join(pos)
        return [f"refused: {self.refused}"]

    def _do_members_say(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        self.members_say = {"out": True, "in": False, "unknown": None}[pos[0]]
        return [f"live members say: {pos[0]}"]

    def _do_drain(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        deadline, wait = float(kw.pop("deadline", 25.0)), float(kw.pop("wait", self.regress_wait))
        self.drain = Drain(self.at, self.at + deadline, wait)
        return [f"drain asked at {self.at:g}: leaves by {self.drain.leave_by:g}, hands over for at most {wait:g} s"]

    def _do_copy(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        self.copy = None if pos[0] == "none" else (int(pos[0]), int(pos[1]))
        return [f"local copy: {'none' if self.copy is None else f'r{self.copy[0]} of g{self.copy[1]}'}"]

    def _do_decide(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        assert self.local is not None
        return [render_action(am.decide(self.view(), am.observe(self.local, self.view())))]

    def _do_memory(self, pos: list[str], kw: dict[str, str]) -> list[str]:
        m = self.local
        assert m is not None
        relaunch = f"#{m.relaunch.incarnation} by {m.relaunch.due:g}" if m.relaunch else "none"
        lost = " ".join(f"{a}/{i or '*'}" for (a, i), _ in m.lost) or "none"
        return [f"incarnation={m.incarnation} to_register={m.to_register} handed_out={m.handed_out} "
                f"voted={m.voted} relaunch={relaunch} restarts={m.restarts} standby_deaths={m.standby_deaths}",
                f"lost={lost} left={int(m.left)} exit_code={m.exit_code}"]

    # --- a turn -------------------------------------------------------------------------------------------

    def turn(self, event: am.Event | None = None, stalled: bool = False) -> list[str]:
        """One driver turn, as `Agent._turn` does it."""
        assert self.local is not None, "no `agent` directive yet"
        self.local = am.begin_turn(self.local)
        out: list[str] = []
        if event is not None:
            self.step(self.view(event, stalled), out)
        while not self.local.left:
            if isinstance(self.step(self.view(stalled=stalled), out), am.RESTING):
                break
            if len(out) > 200:
                raise AssertionError("a turn that does not rest")
        return out or [render_action(am.decide(self.view(), self.local))]

    def step(self, view: am.AgentView, out: list[str]) -> am.Action:
        assert self.local is not None
        self.local = am.observe(self.local, view)
        action = am.decide(view, self.local)
        out.append(render_action(action))
        outcome = self.perform(action, out)
        self.local = am.advance(self.local, action, outcome)
        self.actions.append((action, outcome))
        if not isinstance(action, am.RESTING):
            out.append("-> " + RESULT[None if outcome is None else outcome.ok])
        return action

    def perform(self, action: am.Action, out: list[str]) -> Outcome | None:
        """What the agent would do (`Agent._perform`), on the simulated processes and the machine."""
        at, peer = self.at, self.peer
        match action:
            case am.Configure():
                return self.submit(Configure(self.min_members, at=at, regress_wait=self.regress_wait), out)
            case am.Register(incarnation):
                return self.submit(Register(peer, incarnation, (("agent", AGENT_ADDR), ("agent_instance", "i0")),
                                            at=at), out)
            case am.Launch(incarnation):
                self.standby = None
                self.app = App(incarnation, at)
            case am.PromoteStandby(incarnation):
                assert self.standby is not None
                self.app, self.standby = App(incarnation, self.standby.started), None
            case am.StartStandby():
                self.standby = Standby(at)
            case am.VoteReady(generation, incarnation):
                return self.submit(Ready(generation, peer, incarnation, "proved", 0, "", 0, at=at), out)
            case am.KillApp(incarnation, why, _, report):
                assert self.app is not None
                self.app.killed, self.app.stopped_at = True, None
                if report:
                    self.submit(Suspect(peer, peer, incarnation, why, at=at), out)
            case am.ReportDeath(incarnation, why):
                kept = {} if self.copy is None else \
                    {"kept_revision": self.copy[0], "kept_digest": f"h{self.copy[0]}", "kept_lineage": self.copy[1]}
                self.submit(Suspect(peer, peer, incarnation, why, at=at, **kept), out)
            case am.Evicted(kill=kill) if kill is not None:
                assert self.app is not None and self.app.incarnation == kill
                self.app.killed, self.app.stopped_at = True, None
            case am.EvictLost(suspects):
                for p, i, why in suspects:
                    self.submit(Suspect(peer, p, i, why, at=at), out)
            case am.AskMembership(voter=voter):
                answer = self.members_say if voter else None
                return None if answer is None else Outcome(answer, "asked")
            case am.Rejoin():
                self.voter, self.removed, self.refused = False, None, None
            case am.StopApp():
                assert self.drain is not None
                self.drain = replace(self.drain, app_asked=at)
            case am.Leave():
                if self.local is not None and self.local.incarnation is not None:
                    self.submit(Leave(peer, self.local.incarnation, at=at), out)
        return am.DONE

    def submit(self, command: Command, out: list[str]) -> Outcome | None:
        if self.raft == "down" or not self.node:
            out.append("  (no Raft quorum)")
            return None
        self.index += 1
        outcome = self.machine.apply(command, LogPosition(self.term, self.index))
        self.log.append((command, LogPosition(self.term, self.index)))
        out += ["  " + line for line in render_outcome(outcome).splitlines()]
        if self.raft == "lose":
            self.raft = "up"
            out.append("  (its answer is lost)")
            return None
        return outcome


def run_agent_transcript(text: str) -> tuple[list[Directive], list[list[str]], list[str], Interpreter]:
    return run_transcript(text, AgentInterpreter)


__all__ = ["AgentInterpreter", "format_transcript", "render_action", "run_agent_transcript"]

"""Hypothesis: one agent's driver (p2pgen.core.agentmachine) beside other members, without processes.

`AgentJob` runs the agent of peer `a` (with or without an application, a standby, an attach grace) on the
transcript interpreter's simulated processes and Raft node, beside peers b and c whose members register, vote,
suspect a's member and die. Hypothesis interleaves, in any order: driver turns, a's application attaching,
voting, exiting, stopped and continued, stopping at a drain's boundary, the local copy it leaves, its standby
dying or stopped, submits finding no quorum or losing their answer, the agent losing its Raft node, its leader,
its voter, other agents reported lost, re-forms, drains, and time passing.

Checked after every step (I3 and the driver's own rules, from what it performed):
- never two registrations in flight: a registration whose answer was lost is retried with the same number until
  an answer comes or its process is gone;
- incarnations strictly increasing: every number handed out is above every one handed out before and every one
  the job had seen when it was decided; none the job evicted is ever registered again;
- an evicted (or dead) incarnation's application is killed at most once and relaunched at most once;
- a vote the job took is never repeated for the same (generation, incarnation);
- leave is final: after `Leave`, the machine decides nothing but `Wait`;
- a turn that rests on a settled view (`agentmachine.settled`: the driver then waits up to SETTLED_TURN_S for an
  event) leaves nothing for the clock alone: the same view any time later decides a resting action.
"""

from __future__ import annotations

from agent_transcript import AgentInterpreter
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from p2pgen.core import Outcome
from p2pgen.core import agentmachine as am

OTHERS = ("b", "c")


class CheckedAgent(AgentInterpreter):
    """The interpreter, recording what the rules above need at each action it performs."""

    def __init__(self) -> None:
        super().__init__()
        self.handed: list[int] = []
        self.unanswered: int | None = None     # a registration whose answer was lost
        self.relaunches: dict[int, int] = {}
        self.kills: dict[int, int] = {}
        self.votes: set[tuple[int, int]] = set()
        self.gone: set[int] = set()            # incarnations the agent learned the job evicted, or that died
        self.violations: list[str] = []

    def perform(self, action: am.Action, out: list[str]) -> Outcome | None:
        local = self.local
        assert local is not None
        seen = self.machine.last_incarnation.get("a", 0)
        number = _handed_out(action)
        if local.left and not isinstance(action, am.Wait):
            self.violations.append(f"{action} after the leave")
        if number is not None:
            if number <= max([seen, *self.handed]):
                self.violations.append(f"#{number} handed out, not above {seen} (seen) and {self.handed}")
            self.handed.append(number)
        if isinstance(action, (am.Launch, am.PromoteStandby)) and local.relaunch is not None:
            dead = local.relaunch.incarnation
            self.relaunches[dead] = self.relaunches.get(dead, 0) + 1
        killed = action.incarnation if isinstance(action, am.KillApp) else \
            action.kill if isinstance(action, am.Evicted) else None
        if killed is not None:
            self.kills[killed] = self.kills.get(killed, 0) + 1
        if isinstance(action, (am.Evicted, am.ReportDeath)) and action.incarnation is not None:
            self.gone.add(action.incarnation)
        if isinstance(action, am.Register):
            self.check_register(action.incarnation)
        if isinstance(action, am.ReportDeath) and action.incarnation == self.unanswered:
            self.unanswered = None
        outcome = super().perform(action, out)
        if isinstance(action, am.Register):
            self.unanswered = action.incarnation if outcome is None else None
        if isinstance(action, am.VoteReady) and outcome is not None:
            key = (action.generation, action.incarnation)
            if key in self.votes:
                self.violations.append(f"vote {key} repeated")
            self.votes.add(key)
        return outcome

    def check_register(self, incarnation: int) -> None:
        if self.unanswered is not None and self.unanswered != incarnation:
            self.violations.append(f"register #{incarnation} while #{self.unanswered} is in flight")
        if incarnation in self.gone:
            self.violations.append(f"register #{incarnation}, evicted or dead before")


def _handed_out(action: am.Action) -> int | None:
    match action:
        case am.Launch(incarnation) | am.PromoteStandby(incarnation) | am.Renumber(incarnation):
            return incarnation
        case am.Evicted(renumber=renumber):
            return renumber
    return None


class AgentJob(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.job = CheckedAgent()
        self.incarnation = dict.fromkeys(OTHERS, 0)

    def run(self, line: str) -> list[str]:
        out = self.job.run(line)
        assert not any(x.startswith("ERROR") for x in out), (line, out)
        return out

    @property
    def app(self):
        return self.job.app

    @initialize(command=st.booleans(), grace=st.sampled_from(("inf", "2")), standby=st.booleans(),
                max_restarts=st.sampled_from((2, 50)), min_members=st.sampled_from((1, 2)))
    def start(self, command: bool, grace: str, standby: bool, max_restarts: int, min_members: int) -> None:
        self.run(f"agent a command={int(command)} grace={grace} standby={int(standby)} max_restarts={max_restarts} "
                 f"min={min_members} timeout=1.5 retire=5")

    # --- the driver -------------------------------------------------------------------------------------

    @rule(stalled=st.booleans())
    def turn(self, stalled: bool) -> None:
        self.run(f"turn stalled={int(stalled)}")
        self.check_settled_rest()

    def check_settled_rest(self) -> None:
        job, local = self.job, self.job.local
        if local is None or local.left or not am.settled(job.view(), local):
            return
        now = job.at
        try:
            for later in (0.3, 1.0, 5.0, 60.0):
                job.at = now + later
                view = job.view()
                action = am.decide(view, am.observe(am.begin_turn(local), view))
                assert isinstance(action, am.RESTING), (f"settled at {now}, yet {action} at {job.at}",
                                                        job.run("memory"))
        finally:
            job.at = now

    @rule(seconds=st.sampled_from((0.1, 0.6, 1.2, 3.0, 6.0)))
    def time_passes(self, seconds: float) -> None:
        self.job.at += seconds

    # --- a's processes ----------------------------------------------------------------------------------

    @precondition(lambda self: self.app is not None and not self.app.exited and not self.job.local.left)
    @rule()
    def attach(self) -> None:
        self.run("attach")

    @precondition(lambda self: self.app is not None and not self.app.exited and not self.job.local.left)
    @rule(clean=st.sampled_from((False, False, False, True)))
    def app_exits(self, clean: bool) -> None:
        self.run(f"exits clean={int(clean)}")

    @precondition(lambda self: self.app is not None and not self.app.exited)
    @rule(stop=st.booleans())
    def app_stopped_or_continued(self, stop: bool) -> None:
        self.run("sigstop" if stop else "sigcont")

    @precondition(lambda self: self.app is not None and self.app.attached and not self.app.exited)
    @rule()
    def app_votes(self) -> None:
        """a's attached application votes for the pending generation that names it (as its follower would)."""
        pending, local = self.job.machine.pending, self.job.local
        member = pending.member("a") if pending is not None else None
        if member is not None and member.incarnation == self.app.incarnation == local.incarnation \
                and "a" not in pending.votes:
            self.run(f"ready {pending.generation} a {member.incarnation} proved r=0 digest=")

    @precondition(lambda self: self.job.standby is not None and not self.job.local.left)
    @rule(stop=st.booleans())
    def standby_dies_or_stops(self, stop: bool) -> None:
        self.run("standby_sigstop" if stop else "standby_dies")

    # --- Raft and heartbeats ------------------------------------------------------------------------------

    @rule(state=st.sampled_from(("up", "up", "down", "lose")))
    def raft(self, state: str) -> None:
        self.run(f"raft {state}")

    @rule(back=st.booleans())
    def node(self, back: bool) -> None:
        self.run(f"node {'back' if back else 'none'}")

    @rule(heard=st.booleans())
    def leader(self, heard: bool) -> None:
        self.run(f"leader {'yes' if heard else 'none'}")

    @rule(voter=st.booleans(), answer=st.sampled_from(("out", "in", "unknown")))
    def voter_and_answer(self, voter: bool, answer: str) -> None:
        self.run(f"voter {int(voter)}")
        self.run(f"members_say {answer}")

    @rule()
    def removed(self) -> None:
        self.run("removed")

    @precondition(lambda self: not self.job.local.left)
    @rule(peer=st.sampled_from(OTHERS), heard=st.booleans())
    def other_agent_lost(self, peer: str, heard: bool) -> None:
        addr = f"10.0.0.{OTHERS.index(peer) + 2}:7000"
        self.run(f"heard {addr} {peer}1" if heard else f"unheard {addr}")
        self.run(f"lost {addr} instance={peer}1")

    @precondition(lambda self: self.job.drain is None and not self.job.local.left)
    @rule(deadline=st.sampled_from((12.0, 30.0)))
    def drain(self, deadline: float) -> None:
        self.run(f"drain deadline={deadline} wait=8")

    @precondition(lambda self: self.job.drain is not None and self.job.drain.app_asked is not None
                  and self.app is not None and not self.app.exited and not self.job.local.left)
    @rule()
    def app_stops_at_boundary(self) -> None:
        self.run("boundary")

    @precondition(lambda self: not self.job.local.left)
    @rule(epoch=st.integers(1, 3))
    def recover(self, epoch: int) -> None:
        self.run(f"recover {epoch} 10.0.0.1:7000")

    @rule(revision=st.sampled_from((0, 3, 9)))
    def local_copy(self, revision: int) -> None:
        self.run(f"copy {revision} 1" if revision else "copy none")

    # --- the other members --------------------------------------------------------------------------------

    @rule(peer=st.sampled_from(OTHERS))
    def other_registers(self, peer: str) -> None:
        inc = self.incarnation[peer] = self.incarnation[peer] + 1
        self.run(f"register {peer} {inc} agent=10.0.0.{OTHERS.index(peer) + 2}:7000 agent_instance={peer}1")

    @rule()
    def others_vote(self) -> None:
        pending = self.job.machine.pending
        if pending is None:
            return
        for m in pending.members:
            if m.peer_id in OTHERS and m.peer_id not in pending.votes:
                self.run(f"ready {pending.generation} {m.peer_id} {m.incarnation} proved r=0 digest=")

    @rule(peer=st.sampled_from(("a", *OTHERS)), reporter=st.sampled_from(OTHERS))
    def suspected(self, peer: str, reporter: str) -> None:
        member = next((m for m in self.job.machine.members if m.peer_id == peer), None)
        if member is not None:
            self.run(f'suspect reporter={reporter} {peer} {member.incarnation} reason="silent"')

    # --- checks ---------------------------------------------------------------------------------------------

    @invariant()
    def rules_kept(self) -> None:
        job = self.job
        assert not job.violations, job.violations
        assert all(n <= 1 for n in job.relaunches.values()), job.relaunches
        assert all(n <= 1 for n in job.kills.values()), job.kills
        local = job.local
        if local is not None and local.to_register is not None:
            assert local.to_register == max(job.handed), (local.to_register, job.handed)

    def teardown(self) -> None:
        """No more faults: an agent that has not left ends with its member registered in the job."""
        job = self.job
        if job.local is None or job.local.left or job.drain is not None:
            return
        for line in ("raft up", "node back", "leader yes", "voter 0"):
            self.run(line)
        if job.app is not None and job.app.stopped_at is not None:
            self.run("sigcont")
        for _ in range(12):
            if job.app is not None and job.app.killed and not job.app.exited:
                self.app_exits(False)
            if job.app is not None and not job.app.exited and not job.app.attached:
                self.attach()
            self.time_passes(6.0)
            self.turn(False)
            if job.local.left:
                return
        assert job.local.incarnation is not None, job.run("memory")
        assert job.machine.is_current("a", job.local.incarnation), (job.run("memory"), job.run("state"))


AgentJob.TestCase.settings = settings(max_examples=200, stateful_step_count=60, deadline=None,
                                      suppress_health_check=[HealthCheck.too_slow])
TestAgentJob = AgentJob.TestCase

"""The agent driver's decisions (p2pgen.core.agentmachine), pinned by transcripts on the real machine.

Transcripts: tests/core/testdata/agent/*.txt (format: tests/core/agent_transcript.py); each one simulates one
agent (its application, standby, Raft node and heartbeats) beside the other members' commands.
`P2PGEN_REWRITE=1 pytest tests/core/test_agentmachine.py` rewrites the expected output; only commit what you
understand.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from agent_transcript import run_agent_transcript
from transcript import check_transcript

from p2pgen.core import agentmachine as am

TESTDATA = Path(__file__).parent / "testdata" / "agent"
FILES = sorted(TESTDATA.glob("*.txt"))


def test_agent_testdata_present():
    assert len(FILES) >= 6, f"expected the agent transcripts under {TESTDATA}"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_agent_transcript(path: Path):
    text = path.read_text()
    directives, outputs, trailing, _ = run_agent_transcript(text)
    check_transcript(path, text, directives, outputs, trailing)


def test_a_turn_that_only_waits_leaves_the_memory_as_it_was():
    """The idle agent's turn (begin, wait) replaces nothing: the driver's memory is the very same object, and a
    turn that acted starts the next one with nothing done."""
    idle = am.AgentLocal.start(am.AgentRules("p0"))
    turn = am.begin_turn(idle)
    assert turn is idle and am.advance(turn, am.Wait("nothing to do"), am.DONE) is idle
    acted = am.advance(turn, am.StandbyLost(pid=1, why="exited", deaths=1), am.DONE)
    assert acted.done == {"StandbyLost"} and am.begin_turn(acted).done == frozenset()


def test_a_stopped_application_is_killed_once_whatever_killed_it():
    """A stopped application the job evicted is killed for the job (not counted); while that kill is under way,
    or once the application exited, a stop the shell still reports is no reason to kill it again, counted
    (`stopped_evicted.txt` plays the whole story; this pins the rule on the view the shell could give)."""
    text = (TESTDATA / "stopped_evicted.txt").read_text()
    before_exit = text[:text.index("turn at=3\n")]
    _, _, _, agent = run_agent_transcript(before_exit)
    assert agent.local.killing == (1, False), agent.local
    agent.app.stopped_at, agent.at = 1.0, 3.0          # the stop outlived the kill in the view, past the timeout
    assert not isinstance(am.decide(agent.view(), agent.local), am.KillApp)
    agent.app.exited = True
    agent.local = am.advance(agent.local, am.ReportDeath(1, "was killed", False, 8.0), None)
    assert agent.local.killing is None
    assert not isinstance(am.decide(agent.view(), agent.local), am.KillApp)


def _settled_agent(prefix: str = "agent a timeout=1.5") -> object:
    """Agent a with its application registered, attached and running beside b's member, turned until it rests."""
    _, _, _, agent = run_agent_transcript(f"""{prefix}
----

register b 1 agent=10.0.0.2:7000 agent_instance=b1 at=0
----

turn
----

attach
----

turn
----
""")
    return agent


def _later(agent, seconds: float) -> am.Action:
    """What the driver decides `seconds` later on the same view, nothing else changed (a new turn)."""
    agent.at += seconds
    view = agent.view()
    return am.decide(view, am.observe(am.begin_turn(agent.local), view))


def test_a_registered_running_member_rests_settled_and_the_clock_alone_changes_nothing():
    agent = _settled_agent()
    assert am.settled(agent.view(), agent.local), agent.run("memory")
    assert am.turn_wait(agent.view(), agent.local) == am.SETTLED_TURN_S
    assert isinstance(_later(agent, 3600.0), am.RESTING)


@pytest.mark.parametrize("circumstance", ["stopped", "leaderless", "standby", "grace", "stalled", "voter"])
def test_a_rule_that_acts_on_the_clock_alone_keeps_the_driver_on_short_turns(circumstance: str):
    """Each circumstance in which a rule fires on time passing alone (a stopped application is killed after the
    detector's timeout, a long leaderless spell asks for membership, a standby starts once the application ran
    a while, an application not attached within its grace gets the agent's vote, a stall or a voter in
    preparation) is not settled: the driver turns every TURN_S, and the rule does fire later."""
    prefix = {"standby": "agent a timeout=1.5 command=1 standby=1", "grace": "agent a timeout=1.5 grace=2"}
    agent = _settled_agent(prefix.get(circumstance, "agent a timeout=1.5"))
    view = agent.view()
    if circumstance == "stopped":
        agent.run("sigstop")
    elif circumstance == "leaderless":
        agent.run("leader no")
        agent.local = am.observe(agent.local, agent.view())
    elif circumstance == "grace":
        agent.app.attached = False             # the pending generation then waits for the agent's vote
    if circumstance == "stalled":
        view = replace(agent.view(), stalled=True)
    elif circumstance == "voter":
        view = replace(agent.view(), pending_voter=True)
    else:
        view = agent.view()
    assert not am.settled(view, agent.local), circumstance
    assert am.turn_wait(view, agent.local) == am.TURN_S
    if circumstance in ("stalled", "voter"):
        return                                  # the shell acts on these (its own lateness, the promotion)
    assert not isinstance(_later(agent, 60.0), am.RESTING), (circumstance, agent.run("memory"))


def test_an_action_that_found_no_quorum_keeps_the_driver_on_short_turns():
    """A vote the job could not take (no Raft quorum answered) is tried again at the next turn: a view on which
    the turn rested after it is not settled, however still everything else is (Hypothesis found this one)."""
    agent = _settled_agent("agent a timeout=1.5 grace=2")
    agent.app.attached = False
    agent.at += 5.0                                   # past the grace: the vote is the agent's
    agent.run("raft down")
    out = agent.run("turn")
    assert any(line.startswith("vote") for line in out), out
    assert not am.settled(agent.view(), agent.local)
    assert am.turn_wait(agent.view(), agent.local) == am.TURN_S

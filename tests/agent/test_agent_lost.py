"""`Agent._agent_lost` runs on the heartbeat thread, which must never die: between two Raft nodes (the agent
re-joining, or replaced as a voter) the agent has no node, and a lost agent reported then must not raise.

Seen in a fresh-clone CI run: the AttributeError killed p2's heartbeat thread for good; the agent then
judged no peer again and its member never rejoined (the 40 s stress run did not settle)."""

from __future__ import annotations

import queue
import threading
from types import SimpleNamespace

from p2pgen.agent.agent import Agent


def test_an_agent_lost_while_this_agent_has_no_raft_node_is_queued_without_raising():
    pokes = []
    me = SimpleNamespace(_events=queue.Queue(), voters=SimpleNamespace(poke=lambda: pokes.append(1)), node=None)
    Agent._agent_lost(me, "127.0.0.1:23790", "a1b2", "refused our heartbeats", proven=True)
    assert me._events.get_nowait() == ("agent_lost", "127.0.0.1:23790", "a1b2", "refused our heartbeats")
    assert pokes == [1]


def test_a_silence_judged_while_this_agent_has_no_raft_node_is_not_acted_on():
    """Seen in a stress run: an agent re-joining for 10.8 s queued suspicions of three live agents it could not
    hear then, and had their members evicted once it was back. A proof (refusal, replaced process) still counts."""
    pokes = []
    me = SimpleNamespace(_events=queue.Queue(), voters=SimpleNamespace(poke=lambda: pokes.append(1)), node=None)
    Agent._agent_lost(me, "127.0.0.1:23790", "a1b2", "silent for 1.60 s > timeout 1.50 s")
    assert me._events.empty() and pokes == []


class _Node:
    """A Raft node that follows `leader` and records the elections it is asked to hasten."""

    def __init__(self, leader: str | None) -> None:
        self.leader, self.hastened = leader, []

    def view(self) -> SimpleNamespace:
        return SimpleNamespace(leader=self.leader)

    def hasten_election(self, leader: str) -> None:
        self.hastened.append(leader)


def _agent_with(node: _Node, leaving: bool = False) -> SimpleNamespace:
    flag = threading.Event()
    if leaving:
        flag.set()
    return SimpleNamespace(_events=queue.Queue(), voters=SimpleNamespace(poke=lambda: None), node=node,
                           _leaving=flag)


LEADER = "10.0.0.1:23401/aabbccddeeff"


def test_the_leaders_agent_judged_silent_or_proven_dead_makes_this_follower_campaign_soon():
    """A host that stops or loses its link answers no heartbeat: no proof ever comes, and nothing the agents decide
    about the loss can commit until a new leader is elected. A silence past the detector's verdict hastens the
    election as a proof does; an agent that is not the leader's, or one that is leaving, hastens nothing."""
    for proven in (False, True):
        node = _Node(LEADER)
        Agent._agent_lost(_agent_with(node), "10.0.0.1:23400", "a1b2", "phi 12.1 > 8.0 after 0.30 s", proven)
        assert node.hastened == [LEADER]
    other = _Node(LEADER)
    Agent._agent_lost(_agent_with(other), "10.0.0.2:23400", "a1b2", "phi 12.1 > 8.0 after 0.30 s")
    leaving = _Node(LEADER)
    Agent._agent_lost(_agent_with(leaving, leaving=True), "10.0.0.1:23400", "a1b2", "phi 12.1 > 8.0 after 0.30 s")
    no_leader = _Node(None)
    Agent._agent_lost(_agent_with(no_leader), "10.0.0.1:23400", "a1b2", "phi 12.1 > 8.0 after 0.30 s")
    assert other.hastened == leaving.hastened == no_leader.hastened == []

"""`Agent._agent_lost` runs on the heartbeat thread, which must never die: between two Raft nodes (the agent
re-joining, or replaced as a voter) the agent has no node, and a lost agent reported then must not raise.

Seen in a fresh-clone CI run: the AttributeError killed p2's heartbeat thread for good; the agent then
judged no peer again and its member never rejoined (the 40 s stress run did not settle)."""

from __future__ import annotations

import queue
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

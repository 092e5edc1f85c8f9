"""An idle follower's thread sleeps through the leader's heartbeats: each one moves the follower's election deadline,
and the sleep's end is read again after it, so the thread takes no turn for a deadline that has moved on.
In-process nodes on 127.0.0.1."""

from __future__ import annotations

import time

import pytest

from p2pgen.raft.identity import new_node_id
from p2pgen.raft.node import RaftNode
from p2pgen_lab.rigs.agents import free_control_ports

pytestmark = pytest.mark.timeout(60)
SECRET = b"idle-test-secret-0123456789ab"
WATCHED_S = 1.6            # more than three of the idle cap's wake-ups (0.5 s) and ten leader heartbeats (0.15 s)


def _count_turns(node: RaftNode) -> list[int]:
    """Count the node's turns from now on (its thread looks `_turn` up on the instance every time)."""
    count = [0]
    turn = node._turn

    def counted() -> float:
        count[0] += 1
        return turn()
    node._turn = counted            # type: ignore[method-assign]
    return count


def test_an_idle_follower_takes_no_turn_while_the_leader_is_heard():
    ports = free_control_ports(3)
    ids = [new_node_id(f"127.0.0.1:{p + 1}") for p in ports]
    nodes = [RaftNode("j", i, ids, SECRET) for i in ids]
    try:
        for n in nodes:
            n.start()
        assert nodes[0].wait_view(lambda v: v.leader is not None and v.ready, 10) is not None
        for n in nodes:
            assert n.wait_view(lambda v: v.leader is not None and v.ready, 10) is not None
        time.sleep(0.5)                                          # the formation's messages are handled
        leader = nodes[0].view().leader
        followers = [n for n in nodes if n.node_id != leader]
        counts = [_count_turns(n) for n in followers]
        time.sleep(WATCHED_S)
        assert all(n.view().leader == leader for n in nodes), "an election happened: the test saw no idle job"
        # before: a turn every 0.5 s (3 or 4 each); one is allowed for a heartbeat that a loaded machine delays
        assert max(c[0] for c in counts) <= 1, f"followers took {[c[0] for c in counts]} turns while idle"
    finally:
        for n in nodes:
            n.stop()


def test_a_voter_that_cannot_campaign_keeps_turning_while_keepalives_wake_it():
    """A voter whose election deadline passed but that is connected to no other voter cannot campaign: it
    reconnects on its turns, a tick apart. The keep-alives of the non-voting members connected to it wake its
    poll more often than that; they must not postpone its turns (they did, once the sleep's end was read again
    after every message: 5 formation voters of a 32-agent job never elected a leader)."""
    ports = free_control_ports(2)
    ids = [new_node_id(f"127.0.0.1:{p + 1}") for p in ports]       # ids[1]'s node never starts
    voter = RaftNode("j", ids[0], ids, SECRET)
    readers = [RaftNode("j", None, ids, SECRET) for _ in range(12)]
    try:
        voter.start()
        for r in readers:
            r.start()
        time.sleep(1.5)                                              # connected, idle, deadline long passed
        turns = _count_turns(voter)
        time.sleep(1.0)
        # a tick (0.1 s) apart: about 10; postponed by every keep-alive: none or a few
        assert turns[0] >= 5, f"the voter took {turns[0]} turns in 1 s"
    finally:
        for n in [voter, *readers]:
            n.stop()

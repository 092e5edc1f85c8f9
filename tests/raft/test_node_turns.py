"""A Raft node's thread turns when its clocks call for it, however often messages that call for nothing wake its
poll. In-process nodes on 127.0.0.1."""

from __future__ import annotations

import time

import pytest

from p2pgen.raft.identity import new_node_id
from p2pgen.raft.node import RaftNode
from p2pgen_lab.rigs.agents import free_control_ports

pytestmark = pytest.mark.timeout(60)
SECRET = b"idle-test-secret-0123456789ab"


def _count_turns(node: RaftNode) -> list[int]:
    """Count the node's turns from now on (its thread looks `_turn` up on the instance every time)."""
    count = [0]
    turn = node._turn

    def counted() -> float:
        count[0] += 1
        return turn()
    node._turn = counted            # type: ignore[method-assign]
    return count


def test_a_voter_that_cannot_campaign_keeps_turning_while_keepalives_wake_it():
    """A voter whose election deadline passed but that is connected to no other voter cannot campaign: it
    reconnects on its turns, a tick apart. The keep-alives of the non-voting members connected to it wake its
    poll more often than that; they must not postpone its turns (5 formation voters of a 32-agent job would never
    connect, nor elect a leader)."""
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

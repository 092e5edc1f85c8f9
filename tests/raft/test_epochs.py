"""Raft epochs are fenced: a node of an older epoch cannot talk to a node of a newer one (their keys differ),
while nodes of one epoch form a group as usual. In-process nodes on 127.0.0.1."""

from __future__ import annotations

import time

import pytest

from p2pgen.core import Register
from p2pgen.raft.identity import new_node_id
from p2pgen.raft.node import RaftNode, RaftUnavailable
from p2pgen_lab.rigs.agents import free_control_ports

pytestmark = pytest.mark.timeout(60)
SECRET = b"epoch-test-secret-0123456789"


def test_an_old_epoch_node_cannot_join_a_new_epoch_group():
    ports = free_control_ports(3)
    ids = [new_node_id(f"127.0.0.1:{p + 1}") for p in ports]
    new = [RaftNode("j", i, ids[:2], SECRET, epoch=1) for i in ids[:2]]
    old = RaftNode("j", ids[2], ids, SECRET, epoch=0)            # thinks it is a voter with them, in epoch 0
    stray = RaftNode("j", None, ids[:2], SECRET, epoch=0)        # a non-voting member of epoch 0
    try:
        for n in (*new, old, stray):
            n.start()
        view = new[0].wait_view(lambda v: v.leader is not None and v.ready, 10)
        assert view is not None and view.epoch == 1
        assert new[1].submit(Register("p0", 1, at=1.0), timeout=5).ok
        time.sleep(1.0)
        assert old.view().leader is None and old.view().term == 0   # it never even reached a voter
        assert stray.view().leader is None and not stray.view().ready
        with pytest.raises(RaftUnavailable):
            stray.submit(Register("intruder", 1, at=2.0), timeout=1.0)
        assert new[0].view().machine.member("intruder") is None and new[0].view().term == view.term
    finally:
        for n in (*new, old, stray):
            n.stop()

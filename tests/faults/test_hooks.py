"""Injected partitions reach p2pgen's own traffic: Raft messages, UDP heartbeats, data-plane links, agent RPC.

In-process, on 127.0.0.1. Each node's "agent" is a control port from `free_control_ports`; its Raft, heartbeat and
data addresses sit in that agent's port block, as in a real agent.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import numpy as np
import pytest

from p2pgen import faults
from p2pgen.agent.heartbeat import Announcement, HeartbeatRunner
from p2pgen.agent.rpc import RpcClient
from p2pgen.core import Register
from p2pgen.detect import DetectorConfig
from p2pgen.errors import PeerLost
from p2pgen.raft.identity import new_node_id
from p2pgen.raft.node import RaftNode, RaftUnavailable
from p2pgen.transport import Group, Transport, TransportConfig
from p2pgen_lab.rigs.agents import free_control_ports

pytestmark = pytest.mark.timeout(60)
SECRET = b"partition-hook-secret-0123456789"


@pytest.fixture
def rules(tmp_path):
    """The rules file this process watches for the test; healed and unwatched afterwards."""
    path = tmp_path / "faults.json"
    faults.heal(path)
    faults.watch(str(path), interval=0.0)
    try:
        yield path
    finally:
        faults.watch(None)
        faults.set_local_agent(None)


@contextmanager
def raft_trio():
    """Three Raft voters, one per agent address (the node's port is the agent's + 1), started; stopped after."""
    agents = [f"127.0.0.1:{p}" for p in free_control_ports(3)]
    ids = [new_node_id(f"127.0.0.1:{int(a.split(':')[1]) + 1}") for a in agents]
    nodes = [RaftNode("j", i, ids, SECRET) for i in ids]
    try:
        for n in nodes:
            n.start()
        yield agents, ids, nodes
    finally:
        for n in nodes:
            n.stop()


def test_raft_minority_node_cut_both_ways_cannot_commit_and_catches_up_after_the_heal(rules):
    with raft_trio() as (agents, ids, nodes):
        assert nodes[0].wait_view(lambda v: v.leader is not None and v.ready, 10) is not None
        assert nodes[0].submit(Register("before", 1, at=1.0), timeout=5).ok
        faults.write_partition(rules, [[agents[0]], agents[1:]])
        assert nodes[1].wait_view(lambda v: v.leader in ids[1:], 10) is not None   # the majority elects
        assert nodes[1].submit(Register("during", 1, at=2.0), timeout=5).ok
        with pytest.raises(RaftUnavailable):
            nodes[0].submit(Register("minority", 1, at=3.0), timeout=2.0)
        assert nodes[0].wait_view(lambda v: v.leader is None, 10) is not None      # it knows it is cut off
        assert nodes[0].view().machine.member("during") is None
        faults.heal(rules)
        assert nodes[0].wait_view(lambda v: v.machine.member("during") is not None, 10) is not None
        assert nodes[2].view().machine.member("minority") is None


def test_raft_one_way_cut_silences_the_node_but_the_others_go_on(rules):
    with raft_trio() as (agents, ids, nodes):
        assert nodes[0].wait_view(lambda v: v.leader is not None and v.ready, 10) is not None
        faults.write_partition(rules, [[agents[0]], agents[1:]], one_way=True)
        assert nodes[1].wait_view(lambda v: v.leader in ids[1:], 10) is not None
        assert nodes[2].submit(Register("others", 1, at=1.0), timeout=5).ok
        with pytest.raises(RaftUnavailable):         # what it sends never arrives: no submission gets through
            nodes[0].submit(Register("silenced", 1, at=2.0), timeout=2.0)
        faults.heal(rules)
        assert nodes[0].submit(Register("healed", 1, at=3.0), timeout=10).ok
        assert nodes[1].view().machine.member("silenced") is None


def _runner(addr: str, peers: list[str], suspected: list[str]) -> HeartbeatRunner:
    host, port = addr.rsplit(":", 1)
    config = DetectorConfig(kind="fixed", timeout=0.5, floor=0.3, heartbeat_interval=0.05)
    return HeartbeatRunner(host, int(port), b"k" * 32, "j", addr, config, lambda: set(peers),
                           lambda peer, inst, why: suspected.append(peer),
                           lambda: Announcement(addr, "", False))


def test_heartbeats_cut_one_way_make_only_the_receiver_suspect(rules):
    a, b = [f"127.0.0.1:{p}" for p in free_control_ports(2)]
    sus_a: list[str] = []
    sus_b: list[str] = []
    ra, rb = _runner(a, [b], sus_a), _runner(b, [a], sus_b)
    try:
        ra.start()
        rb.start()
        _until(lambda: b in ra.heard() and a in rb.heard(), "both hear each other")
        faults.write_partition(rules, [[a], [b]], one_way=True)
        _until(lambda: a in sus_b, "b suspects the silenced a")
        assert b in ra.heard() and not sus_a            # a still hears b
        faults.heal(rules)
        _until(lambda: a in rb.heard(), "b hears a again after the heal")
    finally:
        ra.stop()
        rb.stop()


def test_data_plane_links_are_refused_across_a_cut_and_an_open_link_fails(rules):
    agents = [f"127.0.0.1:{p}" for p in free_control_ports(2)]
    config = TransportConfig(connect_timeout=1.0, handshake_timeout=1.0, abort_timeout=2.0)
    ts = [Transport("j", SECRET, f"p{i}", 1, port=int(a.split(":")[1]) + 2, config=config)
          for i, a in enumerate(agents)]
    try:
        members = [t.endpoint() for t in ts]
        faults.write_partition(rules, [[agents[1]], [agents[0]]], one_way=True)   # p1 -> p0 only: TCP breaks
        s0 = ts[0].open_session(Group("j", 1, members, 0))
        ts[1].open_session(Group("j", 1, members, 1))
        with pytest.raises(PeerLost, match="partitioned"):
            s0.link(1)
        faults.heal(rules)
        s0 = ts[0].open_session(Group("j", 2, members, 0))
        s1 = ts[1].open_session(Group("j", 2, members, 1))
        got: list = []
        waiter = threading.Thread(target=lambda: got.append(s1.link(0)), daemon=True)
        waiter.start()
        conn = s0.link(1)
        waiter.join(5)
        assert got, "the accepted link never arrived"
        faults.write_partition(rules, [[agents[0]], [agents[1]]])
        with pytest.raises(PeerLost, match="partitioned"):
            conn.post(1, 0, 0, np.zeros(8, np.uint8), inline=True)
    finally:
        for t in ts:
            t.close()


def test_agent_rpc_is_refused_between_partitioned_agents_but_not_to_ones_own(rules):
    a, b = [f"127.0.0.1:{p}" for p in free_control_ports(2)]
    faults.set_local_agent(a)
    faults.write_partition(rules, [[a], [b]], one_way=True)
    with pytest.raises(ConnectionRefusedError, match="partitioned from"):
        RpcClient(b, SECRET, timeout=0.5)
    with pytest.raises(OSError) as err:                 # nothing listens at a: the cut is not what refuses it
        RpcClient(a, SECRET, timeout=0.5)
    assert "partitioned" not in str(err.value)


def _until(predicate, what: str) -> None:
    done = threading.Event()
    while not predicate():
        done.wait(0.02)
    assert predicate(), what

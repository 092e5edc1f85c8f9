"""Raft links between nodes that have nothing to say to each other stay up without traffic: the kernel judges a
verified link, not pysyncobj's read timer (`p2pgen.raft.transport`). In-process nodes on 127.0.0.1."""

from __future__ import annotations

import socket
import time

import pytest

from p2pgen.raft.identity import new_node_id
from p2pgen.raft.node import RaftNode
from p2pgen.raft.transport import LIVENESS_IDLE_S
from p2pgen_lab.rigs.agents import free_control_ports

pytestmark = pytest.mark.timeout(60)
SECRET = b"links-test-secret-0123456789ab"


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"no {what} within {timeout} s")


def _links(node: RaftNode) -> dict:
    """The node's connections by peer node id (read from another thread: ids and objects only)."""
    return {str(peer.id): conn for peer, conn in dict(node._so._SyncObj__transport._connections).items()}


def _leader(nodes: list[RaftNode]) -> RaftNode | None:
    leaders = [n for n in nodes if (v := n.view()) is not None and v.is_leader]
    return leaders[0] if len(leaders) == 1 else None


@pytest.fixture
def three_voters():
    ports = free_control_ports(3)
    ids = [new_node_id(f"127.0.0.1:{p + 1}") for p in ports]
    nodes = [RaftNode("j", node_id, ids, SECRET) for node_id in ids]
    try:
        for node in nodes:
            node.start()
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def test_an_idle_link_between_followers_is_kept_and_judged_by_the_kernel(three_voters):
    """The two followers exchange nothing while the leader lives; their link outlives pysyncobj's read timeout
    (1 s) several times over, with the kernel's keep-alive and user timeout set on its socket."""
    leader = _wait(lambda: _leader(three_voters), 10, "leader")
    first, second = [n for n in three_voters if n is not leader]
    link = _wait(lambda: _links(first).get(second.node_id), 5, "link between the followers")
    time.sleep(3 * leader._so.conf.connectionTimeout)
    assert _links(first).get(second.node_id) is link, "the idle link was dropped and dialled again"
    assert link.state == 2 and link.judged_by_kernel                  # CONNECTION_STATE.CONNECTED
    sock = link._TcpConnection__socket
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == LIVENESS_IDLE_S
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 1000


def test_the_first_vote_request_after_the_leader_dies_crosses_the_idle_link(three_voters):
    """Pitfall 1: after a long idle spell, the follower told first that its leader is dead campaigns and wins in
    one round (term + 1): its vote request to the other follower was not lost on the idle link."""
    leader = _wait(lambda: _leader(three_voters), 10, "leader")
    followers = [n for n in three_voters if n is not leader]
    time.sleep(3 * leader._so.conf.connectionTimeout)
    term = leader.view().term
    leader.stop()
    for node in followers:
        node.hasten_election(leader.node_id)
    successor = _wait(lambda: _leader(followers), 10, "new leader")
    assert successor.view().term == term + 1, f"elected in term {successor.view().term}, not {term + 1}"

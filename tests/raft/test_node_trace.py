"""A node traces what changed the job, not what repeated it: an agent whose registration timed out while its first
copy committed resubmits it as a new request; that replay is answered ok and must not read, in the trace, as the
same incarnation registered twice (the checker's `register_once`, I3). In-process nodes on 127.0.0.1."""

from __future__ import annotations

import time

import pytest

from p2pgen.core import Register
from p2pgen.raft import checker
from p2pgen.raft.identity import new_node_id
from p2pgen.raft.node import RaftNode, RaftUnavailable
from p2pgen.raft.trace import Trace
from p2pgen_lab.rigs.agents import free_control_ports

pytestmark = pytest.mark.timeout(60)
SECRET = b"trace-test-secret-0123456789"


def test_a_resubmitted_registration_is_traced_once_and_the_checker_passes(tmp_path):
    ports = free_control_ports(2)
    ids = [new_node_id(f"127.0.0.1:{p + 1}") for p in ports]
    traces = [Trace(str(tmp_path), f"p{n}", f"127.0.0.1:{p}", f"i{n}") for n, p in enumerate(ports)]
    nodes = [RaftNode("j", i, ids, SECRET, trace=t) for i, t in zip(ids, traces)]
    try:
        for n in nodes:
            n.start()
        assert nodes[0].wait_view(lambda v: v.leader is not None and v.ready, 10) is not None
        addrs = (("agent", "127.0.0.1:20000"),)
        first = nodes[0].submit(Register("p7", 3, addrs, at=1.0), timeout=5)
        again = nodes[1].submit(Register("p7", 3, addrs, at=2.0), timeout=5)   # a new request, same incarnation
        assert first.ok and not first.replayed
        assert again.ok and again.replayed and "already registered" in again.reason
        later = nodes[0].submit(Register("p7", 4, addrs, at=3.0), timeout=5)   # a real new incarnation
        assert later.ok and not later.replayed
        for n in nodes:
            n.wait_view(lambda v: v.machine.last_incarnation.get("p7") == 4, 5)
    finally:
        for n in nodes:
            n.stop()
        for t in traces:
            t.flush()
    registered = [(r["node"], r["peer_id"], r["incarnation"]) for r in checker.load(tmp_path).of("register")]
    assert sorted(registered) == sorted((node, "p7", inc) for node in ids for inc in (3, 4))
    result = checker.check_dir(tmp_path)
    assert result.counts["register_once"] == 0 and result.checked["registrations"] == 2


def test_a_submit_that_returned_is_in_the_view_the_submitter_reads_next():
    """pysyncobj answers a command before it counts the entry as applied; the node answers only once the view
    holding it is published, so a caller that acts on its own command's effect (a leaving agent judging a
    hand-over right after reporting its application's death) never reads the view before it."""
    ports = free_control_ports(1)
    ids = [new_node_id(f"127.0.0.1:{ports[0] + 1}")]
    node = RaftNode("j", ids[0], ids, SECRET)
    try:
        node.start()
        assert node.wait_view(lambda v: v.leader is not None and v.ready, 10) is not None
        for inc in range(1, 40):
            outcome = node.submit(Register("p7", inc, (("agent", "127.0.0.1:20000"),), at=float(inc)), timeout=5)
            assert outcome.ok
            assert node.view().machine.last_incarnation.get("p7") == inc, inc
    finally:
        node.stop()


def test_a_command_given_to_a_stopped_node_fails_at_once():
    """An agent switching to its promoted voter stops its old node; a command that reached the old node then
    waited out its whole deadline (a stress run: an application's vote hung 6 s while the job waited for it).
    It fails at once now, with the reason, and the caller goes to the node that replaced it."""
    ports = free_control_ports(1)
    ids = [new_node_id(f"127.0.0.1:{ports[0] + 1}")]
    node = RaftNode("j", ids[0], ids, SECRET)
    node.start()
    assert node.wait_view(lambda v: v.leader is not None and v.ready, 10) is not None
    node.stop()
    started = time.monotonic()
    with pytest.raises(RaftUnavailable, match="raft node stopped"):
        node.submit(Register("p7", 1, (("agent", "127.0.0.1:20000"),), at=1.0), timeout=30)
    assert time.monotonic() - started < 10, "the command waited for its deadline"

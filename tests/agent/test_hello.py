"""An agent's `hello` round (`RaftMembership._ask_hello`) against real RPC listeners: an address that refuses
this agent's secret is fatal only when no agent of the job answers at all; a formation voter's announcement and
its wait for a first leader."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from p2pgen.agent.raftmember import JoinError, RaftMembership
from p2pgen.agent.rpc import RpcServer
from p2pgen.raft.node import RaftTiming
from p2pgen.raft.trace import Trace
from tests.fuzz.conftest import bind_free_port

pytestmark = pytest.mark.timeout(30)

JOB, SECRET, OTHER_SECRET = "hello-job", b"hello-secret-0123456789abcdef", b"another-jobs-secret-0123456789"
ANSWER = {"mode": "running", "cluster": [], "node": "127.0.0.1:1/abc", "voters": ["127.0.0.1:1/abc"], "epoch": 0}


@contextlib.contextmanager
def listener(secret: bytes) -> Iterator[str]:
    server = bind_free_port(lambda port: RpcServer("127.0.0.1", port, JOB, secret, {"hello": lambda p: ANSWER}))
    server.start()
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        server.stop()


def membership() -> RaftMembership:
    return RaftMembership(JOB, "127.0.0.1:9", [], SECRET, RaftTiming(), Trace(None, "", "", ""), lambda: False)


def test_one_refusing_address_is_not_fatal_while_another_agent_answers() -> None:
    with listener(OTHER_SECRET) as refusing, listener(SECRET) as answering:
        hellos = membership()._ask_hello([refusing, answering])
    assert [h.addr for h in hellos] == [answering]
    assert hellos[0].mode == "running" and hellos[0].voters == ("127.0.0.1:1/abc",)


def test_refusals_from_every_answering_address_are_fatal_and_say_what_to_do() -> None:
    with listener(OTHER_SECRET) as refusing, listener(OTHER_SECRET) as also_refusing:
        with pytest.raises(JoinError, match="Start this agent with the job's --secret-file"):
            membership()._ask_hello([refusing, also_refusing])


def test_addresses_that_do_not_answer_are_not_a_refusal() -> None:
    with listener(SECRET) as gone:
        pass                                         # stopped: nothing listens there any more
    assert membership()._ask_hello([gone]) == []


class _Node:
    def __init__(self, node_id: str | None) -> None:
        self.node_id = node_id


def test_a_formation_voter_waiting_for_its_first_leader_is_announced() -> None:
    member = membership()
    assert member.announced_node() == ""
    member._launching = _Node("127.0.0.1:10/abc")          # type: ignore[assignment]
    assert member.announced_node() == "127.0.0.1:10/abc"
    member._launching, member.node = _Node(None), _Node("127.0.0.1:10/abc")   # type: ignore[assignment]
    assert member.announced_node() == "127.0.0.1:10/abc"  # a non-voting node launched meanwhile hides no voter
    member.node = _Node(None)                               # type: ignore[assignment]
    assert member.announced_node() == ""


class _WaitingVoter:
    """A formation voter's node that hears no leader; `refused`: the others refuse it (it is not a voter there)."""

    node_id = "127.0.0.1:10/abc"

    def __init__(self, refused: bool) -> None:
        self.refusals = ((time.monotonic(), "127.0.0.1:11/def", "not in the Raft configuration"),) if refused else ()
        self.waits = 0
        self.stopped = False

    def wait_view(self, predicate, timeout: float) -> None:
        self.waits += 1
        return None

    def view(self) -> SimpleNamespace:
        return SimpleNamespace(leader=None, refusals=self.refusals)

    def stop(self) -> None:
        self.stopped = True


def test_a_formation_voter_refused_by_the_others_gives_up_and_one_that_is_not_waits() -> None:
    refused = _WaitingVoter(refused=True)
    assert membership()._await_leader(refused, refused.node_id, [refused.node_id], "formed") is False
    assert refused.stopped and refused.waits == 1
    stopping = iter([False, False, True])                 # not refused: it waits until the agent stops
    member = RaftMembership(JOB, "127.0.0.1:9", [], SECRET, RaftTiming(), Trace(None, "", "", ""),
                            lambda: next(stopping))
    waiting = _WaitingVoter(refused=False)
    assert member._await_leader(waiting, waiting.node_id, [waiting.node_id], "formed") is False
    assert waiting.stopped and waiting.waits == 3

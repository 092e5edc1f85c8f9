"""What reaches the application from `peer.steps()` when its agent has trouble.

The agent here is a double: the real generation machine applied in-process (no Raft), served over the
real authenticated RPC on a real port, with faults on demand. The contract under test (peer.py's
docstring): inside `steps()` the application sees only GenerationChanged / PeerLost (inside `with step:`)
or the fatal `Evicted` / `AgentLost`; an agent that answers but cannot take a command now is waited for.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from p2pgen.agent.rpc import RpcServer
from p2pgen.agent.wire import command_from_wire
from p2pgen.core import GenerationMachine, LogPosition, Register
from p2pgen.core.render import state_json
from p2pgen.errors import AgentLost, P2PGenError
from p2pgen.peer import Peer
from p2pgen.raft.node import RaftUnavailable
from p2pgen.state import SharedState
from p2pgen_lab.rigs.agents import free_control_ports

pytestmark = pytest.mark.timeout(60)

JOB, SECRET, PEER = "faults", b"agent-faults-test-secret-0123456789", "p0"


class FakeAgent:
    """One peer's agent without Raft. Faults: `refuse` (the next n submits answer RaftUnavailable, as an
    agent whose Raft node stopped does), `drop` (the next n submits lose the connection), `stuck` (submits
    are acknowledged and never applied: no quorum to commit them), `leaderless` (its node hears no Raft
    leader: the views it serves say so), `unheard` (it hears the leader but the job is not proven to hear it: a
    one-way cut), `blind_until` (`wait` answers an
    error, as an agent between two Raft nodes does), `vanish()` (the agent dies)."""

    def __init__(self, port: int, agent_voted: bool = False) -> None:
        self.addr = f"127.0.0.1:{port}"
        self.data, self.state = f"127.0.0.1:{port + 2}", f"127.0.0.1:{port + 3}"
        self.machine = GenerationMachine(JOB)
        self.index = 0
        self.changed = threading.Condition()
        self.refuse = self.drop = 0
        self.stuck = False
        self.blind_until = 0.0
        self.leaderless = False
        self.unheard = False
        self.agent_voted = agent_voted
        self.submitted: list[str] = []
        self.server = _DroppingServer("127.0.0.1", port, JOB, SECRET, {
            "attach": lambda p: {"peer_id": PEER, "incarnation": p["incarnation"], "agent_voted": self.agent_voted},
            "show": lambda p: self.view(), "wait": self._wait, "submit": self._submit})
        self.server.start()

    def apply(self, command: Any) -> dict[str, Any]:
        with self.changed:
            self.index += 1
            outcome = self.machine.apply(command, LogPosition(1, self.index))
            self.changed.notify_all()
        return {"ok": outcome.ok, "reason": outcome.reason}

    def view(self) -> dict[str, Any]:
        with self.changed:
            return {"state": state_json(self.machine),
                    "raft": {"term": 1, "index": self.index, "leader": None if self.leaderless else "fake",
                             "heard": not self.unheard,
                             "nodes": ["fake"], "self": "fake", "agents": [self.addr]},
                    "agent": {"peer_id": PEER, "addr": self.addr, "incarnation": 1, "app_pid": None}}

    def register(self, incarnation: int = 1) -> None:
        self.apply(Register(PEER, incarnation, (("agent", self.addr), ("data", self.data), ("state", self.state)),
                            at=time.time()))

    def _wait(self, params: dict[str, Any]) -> dict[str, Any]:
        if time.monotonic() < self.blind_until:
            raise P2PGenError(f"agent {self.addr} is not part of the job yet; ask another member")
        with self.changed:
            self.changed.wait_for(lambda: self.index > params["after_version"], min(params["timeout"], 0.5))
        return self.view()

    def _submit(self, params: dict[str, Any]) -> dict[str, Any]:
        command = command_from_wire(params["command"])
        self.submitted.append(type(command).__name__)
        if self.drop:
            self.drop -= 1
            raise ConnectionResetError("agent dropped the connection")     # the server closes it
        if self.refuse:
            self.refuse -= 1
            raise RaftUnavailable("raft node stopped")
        if self.stuck:
            return {"ok": True, "reason": "accepted, not committed yet"}
        return self.apply(command)

    def vanish(self) -> None:
        self.server.stop()
        self.server.drop_all()


class _DroppingServer(RpcServer):
    """The real RPC server, which can also cut every open connection (an agent process that died)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.open: set[Any] = set()

    def _serve(self, sock: Any, peer: tuple) -> None:
        self.open.add(sock)
        try:
            super()._serve(sock, peer)
        finally:
            self.open.discard(sock)

    def drop_all(self) -> None:
        for sock in list(self.open):
            try:
                sock.shutdown(2)
            except OSError:
                pass


@pytest.fixture
def agent():
    fake = FakeAgent(free_control_ports(1)[0])
    yield fake
    fake.vanish()


def peer_for(agent: FakeAgent) -> Peer:
    state = SharedState(tensors={"w": np.zeros(4, np.float32)})
    return Peer(JOB, state, agent.addr, PEER, 1, SECRET, agent.data, agent.state, reform_after=0.2)


def train(peer: Peer, steps: int, on_step: Any = None) -> None:
    """The README's loop: every step all-reduces and commits, until `steps` revisions."""
    for step in peer.steps():
        if peer.state.revision >= steps:
            return
        with step:
            if on_step:
                on_step(step)
            grad = np.ones(4, np.float32)
            step.all_reduce(grad)
            peer.state.tensors["w"] += grad
            step.commit()


def test_refused_and_dropped_votes_are_retried_until_the_agent_takes_them(agent):
    agent.register()
    agent.refuse, agent.drop = 3, 2                     # no Raft quorum for a while, then two lost connections
    peer = peer_for(agent)
    try:
        train(peer, 3)
        assert peer.state.revision == 3 and peer.generation == 1
        assert agent.submitted.count("Ready") == 6        # 5 failed attempts, then the vote
    finally:
        peer.close()


def test_a_failed_reform_request_is_retried_not_raised(agent):
    agent.agent_voted = True                            # the agent voted for us: we ask for a reform at once
    agent.register()
    from p2pgen.core import Ready
    agent.apply(Ready(1, PEER, 1, "proved", 0, "", 0, at=time.time()))
    assert agent.machine.active is not None
    agent.refuse = 2                                    # "RpcError ... RaftUnavailable: raft node stopped"
    peer = peer_for(agent)
    try:
        train(peer, 2)
        assert peer.state.revision == 2 and peer.generation == 2
        assert agent.submitted[:3] == ["Reform", "Reform", "Reform"]
    finally:
        peer.close()


def test_an_agent_that_answers_without_a_view_is_waited_for(agent):
    agent.register()
    peer = peer_for(agent)
    try:
        def blind_once(step: Any) -> None:
            if step.revision == 1:
                agent.blind_until = time.monotonic() + 1.0    # its Raft node restarts; it still answers
                time.sleep(1.5)                               # while the watcher keeps asking
        train(peer, 4, blind_once)
        assert peer.state.revision == 4
    finally:
        peer.close()


def test_an_agent_lost_between_generations_raises_agent_lost_not_an_attribute_error(agent):
    agent.register()
    agent.stuck = True                                  # the vote never commits: steps() waits between generations
    peer = peer_for(agent)
    threading.Timer(0.5, agent.vanish).start()
    try:
        with pytest.raises(AgentLost, match="lost its agent"):
            train(peer, 3)
        assert peer._backend is None
    finally:
        peer.close()


def test_an_agent_lost_mid_training_discards_the_step_and_raises_agent_lost(agent):
    agent.register()
    peer = peer_for(agent)
    try:
        def vanish_at_2(step: Any) -> None:
            if step.revision == 2:
                agent.vanish()
                time.sleep(1.0)                         # the watcher notices and aborts the communicator
        with pytest.raises(AgentLost):
            train(peer, 5, vanish_at_2)
        assert peer.state.revision == 2 and peer.stats["steps_discarded"] == 1
    finally:
        peer.close()


def test_a_member_whose_agent_hears_no_leader_stops_committing_until_it_hears_the_job_again(agent):
    """The fence: the only member of its generation, cut off from the job with its agent (no leader, nothing
    commits), must not keep committing steps the job's majority will never see."""
    agent.register()
    peer = peer_for(agent)
    at_cut: list[int] = []
    try:
        def cut_at_3(step: Any) -> None:
            if step.revision == 3 and not at_cut:
                agent.stuck = agent.leaderless = True
                at_cut.append(step.generation)
                time.sleep(1.0)                         # the watcher sees the leaderless view and fences
        def heal_later() -> None:
            time.sleep(2.5)
            assert peer.state.revision == 3, "a step committed while the agent heard no leader"
            agent.stuck = agent.leaderless = False
        healer = threading.Thread(target=heal_later)
        healer.start()
        train(peer, 6, cut_at_3)
        healer.join()
        assert peer.state.revision == 6 and peer.stats["steps_discarded"] >= 1
        assert peer.generation > at_cut[0]              # training resumed in a new generation (a reform)
    finally:
        peer.close()


def test_a_member_whose_agent_hears_the_leader_but_is_not_heard_stops_committing_until_heard_again(agent):
    """The fence under a one-way cut: the agent still hears the Raft leader (every view names it), but its sends
    are dropped, so the job will evict the member; alone in its generation, it must stop committing as soon as
    its agent's round trips no longer prove that the job hears it."""
    agent.register()
    peer = peer_for(agent)
    at_cut: list[int] = []
    try:
        def cut_at_3(step: Any) -> None:
            if step.revision == 3 and not at_cut:
                agent.stuck = agent.unheard = True
                at_cut.append(step.generation)
                time.sleep(1.0)                         # the watcher sees the view not heard and fences
        def heal_later() -> None:
            time.sleep(2.5)
            assert peer.state.revision == 3, "a step committed while the job could not hear the agent"
            agent.stuck = agent.unheard = False
        healer = threading.Thread(target=heal_later)
        healer.start()
        train(peer, 6, cut_at_3)
        healer.join()
        assert peer.state.revision == 6 and peer.stats["steps_discarded"] >= 1
        assert peer.generation > at_cut[0]              # training resumed in a new generation (a reform)
    finally:
        peer.close()


def test_close_ends_the_steps_quietly(agent):
    agent.register()
    peer = peer_for(agent)
    seen = []
    for step in peer.steps():
        seen.append(step.revision)
        with step:
            step.commit()
        peer.close()
    assert seen == [0]

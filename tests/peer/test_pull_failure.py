"""A catch-up that fails. When it wrote nothing, the peer simply votes again. When it had already written
tensors, the state is a mix of two revisions and is never voted as either: the peer goes back to its
local copy, or, without one, restarts (Evicted)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

import p2pgen.peer as peer_module
from p2pgen.core.model import Frontier
from p2pgen.core.view import JobView
from p2pgen.errors import Evicted
from p2pgen.peer import Peer
from p2pgen.state import SharedState, StateKeeperConfig, StateSyncError
from tests.peer.test_agent_faults import JOB, PEER, SECRET, agent, peer_for  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(60)


class Events(list):
    """A peer trace that keeps the event names in memory."""

    def record(self, event, **fields):
        self.append(event)

    def close(self):
        pass


def fetch_failing_with(monkeypatch, peer, changed, agent):  # noqa: F811
    def failing_pull(*args, **kwargs):
        err = StateSyncError("could not pull frontier: every source failed (p1: PeerLost)")
        err.changed = changed
        raise err
    monkeypatch.setattr(peer_module, "pull_state", failing_pull)
    real = JobView.from_json(agent.view())
    action = SimpleNamespace(generation=3, pull=SimpleNamespace(sources=("p1",)))
    view = SimpleNamespace(pending=SimpleNamespace(generation=3, frontier=Frontier(9, "ab" * 16), parent=1),
                           member=lambda peer_id: None, instance=real.instance, on_branch=real.on_branch)
    return peer._fetch(action, view)


def test_a_pull_that_failed_before_writing_is_retried_by_the_next_vote(agent, monkeypatch):  # noqa: F811
    agent.register()
    peer = peer_for(agent)
    peer._trace = Events()
    try:
        assert fetch_failing_with(monkeypatch, peer, (), agent) is None
        assert peer._trace == ["pull", "pull_failed"]
    finally:
        peer.close()


def test_a_pull_that_failed_after_writing_goes_back_to_the_local_copy(agent, monkeypatch, tmp_path):  # noqa: F811
    agent.register()
    state = SharedState({"w": np.full(4, 7.0, np.float32)}, revision=5)
    peer = Peer(JOB, state, agent.addr, PEER, 1, SECRET, agent.data, agent.state,
                keep=StateKeeperConfig(local_dir=str(tmp_path)))
    peer._trace = Events()
    try:
        real = JobView.from_json(agent.view())
        peer._keeper.local.save(state, instance=real.instance, incarnation=1, generation=2, epoch=real.state_epoch)
        state.tensors["w"][:2] = 9.0                 # what the failed pull had written
        assert fetch_failing_with(monkeypatch, peer, ("w",), agent) is None
        assert state.tensors["w"].tolist() == [7.0] * 4 and state.revision == 5
        assert peer._trace == ["pull", "pull_failed", "recovered"]
    finally:
        peer.close()


def test_a_pull_that_failed_after_writing_without_a_local_copy_evicts_this_incarnation(agent, monkeypatch):  # noqa: F811
    agent.register()
    peer = peer_for(agent)
    peer._trace = Events()
    try:
        with pytest.raises(Evicted, match="must not vote this state, and it has no local copy"):
            fetch_failing_with(monkeypatch, peer, ("w",), agent)
        assert peer._trace == ["pull", "pull_failed"]
    finally:
        peer.close()


def test_a_pull_is_stopped_once_its_proposal_is_no_longer_pending():
    """`Peer._pull_moot`, which `_fetch` hands the pull as `stop`, on the watcher's latest view."""
    def moot(pending, closed=False):
        peer = SimpleNamespace(_closed=threading.Event(), _view=SimpleNamespace(pending=pending))
        if closed:
            peer._closed.set()
        return Peer._pull_moot(peer, 3)

    assert moot(SimpleNamespace(generation=3)) is None
    assert moot(SimpleNamespace(generation=4)) == \
        "generation 3 is no longer pending (generation 4 is): the job moved on"
    assert moot(None) == "generation 3 is no longer pending (nothing is): the job moved on"
    assert moot(SimpleNamespace(generation=3), closed=True) == "this process is closing"


def test_the_fetch_hands_the_pull_its_stop(agent, monkeypatch):  # noqa: F811
    agent.register()
    peer = peer_for(agent)
    peer._trace = Events()
    handed = {}

    def pull_recording_stop(*args, **kwargs):
        handed["stop"] = kwargs["stop"]
        raise StateSyncError("could not pull frontier: every source failed (p1: PeerLost)")
    try:
        monkeypatch.setattr(peer_module, "pull_state", pull_recording_stop)
        real = JobView.from_json(agent.view())
        action = SimpleNamespace(generation=3, pull=SimpleNamespace(sources=("p1",)))
        view = SimpleNamespace(pending=SimpleNamespace(generation=3, frontier=Frontier(9, "ab" * 16), parent=1),
                               member=lambda peer_id: None, instance=real.instance, on_branch=real.on_branch)
        assert peer._fetch(action, view) is None
        assert handed["stop"].func == peer._pull_moot and handed["stop"].args == (3,)
    finally:
        peer.close()

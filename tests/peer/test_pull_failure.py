"""A catch-up that fails: the peer votes again when nothing was written, and restarts (Evicted) when the
pull had already written tensors, so a mix of two revisions is never voted as either."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import p2pgen.peer as peer_module
from p2pgen.core.model import Frontier
from p2pgen.errors import Evicted
from p2pgen.state import StateSyncError
from tests.peer.test_agent_faults import agent, peer_for  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(60)


class Events(list):
    """A peer trace that keeps the events in memory."""

    def record(self, event, **fields):
        self.append(event)

    def close(self):
        pass


def fetch_failing_with(monkeypatch, peer, changed):
    def failing_pull(*args, **kwargs):
        err = StateSyncError("could not pull frontier: every source failed (p1: PeerLost)")
        err.changed = changed
        raise err
    monkeypatch.setattr(peer_module, "pull_state", failing_pull)
    action = SimpleNamespace(generation=3, pull=SimpleNamespace(sources=("p1",)))
    view = SimpleNamespace(pending=SimpleNamespace(frontier=Frontier(2, "ab" * 16), parent=1),
                           member=lambda peer_id: None)
    return peer._fetch(action, view)


def test_a_pull_that_failed_before_writing_is_retried_by_the_next_vote(agent, monkeypatch):  # noqa: F811
    agent.register()
    peer = peer_for(agent)
    peer.trace = Events()
    try:
        assert fetch_failing_with(monkeypatch, peer, ()) is None
        assert peer.trace == ["pull", "pull_failed"]
    finally:
        peer.close()


def test_a_pull_that_failed_after_writing_tensors_evicts_this_incarnation(agent, monkeypatch):  # noqa: F811
    agent.register()
    peer = peer_for(agent)
    peer.trace = Events()
    try:
        with pytest.raises(Evicted, match="must not vote this state"):
            fetch_failing_with(monkeypatch, peer, ("w",))
        assert peer.trace == ["pull", "pull_failed"]
    finally:
        peer.close()

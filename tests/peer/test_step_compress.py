"""`step.all_reduce(..., compress=, feedback=)`: the compressed all_reduce through the step, its error feedback
adopted only when the step commits (a step that fails after the collective and is retried runs on the same
residual and gets the same bits), bad arguments refused at the call, and `step.wire_bytes()`. Real tcp
backends of one generation; a stand-in peer (no agent)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from p2pgen.collectives.compress import ErrorFeedback
from p2pgen.errors import PeerLost
from p2pgen.peer import Step
from p2pgen.testing.cluster import LocalCluster

pytestmark = pytest.mark.timeout(60)

WORLD = 2


class StandInPeer:
    """What a Step asks of its peer: the state's revision and commit, the trace, the join boundary."""

    def __init__(self) -> None:
        self.state = SimpleNamespace(revision=0, _commit=self._commit)
        self._trace = SimpleNamespace(record=lambda event, **fields: self.events.append((event, fields)))
        self.events: list = []
        self._keeper = None

    def _commit(self) -> int:
        self.state.revision += 1
        return self.state.revision

    def _pending_join_seen(self) -> int:
        return 0

    def switch_after_step(self, generation: int) -> None:
        raise AssertionError("no join in this test")


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(WORLD) as c:
        yield c, c.backends(generation=1)


def _grads(rank: int) -> np.ndarray:
    return np.random.default_rng(rank).standard_normal(1000).astype(np.float32)


def test_feedback_advances_only_when_the_step_commits(cluster):
    local, backends = cluster
    peers = [StandInPeer() for _ in range(WORLD)]
    feedback = [ErrorFeedback() for _ in range(WORLD)]

    def attempt(b, fail: bool):
        step = Step(peers[b.rank], b)
        buf = _grads(b.rank)
        with step:
            step.all_reduce(buf, op="avg", compress="int8", feedback=feedback[b.rank])
            wire = step.wire_bytes()
            if fail:
                raise PeerLost("a member was lost after the collective")
            step.commit()
        return buf, step.discarded, wire

    failed = local.run(lambda b: attempt(b, fail=True), backends)
    assert all(isinstance(discarded, PeerLost) for _, discarded, _ in failed)
    assert all(fb.residual is None for fb in feedback), "a discarded step's residual was adopted"
    retried = local.run(lambda b: attempt(b, fail=False), backends)
    for (first, _, _), (again, discarded, wire) in zip(failed, retried):
        assert discarded is None
        assert first.tobytes() == again.tobytes(), "the retried step saw other inputs"
        assert wire["bytes_sent"] > 0 and wire["frames_sent"] > 0
    adopted = [fb.residual.copy() for fb in feedback]
    assert all(np.any(r != 0) for r in adopted)
    third = local.run(lambda b: attempt(b, fail=False), backends)
    assert third[0][0].tobytes() != retried[0][0].tobytes(), "the next step did not use the residual"
    assert not all(np.array_equal(fb.residual, r) for fb, r in zip(feedback, adopted))
    assert [p.state.revision for p in peers] == [2, 2]
    ops = [f for event, f in peers[0].events if event == "collective" and f["op"] == "all_reduce"]
    assert ops and all(f["compress"] == "int8" for f in ops)


def test_bad_arguments_are_refused_at_the_call(cluster):
    _, backends = cluster
    step = Step(StandInPeer(), backends[0])
    buf = np.ones(10, np.float32)
    with pytest.raises(ValueError, match=r"compress='gzip'.*'bf16', 'int8'"):
        step.all_reduce(buf, compress="gzip")
    with pytest.raises(ValueError, match="feedback= needs compress="):
        step.all_reduce(buf, feedback=ErrorFeedback())
    assert step.wire_bytes() == {"bytes_sent": 0, "bytes_received": 0, "frames_sent": 0, "frames_received": 0}


def test_one_feedback_twice_in_a_step_is_refused(cluster):
    local, backends = cluster

    def member(b):
        step = Step(StandInPeer(), b)
        fb = ErrorFeedback()
        step.all_reduce(np.ones(10, np.float32), compress="bf16", feedback=fb)
        with pytest.raises(ValueError, match="already used in this step"):
            step.all_reduce(np.ones(10, np.float32), compress="bf16", feedback=fb)
        return True

    assert local.run(member, backends) == [True, True]

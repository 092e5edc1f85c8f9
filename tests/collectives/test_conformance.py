"""The tcp backend passes the shared Backend conformance suite at every world size 1-5, and with shared memory
off (every all_reduce on the TCP ring, as between hosts) at world 3 and 4."""

from __future__ import annotations

import pytest

from p2pgen.collectives import Backend, shm
from p2pgen.testing import conformance
from p2pgen.testing.cluster import LocalCluster
from tests.collectives.conftest import SMALL_FRAMES


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_tcp_backend_conformance(members, world):
    group = members(world)
    assert all(isinstance(b, Backend) for b in group.backends)
    conformance.check_backend(group.run, world)
    ops = {b.op_seq for b in group.backends}
    assert len(ops) == 1 and ops.pop() > 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [3, 4])
def test_tcp_ring_conformance(monkeypatch, world):
    monkeypatch.setenv(shm.ENV, "0")
    with LocalCluster(world, config=SMALL_FRAMES) as cluster:
        backends = cluster.backends(generation=1)
        conformance.check_backend(lambda fn: cluster.run(fn, backends, timeout=30.0), world)
        assert not any(b.shm_active for b in backends)


@pytest.mark.timeout(30)
def test_conformance_detects_a_wrong_result(members):
    """The suite can fail: a backend that returns its input unreduced is caught."""
    class Lazy:
        def __init__(self, inner):
            self.rank, self.world, self.generation = inner.rank, inner.world, inner.generation

        def all_reduce(self, buf, op="sum"):
            return buf

    case = conformance.Case("all_reduce", (10,), seed=3)
    group = members(2)
    with pytest.raises(AssertionError, match="differs from the numpy reference"):
        group.run(lambda b: conformance.run_case(Lazy(b), case))

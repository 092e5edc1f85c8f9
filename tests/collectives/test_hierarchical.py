"""The hierarchical all_reduce (p2pgen.collectives.hierarchical) on loopback with fake zones: it passes the Backend
conformance suite (every op and dtype, bit-identical results, padding of sizes its groups do not divide) with
equal groups (columns), unequal groups and one leader per group; a raising all_reduce leaves the buffer as it was;
the parent stays in step (op_seq) and small all_reduces keep the flat ring; bad groups are refused; the backend
factory attaches it from a certificate whose topology says hierarchical."""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest

from p2pgen.collectives import hierarchical
from p2pgen.collectives.select import backend_factory
from p2pgen.core import Frontier, Member
from p2pgen.core.topology import ring_order
from p2pgen.core.view import ActiveGeneration
from p2pgen.errors import GenerationChanged, PeerLost
from p2pgen.testing import conformance
from p2pgen.testing.cluster import LocalCluster
from tests.collectives.conftest import SMALL_FRAMES

pytestmark = pytest.mark.timeout(90)


def _zoned(cluster, groups, min_bytes=0, **options):
    backends = cluster.backends(generation=1)
    hooks = [hierarchical.attach(b, groups, min_bytes=min_bytes, **options) for b in backends]
    return backends, hooks


@pytest.mark.parametrize("groups, leaders_only, algorithm", [
    ([[0, 1], [2, 3]], False, "columns"),
    ([[0, 2], [1, 3]], False, "columns"),          # groups need not be contiguous in rank order
    ([[0, 1], [2, 3]], True, "leaders"),
    ([[0, 1, 2], [3, 4]], False, "leaders"),       # unequal groups: one leader per group
])
def test_hierarchical_all_reduce_passes_conformance(groups, leaders_only, algorithm):
    world = sum(len(g) for g in groups)
    with LocalCluster(world, config=SMALL_FRAMES) as cluster:
        backends, hooks = _zoned(cluster, groups, leaders_only=leaders_only)
        assert {h.algorithm for h in hooks} == {algorithm}
        cases = [c for c in conformance.standard_cases(world) if c.collective in ("all_reduce", "barrier")]
        for case in cases:
            conformance.check_identical(cluster.run(lambda b, c=case: conformance.run_case(b, c), backends), case)
        conformance.check_refusals(lambda fn: cluster.run(fn, backends), conformance.REDUCTIONS)
        assert len({b.op_seq for b in backends}) == 1


def test_the_whole_suite_passes_with_the_hook_attached():
    with LocalCluster(4, config=SMALL_FRAMES) as cluster:
        backends, _ = _zoned(cluster, [[0, 1], [2, 3]])
        conformance.check_backend(lambda fn: cluster.run(fn, backends, timeout=30.0), 4)


def test_small_all_reduces_keep_the_ring_and_count_once():
    with LocalCluster(4, config=SMALL_FRAMES) as cluster:
        backends, hooks = _zoned(cluster, [[0, 1], [2, 3]], min_bytes=1 << 16)
        assert not hooks[0].takes(1 << 10) and hooks[0].takes(1 << 16)
        before = [b.op_seq for b in backends]
        out = cluster.run(lambda b: b.all_reduce(np.full(1 << 14, b.rank + 1, np.float32))[:2].tolist(), backends)
        assert out == [[10.0, 10.0]] * 4
        assert all(h._inner is not None for h in hooks), "a 64 KiB all_reduce takes the hierarchy"
        out = cluster.run(lambda b: int(b.all_reduce(np.full(3, b.rank, np.int64))[0]), backends)
        assert out == [6] * 4
        assert [b.op_seq for b in backends] == [s + 2 for s in before]


def test_a_raising_hierarchical_all_reduce_leaves_the_buffer_as_it_was():
    with LocalCluster(4, config=SMALL_FRAMES) as cluster:
        backends, _ = _zoned(cluster, [[0, 1], [2, 3]])
        cluster.run(lambda b: b.barrier(), backends)
        bufs = [np.full(1 << 16, float(r + 1), np.float32) for r in range(3)]
        errors: list[BaseException | None] = [None] * 3

        def call(r: int) -> None:
            try:
                backends[r].all_reduce(bufs[r])
            except BaseException as e:      # handed to the test below
                errors[r] = e

        threads = [threading.Thread(target=call, args=(r,), daemon=True) for r in range(3)]  # rank 3 never comes
        for t in threads:
            t.start()
        time.sleep(0.3)
        for b in backends:
            b.abort("generation 2 proposed")
        for t in threads:
            t.join(10)
        assert not any(t.is_alive() for t in threads)
        assert all(isinstance(e, (GenerationChanged, PeerLost)) for e in errors), errors
        for r, buf in enumerate(bufs):
            assert np.all(buf == float(r + 1)), f"rank {r}: a raising all_reduce changed the buffer"


@pytest.mark.parametrize("groups", [[[0, 1, 2, 3]], [[0, 1], [1, 2, 3]], [[0, 1], [2]], [[0, 1], [], [2, 3]]])
def test_groups_that_do_not_split_the_generation_are_refused(groups):
    with LocalCluster(4, config=SMALL_FRAMES) as cluster:
        backend = cluster.backends(generation=1)[0]
        with pytest.raises(ValueError, match="must split ranks 0..3"):
            hierarchical.attach(backend, groups)
        assert backend.all_reduce_hook is None


def test_the_backend_factory_attaches_it_where_the_certificate_says_so():
    members = tuple(Member(f"p{i}", 1, (("data", f"10.0.{i % 2}.{i}:7002"),), "ab"[i % 2]) for i in range(4))
    order, topology = ring_order(members, {})
    assert topology.hierarchical and [m.peer_id for m in order] == ["p0", "p2", "p1", "p3"]
    cert = ActiveGeneration(generation=1, parent=0, members=order, frontier=Frontier(0, ""), state_epoch=1,
                            comm_id="", ownership=(), recovery="", regressed_from=None, raft_index=1,
                            activated_at=0.0, topology=topology)
    assert cert.hierarchy() == ((0, 1), (2, 3))
    assert dataclasses.replace(cert, topology=None).hierarchy() is None
    with LocalCluster(4, config=SMALL_FRAMES) as cluster:
        staged = [backend_factory("tcp", cert, t, g) for t, g in zip(cluster.transports, cluster.groups(1))]
        assert all(s.inner.all_reduce_hook.groups == ((0, 1), (2, 3)) for s in staged)
        out = cluster.run(lambda s: s.all_reduce(np.full(1 << 17, s.rank, np.float32))[-1].item(), staged)
        assert out == [6.0] * 4
        for s in staged:
            s.close()

"""The nccl backend's plumbing (pointers, counts, datatypes, ops, roots, peers, groups, staging) passes the
shared Backend conformance suite on the fake NCCL, at world sizes 1-4, with staged and in-place outputs:
every (op, dtype) pair NCCL reduces (nccl_buffers.REDUCTIONS), every dtype moved, all_to_all in every
layout, and a TypeError naming op and dtype for every pair it does not reduce (the bitwise ops)."""

from __future__ import annotations

import pytest

from p2pgen.collectives import Backend
from p2pgen.collectives.nccl_buffers import REDUCTIONS
from p2pgen.testing import conformance
from p2pgen.testing.fake_nccl import FakeNccl, FakeNcclGroup


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stage", [True, False])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_nccl_backend_conformance_on_fake_nccl(world, stage):
    group = FakeNcclGroup(world, generation=3, stage_outputs=stage)
    try:
        assert all(isinstance(b, Backend) for b in group.backends)
        conformance.check_backend(group.run, world, REDUCTIONS)
        assert len({b.op_seq for b in group.backends}) == 1
        assert "destroy" not in group.fake.names(), "a communicator was left to destroy() instead of abort()"
    finally:
        group.close()


@pytest.mark.timeout(30)
def test_cupy13_tuple_ids_work_end_to_end():
    group = FakeNcclGroup(2, fake=FakeNccl(cupy_major=13))
    try:
        case = conformance.Case("all_reduce", (33,), "float64", "max", seed=5)
        conformance.check_identical(group.run(lambda b: conformance.run_case(b, case)), case)
    finally:
        group.close()


@pytest.mark.timeout(30)
def test_conformance_on_the_fake_can_fail():
    """The fake really reduces: a backend whose ranks disagree on the root is caught."""
    group = FakeNcclGroup(2)
    case = conformance.Case("broadcast", (10,), seed=1, root=0)
    try:
        def wrong_root(b):
            real = b.broadcast
            b.broadcast = lambda buf, root: real(buf, 1)
            return conformance.run_case(b, case)

        with pytest.raises(AssertionError, match="differs from the numpy reference"):
            group.run(wrong_root)
    finally:
        group.close()

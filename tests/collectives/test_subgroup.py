"""Subgroups of a generation (torch's `new_group`) on the tcp backend: a subgroup passes the whole conformance
suite while the other members stay idle, its frames never disturb the parent's (the parent stays in step
before and after, interleaved with it), two disjoint subgroups run side by side, and aborting the generation
fails the subgroup's collective the same way as the parent's."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from p2pgen.errors import GenerationChanged, PeerLost
from p2pgen.testing import conformance
from p2pgen.testing.cluster import LocalCluster
from tests.collectives.conftest import SMALL_FRAMES


def _parent_sum(cluster, backends):
    out = cluster.run(lambda b: b.all_reduce(np.full(5, b.rank + 1, np.int64)), backends)
    return [int(o[0]) for o in out]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ranks", [[1, 3], [0, 2, 3], [2]])
def test_subgroup_passes_conformance_between_parent_collectives(ranks):
    with LocalCluster(4, config=SMALL_FRAMES) as cluster:
        parent = cluster.backends(generation=1)
        assert _parent_sum(cluster, parent) == [10] * 4
        subs = [parent[r].subgroup(ranks) for r in ranks]
        assert [s.rank for s in subs] == list(range(len(ranks))) and {s.world for s in subs} == {len(ranks)}
        conformance.check_backend(lambda fn: cluster.run(fn, subs, timeout=30.0), len(ranks))
        assert _parent_sum(cluster, parent) == [10] * 4
        assert len({b.op_seq for b in parent}) == 1


@pytest.mark.timeout(60)
def test_disjoint_subgroups_run_side_by_side_and_interleave_with_the_parent():
    with LocalCluster(4, config=SMALL_FRAMES) as cluster:
        parent = cluster.backends(generation=1)
        halves = {r: parent[r].subgroup([0, 1] if r < 2 else [2, 3]) for r in range(4)}

        def body(b):
            results = []
            for i in range(3):
                x = np.full(3000, b.rank + i, np.float64)
                halves[b.rank].all_reduce(x)
                results.append(x[0])
                y = np.full(7, 1, np.int32)
                b.all_reduce(y)
                results.append(y[0])
            return results

        out = cluster.run(body, parent)
        for r in range(4):
            pair = (0, 1) if r < 2 else (2, 3)
            assert out[r] == [v for i in range(3) for v in (sum(p + i for p in pair), 4)]


def test_subgroup_ranks_are_checked():
    with LocalCluster(2, config=SMALL_FRAMES) as cluster:
        b = cluster.backends(generation=1)[0]
        for bad in ([1, 0], [0, 0], [0, 2], []):
            with pytest.raises(ValueError, match="distinct, ascending ranks"):
                b.subgroup(bad)
        with pytest.raises(ValueError, match="rank 0 is not in subgroup"):
            b.subgroup([1])


@pytest.mark.timeout(60)
def test_aborting_the_generation_fails_a_subgroup_collective_in_flight():
    with LocalCluster(3, config=SMALL_FRAMES) as cluster:
        parent = cluster.backends(generation=1)
        subs = [parent[r].subgroup([0, 1]) for r in (0, 1)]
        errors: list[BaseException] = []

        def waiting():                    # rank 0 waits for rank 1, which never joins this all_reduce
            try:
                subs[0].all_reduce(np.ones(4))
            except BaseException as e:
                errors.append(e)

        t = threading.Thread(target=waiting)
        t.start()
        t.join(0.3)
        assert t.is_alive()
        assert parent[0].abort("generation 2 proposed") == "proved"
        t.join(10)
        assert not t.is_alive() and isinstance(errors[0], GenerationChanged), errors
        with pytest.raises((GenerationChanged, PeerLost)):
            subs[0].all_reduce(np.ones(4))
        for b in parent:
            b.abort("test over")

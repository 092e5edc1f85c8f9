"""The elastic sampler: each revision's global batch split by (rank, world) with nothing lost or repeated, every
index once per epoch across world changes and batch changes, the record kept in shared state, bad input refused,
and the loader never handing out a batch prefetched for another step."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pgen.data import STATE_KEY, ElasticLoader, ElasticSampler, share
from p2pgen.state import SharedState
from p2pgen.state.shared import objects_bytes

pytestmark = pytest.mark.timeout(60)


def sampler(n=100, batch=8, seed=3, **kw) -> ElasticSampler:
    return ElasticSampler(SharedState(), n, batch, seed, **kw)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 300), data=st.data())
def test_the_ranks_of_any_world_partition_each_global_batch(n, data):
    batch = data.draw(st.integers(1, n))
    world = data.draw(st.integers(1, 12))
    revision = data.draw(st.integers(0, 50))
    s = sampler(n, batch)
    parts = [s.indices_for(revision, rank, world) for rank in range(world)]
    assert np.array_equal(np.concatenate(parts), s.global_indices(revision))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 200), data=st.data())
def test_every_index_appears_once_per_epoch_whatever_the_world_does(n, data):
    batch = data.draw(st.integers(1, n))
    worlds = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=40))
    s = sampler(n, batch)
    seen: list[int] = []
    for revision, world in enumerate(worlds):        # a world per step: 4 -> 3 -> 5 ...
        for rank in range(world):
            seen += s.indices_for(revision, rank, world).tolist()
    epochs, rest = divmod(len(seen), n)
    for e in range(epochs):
        assert sorted(seen[e * n:(e + 1) * n]) == list(range(n))
    assert len(set(seen[epochs * n:])) == rest                # the epoch under way: no index twice so far


def test_the_position_is_a_function_of_the_committed_revision():
    state = SharedState()
    s = ElasticSampler(state, 10, 4, seed=1)
    first = s.indices_for(0, 0, 1)
    assert s.position() == (0, 0) and np.array_equal(s.indices_for(0, 0, 1), first)   # a redo: same indices
    state._commit()
    state._commit()
    state._commit()
    assert s.position() == (1, 2)                              # 12 samples: one epoch of 10, then 2
    assert set(state.objects[STATE_KEY]) == {"seed", "dataset_len", "global_batch", "base_revision",
                                             "base_position"}


def test_a_new_global_batch_starts_where_the_old_one_stopped():
    state = SharedState()
    s = ElasticSampler(state, 30, 4, seed=2)
    seen = []
    for r in range(9):
        if r == 4:
            s.set_global_batch(7)
        seen += s.indices_for(r, 0, 1).tolist()
        state._commit()
    assert sorted(seen[:30]) == list(range(30)) and len(seen) == 4 * 4 + 5 * 7


def test_members_with_one_record_agree_and_a_pulled_record_replaces_a_fresh_one():
    a, b = SharedState(), SharedState()
    sa, sb = ElasticSampler(a, 50, 10, seed=5), ElasticSampler(b, 50, 10, seed=5)
    for _ in range(7):
        a._commit()
    b._load_objects(objects_bytes(a.objects))                  # what a pull moves
    b.revision = a.revision
    assert np.array_equal(sa.indices_for(7, 1, 3), sb.indices_for(7, 1, 3))
    assert a.digest() == b.digest()


@pytest.mark.parametrize("n, batch, message", [(0, 1, "needs a dataset with samples"),
                                               (10, 11, "between 1 and the dataset length 10"),
                                               (10, 0, "between 1 and")])
def test_bad_sizes_are_refused(n, batch, message):
    with pytest.raises(ValueError, match=message):
        ElasticSampler(SharedState(), n, batch)


def test_a_record_of_another_dataset_or_seed_is_refused_with_what_differs():
    state = SharedState()
    ElasticSampler(state, 100, 10, seed=1)
    with pytest.raises(ValueError, match="dataset length: the state has 100, this run 120"):
        ElasticSampler(state, 120, 10, seed=1)
    with pytest.raises(ValueError, match="seed: the state has 1, this run 2"):
        ElasticSampler(state, 100, 10, seed=2)
    with pytest.raises(ValueError, match="global batches of 10"):
        ElasticSampler(state, 100, 20, seed=1)
    mine = ElasticSampler(SharedState(), 100, 10, seed=9)
    mine.state.objects[STATE_KEY] = dict(state.objects[STATE_KEY])      # as if pulled from another job's data
    with pytest.raises(ValueError, match="seed: the state has 1, this run 9"):
        mine.indices_for(0, 0, 1)


def test_a_share_over_the_memory_cap_comes_in_micro_batches():
    s = sampler(100, 40, max_per_member=6)
    step = SimpleNamespace(revision=2, rank=1, world=2)
    pieces = s.micro_batches(step)
    assert [len(p) for p in pieces] == [6, 6, 6, 2] and np.array_equal(np.concatenate(pieces), s.indices(step))
    with pytest.raises(ValueError, match="at least 1 sample"):
        sampler(max_per_member=0)
    assert share(3, 4, 5) == (2, 3) and share(3, 0, 5) == (0, 0)


class Squares:
    def __len__(self) -> int:
        return 60

    def __getitem__(self, i: int) -> int:
        return i * i


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_hands_out_only_batches_made_for_the_step_asking(workers):
    import torch

    s = sampler(60, 9, seed=4)
    loader = ElasticLoader(Squares(), s, num_workers=workers)
    try:
        order = [(0, 0, 3), (1, 0, 3), (2, 0, 3), (2, 1, 2), (3, 1, 2), (1, 0, 4), (2, 0, 4), (2, 0, 4)]
        for revision, rank, world in order:       # a new generation, a pulled (older) state, a redone step
            got = loader.batch(SimpleNamespace(revision=revision, rank=rank, world=world))
            want = torch.as_tensor(s.indices_for(revision, rank, world)) ** 2
            assert torch.equal(got, want), (revision, rank, world)
        assert loader.restarts == 3
        assert loader.batch(SimpleNamespace(revision=0, rank=0, world=10)) is None     # [0, 9 // 10): empty
    finally:
        loader.close()
    with pytest.raises(ValueError, match="the dataset has 60 samples, the sampler 61"):
        ElasticLoader(Squares(), sampler(61, 9))

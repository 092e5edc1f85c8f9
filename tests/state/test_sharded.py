"""ShardedObject: the part of a sharded logical object a member holds, its digests, verified installs."""

from __future__ import annotations

import numpy as np
import pytest

from p2pgen.core.model import ShardPull
from p2pgen.core.ownership import parse_layout, parse_shards
from p2pgen.core.view import JobView
from p2pgen.state import ShardMismatch, SharedState, wire
from p2pgen.transport import hooks

pytestmark = pytest.mark.timeout(30)


def test_declared_object_starts_whole_and_is_out_of_the_digest():
    state = SharedState({"w": np.zeros(4, np.float32)})
    before = state.digest()
    obj = state.shard("adam", 10, 3, "float32", r=2)
    assert obj.owned() == [0, 1, 2] and obj.nbytes_held == 40
    assert state.digest() == before
    assert parse_layout(state._layout_text())[0].describe() == "even(length=10,shards=3,itemsize=4)"
    assert set(parse_shards(state._shards_text())) == {("adam", 0), ("adam", 1), ("adam", 2)}


def test_install_verifies_and_keep_only_drops():
    a = SharedState().shard("m", 6, 2, "float64")
    b = SharedState().shard("m", 6, 2, "float64")
    a.held[1][:] = [1.0, 2.0, 3.0]
    digest = a.digest(1)
    with pytest.raises(ShardMismatch, match="does not hash"):
        b.install(1, a.shard_bytes(0), digest)
    b.install(1, a.shard_bytes(1), digest)
    assert b.digest(1) == digest and b.held[1].tolist() == [1.0, 2.0, 3.0]
    assert b.keep_only([1]) == [0] and b.owned() == [1]
    with pytest.raises(ShardMismatch, match="bytes offered"):
        b.install(0, b"\0" * 3)


def test_declaring_twice_is_a_clear_error():
    state = SharedState()
    state.shard("adam", 4, 2)
    with pytest.raises(ValueError, match="already declared"):
        state.shard("adam", 4, 2)


def _sharded(values: list[float], held: list[int]) -> SharedState:
    state = SharedState({"w": np.zeros(2, np.float32)})
    obj = state.shard("adam", 6, 3, "float32")
    for i in obj.owned():
        start, stop = obj.bounds(i)
        obj.held[i][:] = values[start:stop]
    obj.keep_only(held)
    return state


@pytest.mark.parametrize("encrypt", [False, True], ids=["plain", "sealed"])
def test_pull_shards_in_chunks_skips_a_source_with_a_stale_copy(servers, encrypt):
    from p2pgen.state import ServerConfig
    from p2pgen.state.pull import PullConfig
    from p2pgen.state.shardpull import pull_shards
    from tests.state.helpers import JOB, SECRET, source_of
    good = _sharded([1, 2, 3, 4, 5, 6], [1, 2])
    stale = _sharded([1, 2, 9, 9, 5, 6], [1])             # an older revision's copy of shard 1
    puller = _sharded([0] * 6, [0])
    digest = good.sharded["adam"].digest(1)
    sealed = ServerConfig(encrypt=encrypt)
    s_stale, s_good = servers(stale, ("stale", 1), config=sealed), servers(good, ("good", 1), config=sealed)
    chunks: list[tuple[str, int, int]] = []
    remove = hooks.add_frame_hook(lambda e: chunks.append((e.peer[0], e.chunk, e.nbytes))
                                  if e.plane == hooks.SHARD and e.kind == wire.CHUNK else None)
    try:
        with s_stale.serving(3), s_good.serving(3):
            pulls = [ShardPull("p", 1, "adam", 1, 8, ("stale", "good"), digest)]
            report = pull_shards(puller, pulls, {"stale": source_of(s_stale), "good": source_of(s_good)}, job=JOB,
                                 secret=SECRET, me=("p", 1), generation=3, frontier_revision=7,
                                 config=PullConfig(chunk_bytes=3, encrypt=encrypt))
    finally:
        remove()
    assert chunks == [(src, c, n) for src in ("stale", "good") for c, n in ((0, 3), (1, 3), (2, 2))]  # frame hook
    assert puller.sharded["adam"].held[1].tolist() == [3.0, 4.0]
    assert report.shards == ["adam[1]<-good"] and report.bytes_by_source == {"good": 8}
    assert "adam[1]<-stale" in report.failures and "does not hash" in report.failures["adam[1]<-stale"]


def test_pull_shards_fails_loudly_when_no_source_has_it(servers):
    from p2pgen.state.shardpull import pull_shards
    from p2pgen.state.wire import StateSyncError
    from tests.state.helpers import JOB, SECRET, source_of
    other = _sharded([1, 2, 3, 4, 5, 6], [0])
    puller = _sharded([0] * 6, [])
    server = servers(other, ("o", 1))
    with server.serving(2):
        pulls = [ShardPull("p", 1, "adam", 2, 8, ("o",), "x")]
        with pytest.raises(StateSyncError, match="could not pull shard adam\\[2\\]"):
            pull_shards(puller, pulls, {"o": source_of(server)}, job=JOB, secret=SECRET, me=("p", 1),
                        generation=2, frontier_revision=5)
    assert puller.sharded["adam"].owned() == []


def test_local_copy_keeps_the_shards_held_and_restores_exactly_those(tmp_path):
    from p2pgen.state import LocalCopy
    state = _sharded([1, 2, 3, 4, 5, 6], [0, 2])
    state.revision = 9
    copy = LocalCopy(str(tmp_path), "job", "p0")
    copy.save(state, instance="i", incarnation=1, generation=3, epoch=1)
    fresh = _sharded([0] * 6, [0, 1, 2])                  # a restarted application: every shard at its initial value
    copy.load_into(fresh, instance="i")
    assert fresh.revision == 9 and fresh.sharded["adam"].owned() == [0, 2]
    assert fresh.sharded["adam"].held[2].tolist() == [5.0, 6.0]
    assert fresh._shards_text() == state._shards_text()


def test_checkpointed_shards_are_written_once_each_and_a_checkpoint_is_complete_only_with_all(tmp_path):
    from p2pgen.state.checkpoint import CheckpointError
    from p2pgen.state.shardckpt import find_shards, load_shards, write_shards
    a = _sharded([1, 2, 3, 4, 5, 6], [0, 1])
    b = _sharded([1, 2, 3, 4, 5, 6], [1, 2])
    a.revision = b.revision = 10
    layout = [a.sharded["adam"].partition]
    assert write_shards(a, tmp_path, [("adam", 0), ("adam", 1)]) == 2
    assert find_shards(tmp_path, 10, layout) is None              # adam[2]'s owner has not written yet
    assert write_shards(b, tmp_path, [("adam", 1), ("adam", 2)]) == 1   # adam[1] is there already
    assert sorted(find_shards(tmp_path, 10, layout)) == [("adam", 0), ("adam", 1), ("adam", 2)]
    fresh = _sharded([0] * 6, [0, 1, 2])
    load_shards(fresh, tmp_path, 10)
    assert [fresh.sharded["adam"].held[i].tolist() for i in range(3)] == [[1, 2], [3, 4], [5, 6]]
    path, _ = find_shards(tmp_path, 10, layout)[("adam", 2)]
    path.write_bytes(b"\0" * 8)                                      # corrupted on disk
    with pytest.raises(CheckpointError, match="does not hash"):
        load_shards(_sharded([0] * 6, [0]), tmp_path, 10)


def test_keeper_offers_a_sharded_checkpoint_only_when_every_shard_is_there(tmp_path):
    from p2pgen.state import StateKeeper, StateKeeperConfig
    from p2pgen.state.checkpoint import write_checkpoint
    job_state = JobView(job="job", instance="i", index=1, leader="n1", agents=1, members=(), active=None,
                        pending=None, tombstones=frozenset(), state_epoch=1, forks=())
    a = _sharded([1, 2, 3, 4, 5, 6], [0, 1, 2])
    a.revision = 10
    write_checkpoint(a, tmp_path, job="job", instance="i", epoch=1, generation=3, writer=("a", 1))
    keeper = StateKeeper(StateKeeperConfig(checkpoint_dir=str(tmp_path)), a, "job", ("a", 1))
    assert "ckpt_revision" not in keeper.vote_fields(job_state)      # the replicated part alone is not enough
    from p2pgen.state.shardckpt import write_shards
    write_shards(a, tmp_path, [("adam", i) for i in range(3)])
    assert keeper.vote_fields(job_state)["ckpt_revision"] == 10


def test_pull_shards_goes_on_from_the_next_source_when_one_stops_serving(servers):
    from p2pgen.state import ServerConfig
    from p2pgen.state.pull import PullConfig
    from p2pgen.state.shardpull import pull_shards
    from tests.state.helpers import JOB, SECRET, source_of
    gone = _sharded([1, 2, 3, 4, 5, 6], [1])
    good = _sharded([1, 2, 3, 4, 5, 6], [1])
    puller = _sharded([0] * 6, [])
    s_gone = servers(gone, ("gone", 1), config=ServerConfig(wait_for_window=0.2))   # never opens its window
    s_good = servers(good, ("good", 1))
    digest = good.sharded["adam"].digest(1)
    with s_good.serving(4):
        pulls = [ShardPull("p", 1, "adam", 1, 8, ("gone", "good"), digest)]
        report = pull_shards(puller, pulls, {"gone": source_of(s_gone), "good": source_of(s_good)}, job=JOB,
                             secret=SECRET, me=("p", 1), generation=4, frontier_revision=7,
                             config=PullConfig(chunk_bytes=4, op_timeout=5.0))
    assert report.shards == ["adam[1]<-good"] and "not serving" in report.failures["adam[1]<-gone"]
    assert puller.sharded["adam"].held[1].tolist() == [3.0, 4.0]

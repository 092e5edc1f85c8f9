"""ShardedObject: the part of a sharded logical object a member holds, its digests, verified installs."""

from __future__ import annotations

import numpy as np
import pytest

from p2pgen.core.ownership import parse_layout, parse_shards
from p2pgen.state import SharedState, ShardMismatch

pytestmark = pytest.mark.timeout(30)


def test_declared_object_starts_whole_and_is_out_of_the_digest():
    state = SharedState({"w": np.zeros(4, np.float32)})
    before = state.digest()
    obj = state.shard("adam", 10, 3, "float32", r=2)
    assert obj.owned() == [0, 1, 2] and obj.nbytes_held == 40
    assert state.digest() == before
    assert parse_layout(state.layout_text())[0].describe() == "even(length=10,shards=3,itemsize=4)"
    assert set(parse_shards(state.shards_text())) == {("adam", 0), ("adam", 1), ("adam", 2)}


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

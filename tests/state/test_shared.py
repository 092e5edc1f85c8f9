"""SharedState digests: content only, dtype and shape included, cached while provably unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from p2pgen.state import Manifest, SharedState

pytestmark = pytest.mark.timeout(20)


def test_equal_content_gives_equal_digest_whatever_the_revision_or_kind():
    a = SharedState({"w": np.arange(12, dtype=np.float32), "b": np.ones(3)}, {"step": 3}, revision=3)
    b = SharedState({"b": np.ones(3), "w": torch.arange(12, dtype=torch.float32)}, {"step": 3}, revision=99)
    assert a.digest() == b.digest()
    assert a.tensor_digests() == b.tensor_digests()
    b.tensors["w"][0] = 1.0
    assert a.digest() != b.digest()


def test_dtype_and_shape_are_part_of_the_digest():
    raw = np.arange(6, dtype=np.int32)
    base = SharedState({"x": raw.reshape(2, 3)}).digest()
    assert SharedState({"x": raw.reshape(3, 2)}).digest() != base
    assert SharedState({"x": raw.view(np.float32).reshape(2, 3)}).digest() != base
    assert SharedState({"x": raw.reshape(2, 3).copy()}).digest() == base


def test_objects_are_part_of_the_digest():
    assert SharedState(objects={"step": 1}).digest() != SharedState(objects={"step": 2}).digest()


def test_torch_digest_is_cached_until_an_in_place_write_or_a_commit():
    w, v = torch.zeros(1000), torch.ones(1000)
    state = SharedState({"w": w, "v": v})
    first = state.digest()
    hashed = state.hashed_bytes
    assert state.digest() == first and state.hashed_bytes == hashed          # cached: nothing re-hashed
    w.add_(1.0)                                                               # bumps w._version only
    assert state.digest() != first
    assert state.hashed_bytes == hashed + w.nbytes                           # only w was re-hashed
    state._commit()                                                            # fused optimizers skip _version
    state.digest()
    assert state.hashed_bytes == hashed + 2 * w.nbytes + v.nbytes


def test_a_write_that_torch_does_not_count_is_seen_after_touch():
    w = torch.zeros(10)
    state = SharedState({"w": w})
    before = state.digest()
    w.data.add_(1.0)                      # .data has its own version counter: invisible to the cache
    assert state.digest() == before       # the documented hole, hence touch()
    state.touch("w")
    assert state.digest() != before


def test_numpy_arrays_are_rehashed_every_call():
    a = np.zeros(100, np.float32)
    state = SharedState({"a": a})
    before = state.digest()
    a[5] = 1.0
    assert state.digest() != before
    assert state.hashed_bytes == 2 * a.nbytes


def test_replacing_an_entry_drops_its_cached_digest():
    state = SharedState({"w": torch.zeros(4)})
    before = state.digest()
    state.tensors["w"] = torch.ones(4)
    assert state.digest() != before


def test_manifest_round_trips_and_refuses_a_tampered_one():
    state = SharedState({"w": np.arange(5.0), "e": np.zeros((0, 3), np.float16)}, {"k": [1, 2]}, revision=4)
    m = state._manifest()
    assert Manifest.from_wire(m.to_wire()) == m
    assert m.digest == state.digest() and m.revision == 4 and m.entry("e").shape == (0, 3)
    for tamper, error in ((lambda w: w["entries"][0].__setitem__(1, "0" * 32), "do not add up to its digest"),
                          (lambda w: w["entries"][1][5].__setitem__(0, w["entries"][1][5][0] ^ 1), "do not add up"),
                          (lambda w: w["entries"][1][5].append(7), "has 2 block digests"),
                          (lambda w: w["entries"][1][5].__setitem__(0, -1), "out of range"),
                          (lambda w: w.__setitem__("digest", "0" * 32), "does not match its entries")):
        bad = m.to_wire()
        tamper(bad)
        with pytest.raises(ValueError, match=error):
            Manifest.from_wire(bad)


def test_a_tensor_digest_is_built_from_its_block_digests():
    """Blocks of DIGEST_BLOCK bytes, each xxh3-64 (a data frame's payload digest), then xxh3-128 over
    dtype, shape and the block digests: equal for every way of computing it, and sensitive to every block."""
    from p2pgen.state.shared import DIGEST_BLOCK, block_digests, digest_of_blocks, tensor_digest
    from p2pgen.transport import frame
    data = np.random.default_rng(3).integers(0, 256, 2 * DIGEST_BLOCK + 5, dtype=np.uint8)
    blocks = block_digests(data)
    assert len(blocks) == 3 and blocks[2] == frame.digest(data[2 * DIGEST_BLOCK:])
    whole = tensor_digest("uint8", (len(data),), data)
    assert whole == digest_of_blocks("uint8", (len(data),), blocks)
    state = SharedState({"t": data})
    assert state.tensor_digests()["t"] == whole
    for b in range(3):
        other = data.copy()
        other[b * DIGEST_BLOCK] ^= 1
        assert tensor_digest("uint8", (len(data),), other) != whole
    assert tensor_digest("int8", (len(data),), data) != whole
    assert len(block_digests(np.zeros(0, np.uint8))) == 1


def test_holds_stops_at_the_first_differing_block_and_caches_an_equal_torch_tensor():
    from p2pgen.state.shared import DIGEST_BLOCK
    src = SharedState({"t": np.arange(3 * DIGEST_BLOCK, dtype=np.uint8), "w": torch.arange(1000.0)})
    entries = {e.name: e for e in src._manifest().entries}
    fresh = SharedState({"t": np.zeros(3 * DIGEST_BLOCK, np.uint8), "w": torch.zeros(1000)})
    assert not fresh._holds(entries["t"]) and fresh.hashed_bytes == DIGEST_BLOCK     # one block, not three
    late = np.arange(3 * DIGEST_BLOCK, dtype=np.uint8)
    late[-1] ^= 1
    assert not SharedState({"t": late})._holds(entries["t"])
    same = SharedState({"t": np.arange(3 * DIGEST_BLOCK, dtype=np.uint8), "w": torch.arange(1000.0)})
    assert same._holds(entries["t"]) and same._holds(entries["w"])
    hashed = same.hashed_bytes
    assert same._holds(entries["w"]) and same.hashed_bytes == hashed                 # cached
    assert same.digest() == src.digest()


def test_unsupported_values_are_refused():
    with pytest.raises(TypeError, match="objects"):
        SharedState({"x": [1, 2, 3]})
    with pytest.raises(ValueError, match="byte order"):
        SharedState({"x": np.zeros(3, dtype=">f4")})

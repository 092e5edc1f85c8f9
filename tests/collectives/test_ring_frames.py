"""Ring frame sizes: `chunk_bytes` for modest chunks, larger frames (a PIPELINE_FRAMES-th of the chunk, up to
LARGE_FRAME_BYTES and max_frame_bytes) for large ones; the ring collectives that use them give exact,
bit-identical results, and a raising all_reduce still leaves its buffer as passed."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from p2pgen.collectives import shm
from p2pgen.collectives.tcp import LARGE_FRAME_BYTES, PIPELINE_FRAMES, ring_frame_bytes
from p2pgen.errors import P2PGenError
from p2pgen.testing.cluster import LocalCluster
from p2pgen.transport import FrameKind, TransportConfig, hooks

pytestmark = pytest.mark.timeout(60)

CONFIG = TransportConfig(chunk_bytes=4096, max_frame_bytes=32 << 10)


@pytest.mark.parametrize("chunk, expected", [
    (100, 4096), (4 * 4096, 4096), (5 * 4096, 5 * 1024), (4 * 32 << 10, 32 << 10), (1 << 30, 32 << 10),
])
def test_frames_grow_with_the_chunk_up_to_the_bound(chunk, expected):
    assert ring_frame_bytes(chunk, 4096, 32 << 10) == expected


def test_default_frames_of_a_64_mib_all_reduce_at_world_4_are_4_mib():
    config = TransportConfig()
    frame = ring_frame_bytes((64 << 20) // 4, config.chunk_bytes, min(LARGE_FRAME_BYTES, config.max_frame_bytes))
    assert frame == 4 << 20 and (16 << 20) // frame == PIPELINE_FRAMES


def _posted_sizes(fn):
    sizes: list[int] = []
    lock = threading.Lock()

    def record(event: hooks.FrameEvent) -> None:
        if event.kind == FrameKind.COLLECTIVE and event.direction == "posted":
            with lock:
                sizes.append(event.nbytes)

    remove = hooks.add_frame_hook(record)
    try:
        out = fn()
    finally:
        remove()
    return out, sizes


@pytest.mark.parametrize("world", [3, 4])
def test_large_frames_give_exact_bit_identical_results(monkeypatch, world):
    monkeypatch.setenv(shm.ENV, "0")                # all_reduce on the ring
    n = 40_000                                      # float64: chunks of 80-107 KiB, frames of 20-27 KiB
    inputs = [np.random.default_rng(r).integers(-1000, 1000, n).astype(np.float64) for r in range(world)]
    expected = np.sum(inputs, axis=0)
    with LocalCluster(world, config=CONFIG) as cluster:
        backends = cluster.backends(generation=1)
        reduced, sizes = _posted_sizes(lambda: cluster.run(lambda b: b.all_reduce(inputs[b.rank].copy()),
                                                           backends))
        assert max(sizes) > CONFIG.chunk_bytes and max(sizes) <= CONFIG.max_frame_bytes
        assert all(np.array_equal(r, expected) for r in reduced)
        m = n // world
        scattered = cluster.run(lambda b: b.reduce_scatter(np.empty(m), inputs[b.rank][:m * world].copy()),
                                backends)
        for r, out in enumerate(scattered):
            assert np.array_equal(out, expected[r * m:(r + 1) * m])
        gathered = cluster.run(lambda b: b.all_gather(np.empty(m * world), inputs[b.rank][:m].copy()), backends)
        assert all(np.array_equal(g, np.concatenate([x[:m] for x in inputs])) for g in gathered)


def test_a_raising_all_reduce_with_large_frames_leaves_its_buffer_as_passed(monkeypatch):
    """The member that fails mid-ring (a hook raises on its fifth large frame from peer0) and the ones that
    see it go all keep their buffers exactly as passed."""
    monkeypatch.setenv(shm.ENV, "0")
    world, n = 3, 60_000
    with LocalCluster(world, config=CONFIG) as cluster:
        backends = cluster.backends(generation=1)
        cluster.run(lambda b: b.barrier(), backends)
        bufs = [np.random.default_rng(r).standard_normal(n) for r in range(world)]
        before = [b.copy() for b in bufs]
        seen = {"n": 0}

        def fail(event: hooks.FrameEvent) -> None:
            if event.direction == "received" and event.peer[0] == "peer0" and event.nbytes > CONFIG.chunk_bytes:
                seen["n"] += 1
                if seen["n"] == 5:
                    raise RuntimeError("injected: a member fails mid-ring")

        remove = hooks.add_frame_hook(fail)
        try:
            with pytest.raises((P2PGenError, RuntimeError)):
                cluster.run(lambda b: b.all_reduce(bufs[b.rank]), backends, timeout=30.0)
        finally:
            remove()
        for buf, was in zip(bufs, before):
            assert np.array_equal(buf, was), "a raising all_reduce changed its buffer"

"""Ring receipts: no member returns from a ring collective alone.

A member whose last frames never reach its successor (its link cut while they were in flight) has received
everything it needs and would complete the call; the rest of the ring, missing those frames, gives it up and
takes the step again in the next generation. With receipts it waits for its successor's receipt and fails
with the others, its buffers as passed; a member that returns does so because its successor received every
frame it sent, and so holds the whole result.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from p2pgen.errors import P2PGenError
from p2pgen.testing.cluster import LocalCluster
from p2pgen.transport import FrameKind, TransportConfig, frame

pytestmark = pytest.mark.timeout(60)

CONFIG = TransportConfig(chunk_bytes=4096, max_frame_bytes=8192, op_timeout=1.5)


def _ring_only(cluster, backends) -> None:
    """Members on one host would take shared memory for all_reduce: the ring, its links made."""
    for b in backends:
        b._shm.enabled = False
    cluster.run(lambda b: b.connect(), backends)


def _buffers(name: str, rank: int, world: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(input, output) of member `rank` for one call of `name` (all_reduce: one buffer, in place)."""
    if name == "all_reduce":
        buf = np.arange(n, dtype=np.float64) * (rank + 1)
        return buf, buf
    inp = np.arange(n, dtype=np.float64) + 1000 * rank
    return inp, np.full(n * world if name == "all_gather" else n // world, -1.0)


def _call(name: str, b, inp: np.ndarray, out: np.ndarray) -> None:
    if name == "all_reduce":
        b.all_reduce(out)
    else:
        getattr(b, name)(out, inp)


def _watched(name: str, b, n: int) -> tuple[np.ndarray, P2PGenError | None]:
    """One call on member `b`: (its output, the error it raised or None); a raising call must leave the
    output as it was passed."""
    inp, out = _buffers(name, b.rank, b.world, n)
    passed = out.copy()
    try:
        _call(name, b, inp, out)
    except P2PGenError as e:
        assert np.array_equal(out, passed), f"rank {b.rank} raised {e!r} with its output changed"
        return out, e
    return out, None


def _frames_to_successor(cluster, backends, name: str, n: int, victim: int) -> int:
    """How many collective frames the victim sends its successor in one call of `name` (a dry run)."""
    link = backends[victim]._link((victim + 1) % len(backends))
    sent = []
    original = link._send_one

    def count(header: bytes, payload) -> None:
        if frame.unpack_header(header).kind == FrameKind.COLLECTIVE:
            sent.append(1)
        original(header, payload)

    link._send_one = count
    try:
        cluster.run(lambda b: _watched(name, b, n), backends)
    finally:
        link._send_one = original
    return len(sent)


def _lose_frames_from(link, first_lost: int) -> threading.Event:
    """From now on the link's collective frames with chunk >= `first_lost` vanish on the wire, silently (as
    when the sender's link goes down while they are in flight: its sends succeed). Returns an event set once
    one was lost."""
    original, lost = link._send_one, threading.Event()

    def send(header: bytes, payload) -> None:
        h = frame.unpack_header(header)
        if h.kind == FrameKind.COLLECTIVE and h.chunk >= first_lost:
            lost.set()
            return
        original(header, payload)

    link._send_one = send
    return lost


@pytest.mark.parametrize("name", ["all_reduce", "all_gather", "reduce_scatter"])
@pytest.mark.parametrize("world, lost", [(3, 1), (4, 1), (4, 3), (2, 1)])
def test_a_member_whose_last_frames_are_lost_does_not_complete_alone(name, world, lost):
    victim, n = world - 1, 4096 * world          # several frames per chunk
    with LocalCluster(world, config=CONFIG) as cluster:
        backends = cluster.backends(generation=1)
        _ring_only(cluster, backends)
        expected = [out for out, _ in cluster.run(lambda b: _watched(name, b, n), backends)]   # and set-up
        total = _frames_to_successor(cluster, backends, name, n, victim)
        assert total > lost
        was_lost = _lose_frames_from(backends[victim]._link((victim + 1) % world), total - lost)
        results = cluster.run(lambda b: _watched(name, b, n), backends, timeout=30)
    assert was_lost.is_set()
    assert results[victim][1] is not None, \
        f"rank {victim} completed {name} though its successor never got its last frames"
    for rank, (out, error) in enumerate(results):
        if error is None:
            assert np.array_equal(out, expected[rank]), f"rank {rank} returned a wrong result"


def test_receipts_count_the_frames_and_a_ring_of_two_shares_one_link():
    """Each receipt carries how many frames its sender received; the ring of two sends both directions' data
    and receipts on one link, in order. Results stay exact over many calls of mixed sizes."""
    with LocalCluster(2, config=CONFIG) as cluster:
        backends = cluster.backends(generation=1)
        _ring_only(cluster, backends)

        def body(b):
            ok = []
            for n in (1, 7, 4096, 3 * 4096 + 5):
                buf = np.full(n, b.rank + 1.0)
                b.all_reduce(buf)
                ok.append(bool(np.all(buf == 3.0)))
            return all(ok)

        assert cluster.run(body, backends) == [True, True]

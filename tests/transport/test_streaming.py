"""How frames move: a post hands the frame to the kernel on the caller's thread when nothing is queued and
never blocks when the peer does not read (the rest waits for the sender thread, in order)."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from p2pgen.transport import FrameKind, RecvSlot
from p2pgen.transport.connection import Connection
from p2pgen.transport.stats import RejectCounters

pytestmark = pytest.mark.timeout(20)


def _pair(buffer_bytes: int) -> tuple[Connection, Connection]:
    """Two connections of generation 1 over loopback: a (incarnation 1) and b (incarnation 2)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        dialed = socket.socket()
        for s in (dialed, listener):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)
        dialed.connect(listener.getsockname())
        accepted, _ = listener.accept()
    common = dict(job="job", generation=1, max_frame_bytes=1 << 20, op_timeout=10.0, counters=RejectCounters(),
                  on_error=lambda e: None)
    return (Connection(dialed, my_incarnation=1, peer=("b", 2), rank=1, **common),
            Connection(accepted, my_incarnation=2, peer=("a", 1), rank=0, **common))


def _receive(conn: Connection, chunk: int, nbytes: int) -> np.ndarray:
    out = np.empty(nbytes, np.uint8)
    slot = RecvSlot(memoryview(out))
    conn.recv_into(slot, FrameKind.COLLECTIVE, 3, chunk)
    slot.take((FrameKind.COLLECTIVE, 3, chunk))
    return out


def test_posts_never_block_and_frames_arrive_whole_and_in_order():
    a, b = _pair(64 << 10)
    try:
        small = np.full(4096, 7, np.uint8)
        assert a.is_sent(a.post(FrameKind.COLLECTIVE, 3, 0, small))      # idle: handed over at once
        frames = [np.full(256 << 10, i, np.uint8) for i in range(1, 17)]  # 4 MiB, far beyond the buffers
        tickets = [a.post(FrameKind.COLLECTIVE, 3, i, f) for i, f in enumerate(frames, start=1)]
        assert not a.is_sent(tickets[-1]), "the peer reads nothing, so the last frame cannot be in the kernel yet"
        assert np.array_equal(_receive(b, 0, small.nbytes), small)
        for i, f in enumerate(frames, start=1):
            assert np.array_equal(_receive(b, i, f.nbytes), f)
        a.flush()
        assert a.is_sent(tickets[-1])
    finally:
        a.close(2.0)
        b.close(2.0)

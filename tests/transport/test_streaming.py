"""How frames move: a post never blocks when the peer does not read (the sender thread sends in order once it
does); a receive that waits for a whole payload still delivers one that arrives in pieces, and the next small
frame after it."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from p2pgen.transport import FrameKind, RecvSlot
from p2pgen.transport.connection import Connection
from p2pgen.transport.stats import RejectCounters

pytestmark = pytest.mark.timeout(20)


def _pair(buffer_bytes: int, op_timeout: float = 10.0) -> tuple[Connection, Connection]:
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
    common = dict(job="job", generation=1, max_frame_bytes=1 << 20, op_timeout=op_timeout, counters=RejectCounters(),
                  on_error=lambda e: None, wake_once=True)
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
        a.post(FrameKind.COLLECTIVE, 3, 0, small)
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


def test_a_payload_that_arrives_in_pieces_is_delivered_then_the_next_small_frame():
    """Each receive starts before its bytes arrive; a receive stuck waiting for bytes that are not coming
    would outlive the test's timeout (the connections' op_timeout is longer)."""
    a, b = _pair(4 << 20, op_timeout=120.0)
    try:
        big = np.arange(128 << 10, dtype=np.uint32).view(np.uint8)
        small = np.full(64, 3, np.uint8)
        raw = _frame_bytes(a, 0, big)
        got: dict[str, np.ndarray] = {}
        done_big = threading.Event()

        def receive() -> None:
            got["big"] = _receive(b, 0, big.nbytes)
            done_big.set()
            got["small"] = _receive(b, 1, small.nbytes)

        receiver = threading.Thread(target=receive, daemon=True)
        receiver.start()
        a.sock.sendall(raw[:200 << 10])
        time.sleep(0.3)
        a.sock.sendall(raw[200 << 10:])
        assert done_big.wait(15), "the payload's last bytes arrived, but the receive did not return"
        time.sleep(0.2)                     # the receiver now waits for the small frame's header
        a.sock.sendall(_frame_bytes(a, 1, small))
        receiver.join(15)
        assert not receiver.is_alive(), "the small frame arrived, but the receive did not return"
        assert np.array_equal(got["big"], big) and np.array_equal(got["small"], small)
    finally:
        a.close(2.0)
        b.close(2.0)


def _frame_bytes(conn: Connection, chunk: int, payload: np.ndarray) -> bytes:
    """The frame `conn.post` would send, as bytes, so that a test can write it in pieces of its choosing."""
    from p2pgen.transport import frame

    return frame.pack_header(FrameKind.COLLECTIVE, conn._tag, 1, 1, 3, chunk, payload) + payload.tobytes()

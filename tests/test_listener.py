"""p2pgen.listener.Listener on loopback: close() ends blocked handshakes, live connections are tracked
and ended, a raising handler leaves the accept loop serving, and nothing (thread, fd) outlives close()."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Iterator

import pytest

from p2pgen.listener import Listener

pytestmark = pytest.mark.timeout(20)

BOUND = 5.0          # the join bound given to close()/end(): generous, it is never reached here


class Recorder:
    """A handler that reads until EOF (a handshake that waits for a dialer who never speaks), then
    records how the connection ended and closes its socket."""

    def __init__(self) -> None:
        self.started = threading.Semaphore(0)
        self.ended: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, sock: socket.socket, peer: tuple) -> None:
        self.started.release()
        try:
            outcome = "eof" if sock.recv(1) == b"" else "data"
        except OSError as e:
            outcome = f"error {e!r}"
        with self.lock:
            self.ended.append(outcome)
        sock.close()

    def wait_started(self, n: int) -> None:
        for _ in range(n):
            assert self.started.acquire(timeout=BOUND), "a handler did not start"


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture
def no_leaks() -> Iterator[None]:
    threads, fds = set(threading.enumerate()), open_fds()
    yield
    left = [t.name for t in threading.enumerate() if t not in threads and t.is_alive()]
    assert left == [], f"threads left running: {left}"
    assert open_fds() <= fds, f"fds left open: {sorted(open_fds() - fds)}"


def dial(listener: Listener) -> socket.socket:
    return socket.create_connection(listener.address, timeout=BOUND)


def test_close_during_a_blocked_handshake_ends_it(no_leaks) -> None:
    handler = Recorder()
    listener = Listener("127.0.0.1", 0, handler, name="test-listener").start()
    with dial(listener):
        handler.wait_started(1)
        listener.close(BOUND)
        assert handler.ended == ["eof"]


def test_live_connections_are_tracked_and_all_ended_by_close(no_leaks) -> None:
    handler = Recorder()
    listener = Listener("127.0.0.1", 0, handler, name="test-listener").start()
    clients = [dial(listener) for _ in range(4)]
    try:
        handler.wait_started(4)
        assert len(listener._conns) == 4
        listener.close(BOUND)
        assert handler.ended == ["eof"] * 4 and listener._conns == {}
        for c in clients:
            assert c.recv(1) == b""          # the server side is gone: the dialer reads EOF
    finally:
        for c in clients:
            c.close()


def test_end_ends_only_the_selected_connections(no_leaks) -> None:
    handler = Recorder()
    listener = Listener("127.0.0.1", 0, handler, name="test-listener").start()
    first, second = dial(listener), dial(listener)
    try:
        handler.wait_started(2)
        chosen = first.getsockname()
        listener.end(lambda s: s.getpeername() == chosen, BOUND)
        assert handler.ended == ["eof"] and len(listener._conns) == 1
        second.sendall(b"x")
        listener.close(BOUND)
        assert sorted(handler.ended) == ["data", "eof"]
    finally:
        first.close()
        second.close()


def test_no_connection_is_accepted_once_stop_returns(no_leaks) -> None:
    handler = Recorder()
    listener = Listener("127.0.0.1", 0, handler, name="test-listener").start()
    address = listener.address
    listener.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=BOUND)
    listener.close(BOUND)
    listener.close(BOUND)                    # idempotent
    assert handler.ended == []


def test_a_listener_never_started_closes_cleanly(no_leaks) -> None:
    Listener("127.0.0.1", 0, Recorder(), name="test-listener").close(BOUND)


def test_a_taken_port_raises_and_leaves_no_socket(no_leaks) -> None:
    listener = Listener("127.0.0.1", 0, Recorder(), name="test-listener")
    try:
        with pytest.raises(OSError):
            Listener("127.0.0.1", listener.address[1], Recorder(), name="test-listener")
    finally:
        listener.close(BOUND)


def test_a_raising_handler_is_logged_and_the_accept_loop_goes_on(no_leaks, caplog) -> None:
    served = Recorder()
    calls = []

    def handler(sock: socket.socket, peer: tuple) -> None:
        calls.append(peer)
        if len(calls) == 1:
            raise RuntimeError("handler bug")
        served(sock, peer)

    listener = Listener("127.0.0.1", 0, handler, name="test-listener").start()
    with caplog.at_level(logging.ERROR, logger="p2pgen.listener"):
        with dial(listener) as broken:
            assert broken.recv(1) == b""         # the raising handler's socket was closed
        with dial(listener) as healthy:
            served.wait_started(1)
            healthy.sendall(b"x")
            listener.close(BOUND)
    assert served.ended == ["data"]
    assert [r.exc_info[1].args for r in caplog.records if r.exc_info] == [("handler bug",)]

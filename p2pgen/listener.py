"""The lifecycle of one TCP listener: its socket, its accept thread and a thread per accepted connection.

Serves the four listeners of a process (data transport, state server, channel listener, agent RPC).
Owns: binding and listening (SO_REUSEADDR, plus the caller's own options through `new_socket`), the
accept thread, and the live connections: the (socket, thread) of every connection whose handler is
still running. It does not own authentication: `handler(sock, peer)` runs the caller's handshake and
whatever it serves next on the connection's own thread, and owns the socket (closes it, or hands it on);
the connection stops being tracked when the handler returns. A handler that raises is logged and its
socket closed; the accept loop goes on.

Connections are ended by shutdown(SHUT_RDWR), not close(): on Linux a shutdown wakes a thread blocked
in accept/recv/send on that socket at once, where a close would not, and would free the fd number for
reuse while that thread still holds it. The handler then closes its socket on its way out.

Invariant: once `stop()` returns no connection is accepted any more (it ends the accept thread's wait
at once, no polling); once `end()` or `close()` returns, every connection it ended has been shut down
and its thread has finished, unless that thread is blocked on something other than its socket for
longer than `timeout` (bounded wait, all threads together).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

Handler = Callable[[socket.socket, tuple], None]
Selector = Callable[[socket.socket], bool]
ACCEPT_RETRY_S = 0.1       # pause after a failed accept (EMFILE, ECONNABORTED) before accepting again


def plain_socket() -> socket.socket:
    return socket.socket(socket.AF_INET, socket.SOCK_STREAM)


class Listener:
    """Listens on (host, port) from construction; accepts, one thread per connection, from `start()`."""

    def __init__(self, host: str, port: int, handler: Handler, *, name: str, backlog: int = 64,
                 new_socket: Callable[[], socket.socket] = plain_socket) -> None:
        self._handler = handler
        self._name = name
        self._lock = threading.Lock()
        self._conns: dict[socket.socket, threading.Thread] = {}   # guarded by _lock
        self._stopped = threading.Event()                         # set under _lock
        self._sock = _bind(new_socket(), host, port, backlog)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"{name}-accept", daemon=True)

    def start(self) -> Listener:
        self._acceptor.start()
        return self

    def stop(self) -> None:
        """Stop accepting, at once; live connections go on. Idempotent."""
        with self._lock:
            self._stopped.set()
        _shutdown(self._sock)
        if self._acceptor.is_alive():
            self._acceptor.join()
        self._sock.close()

    def end(self, which: Selector | None = None, timeout: float = 2.0) -> None:
        """Shut down the live connections `which` selects (all by default) and wait up to `timeout`
        seconds, all together, for their threads to finish."""
        with self._lock:
            ending = [(s, t) for s, t in self._conns.items() if which is None or which(s)]
        for sock, _ in ending:
            _shutdown(sock)
        deadline = time.monotonic() + timeout
        for _, thread in ending:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    def close(self, timeout: float = 2.0) -> None:
        """`stop()`, then `end()` every connection. Idempotent."""
        self.stop()
        self.end(timeout=timeout)

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, peer = self._sock.accept()
            except OSError as e:
                if self._stopped.is_set():
                    return
                log.warning("%s: accept failed (%r); accepting again", self._name, e)
                if self._stopped.wait(ACCEPT_RETRY_S):
                    return
                continue
            self._spawn(sock, peer)

    def _spawn(self, sock: socket.socket, peer: tuple) -> None:
        with self._lock:
            if self._stopped.is_set():      # accepted as stop() began: not served
                sock.close()
                return
            thread = threading.Thread(target=self._run, args=(sock, peer), name=f"{self._name}-conn", daemon=True)
            self._conns[sock] = thread
            thread.start()                  # under the lock, so `end()` never sees a thread it cannot join

    def _run(self, sock: socket.socket, peer: tuple) -> None:
        try:
            self._handler(sock, peer)
        except Exception:
            log.exception("%s: the handler of the connection from %s failed", self._name, peer)
            sock.close()
        finally:
            with self._lock:
                self._conns.pop(sock, None)


def _bind(sock: socket.socket, host: str, port: int, backlog: int) -> socket.socket:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass

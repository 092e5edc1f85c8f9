"""The process's data-plane endpoint: one listening socket, the sessions of its generations, and the
counters of everything it refused.

A Transport belongs to one (job, peer_id, incarnation). It hands accepted, authenticated connections to
the session of the generation they were bound to; a connection for a generation this process has not
opened yet is parked until it does, and refused (closed, so its dialer's receive fails) if it does not within
`connect_timeout`; one for an older generation is refused.

Invariants:
- Generations opened here only go up (I2): `open_session(G)` requires G above every generation opened
  before, and aborts the older sessions first, so no connection of G-1 is open once G exists.
- Only dialers that proved the job secret (I8), agree on `config.encrypt` and are members of the generation
  with the listed incarnation (I3) reach a session; every refusal is counted in `stats()`.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

from p2pgen import auth
from p2pgen.errors import GenerationChanged
from p2pgen.listener import Listener
from p2pgen.transport import handshake
from p2pgen.transport.config import TransportConfig
from p2pgen.transport.group import Endpoint, Group
from p2pgen.transport.session import Session
from p2pgen.transport.stats import RejectCounters, WireCounters

log = logging.getLogger(__name__)

MAX_PARKED = 64


class Transport:
    def __init__(self, job: str, secret: bytes, peer_id: str, incarnation: int, host: str = "127.0.0.1",
                 port: int = 0, config: TransportConfig | None = None) -> None:
        if not secret:
            raise ValueError("the job secret is empty: load it with p2pgen.auth.load_secret")
        self.job = job
        self.identity = (peer_id, incarnation)
        self.config = config or TransportConfig()
        self.key = auth.derive_key(secret, job, "data")
        self.counters = RejectCounters()
        self.wire = WireCounters()           # every generation's data-plane frames (`wire_counters()`)
        self._lock = threading.Lock()
        self._sessions: dict[int, Session] = {}
        self._retired: list[Session] = []
        self._newest = -1
        self._parked: list[tuple[float, handshake.Hello, socket.socket]] = []
        self._closed = False
        self._listener = Listener(host, port, self._handshake, name=f"p2pgen-data-{peer_id}", backlog=128,
                                  new_socket=self.new_socket).start()
        self.host, self.port = host, self._listener.address[1]

    def new_socket(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.config.socket_buffer_bytes:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.config.socket_buffer_bytes)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.config.socket_buffer_bytes)
        return sock

    def endpoint(self) -> Endpoint:
        """This process as a member: what goes into the generation's member list."""
        return Endpoint(self.identity[0], self.identity[1], self.host, self.port)

    def stats(self) -> dict[str, int]:
        """Rejected frames/connections by reason, and the number of open data connections."""
        out = self.counters.snapshot()
        out["connections_open"] = len(self.open_connections())
        return out

    def wire_counters(self) -> dict[str, int]:
        """Payload bytes and frames this process's data plane sent and received, every generation together
        (`stats.WIRE_KEYS`)."""
        return self.wire.snapshot()

    def open_connections(self) -> list[tuple[int, str]]:
        """(generation, peer_id) of every open data connection, parked ones included."""
        with self._lock:
            self._retired = [s for s in self._retired if s.open_links()]
            sessions = list(self._sessions.values()) + self._retired
            parked = [(h.generation, h.dialer[0]) for _, h, _ in self._parked]
        return parked + [(s.generation, c.peer[0]) for s in sessions for c in s.open_links()]

    # ---- sessions ------------------------------------------------------------------------------
    def open_session(self, group: Group) -> Session:
        """A session for `group`'s generation; cheap (no I/O). Older sessions are aborted first."""
        self._check_group(group)
        with self._lock:
            if self._closed:
                raise RuntimeError("this Transport is closed: create a new one")
            if group.generation <= self._newest:
                raise GenerationChanged(f"generation {group.generation} is not newer than generation "
                                        f"{self._newest}, already opened on this process")
            self._newest = group.generation
            older = list(self._sessions.values())
            session = Session(self, group)
            self._sessions[group.generation] = session
            parked, self._parked = self._parked, []
        for old in older:
            old.abort(f"generation {group.generation} opened")
        for _, hello, sock in parked:
            self._route(hello, sock)
        return session

    def _check_group(self, group: Group) -> None:
        if group.job != self.job:
            raise ValueError(f"group is for job {group.job!r}, this transport serves {self.job!r}")
        me = group.me
        if me.identity != self.identity or me.port != self.port:
            raise ValueError(f"group member {group.self_index} is {me}, but this transport is "
                             f"{self.endpoint()}: pass self_index of this process's own entry")

    def retire(self, session: Session) -> None:
        with self._lock:
            if self._sessions.get(session.generation) is session:
                del self._sessions[session.generation]
                self._retired.append(session)

    # ---- accepting -----------------------------------------------------------------------------
    def _handshake(self, sock: socket.socket, _peer: tuple) -> None:
        """The accepted connection's thread (run by the Listener): authenticate, then route it."""
        try:
            sock.settimeout(self.config.handshake_timeout)
            hello = handshake.accept(sock, self.key, self.job, self.identity, self._decide, self.config.encrypt)
        except handshake.HandshakeRejected as e:
            self.counters.add(e.reason)
            log.warning("refused a data connection (%s): %s", e.reason, e.detail)
            handshake.refuse(sock, e)
            sock.close()
            return
        except OSError as e:
            self._refuse(sock, "truncated", f"handshake did not complete: {e!r}")
            return
        self._route(hello, sock)

    def _decide(self, hello: handshake.Hello) -> tuple[str, str] | None:
        with self._lock:
            session = self._sessions.get(hello.generation)
            newest = self._newest
            parked = len(self._parked)
        if session is not None:
            verdict = session.admission(hello.dialer)
            return verdict if isinstance(verdict, tuple) else None
        if hello.generation <= newest:
            return ("stale_generation", f"generation {hello.generation} is retired here "
                    f"(newest opened: {newest})")
        if parked >= MAX_PARKED:
            return ("malformed", f"{parked} connections already wait for future generations")
        return None

    def _route(self, hello: handshake.Hello, sock: socket.socket) -> None:
        """Hand an accepted connection to its session, park it, or refuse it."""
        with self._lock:
            session = self._sessions.get(hello.generation)
            if session is None and hello.generation > self._newest and not self._closed:
                self._parked.append((time.monotonic() + self.config.connect_timeout, hello, sock))
                sock = None
        if sock is None:
            # Its dialer waits on it: if this process never opens that generation, refuse it once its time is
            # up rather than leave the dialer blocked until its op_timeout.
            timer = threading.Timer(self.config.connect_timeout + 0.01, self._expire_parked)
            timer.daemon = True
            timer.start()
            self._expire_parked()
            return
        if session is None:
            self._refuse(sock, "stale_generation", f"generation {hello.generation} is retired here")
            return
        verdict = session.admission(hello.dialer)
        if isinstance(verdict, tuple):
            self._refuse(sock, *verdict)
        elif not session.deliver(verdict, sock, hello.keys):
            self.counters.add("stale_generation")

    def _expire_parked(self) -> None:
        """Refuse (close) the parked connections whose generation was not opened within connect_timeout."""
        now = time.monotonic()
        with self._lock:
            expired = [p for p in self._parked if p[0] <= now]
            self._parked = [p for p in self._parked if p[0] > now]
        for _, hello, sock in expired:
            self._refuse(sock, "stale_generation", f"nobody opened generation {hello.generation} in time")

    def _refuse(self, sock: socket.socket, reason: str, detail: str) -> None:
        self.counters.add(reason)
        log.warning("refused a data connection (%s): %s", reason, detail)
        sock.close()

    # ---- teardown ------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop accepting and end the handshakes in flight, then abort every session and close every
        parked socket. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._listener.close(self.config.handshake_timeout)
        with self._lock:
            sessions = list(self._sessions.values())
            parked, self._parked = self._parked, []
        for s in sessions:
            s.abort("transport closed")
        for _, _, sock in parked:
            sock.close()

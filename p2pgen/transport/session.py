"""The connections of one generation on one process, and the abort that retires them.

A Session is bound to exactly one Group (one generation). Links are made lazily: for each pair of ranks
the lower rank dials, the higher one waits for the transport to hand it the accepted connection.

Invariants:
- After the first failure (a lost peer, a rejected frame) or an abort, every link is shut down at once,
  so blocked receives and sends wake within milliseconds and neighbours notice in turn; every later
  operation raises the same kind of error.
- `abort()` returns only after the in-flight operation has left and every sender thread has stopped;
  it then reports quiescence "proved" (otherwise "unknown", after `abort_timeout`).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from p2pgen import auth, faults
from p2pgen.errors import GenerationChanged, P2PGenError, PeerLost
from p2pgen.transport import handshake
from p2pgen.transport.config import TransportConfig
from p2pgen.transport.connection import Connection
from p2pgen.transport.group import Group
from p2pgen.transport.seal import LinkKeys, Seal
from p2pgen.transport.stats import RejectCounters, WireCounters

log = logging.getLogger(__name__)

PROVED = "proved"
UNKNOWN = "unknown"


class Owner(Protocol):
    """What a session needs of the Transport that opened it (so this module does not import that one)."""

    config: TransportConfig
    key: bytes
    counters: RejectCounters
    wire: WireCounters

    def new_socket(self) -> socket.socket: ...

    def retire(self, session: Session) -> None: ...


class Session:
    def __init__(self, transport: Owner, group: Group) -> None:
        self.group = group
        self.config = transport.config
        self._transport = transport
        self._cond = threading.Condition()
        self._links: dict[int, Connection] = {}
        self._error: P2PGenError | None = None
        self._abort_reason: str | None = None
        self._inflight: tuple[str, int, float] | None = None    # (operation, thread, monotonic start)
        self._abort_lock = threading.Lock()
        self._quiescence: str | None = None
        self.wire = WireCounters(transport.wire)     # this generation's frames (and the transport's total)

    @property
    def generation(self) -> int:
        return self.group.generation

    def __repr__(self) -> str:
        return f"Session(job={self.group.job!r}, generation={self.generation}, rank={self.group.rank})"

    # ---- links ---------------------------------------------------------------------------------
    def link(self, rank: int) -> Connection:
        """The connection to `rank`, made on first use (dialed if `rank` is higher than ours)."""
        with self._cond:
            self._raise_if_dead()
            conn = self._links.get(rank)
        if conn is not None:
            return conn
        if rank > self.group.rank:
            return self._store(rank, self._dial(rank))
        return self._await(rank)

    def _store(self, rank: int, conn: Connection) -> Connection:
        with self._cond:
            if self._error is None:
                self._links[rank] = conn
                return conn
            err = self._error
        conn.close(self.config.abort_timeout)
        raise _with_op(err, "connecting", self.generation)

    def _await(self, rank: int) -> Connection:
        timeout = self.config.connect_timeout
        with self._cond:
            self._cond.wait_for(lambda: rank in self._links or self._error is not None, timeout)
            self._raise_if_dead()
            if rank in self._links:
                return self._links[rank]
        peer = self.group.members[rank]
        raise PeerLost(f"rank {rank} ({peer.peer_id}, incarnation {peer.incarnation}) did not connect "
                       f"within {timeout}s in generation {self.generation}")

    def _dial(self, rank: int) -> Connection:
        peer = self.group.members[rank]
        deadline = time.monotonic() + self.config.connect_timeout
        hello = handshake.Hello(self.group.job, self.generation, self.group.me.identity, peer.identity,
                                auth.new_nonce(), self.config.encrypt)
        while True:
            sock = self._transport.new_socket()
            try:
                sock.settimeout(max(0.05, deadline - time.monotonic()))
                faults.refuse_connect(f"{peer.host}:{peer.port}", f"{self.group.me.host}:{self.group.me.port}")
                sock.connect((peer.host, peer.port))
                sock.settimeout(self.config.handshake_timeout)
                keys = handshake.dial(sock, self._transport.key, hello)
                return self._connection(sock, rank, keys)
            except OSError as e:
                sock.close()
                with self._cond:
                    self._raise_if_dead()
                if time.monotonic() >= deadline:
                    raise PeerLost(f"cannot connect to rank {rank} ({peer.peer_id} at {peer.host}:"
                                   f"{peer.port}) within {self.config.connect_timeout}s: {e!r}") from e
                time.sleep(0.02)
            except BaseException:
                sock.close()
                raise

    def _connection(self, sock: socket.socket, rank: int, keys: LinkKeys | None) -> Connection:
        peer = self.group.members[rank]
        return Connection(sock, job=self.group.job, generation=self.generation,
                          my_incarnation=self.group.me.incarnation, peer=peer.identity, rank=rank,
                          max_frame_bytes=self.config.max_frame_bytes, op_timeout=self.config.op_timeout,
                          counters=self._transport.counters, on_error=self._fail,
                          addrs=(f"{self.group.me.host}:{self.group.me.port}", f"{peer.host}:{peer.port}"),
                          seal=Seal(keys) if keys is not None else None,
                          wake_once=self.config.socket_buffer_bytes > 0, wire=self.wire)

    def admission(self, dialer: tuple[str, int]) -> tuple[str, str] | int:
        """The dialer's rank, or (reason, detail) if it may not dial us in this generation."""
        rank = self.group.rank_of(dialer[0])
        if rank is None:
            return ("not_member", f"{dialer[0]} is not a member of generation {self.generation}")
        if self.group.members[rank].incarnation != dialer[1]:
            return ("wrong_incarnation", f"{dialer[0]} is incarnation {self.group.members[rank].incarnation} "
                    f"in generation {self.generation}, not {dialer[1]}")
        if rank >= self.group.rank:
            return ("malformed", f"rank {rank} must not dial rank {self.group.rank}: the lower rank dials")
        with self._cond:
            if self._error is not None:
                return ("stale_generation", f"generation {self.generation} was retired here")
            if rank in self._links:
                return ("malformed", f"rank {rank} is already connected")
        return rank

    def deliver(self, rank: int, sock: socket.socket, keys: LinkKeys | None = None) -> bool:
        """Take an accepted connection from `rank` (with its keys, if sealed); False (caller closes it) if we
        can no longer use it."""
        conn = self._connection(sock, rank, keys)
        with self._cond:
            if self._error is None and rank not in self._links:
                self._links[rank] = conn
                self._cond.notify_all()
                return True
        conn.close(self.config.abort_timeout)
        return False

    def open_links(self) -> list[Connection]:
        with self._cond:
            return [c for c in self._links.values() if not c.closed]

    # ---- operations ----------------------------------------------------------------------------
    @contextmanager
    def operation(self, name: str) -> Iterator[None]:
        """Scope of one collective: one at a time; any failure inside retires the whole session."""
        with self._cond:
            self._raise_if_dead()
            if self._inflight is not None:
                raise RuntimeError(f"{name} called while {self._inflight[0]} is in flight: a communicator "
                                   "runs one operation at a time")
            self._inflight = (name, threading.get_ident(), time.monotonic())
        try:
            yield
        except BaseException as e:
            err = self._fail(e if isinstance(e, P2PGenError) else PeerLost(f"{name} failed: {e!r}"))
            if isinstance(e, (OSError, P2PGenError)):
                raise _with_op(err, name, self.generation) from e
            raise
        finally:
            with self._cond:
                self._inflight = None
                self._cond.notify_all()

    def inflight_since(self) -> float | None:
        """When (time.monotonic) the operation in flight began, or None while none is. Any thread may ask."""
        flight = self._inflight
        return None if flight is None else flight[2]

    @property
    def error(self) -> P2PGenError | None:
        """The error this session was retired with (a failure or an abort), or None while it is usable."""
        return self._error

    def fail(self, err: P2PGenError) -> P2PGenError:
        """Retire this session because of `err`: every link is shut down and every later operation raises it
        (the first error wins, and is returned)."""
        return self._fail(err)

    def _fail(self, err: P2PGenError) -> P2PGenError:
        """Record the first error and shut every link down; returns the error operations should raise."""
        with self._cond:
            if self._error is None:
                self._error = err
                log.warning("generation %d on rank %d failed: %s", self.generation, self.group.rank, err)
            links = list(self._links.values())
            self._cond.notify_all()
            first = self._error
        for conn in links:
            conn.shutdown()
        return first

    def _raise_if_dead(self) -> None:
        if self._error is not None:
            raise _with_op(self._error, "this operation", self.generation)

    # ---- abort ---------------------------------------------------------------------------------
    def abort(self, reason: str) -> str:
        """Retire this generation: in-flight work raises GenerationChanged; returns the quiescence.

        Idempotent and thread-safe; a second call waits for the first and returns its answer.
        """
        with self._abort_lock:
            if self._quiescence is None:
                self._quiescence = self._do_abort(reason)
            return self._quiescence

    def _do_abort(self, reason: str) -> str:
        with self._cond:
            self._abort_reason = reason
            self._error = GenerationChanged(f"generation {self.generation} was aborted: {reason}")
        self._fail(self._error)
        self._transport.retire(self)
        deadline = time.monotonic() + self.config.abort_timeout
        with self._cond:
            own = self._inflight is not None and self._inflight[1] == threading.get_ident()
            idle = own or self._cond.wait_for(lambda: self._inflight is None, self.config.abort_timeout)
            links = list(self._links.values())
        stopped = [c.close(max(0.0, deadline - time.monotonic())) for c in links]
        quiescence = PROVED if idle and not own and all(stopped) else UNKNOWN
        log.info("generation %d on rank %d aborted (%s): quiescence %s", self.generation, self.group.rank,
                 reason, quiescence)
        return quiescence


def _with_op(err: P2PGenError, name: str, generation: int) -> P2PGenError:
    """A fresh exception of the same class, naming the operation that saw it."""
    return type(err)(f"{name} in generation {generation}: {err}")

"""The receiving side of exactly-once channels: a listener, one receiver per sending peer_id, messages.

    listener = ChannelListener(job, secret, ("decode", incarnation), log_dir, host, port)
    rx = listener.receiver("prefill")
    for msg in rx:                 # at most one message in hand at a time
        attach(msg.array())        # the application's effect
        msg.consumed()             # only now is the number appended to the consumption log

A receiver owns the channel's consumption log (`p2pgen.channel.log`), its receive slots and the one
current connection. A connection from the sender *takes over* the channel: older connections are retired,
the messages they delivered and nobody took are purged, the message in hand (if any) is waited for, the
dialer is recorded as the channel's owner, and only then is the log snapshot sent back. The sender resends
exactly the numbers missing from that snapshot.

Invariants:
- I6: in `exactly_once` mode a number is handed to the application only if the log does not hold it, and
  at most one message is in hand, so no number is consumed twice; a number enters the log only through
  `Message.consumed()`.
- I3/I2: once a sender incarnation (or generation) took over, no message stamped by an older one is
  handed out, and a dialer with an older incarnation ("superseded") or generation ("stale_generation")
  than the log's owner is refused; refusals and dropped frames are counted in `stats()`.
- A message is handed out only from a full slot holding its (connection, number) key; slots are marked
  empty before each receive, so a torn or aborted receive is never consumed.
- With `config.encrypt` a sender that does not seal is refused ("encryption_mismatch"), and a sealed frame
  that fails its tag or comes out of order ("bad_seal", "replayed") closes its connection, never delivered.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections import deque
from itertools import count

import numpy as np

from p2pgen import auth
from p2pgen.channel.config import EXACTLY_ONCE, ChannelConfig, check_mode
from p2pgen.channel.log import ConsumptionLog, LogBusy, channel_path
from p2pgen.channel.wire import (
    ACK,
    ARRAY,
    DATA,
    LOG,
    OPEN,
    Rejected,
    Slot,
    Stamp,
    decode_array,
    parse_header,
    read_exact,
    read_payload,
    recv_control,
    send_control,
    write_frame,
)
from p2pgen.errors import P2PGenError, ProtocolError
from p2pgen.listener import Listener
from p2pgen.transport import frame, handshake
from p2pgen.transport.seal import Seal

log = logging.getLogger(__name__)

COUNTERS = ("delivered", "consumed", "duplicates_dropped", "purged", "takeovers", "stale_generation",
            "wrong_incarnation", "superseded", "busy", "bad_checksum", "oversized", "truncated",
            "malformed", "auth_failed", "bad_seal", "replayed", "encryption_mismatch")


class Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNTERS, 0)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class _Conn:
    """One accepted connection of a channel: its stamps, mode and the lock its ACK writes share."""

    def __init__(self, cid: int, sock: socket.socket, hello: handshake.Hello, me: int, tag: int,
                 mode: str, seal: Seal | None = None) -> None:
        self.id = cid
        self.sock = sock
        self.seal = seal
        self.sender = hello.dialer
        self.generation = hello.generation
        self.mode = mode
        self.stamp_in = Stamp(tag, hello.generation, hello.dialer[1])
        self.stamp_out = Stamp(tag, hello.generation, me)
        self.send_lock = threading.Lock()

    def ack(self, seq: int) -> None:
        """Best effort: a lost ACK only makes the sender ask the log after its next fault."""
        with self.send_lock:
            try:
                write_frame(self.sock, ACK, self.stamp_out, seq, 0, b"", self.seal)
            except OSError:
                pass

    def shutdown(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class Message:
    """One delivered message, in hand until `consumed()`. Its payload view is valid until then."""

    __slots__ = ("seq", "generation", "incarnation", "encoding", "_rx", "_conn", "_slot")

    def __init__(self, rx: ChannelReceiver, conn: _Conn, seq: int, encoding: int, slot: Slot) -> None:
        self.seq = seq
        self.generation = conn.generation
        self.incarnation = conn.sender[1]
        self.encoding = encoding
        self._rx, self._conn, self._slot = rx, conn, slot

    def __repr__(self) -> str:
        return f"Message(seq={self.seq}, generation={self.generation}, sender_incarnation={self.incarnation})"

    @property
    def payload(self) -> memoryview:
        return self._slot.view((self._conn.id, self.seq))

    def array(self) -> np.ndarray:
        """The tensor this message carries (a read-only view; copy it to keep it past `consumed()`)."""
        if self.encoding != ARRAY:
            raise TypeError(f"message {self.seq} carries bytes, not an array: read .payload")
        return decode_array(self.payload)

    def consumed(self) -> bool:
        """Record that the application consumed this message; False if its number had been consumed
        before (possible only in `naive`/`batched` mode, which do not deduplicate)."""
        return self._rx._consume(self)


class ChannelReceiver:
    """The messages one sending peer_id sends to this process, and that channel's consumption log."""

    def __init__(self, sender: str, log_path: str, me: int, tag: int, config: ChannelConfig) -> None:
        self.sender = sender
        self.config = config
        self.counters = Counters()
        self._log = ConsumptionLog(log_path, fsync=config.fsync, compact_records=config.compact_records)
        self._me, self._tag = me, tag
        self._cond = threading.Condition()
        self._takeover = threading.Lock()
        self._free = [Slot() for _ in range(config.slots)]
        self._ready: deque[tuple[_Conn, int, int, Slot]] = deque()
        self._in_hand: Message | None = None
        self._conn: _Conn | None = None
        self._floor = 0
        self._closed = False

    # ---- application side ----------------------------------------------------------------------
    def __iter__(self):
        while (msg := self.receive()) is not None:
            yield msg

    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message to consume; None if `timeout` passed or the receiver was closed.

        The previous message must have been `consumed()` first (one message in hand at a time).
        """
        end = None if timeout is None else self.config.clock() + timeout
        while True:
            with self._cond:
                if self._in_hand is not None:
                    raise ProtocolError(f"{self._in_hand} is still in hand: call consumed() on it first")
                msg, dup = self._wait_next_locked(end)
            if dup is None:
                return msg
            dup[0].ack(dup[1])     # a resend of a consumed number: ack it again so the sender frees it

    def _wait_next_locked(self, end: float | None) -> tuple[Message | None, tuple[_Conn, int] | None]:
        while not self._ready and not self._closed:
            left = None if end is None else end - self.config.clock()
            if left is not None and left <= 0:
                return None, None
            self._cond.wait(left)
        return self._next_locked()

    def _next_locked(self) -> tuple[Message | None, tuple[_Conn, int] | None]:
        if not self._ready:
            return None, None
        conn, seq, encoding, slot = self._ready.popleft()
        if conn.mode == EXACTLY_ONCE and seq in self._log.consumed:
            self.counters.add("duplicates_dropped")
            self._release(slot)
            return None, (conn, seq)
        self._in_hand = Message(self, conn, seq, encoding, slot)
        return self._in_hand, None

    def _consume(self, msg: Message) -> bool:
        with self._cond:
            if self._in_hand is not msg:
                raise ProtocolError(f"{msg} is not the message in hand (consumed twice?)")
            fresh = self._log.consume(msg.seq)
            self._in_hand = None
            self._release(msg._slot)
            self.counters.add("consumed")
            self._cond.notify_all()
        if msg._conn.mode == EXACTLY_ONCE:
            msg._conn.ack(msg.seq)
        return fresh

    def consumed_numbers(self) -> tuple[int, list[int]]:
        """(watermark, numbers above it) of the consumption log: every number below the watermark and
        those listed were consumed."""
        with self._cond:
            return self._log.consumed.snapshot()

    def stats(self) -> dict[str, int]:
        return self.counters.snapshot()

    # ---- connection side -----------------------------------------------------------------------
    def serve(self, conn: _Conn) -> None:
        """Take the channel over for `conn`, answer its log query, then read its frames until it ends."""
        snapshot = self._take_over(conn)
        if snapshot is None:
            return
        w, above = snapshot
        try:
            send_control(conn.sock, LOG, conn.stamp_out, {"w": w, "above": above}, conn.seal)
            self._read_loop(conn)
        except (OSError, P2PGenError) as e:
            log.debug("channel %s -> %s: connection %d ended: %s", self.sender, self._me, conn.id, e)
        finally:
            self._retire(conn)
            conn.sock.close()

    def _take_over(self, conn: _Conn) -> tuple[int, list[int]] | None:
        with self._takeover:
            with self._cond:
                refusal = self._refusal(conn)
                if refusal is None:
                    self._retire_locked(self._conn)
                    if not self._cond.wait_for(lambda: self._in_hand is None, self.config.takeover_timeout):
                        refusal = ("busy", f"the application held {self._in_hand} for "
                                   f"{self.config.takeover_timeout}s")
                if refusal is None:
                    if self._log.owner != (conn.sender[1], conn.generation):
                        self._log.set_owner(conn.sender[1], conn.generation)
                    self._conn = conn
                    self.counters.add("takeovers")
                    return self._log.consumed.snapshot()
        self.counters.add(refusal[0])
        log.warning("channel %s -> %s: refused %s (%s): %s", self.sender, self._me, conn.sender, *refusal)
        try:
            send_control(conn.sock, LOG, conn.stamp_out, {"refused": refusal[0], "detail": refusal[1]}, conn.seal)
        except OSError:
            pass
        conn.sock.close()
        return None

    def _refusal(self, conn: _Conn) -> tuple[str, str] | None:
        owner_inc, owner_gen = self._log.owner
        if self._closed:
            return ("busy", "the receiver is closed")
        if conn.sender[1] < owner_inc:
            return ("superseded", f"incarnation {conn.sender[1]} of {self.sender} was superseded by "
                    f"incarnation {owner_inc}, which already took this channel over")
        if conn.generation < max(owner_gen, self._floor):
            return ("stale_generation", f"generation {conn.generation} is older than generation "
                    f"{max(owner_gen, self._floor)} already seen on this channel")
        return None

    def _read_loop(self, conn: _Conn) -> None:
        raw = bytearray(frame.HEADER_BYTES)
        while (slot := self._free_slot(conn)) is not None:
            try:
                h = self._read_frame(conn, raw, slot)
            except Rejected as e:
                self._release_now(slot)
                self.counters.add(e.reason)
                log.warning("channel %s -> %s: closing connection %d: %s", self.sender, self._me, conn.id, e)
                return
            except BaseException:
                self._release_now(slot)
                raise
            if h is None:
                self._release_now(slot)
            elif self._deliver(conn, h.op_seq, h.chunk, slot) and conn.mode != EXACTLY_ONCE:
                conn.ack(h.op_seq)    # naive/batched: completion means delivered

    def _read_frame(self, conn: _Conn, raw: bytearray, slot: Slot) -> frame.Header | None:
        """Receive one DATA frame into `slot` (marked empty first); None if it was dropped and counted."""
        read_exact(conn.sock, memoryview(raw))
        h = parse_header(raw, self.config.max_message_bytes)
        read_payload(lambda v: read_exact(conn.sock, v), raw, h, slot.prepare(h.length), conn.seal)
        if h.kind != DATA or h.job_tag != self._tag:
            raise Rejected("malformed", f"frame kind {h.kind} of job tag {h.job_tag} on a channel")
        if h.generation != conn.generation:
            self.counters.add("stale_generation")
            return None
        if h.incarnation != conn.sender[1]:
            self.counters.add("wrong_incarnation")
            return None
        return h

    def _free_slot(self, conn: _Conn) -> Slot | None:
        with self._cond:
            self._cond.wait_for(lambda: self._free or self._conn is not conn)
            return self._free.pop() if self._conn is conn else None

    def _deliver(self, conn: _Conn, seq: int, encoding: int, slot: Slot) -> bool:
        with self._cond:
            if self._conn is not conn:
                self.counters.add("purged")
                self._release(slot)
                return False
            slot.fill((conn.id, seq))
            self._ready.append((conn, seq, encoding, slot))
            self.counters.add("delivered")
            self._cond.notify_all()
            return True

    def _retire(self, conn: _Conn) -> None:
        with self._cond:
            self._retire_locked(conn)

    def _retire_locked(self, conn: _Conn | None) -> None:
        """Stop handing out `conn`'s messages: purge the delivered ones nobody took, wake its reader."""
        if conn is None:
            return
        if self._conn is conn:
            self._conn = None
        kept: deque = deque()
        for item in self._ready:
            if item[0] is conn:
                self.counters.add("purged")
                self._release(item[3])
            else:
                kept.append(item)
        self._ready = kept
        conn.shutdown()
        self._cond.notify_all()

    def _release(self, slot: Slot) -> None:
        slot.mark_empty()
        self._free.append(slot)

    def _release_now(self, slot: Slot) -> None:
        with self._cond:
            self._release(slot)
            self._cond.notify_all()

    def set_floor(self, generation: int) -> None:
        with self._cond:
            self._floor = max(self._floor, generation)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._retire_locked(self._conn)
        self._log.close()


class ChannelListener:
    """This process's channel endpoint: accepts senders of `job` and routes each to its receiver."""

    def __init__(self, job: str, secret: bytes, self_id: tuple[str, int], log_dir: str,
                 host: str = "127.0.0.1", port: int = 0, config: ChannelConfig | None = None) -> None:
        if not secret:
            raise ValueError("the job secret is empty: load it with p2pgen.auth.load_secret")
        self.job = job
        self.identity = (self_id[0], int(self_id[1]))
        self.log_dir = log_dir
        self.config = config or ChannelConfig()
        self.counters = Counters()
        self._key = auth.derive_key(secret, job, "channel")
        self._tag = frame.job_tag(job)
        self._lock = threading.Lock()
        self._receivers: dict[str, ChannelReceiver] = {}
        self._ids = count()
        self._generation = 0
        self._closed = False
        self._listener = Listener(host, port, self._serve, name=f"p2pgen-channel-{self_id[0]}", backlog=64).start()
        self.host, self.port = host, self._listener.address[1]

    def receiver(self, sender: str) -> ChannelReceiver:
        """The receiver of the channel `sender` -> this peer (opens its consumption log on first use)."""
        with self._lock:
            rx = self._receivers.get(sender)
            if rx is None:
                path = channel_path(self.log_dir, self.job, sender, self.identity[0])
                rx = self._receivers[sender] = ChannelReceiver(sender, path, self.identity[1], self._tag,
                                                               self.config)
                rx.set_floor(self._generation)
            return rx

    def on_generation(self, generation: int) -> None:
        """Refuse, from now on, senders that dial with a generation older than `generation` (I2)."""
        with self._lock:
            self._generation = max(self._generation, generation)
            receivers = list(self._receivers.values())
        for rx in receivers:
            rx.set_floor(generation)

    def stats(self) -> dict[str, int]:
        """Handshake refusals, plus every receiver's counters summed."""
        out = self.counters.snapshot()
        with self._lock:
            receivers = list(self._receivers.values())
        for rx in receivers:
            for k, v in rx.stats().items():
                out[k] += v
        return out

    def _serve(self, sock: socket.socket, _peer: tuple) -> None:
        """The accepted connection's thread (run by the Listener): authenticate, then serve its channel."""
        try:
            conn = self._open(sock)
        except handshake.HandshakeRejected as e:
            self.counters.add(e.reason if e.reason in COUNTERS else "malformed")
            handshake.refuse(sock, e)
            sock.close()
            return
        except (OSError, P2PGenError) as e:
            self.counters.add(e.reason if isinstance(e, Rejected) else "truncated")
            log.debug("channel handshake failed: %s", e)
            sock.close()
            return
        try:
            rx = self.receiver(conn.sender[0])
        except (LogBusy, OSError) as e:   # another receiver process, or an unwritable log directory
            log.error("channel from %s: cannot open its consumption log: %s", conn.sender[0], e)
            sock.close()
            return
        rx.serve(conn)

    def _open(self, sock: socket.socket) -> _Conn:
        _tune(sock, self.config.socket_buffer_bytes)
        sock.settimeout(self.config.handshake_timeout)
        hello = handshake.accept(sock, self._key, self.job, self.identity, lambda _hello: None, self.config.encrypt)
        sealed = Seal(hello.keys) if hello.keys is not None else None
        opening = recv_control(sock, OPEN, Stamp(self._tag, hello.generation, hello.dialer[1]), sealed)
        try:
            mode = check_mode(str(opening.get("mode")))
        except ValueError as e:
            raise Rejected("malformed", str(e)) from None
        sock.settimeout(None)
        return _Conn(next(self._ids), sock, hello, self.identity[1], self._tag, mode, sealed)

    def close(self) -> None:
        """Stop accepting, end every connection and close every log. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            receivers = list(self._receivers.values())
        self._listener.stop()
        for rx in receivers:           # ends their connections and wakes the threads waiting on them
            rx.close()
        self._listener.end(timeout=self.config.handshake_timeout)


def _tune(sock: socket.socket, buffer_bytes: int) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if buffer_bytes:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)

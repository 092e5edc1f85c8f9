"""One authenticated TCP connection of one generation: framed sends (on a sender thread) and verified
receives (on the caller's thread).

Who does what, and why: the caller's thread stamps and checksums every frame it posts and verifies every
frame it receives, right after producing or receiving the bytes, while they are still in cache (hashing a
cold MiB costs several times a hot one, and xxhash holds the GIL, so hashing on the sender thread would
stall the caller). The sender thread only runs blocking `sendmsg` calls, which release the GIL, so the
next frame streams out while the caller receives and reduces the current one, and the sends' kernel
copies run on another core beside the caller's receives, hashing and reductions. A receive sleeps until
a payload (or a quarter of the receive buffer of it) is queued whole, then copies it in one pass.

Invariants:
- A frame is delivered only if its checksum verifies and its stamp is exactly (job, generation, the
  peer's incarnation, the expected kind, op_seq and chunk). A frame of another generation or incarnation
  is dropped and counted (I2, I3); any other bad frame is counted and closes the connection.
- Receive slots: the destination is marked empty before each receive and marked full only after a frame
  verified into it, so a torn, stale or corrupt frame is never consumed as data.
- The socket is closed only after the sender thread has stopped, so no thread ever writes to a reused fd.
- On a sealed connection (`seal`, `--encrypt`) every frame is encrypted on the thread that writes it and
  decrypted before any check of its stamp; a frame that fails authentication or comes out of order is
  counted (`bad_seal`, `replayed`) and closes the connection like a bad checksum.
"""

from __future__ import annotations

import logging
import queue
import select
import socket
import struct
import threading
from collections.abc import Callable

import numpy as np
import xxhash

from p2pgen import faults
from p2pgen.errors import PeerLost, ProtocolError
from p2pgen.transport import frame, hooks
from p2pgen.transport.seal import Seal, SealError
from p2pgen.transport.stats import RejectCounters, WireCounters

log = logging.getLogger(__name__)

_DISCARD_BYTES = 1 << 20
_WAKE_ONCE_BYTES = 64 << 10      # payloads from this size on are waited for whole (see `_read_waking_once`)


class RecvSlot:
    """A destination for one frame's payload, with an explicit empty/full state."""

    __slots__ = ("view", "full", "stamp")

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.full = False
        self.stamp: tuple[int, int, int] | None = None

    def mark_empty(self) -> None:
        self.full = False
        self.stamp = None

    def fill(self, stamp: tuple[int, int, int]) -> None:
        self.full = True
        self.stamp = stamp

    def take(self, stamp: tuple[int, int, int]) -> memoryview:
        """The payload, if the slot holds the frame with `stamp` (kind, op_seq, chunk); empties the slot."""
        if not self.full or self.stamp != stamp:
            raise ProtocolError(f"receive slot holds {self.stamp if self.full else 'nothing'}, "
                                f"expected frame {stamp}: refusing to consume it")
        self.mark_empty()
        return self.view


class Connection:
    """A connected, handshaken socket bound to one generation and one remote (peer_id, incarnation)."""

    def __init__(self, sock: socket.socket, *, job: str, generation: int, my_incarnation: int,
                 peer: tuple[str, int], rank: int, max_frame_bytes: int, op_timeout: float | None,
                 counters: RejectCounters, on_error: Callable[[Exception], None],
                 addrs: tuple[str, str] | None = None, seal: Seal | None = None,
                 wake_once: bool = False, wire: WireCounters | None = None) -> None:
        self.sock = sock
        self._wire = wire if wire is not None else WireCounters()   # payload bytes and frames moved
        self._seal = seal              # None: frames go in the clear
        self._addrs = addrs            # (this end's, the peer's) data address, for injected partitions
        self.peer = peer
        self.rank = rank
        self.generation = generation
        self._tag = frame.job_tag(job)
        self._my_inc = my_incarnation
        self._max = max_frame_bytes
        self._counters = counters
        self._on_error = on_error
        self._hdr = bytearray(frame.HEADER_BYTES)
        self._discard = bytearray(min(_DISCARD_BYTES, max_frame_bytes))
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._posted = 0               # frames posted, and frames the sender thread is done with (handed to
        self._sent = 0                 # the kernel, or skipped after a send error), in post order
        self._send_error: Exception | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._poll_ms = -1 if op_timeout is None else int(op_timeout * 1000)
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN)
        self._wake_mark = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 4 if wake_once else 0
        _set_blocking_with_timeout(sock, op_timeout)
        self._sender = threading.Thread(target=self._send_loop, name=f"p2pgen-send-g{generation}-r{rank}",
                                        daemon=True)
        self._sender.start()

    def __repr__(self) -> str:
        return f"Connection(gen={self.generation}, rank={self.rank}, peer={self.peer})"

    @property
    def closed(self) -> bool:
        return self._closed

    # ---- sending -------------------------------------------------------------------------------
    def post(self, kind: int, op_seq: int, chunk: int, payload: np.ndarray, inline: bool = False,
             digest: int | None = None) -> int:
        """Send one frame: queued for the sender thread, or (`inline`) on the caller's thread. Returns the
        frame's ticket: once `is_sent(ticket)`, the payload may change.

        The frame is stamped and checksummed here; `digest` (only the one `recv_into` returned for exactly
        these bytes, or None to hash them now) spares a second pass over forwarded bytes. A queued
        `payload` (uint8, contiguous) must stay unchanged until `is_sent(ticket)` or `flush()` returned.
        Send inline only while nothing is queued and the bytes in flight fit the socket buffers, or a ring
        deadlocks.
        """
        header = frame.pack_header(kind, self._tag, self.generation, self._my_inc, op_seq, chunk, payload,
                                   digest if self._seal is None else frame.SEALED_DIGEST)
        self._posted += 1
        ticket = self._posted
        if not inline:
            self._queue.put((header, payload))
        else:
            if self._send_error is None:
                self._send_one(header, payload)
            self._sent += 1
            if self._send_error is not None:
                raise self._send_error
        self._wire.sent(payload.nbytes)
        hooks.frame_moved(hooks.COLLECTIVE, "posted", kind, op_seq, chunk, payload.nbytes, self.peer)
        return ticket

    @property
    def idle(self) -> bool:
        """Whether the sender thread has no frame queued or in flight, so that an inline send now cannot
        interleave with one of its sends."""
        return self._sent == self._posted

    def is_sent(self, ticket: int) -> bool:
        """Whether the sender thread is done with frame `ticket` (and every frame posted before it), so its
        payload buffer may change. Never blocks: a caller that waited here for its own sender could close a
        ring of members each waiting for the next to receive."""
        return self._sent >= ticket

    def flush(self) -> None:
        """Wait until every posted frame was handed to the kernel; raises the send error, if any."""
        if self._sent != self._posted:
            done = threading.Event()
            self._queue.put(done)
            done.wait()
        if self._send_error is not None:
            raise self._send_error

    def _send_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            if self._send_error is None:
                self._send_one(*item)
            self._sent += 1          # only this thread writes it once the connection is in use

    def _send_one(self, header: bytes, payload: np.ndarray) -> None:
        try:
            if self._addrs is not None and faults.cut(*self._addrs):
                self.shutdown()            # the peer's receive fails too, as when a route goes away
                raise ConnectionResetError(f"partitioned from {self._addrs[1]} (fault injected through "
                                           f"${faults.ENV})")
            sendmsg_all(self.sock, [header, memoryview(payload)] if self._seal is None
                        else self._seal.seal_frame(header, payload))
        except OSError as e:
            self._send_error = PeerLost(f"sending to {self._who()} failed: {e!r}")
            self._on_error(self._send_error)

    # ---- receiving -----------------------------------------------------------------------------
    def recv_into(self, slot: RecvSlot, kind: int, op_seq: int, chunk: int) -> int:
        """Fill `slot` with the next frame stamped (kind, op_seq, chunk) of this generation; returns the
        verified payload digest (pass it to `post` to forward these bytes unchanged; a sealed connection
        returns `frame.SEALED_DIGEST`, which its `post` ignores).

        Frames of another generation or incarnation are dropped and counted; any other mismatch is
        counted, closes the connection and raises ProtocolError. A closed peer raises PeerLost.
        """
        slot.mark_empty()
        while True:
            h = self._read_header()
            ours = h.generation == self.generation and h.incarnation == self.peer[1]
            expected = ours and (h.kind, h.op_seq, h.chunk, h.length) == (kind, op_seq, chunk, len(slot.view))
            payload_digest = self._read_payload(h, slot.view if expected else None)
            self._check_frame(h, frame.verify_digest(self._hdr, payload_digest, h))
            if h.generation != self.generation:
                self._drop("stale_generation", f"frame of generation {h.generation} on a generation "
                           f"{self.generation} connection")
                continue
            if h.incarnation != self.peer[1]:
                self._drop("wrong_incarnation", f"frame of incarnation {h.incarnation}, "
                           f"peer is incarnation {self.peer[1]}")
                continue
            if not expected:
                self._fatal("malformed", f"got frame kind={h.kind} op_seq={h.op_seq} chunk={h.chunk} of "
                            f"{h.length} bytes, expected kind={kind} op_seq={op_seq} chunk={chunk} of "
                            f"{len(slot.view)} bytes: do all members call the same collectives, in the same "
                            "order, with the same shapes and dtypes?")
            slot.fill((kind, op_seq, chunk))
            self._wire.received(h.length)
            hooks.frame_moved(hooks.COLLECTIVE, "received", kind, op_seq, chunk, h.length, self.peer)
            return payload_digest

    def peek_header(self) -> frame.Header | None:
        """The header of the next frame if all of it has arrived, without consuming it (None: not yet, or the
        peer closed; the next `recv_into` then tells which). A malformed header closes the connection."""
        try:
            raw = self.sock.recv(frame.HEADER_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as e:
            raise PeerLost(f"receiving from {self._who()} failed: {e!r}") from e
        if len(raw) < frame.HEADER_BYTES:
            return None
        try:
            return frame.unpack_header(raw)
        except ValueError as e:
            self._fatal("malformed", str(e))

    def readable(self, timeout: float) -> bool:
        """Whether bytes (or the peer's close) can be read within `timeout` seconds, without reading them."""
        try:
            ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        except (OSError, ValueError) as e:
            raise PeerLost(f"waiting for {self._who()} failed: {e!r}") from e
        return bool(ready)

    def _read_header(self) -> frame.Header:
        self._read_exact(memoryview(self._hdr), start_of_frame=True)
        try:
            h = frame.unpack_header(self._hdr)
        except ValueError as e:
            self._fatal("malformed", str(e))
        if h.length > self._max:
            self._fatal("oversized", f"frame of {h.length} bytes exceeds max_frame_bytes={self._max}")
        return h

    def _read_payload(self, h: frame.Header, dest: memoryview | None) -> int:
        """Read the payload (into dest, or discarded) and return its digest. A payload for `dest` (only a
        frame that will be delivered: its stamp and length are the expected ones) is waited for and read in
        as few pieces as the receive buffer allows (`_read_waking_once`), then hashed in one call; a
        discarded one is read in pieces and hashed as a stream."""
        if self._seal is not None:
            try:
                self._seal.open_frame(self._hdr, h.length, self._read_exact, dest)
            except SealError as e:
                self._fatal(e.reason, e.detail)
            return frame.SEALED_DIGEST
        if dest is not None:
            self._read_waking_once(dest)
            return xxhash.xxh3_64_intdigest(dest)
        hasher = xxhash.xxh3_64()
        left = h.length
        while left:
            piece = memoryview(self._discard)[:min(left, len(self._discard))]
            self._read_exact(piece)
            hasher.update(piece)
            left -= len(piece)
        return hasher.intdigest()

    def _read_waking_once(self, dest: memoryview) -> None:
        """Read a payload into `dest` in pieces of at most `_wake_mark` bytes, sleeping until each piece is
        queued whole (SO_RCVLOWAT, then one poll), so that each is copied in one pass. A plain MSG_WAITALL
        receive wakes every few skbs (measured on loopback: 2.4 wake-ups per MiB against 0.3, and about
        30 % more kernel CPU on both ends). The mark is a quarter of the receive buffer, so the window stays
        open while a piece waits and is copied; it is back at one byte before any receive that may wait (a
        receive that copied part of a frame and then waits is woken only by a mark's worth of new bytes)."""
        mark = self._wake_mark
        if not mark or len(dest) < _WAKE_ONCE_BYTES:
            self._read_exact(dest)
            return
        try:
            for lo in range(0, len(dest), mark):
                piece = dest[lo:lo + mark]
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, len(piece))
                if not self._poller.poll(self._poll_ms):
                    raise PeerLost(f"receiving from {self._who()} failed: nothing within "
                                   f"{self._poll_ms / 1000:g} s")
                self._read_exact(piece)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
        except OSError as e:
            raise PeerLost(f"receiving from {self._who()} failed: {e!r}") from e

    def _check_frame(self, h: frame.Header, checksum_ok: bool) -> None:
        if not checksum_ok:
            self._fatal("bad_checksum", f"checksum mismatch in frame op_seq={h.op_seq} chunk={h.chunk}")
        if h.job_tag != self._tag:
            self._fatal("malformed", "frame of another job")

    def _read_exact(self, view: memoryview, start_of_frame: bool = False) -> None:
        got, n = 0, len(view)
        while got < n:
            try:
                k = self.sock.recv_into(view[got:] if got else view, n - got, socket.MSG_WAITALL)
            except OSError as e:
                raise PeerLost(f"receiving from {self._who()} failed: {e!r}") from e
            if k == 0:
                if got == 0 and start_of_frame:
                    raise PeerLost(f"{self._who()} closed the connection")
                self._counters.add("truncated")
                log.warning("%s: truncated frame (%d of %d bytes), closing", self._who(), got, n)
                self.shutdown()
                raise PeerLost(f"{self._who()} closed the connection in the middle of a frame (truncated)")
            got += k

    def _drop(self, reason: str, detail: str) -> None:
        self._counters.add(reason)
        log.warning("%s: dropped frame (%s): %s", self._who(), reason, detail)

    def _fatal(self, reason: str, detail: str):
        self._counters.add(reason)
        log.warning("%s: closing connection (%s): %s", self._who(), reason, detail)
        self.shutdown()
        raise ProtocolError(f"frame from {self._who()} rejected ({reason}): {detail}; connection closed")

    def _who(self) -> str:
        return f"{self.peer[0]} (incarnation {self.peer[1]}, rank {self.rank}, generation {self.generation})"

    # ---- teardown ------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Wake every thread blocked on this socket; safe from any thread, any number of times."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self, timeout: float) -> bool:
        """Shut down, stop the sender thread and close the socket; True if the sender stopped in time."""
        with self._lock:
            if self._closed:
                return True
            self._closed = True
        self.shutdown()
        self._queue.put(None)
        self._sender.join(timeout)
        stopped = not self._sender.is_alive()
        if stopped:
            self.sock.close()
        return stopped


def _set_blocking_with_timeout(sock: socket.socket, timeout: float | None) -> None:
    """Blocking mode, so one recv (MSG_WAITALL) or sendmsg moves a whole frame without a poll per call;
    the backstop timeout goes to the kernel (SO_RCVTIMEO / SO_SNDTIMEO) and surfaces as an OSError."""
    sock.settimeout(None)
    if timeout is not None:
        tv = struct.pack("ll", int(timeout), int((timeout % 1) * 1e6))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def sendmsg_all(sock: socket.socket, buffers: list) -> None:
    """sendmsg until every byte of `buffers` is on its way (a partial send resumes mid-buffer)."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        sent = sock.sendmsg(views)
        while sent:
            if sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0

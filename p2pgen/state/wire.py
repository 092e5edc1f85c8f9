"""State-transfer wire format, on a connection authenticated by `p2pgen.transport.handshake` with the
job's "state" key (I8).

After the handshake the puller sends requests (4-byte big-endian length + msgpack map, at most
MAX_REQUEST bytes) and the source answers with `p2pgen.transport.frame` frames stamped
(job, generation being formed, source incarnation, op_seq, chunk):

    {"op": "manifest"}                          -> MANIFEST frame, payload msgpack(Manifest.to_wire())
    {"op": "objects"}                           -> OBJECTS frame, payload the pickled objects
    {"op": "get", "t": i, "first": c, "count": n, "cb": chunk_bytes}
                                                -> n CHUNK frames, op_seq i (index of the tensor in the
                                                   manifest), chunk c..c+n-1, each cb bytes (last: the rest)
    any refusal                                 -> ERROR frame, payload msgpack {"reason", "detail"}; closed

On a sealed connection (`--encrypt`: the handshake agreed on it and keyed it, `p2pgen.transport.seal`)
every request is a sealed message and every frame a sealed frame, in both directions.

Invariant: a frame is accepted only if its length is within bound and equals the one expected, its
checksum verifies (and, sealed, its tag and counter) and its stamp is exactly the expected (job,
generation, incarnation, kind, op_seq, chunk); otherwise the connection is dropped and the refusal counted
under one reason.
"""

from __future__ import annotations

import socket
import struct
import threading

import msgpack

from p2pgen.errors import P2PGenError, PeerLost, ProtocolError
from p2pgen.transport import frame, hooks
from p2pgen.transport.seal import OVERHEAD, Seal, SealError

MANIFEST, OBJECTS, CHUNK, ERROR = 16, 17, 18, 19   # frame kinds; the data plane uses 1 and 2
MAX_REQUEST = 64 << 10
KEY_PURPOSE = "state"
_LEN = struct.Struct(">I")

REASONS = ("auth_failed", "not_member", "wrong_incarnation", "stale_generation", "not_serving", "mutated",
           "malformed", "oversized", "truncated", "bad_checksum", "digest_mismatch", "wrong_frontier", "bad_seal",
           "replayed", "encryption_mismatch")


class StateSyncError(P2PGenError):
    """A state pull could not reach the frontier digest; the message says which source and why.

    `changed` names the tensors the pull had already written (in place, or installed) when it failed:
    when it is not empty the state is a mix of its old revision and the frontier, and must not be
    reported as either (a peer goes back to its local copy, or restarts as a new incarnation)."""

    changed: tuple[str, ...] = ()


class DigestMismatch(StateSyncError):
    """Received bytes did not hash to the digest the source's manifest promised."""


class Refused(Exception):
    """A request refused by a source; `reason` is one of REASONS."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class Counters:
    """Refusals by reason; thread safe. Every refusal is counted exactly once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(REASONS, 0)

    def add(self, reason: str) -> None:
        with self._lock:
            self._counts[reason] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def chunk_count(nbytes: int, chunk_bytes: int) -> int:
    """Chunks of a tensor of `nbytes` (an empty tensor still has one, empty, chunk)."""
    return max(1, -(-nbytes // chunk_bytes))


def send_request(sock: socket.socket, msg: dict, seal: Seal | None = None) -> None:
    body = msgpack.packb(msg)
    sock.sendall(_LEN.pack(len(body)) + body if seal is None else seal.seal_message(body))


def recv_request(sock: socket.socket, seal: Seal | None = None) -> dict | None:
    """The next request (a sealed message when `seal` is given), or None if the puller closed the connection
    between requests."""
    head = recv_exact(sock, _LEN.size, eof_ok=True)
    if head is None:
        return None
    (n,) = _LEN.unpack(head)
    if n > MAX_REQUEST + (OVERHEAD if seal is not None else 0):
        raise Refused("oversized", f"request of {n} bytes (limit {MAX_REQUEST})")
    try:
        body = recv_exact(sock, n) if seal is None else seal.open_message(n, lambda v: recv_exact(sock, n, v))
    except SealError as e:
        raise Refused(e.reason, f"request: {e.detail}") from None
    try:
        msg = msgpack.unpackb(body)
    except (ValueError, msgpack.UnpackException) as e:
        raise Refused("malformed", f"request is not msgpack: {e}") from e
    if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
        raise Refused("malformed", "request is not a map with an 'op'")
    return msg


def recv_exact(sock: socket.socket, n: int, into: memoryview | None = None, eof_ok: bool = False):
    """Read exactly n bytes (into `into` when given). EOF before the first byte returns None if eof_ok;
    any other EOF raises Refused("truncated")."""
    view = into if into is not None else memoryview(bytearray(n))
    got = 0
    while got < n:     # MSG_WAITALL: one wake-up and one GIL hand-off per frame, not one per skb
        k = sock.recv_into(view[got:] if got else view, n - got, socket.MSG_WAITALL)
        if k == 0:
            if got == 0 and eof_ok:
                return None
            raise Refused("truncated", f"connection closed after {got} of {n} bytes")
        got += k
    return view if into is not None else bytes(view)


class FrameSender:
    """The source's side: frames stamped with the job, generation and the source's incarnation."""

    def __init__(self, sock: socket.socket, job: str, generation: int, incarnation: int,
                 seal: Seal | None = None) -> None:
        self.sock = sock
        self.seal = seal
        self._stamp = (frame.job_tag(job), generation, incarnation)

    def send(self, kind: int, op_seq: int, chunk: int, payload, payload_digest: int | None = None) -> None:
        """Send one frame; pass `payload_digest` only if it is the xxh3-64 of exactly these bytes (as
        computed earlier): it then goes into the checksum without hashing the payload again (a sealed frame
        carries no digest)."""
        tag, gen, inc = self._stamp
        if self.seal is not None:
            header = frame.pack_header(kind, tag, gen, inc, op_seq, chunk, payload, frame.SEALED_DIGEST)
            views = [memoryview(b).cast("B") for b in self.seal.seal_frame(header, payload)]
        else:
            header = frame.pack_header(kind, tag, gen, inc, op_seq, chunk, payload, payload_digest)
            views = [memoryview(header), memoryview(payload).cast("B")]
        while views:
            sent = self.sock.sendmsg(views)
            while sent and views:
                k = min(sent, len(views[0]))
                views[0] = views[0][k:]
                sent -= k
                if not len(views[0]):
                    views.pop(0)

    def refuse(self, reason: str, detail: str) -> None:
        """Tell the puller why (best effort), before the connection closes."""
        try:
            self.send(ERROR, 0, 0, msgpack.packb({"reason": reason, "detail": detail}))
        except OSError:
            pass


class FrameReceiver:
    """The puller's side: checks every frame against the expected stamp before anyone uses it."""

    def __init__(self, sock: socket.socket, job: str, generation: int, source: tuple[str, int],
                 max_frame_bytes: int, counters: Counters, plane: str = hooks.STATE,
                 seal: Seal | None = None) -> None:
        self.sock = sock
        self.seal = seal
        self.source = source
        self.plane = plane             # what the frames are for, as frame hooks are told (state or shard pull)
        self._stamp = (frame.job_tag(job), generation, source[1])
        self._max = max_frame_bytes
        self._counters = counters
        self._hdr = bytearray(frame.HEADER_BYTES)

    def request(self, msg: dict) -> None:
        """Send the source a request on this connection (sealed if the connection is)."""
        send_request(self.sock, msg, self.seal)

    def recv(self, kind: int, op_seq: int, chunk: int, into: memoryview | None = None) -> memoryview | bytes:
        """The payload of the next frame, which must be (kind, op_seq, chunk) and, with `into`, exactly
        len(into) bytes, read straight into it. Raises ProtocolError (counted) or PeerLost."""
        return self.recv_verified(kind, op_seq, chunk, into)[0]

    def recv_verified(self, kind: int, op_seq: int, chunk: int,
                      into: memoryview | None = None) -> tuple[memoryview | bytes, int]:
        """`recv`, and the payload's digest (xxh3-64) that the frame's checksum verified."""
        try:
            payload, payload_digest = self._recv(kind, op_seq, chunk, into)
        except Refused as e:
            self._counters.add(e.reason)
            raise PeerLost(f"state source {self.source} closed the connection ({e.detail})") from e
        except OSError as e:
            raise PeerLost(f"receiving state from {self.source} failed: {e!r}") from e
        hooks.frame_moved(self.plane, "received", kind, op_seq, chunk, len(payload), self.source)
        return payload, payload_digest

    def _recv(self, kind: int, op_seq: int, chunk: int, into: memoryview | None):
        recv_exact(self.sock, len(self._hdr), memoryview(self._hdr))
        try:
            h = frame.unpack_header(self._hdr)
        except ValueError as e:
            self._fail("malformed", str(e))
        if h.length > self._max:
            self._fail("oversized", f"frame of {h.length} bytes exceeds max_frame_bytes={self._max}")
        if h.kind == ERROR:
            self._source_refused(h)
        if into is not None and h.length != len(into):
            self._fail("malformed", f"frame of {h.length} bytes where {len(into)} were expected")
        payload = self._payload(h, into)
        payload_digest = frame.digest(payload)
        if not frame.verify_digest(self._hdr, payload_digest if self.seal is None else frame.SEALED_DIGEST, h):
            self._fail("bad_checksum", f"checksum mismatch in frame op_seq={h.op_seq} chunk={h.chunk}")
        got = (h.job_tag, h.generation, h.incarnation, h.kind, h.op_seq, h.chunk)
        want = (*self._stamp, kind, op_seq, chunk)
        if got != want:
            reason = "stale_generation" if h.generation != self._stamp[1] else (
                "wrong_incarnation" if h.incarnation != self._stamp[2] else "malformed")
            self._fail(reason, f"frame stamped (job_tag, gen, inc, kind, op_seq, chunk)={got}, expected {want}")
        return payload, payload_digest

    def _payload(self, h: frame.Header, into: memoryview | None):
        """The frame's payload (into `into` when given), decrypted and authenticated on a sealed connection."""
        if self.seal is None:
            return recv_exact(self.sock, h.length, into)
        try:
            return self.seal.open_frame(self._hdr, h.length, lambda v: recv_exact(self.sock, len(v), v), into)
        except SealError as e:
            self._fail(e.reason, e.detail)

    def _source_refused(self, h: frame.Header):
        body = bytes(self._payload(h, None))
        try:
            msg = msgpack.unpackb(body)
            reason, detail = str(msg["reason"]), str(msg["detail"])
        except (ValueError, TypeError, KeyError, msgpack.UnpackException):
            reason, detail = "malformed", "unreadable refusal"
        raise ProtocolError(f"state source {self.source} refused: {reason}: {detail}")

    def _fail(self, reason: str, detail: str):
        self._counters.add(reason)
        raise ProtocolError(f"state frame of generation {self._stamp[1]} from {self.source} rejected ({reason}): "
                            f"{detail}")

"""Channel wire format: the transport's frame header (stamp, sequence number, checksum, bounded length)
with four channel frame kinds, payload encodings, and receive slots.

After the transport handshake (`p2pgen.transport.handshake`, I8) one connection carries:
    sender -> OPEN  {mode}                               msgpack payload
    receiver -> LOG {w, above} | {refused, detail}       msgpack payload: the consumption log, or why not
    sender -> DATA  op_seq=sequence number, chunk=encoding, payload = the message
    receiver -> ACK op_seq=sequence number (delivered in naive/batched modes, consumed in exactly_once)
Every frame's header carries the stamp (job tag, generation, sender's or receiver's incarnation, op_seq)
and an xxh3 checksum over header and payload, so a torn frame (half new, half old) never verifies.

On a sealed connection (`--encrypt`, keyed by the handshake: `p2pgen.transport.seal`) every frame, in both
directions, is a sealed frame: its payload encrypted, header and payload authenticated, in counter order.

Invariant: a receive slot is marked empty before each receive and full only after its frame verified; a
message is read from a slot only while the slot is full and holds that message's stamp.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

import msgpack
import numpy as np

from p2pgen.errors import PeerLost, ProtocolError
from p2pgen.transport import frame
from p2pgen.transport.connection import sendmsg_all
from p2pgen.transport.seal import OVERHEAD, Seal, SealError

OPEN, LOG, DATA, ACK = 16, 17, 18, 19     # frame kinds; the transport's own kinds are 1 and 2
RAW, ARRAY = 0, 1                          # DATA encodings, carried in the header's `chunk` field
MAX_CONTROL = 1 << 20                      # OPEN and LOG payloads (LOG lists numbers above the watermark)
_META = struct.Struct("<H")


@dataclass(frozen=True)
class Stamp:
    """What a frame claims: (job tag, generation, incarnation of its writer)."""
    tag: int
    generation: int
    incarnation: int


def encode(payload) -> tuple[int, bytes | bytearray]:
    """(encoding, bytes to send) for bytes-like objects, numpy arrays and CPU torch tensors (copied)."""
    if hasattr(payload, "numpy") and not isinstance(payload, np.ndarray):
        payload = payload.detach().cpu().numpy()
    if isinstance(payload, np.ndarray):
        arr = np.ascontiguousarray(payload)
        meta = msgpack.packb([arr.dtype.str, list(arr.shape)])
        out = bytearray(_META.size + len(meta) + arr.nbytes)
        _META.pack_into(out, 0, len(meta))
        out[_META.size:_META.size + len(meta)] = meta
        out[_META.size + len(meta):] = arr.reshape(-1).view(np.uint8).data
        return ARRAY, out
    return RAW, bytes(payload)


def decode_array(view: memoryview) -> np.ndarray:
    """The array an ARRAY payload holds (a view onto `view`, no copy)."""
    (n,) = _META.unpack_from(view)
    dtype, shape = msgpack.unpackb(view[_META.size:_META.size + n])
    return np.frombuffer(view[_META.size + n:], dtype=np.dtype(dtype)).reshape(shape)


def write_frame(sock: socket.socket, kind: int, stamp: Stamp, op_seq: int, chunk: int, payload,
                seal: Seal | None = None) -> None:
    """Write one frame (sealed when `seal` is given: one writer per connection at a time)."""
    if seal is None:
        header = frame.pack_header(kind, stamp.tag, stamp.generation, stamp.incarnation, op_seq, chunk, payload)
        sendmsg_all(sock, [header, payload])
        return
    header = frame.pack_header(kind, stamp.tag, stamp.generation, stamp.incarnation, op_seq, chunk, payload,
                               frame.SEALED_DIGEST)
    sendmsg_all(sock, seal.seal_frame(header, payload))


def send_control(sock: socket.socket, kind: int, stamp: Stamp, body: dict, seal: Seal | None = None) -> None:
    write_frame(sock, kind, stamp, 0, 0, msgpack.packb(body), seal)


def frame_bytes(length: int, seal: Seal | None) -> int:
    """Bytes on the wire of a frame with `length` payload bytes."""
    return frame.HEADER_BYTES + length + (OVERHEAD if seal is not None else 0)


def read_payload(read: Callable[[memoryview], None], raw, h: frame.Header, view: memoryview,
                 seal: Seal | None) -> None:
    """Read (with `read`, which fills a view) the payload of the frame whose header `raw` was read into `view`,
    decrypted if sealed, and check it; Rejected("bad_checksum" / "bad_seal" / "replayed") if it does not
    verify."""
    if seal is None:
        read(view)
        if not frame.verify(raw, view, h):
            raise Rejected("bad_checksum", f"frame kind {h.kind} op_seq {h.op_seq}: checksum mismatch (a torn or "
                                           "corrupt frame)")
        return
    try:
        seal.open_frame(raw, h.length, read, view)
    except SealError as e:
        raise Rejected(e.reason, f"frame kind {h.kind} op_seq {h.op_seq} of generation {h.generation}: "
                                 f"{e.detail}") from None
    if not frame.verify_digest(raw, frame.SEALED_DIGEST, h):
        raise Rejected("bad_checksum", f"frame kind {h.kind} op_seq {h.op_seq}: header checksum mismatch")


def recv_control(sock: socket.socket, kind: int, stamp: Stamp, seal: Seal | None = None) -> dict:
    """Read one control frame of `kind` stamped exactly `stamp`; Rejected (a ProtocolError, with the reason
    to count it under) on anything else: a replayed frame of another generation or incarnation says so."""
    raw = bytearray(frame.HEADER_BYTES)
    read_exact(sock, memoryview(raw))
    h = parse_header(raw, MAX_CONTROL)
    body = bytearray(h.length)
    read_payload(lambda v: read_exact(sock, v), raw, h, memoryview(body), seal)
    got = Stamp(h.job_tag, h.generation, h.incarnation)
    if h.kind != kind or got != stamp:
        reason = ("malformed" if h.kind != kind or got.tag != stamp.tag else
                  "stale_generation" if got.generation != stamp.generation else "wrong_incarnation")
        raise Rejected(reason, f"expected control frame kind {kind} stamped {stamp}, got kind {h.kind} "
                               f"stamped ({h.job_tag}, {h.generation}, {h.incarnation})")
    try:
        msg = msgpack.unpackb(bytes(body))
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise Rejected("malformed", f"control frame is not msgpack: {e}") from None
    if not isinstance(msg, dict):
        raise Rejected("malformed", f"control frame holds a {type(msg).__name__}, not a map")
    return msg


def parse_header(raw, max_length: int) -> frame.Header:
    """Unpack a header; Rejected if it is malformed or announces more than `max_length` bytes."""
    try:
        h = frame.unpack_header(raw)
    except ValueError as e:
        raise Rejected("malformed", str(e)) from None
    if h.length > max_length:
        raise Rejected("oversized", f"frame of {h.length} bytes exceeds the bound of {max_length}")
    return h


class Rejected(ProtocolError):
    """A frame the receiver refuses; `reason` names the counter it goes under."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def read_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill `view` from `sock`. PeerLost if the peer closed before the first byte, Rejected("truncated")
    if it closed in the middle."""
    got, n = 0, len(view)
    while got < n:
        try:
            k = sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)
        except OSError as e:
            raise PeerLost(f"connection failed: {e!r}") from e
        if k == 0:
            if got == 0:
                raise PeerLost("peer closed the connection")
            raise Rejected("truncated", f"peer closed the connection after {got} of {n} bytes")
        got += k


class Slot:
    """A receive buffer with an explicit empty/full state and the stamp of the message it holds."""

    __slots__ = ("buf", "length", "full", "key")

    def __init__(self) -> None:
        self.buf = bytearray(0)
        self.length = 0
        self.full = False
        self.key: tuple[int, int] | None = None     # (connection id, sequence number)

    def prepare(self, length: int) -> memoryview:
        """Mark empty, then return a view of `length` bytes to receive into."""
        self.mark_empty()
        if len(self.buf) < length:
            self.buf = bytearray(length)
        self.length = length
        return memoryview(self.buf)[:length]

    def mark_empty(self) -> None:
        self.full = False
        self.key = None

    def fill(self, key: tuple[int, int]) -> None:
        self.full = True
        self.key = key

    def view(self, key: tuple[int, int]) -> memoryview:
        if not self.full or self.key != key:
            raise ProtocolError(f"receive slot holds {self.key if self.full else 'nothing'}, expected "
                                f"message {key}: refusing to consume it")
        return memoryview(self.buf)[:self.length]

"""Sealed links (`--encrypt`): AES-256-GCM over every frame of a data-plane, state-transfer or channel
connection, keyed per connection from the job secret and both handshake nonces.

Owns: the key schedule, the sealed frame layout and the per-direction counters.

Keys: once a handshake (`p2pgen.transport.handshake`) proved the job secret both ways, each side runs
HKDF-SHA256 over the plane's job key (`auth.derive_key(secret, job, purpose)`), salted with the dialer's
and the listener's nonce (16 fresh random bytes each) and labelled with the connection's binding (job,
generation, dialer and listener identities), into two 256-bit keys: one per direction. Every connection,
so every generation, has keys of its own.

Layout of a sealed frame, after the usual 56-byte frame header (`p2pgen.transport.frame`), which stays in
the clear so that a receiver can bound and route the frame, and is bound as associated data:

    counter u64 LE | ciphertext (header.length bytes) | tag (16 bytes)

A sealed message (a state request: no frame header) is `length u32 BE | counter | ciphertext | tag`, the
length bound as associated data. The AEAD nonce is the counter (12 bytes, little endian). A sealed frame
carries no payload digest: its header checksum covers the header alone (`frame.SEALED_DIGEST`), since the
tag covers header and payload, and a digest in the clear would let an eavesdropper test guesses of the
payload.

Invariants:
- A nonce is never used twice under one key: each direction's counter starts at 0 and goes up by one per
  sealed frame or message; a connection never outlives its generation, and a new one has new keys.
- A receiver accepts exactly the next counter, and only a frame whose tag verifies: a changed byte (header,
  counter, payload or tag), a replayed, reordered or dropped frame, or a sender with another key fails
  with `SealError` (reason `replayed` or `bad_seal`), which the caller counts and fails the connection on.
- One writer and one reader per direction at a time (the connection's own rule: frames leave in order):
  sealing reuses one output buffer, opening one input buffer.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

ENV = "P2PGEN_ENCRYPT"                        # "1": the application's links are sealed (the agent sets it)
CIPHER = "aes-256-gcm"
INFO = b"p2pgen-seal/1"
TAG_BYTES = 16
_COUNTER = struct.Struct("<Q")
_LEN = struct.Struct(">I")
OVERHEAD = _COUNTER.size + TAG_BYTES          # bytes a sealed frame adds to its payload
REASONS = ("bad_seal", "replayed")            # the counters a failed frame goes under

Read = Callable[[memoryview], None]           # fills the view from the connection, or raises


def from_env(environ: Mapping[str, str]) -> bool:
    """Whether $P2PGEN_ENCRYPT asks for sealed links ("1"; unset, empty or "0": not).

    Raises:
        ValueError: any other value.
    """
    value = environ.get(ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"${ENV}={value!r}: use 1 to encrypt the links, 0 (or unset) not to")
    return value == "1"


class SealError(Exception):
    """A sealed frame or message that must not be used; `reason` is one of REASONS."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class LinkKeys:
    """The two keys of one connection, as one end sees them: what it seals with, what it opens with."""

    send: bytes = field(repr=False)
    recv: bytes = field(repr=False)


def derive_link_keys(key: bytes, binding: tuple[bytes, ...], dialer_nonce: bytes, listener_nonce: bytes,
                     dialer: bool) -> LinkKeys:
    """The connection's keys for the dialer (`dialer=True`) or the listener.

    Args:
        key: the plane's job key (`auth.derive_key(secret, job, purpose)`), the one the handshake proved.
        binding: the handshake's binding (job, generation, dialer and listener identities).
        dialer_nonce, listener_nonce: the two fresh nonces of the handshake.
        dialer: which end asks.
    Raises:
        ValueError: a nonce is empty (a handshake without fresh nonces must not key a link).
    """
    if not dialer_nonce or not listener_nonce:
        raise ValueError("sealed links need both handshake nonces: this handshake carried none")
    info = INFO + b"".join(len(part).to_bytes(4, "big") + part for part in binding)
    okm = HKDF(algorithm=hashes.SHA256(), length=64, salt=dialer_nonce + listener_nonce, info=info).derive(key)
    to_listener, to_dialer = okm[:32], okm[32:]
    return LinkKeys(to_listener, to_dialer) if dialer else LinkKeys(to_dialer, to_listener)


def _nonce(counter: int) -> bytes:
    return counter.to_bytes(12, "little")


class Seal:
    """Both directions of one sealed connection: `seal_*` on the writing side, `open_*` on the reading side."""

    def __init__(self, keys: LinkKeys) -> None:
        self._tx = AESGCM(keys.send)
        self._rx = AESGCM(keys.recv)
        self._sent = 0
        self._received = 0
        self._lock = threading.Lock()
        self._out = bytearray(0)
        self._in = bytearray(0)

    @property
    def counters(self) -> tuple[int, int]:
        """(frames sealed, frames opened) so far."""
        return self._sent, self._received

    # ---- writing -----------------------------------------------------------------------------------
    def seal_frame(self, header: bytes, payload) -> list:
        """The buffers to write for one frame: `header` (sent as is) and the sealed payload. The second buffer
        is reused by the next call: write it before sealing again.

        Args:
            header: the frame's packed header (its checksum made with `frame.SEALED_DIGEST`).
            payload: the frame's payload, any contiguous bytes-like object.
        """
        data = memoryview(payload).cast("B")
        n = len(data)
        out = self._buffer_out(n + OVERHEAD)
        counter = self._next_counter()
        _COUNTER.pack_into(out, 0, counter)
        self._tx.encrypt_into(_nonce(counter), data, header, out[_COUNTER.size:])
        return [header, out]

    def seal_message(self, body: bytes) -> bytes:
        """A whole sealed message (length, counter, ciphertext, tag) for a stream without frame headers."""
        counter = self._next_counter()
        length = _LEN.pack(len(body) + OVERHEAD)
        return length + _COUNTER.pack(counter) + self._tx.encrypt(_nonce(counter), body, length)

    def _next_counter(self) -> int:
        with self._lock:
            counter, self._sent = self._sent, self._sent + 1
        return counter

    def _buffer_out(self, n: int) -> memoryview:
        if len(self._out) < n:
            self._out = bytearray(n)
        return memoryview(self._out)[:n]

    # ---- reading -----------------------------------------------------------------------------------
    def open_frame(self, header, length: int, read: Read, dest: memoryview | None = None) -> memoryview:
        """Read the sealed payload of a frame whose `header` (raw bytes) announced `length` bytes, verify it and
        decrypt it into `dest` (exactly `length` bytes; None: a new buffer). Returns the plaintext view.

        Args:
            header: the frame header exactly as received (associated data).
            length: the header's payload length, already checked against the connection's bound.
            read: fills a view from the connection (raises the connection's own error when it ends).
            dest: where the plaintext goes; its bytes are undefined if this raises.
        Raises:
            SealError: `replayed` (not the next counter) or `bad_seal` (the tag did not verify).
        """
        wire = self._buffer_in(length + OVERHEAD)
        read(wire)
        out = dest if dest is not None else memoryview(bytearray(length))
        self._open(wire, bytes(header), out)
        return out

    def open_message(self, length: int, read: Read) -> bytes:
        """The body of a sealed message whose 4-byte length prefix (already read) announced `length` bytes.

        Raises:
            SealError: `bad_seal` (too short, or the tag did not verify) or `replayed`.
        """
        if length < OVERHEAD:
            raise SealError("bad_seal", f"sealed message of {length} bytes is shorter than its {OVERHEAD}-byte "
                                        "counter and tag")
        wire = memoryview(bytearray(length))
        read(wire)
        out = memoryview(bytearray(length - OVERHEAD))
        self._open(wire, _LEN.pack(length), out)
        return bytes(out)

    def _open(self, wire: memoryview, associated: bytes, out: memoryview) -> None:
        (counter,) = _COUNTER.unpack_from(wire)
        if counter != self._received:
            raise SealError("replayed", f"frame counter {counter} where {self._received} was next: a replayed, "
                                        "reordered or dropped frame")
        try:
            self._rx.decrypt_into(_nonce(counter), wire[_COUNTER.size:], associated, out)
        except InvalidTag:
            raise SealError("bad_seal", f"frame {counter} failed authentication ({CIPHER}): its bytes were changed "
                                        "on the way, or its sender holds another key") from None
        self._received += 1

    def _buffer_in(self, n: int) -> memoryview:
        if len(self._in) < n:
            self._in = bytearray(n)
        return memoryview(self._in)[:n]

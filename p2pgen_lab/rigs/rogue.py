"""Test double: a misbehaving data-plane peer that writes hand-made frames on a real socket.

It dials a listener with any (generation, identity, secret, --encrypt setting) and, once admitted, sends
frames whose stamp, length, checksum or completeness the test chooses; on a sealed link (`encrypt=True`) the
frames it makes are sealed with the connection's real keys, in counter order, so a test can also replay,
reorder or damage them. Used to prove that receivers drop and count every kind of bad frame and never
deliver one.
"""

from __future__ import annotations

import socket
import struct

from p2pgen import auth
from p2pgen.transport import FrameKind, frame, handshake
from p2pgen.transport.group import Endpoint
from p2pgen.transport.seal import Seal

_LENGTH_AT = frame.HEADER_BYTES - 12   # u32 length, then u64 checksum, end the header


class RoguePeer:
    def __init__(self, job: str, secret: bytes, peer_id: str, incarnation: int, generation: int,
                 encrypt: bool = False) -> None:
        self.job, self.secret = job, secret
        self.identity = (peer_id, incarnation)
        self.generation = generation
        self.encrypt = encrypt
        self.seal: Seal | None = None         # the connection's seal, once a sealed handshake passed
        self.sock: socket.socket | None = None

    def dial(self, target: Endpoint, timeout: float = 5.0) -> RoguePeer:
        """Connect and run the real dialer handshake (raises what a real dialer would)."""
        self.sock = socket.create_connection((target.host, target.port), timeout=timeout)
        hello = handshake.Hello(self.job, self.generation, self.identity, target.identity, auth.new_nonce(),
                                self.encrypt)
        keys = handshake.dial(self.sock, auth.derive_key(self.secret, self.job, "data"), hello)
        self.seal = Seal(keys) if keys is not None else None
        return self

    def frame(self, payload: bytes, *, generation: int | None = None, incarnation: int | None = None,
              kind: int = FrameKind.P2P, op_seq: int = 0, chunk: int = 0, job: str | None = None) -> bytes:
        """A well-formed frame, stamped with this peer's values unless overridden."""
        gen = self.generation if generation is None else generation
        inc = self.identity[1] if incarnation is None else incarnation
        if self.seal is None:
            return frame.pack_header(kind, frame.job_tag(job or self.job), gen, inc, op_seq, chunk,
                                     payload) + payload
        header = frame.pack_header(kind, frame.job_tag(job or self.job), gen, inc, op_seq, chunk, payload,
                                   frame.SEALED_DIGEST)
        return b"".join(bytes(b) for b in self.seal.seal_frame(header, payload))   # the next counter

    @staticmethod
    def corrupt_payload(raw: bytes) -> bytes:
        return raw[:-1] + bytes([raw[-1] ^ 0x01])

    @staticmethod
    def with_length(raw: bytes, length: int) -> bytes:
        """The frame with its header's length field replaced (the checksum is left as it was)."""
        out = bytearray(raw)
        struct.pack_into("<I", out, _LENGTH_AT, length)
        return bytes(out)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()

"""Data frames: a fixed binary header carrying the stamp, the payload length and an xxh3 checksum.

Layout (little endian, 56 bytes):
    magic "P2Df" | version u8 | kind u8 | reserved u16 | job_tag u64 | generation u64 |
    incarnation u64 | op_seq u64 | chunk u32 | length u32 | checksum u64

`checksum` is xxh3_64 over the 48 header bytes before it followed by the payload's digest (xxh3_64 of
the payload, u64 little endian): a two-level hash that covers header and payload, so a flipped stamp bit
is caught like a flipped payload bit. The payload digest is separate so that a member forwarding bytes
it received verbatim (ring all-gather, broadcast chain) re-stamps them without hashing the payload again:
it sends the digest it verified on receipt, which the next member checks against the bytes it gets.
`incarnation` is the sender's. On a sealed link (`p2pgen.transport.seal`, `--encrypt`) the payload is
encrypted and the checksum is made with `SEALED_DIGEST` in place of the payload's digest: it covers the
header alone, the AEAD tag covers header and payload, and no digest of the plaintext crosses the wire.
Invariant: `length` is checked against the configured bound before any payload byte is read.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

import xxhash

MAGIC = b"P2Df"
VERSION = 2
_PREFIX = struct.Struct("<4sBBHQQQQII")
_SUM = struct.Struct("<Q")
PREFIX_BYTES = _PREFIX.size
HEADER_BYTES = _PREFIX.size + _SUM.size
SEALED_DIGEST = 0        # the payload digest a sealed frame's checksum is made with (see the module docstring)


class FrameKind(enum.IntEnum):
    COLLECTIVE = 1   # op_seq is the communicator's collective sequence number
    P2P = 2          # op_seq counts send/recv calls between this ordered pair of ranks
    RECEIPT = 3      # a ring collective's receipt: every frame of op_seq from its addressee arrived


@dataclass(frozen=True)
class Header:
    kind: int
    job_tag: int
    generation: int
    incarnation: int
    op_seq: int
    chunk: int
    length: int
    checksum: int


def job_tag(job: str) -> int:
    return xxhash.xxh3_64_intdigest(job.encode())


def digest(payload) -> int:
    """The payload's digest (xxh3_64); hashing holds the GIL, so callers do it where the bytes are hot."""
    return xxhash.xxh3_64_intdigest(payload)


def checksum(prefix: bytes, payload_digest: int) -> int:
    return xxhash.xxh3_64_intdigest(prefix + _SUM.pack(payload_digest))


def pack_header(kind: int, tag: int, generation: int, incarnation: int, op_seq: int, chunk: int,
                payload, payload_digest: int | None = None) -> bytes:
    """The header for `payload`; pass `payload_digest` only if it is the digest of exactly these bytes."""
    prefix = _PREFIX.pack(MAGIC, VERSION, kind, 0, tag, generation, incarnation, op_seq, chunk,
                          len(payload))
    if payload_digest is None:
        payload_digest = digest(payload)
    return prefix + _SUM.pack(checksum(prefix, payload_digest))


def unpack_header(raw) -> Header:
    """Parse a header; raises ValueError (a malformed frame) if the magic or version is wrong."""
    magic, version, kind, _, tag, gen, inc, seq, chunk, length = _PREFIX.unpack_from(raw)
    if magic != MAGIC:
        raise ValueError(f"bad magic {magic!r}: not a p2pgen data frame")
    if version != VERSION:
        raise ValueError(f"frame version {version}, this process speaks {VERSION}")
    (csum,) = _SUM.unpack_from(raw, _PREFIX.size)
    return Header(kind, tag, gen, inc, seq, chunk, length, csum)


def verify(raw_header, payload, header: Header) -> bool:
    return verify_digest(raw_header, digest(payload), header)


def verify_digest(raw_header, payload_digest: int, header: Header) -> bool:
    """Whether the header's checksum matches its own bytes and a payload whose digest is `payload_digest`."""
    return checksum(bytes(raw_header[:PREFIX_BYTES]), payload_digest) == header.checksum

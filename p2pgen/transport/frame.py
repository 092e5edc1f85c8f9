"""Data frames: a fixed binary header carrying the stamp, the payload length and an xxh3 checksum.

Layout (little endian, 56 bytes):
    magic "P2Df" | version u8 | kind u8 | reserved u16 | job_tag u64 | generation u64 |
    incarnation u64 | op_seq u64 | chunk u32 | length u32 | checksum u64

`checksum` is xxh3_64 over the 48 header bytes before it and the payload, so a flipped stamp bit is
caught like a flipped payload bit. `incarnation` is the sender's. Invariant: `length` is checked against
the configured bound before any payload byte is read.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

import xxhash

MAGIC = b"P2Df"
VERSION = 1
_PREFIX = struct.Struct("<4sBBHQQQQII")
_SUM = struct.Struct("<Q")
HEADER_BYTES = _PREFIX.size + _SUM.size


class FrameKind(enum.IntEnum):
    COLLECTIVE = 1   # op_seq is the communicator's collective sequence number
    P2P = 2          # op_seq counts send/recv calls between this ordered pair of ranks


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


def checksum(prefix: bytes, payload) -> int:
    h = xxhash.xxh3_64(prefix)
    h.update(payload)
    return h.intdigest()


def pack_header(kind: int, tag: int, generation: int, incarnation: int, op_seq: int, chunk: int,
                payload) -> bytes:
    prefix = _PREFIX.pack(MAGIC, VERSION, kind, 0, tag, generation, incarnation, op_seq, chunk,
                          len(payload))
    return prefix + _SUM.pack(checksum(prefix, payload))


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
    return checksum(bytes(raw_header[:_PREFIX.size]), payload) == header.checksum

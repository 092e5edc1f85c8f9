"""The NCCL unique id as it travels in a generation's proposal: 128 raw bytes, written as 256 hex digits.

Owns the only conversions between three forms of one id:
- the certificate's `comm_id` (lower-case hex string, exactly 2 x 128 digits), which rank 0 puts in its `ready`
  vote and every member reads from the certificate, so a communicator belongs to exactly one generation;
- raw `bytes` (128 of them, `ncclUniqueId.internal`), which is what CuPy 14 returns from
  `cupy.cuda.nccl.get_unique_id()` and takes in `NcclCommunicator(ndev, commId, rank)` (cupy/cupy#9438);
- CuPy 13's tuple of 128 ints, one C `char` each: signed (-128..127) where `char` is signed (x86-64) and
  unsigned (0..255) where it is not (aarch64, ppc64le, s390x) (cupy/cupy#9435).

Invariant: `decode(encode(x))` gives the same 128 bytes whatever form `x` came in, and nothing else is ever
accepted: a wrong length, a non-hex digit or an out-of-range int raises `ValueError` saying what was wrong.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence

UNIQUE_ID_BYTES = 128          # NCCL_UNIQUE_ID_BYTES in nccl.h
HEX_DIGITS = 2 * UNIQUE_ID_BYTES
_UNSIGNED_CHAR_MACHINES = ("aarch64", "arm64", "armv7l", "ppc64le", "ppc64", "s390x")

CupyUniqueId = bytes | tuple[int, ...]


def encode(uid: bytes | bytearray | Sequence[int]) -> str:
    """The `comm_id` string for a unique id in any form `get_unique_id()` returns."""
    return to_bytes(uid).hex()


def decode(comm_id: str) -> bytes:
    """The 128 raw bytes of a certificate's `comm_id`."""
    if not isinstance(comm_id, str):
        raise ValueError(f"comm_id must be a hex string, got {type(comm_id).__name__}")
    if len(comm_id) != HEX_DIGITS:
        hint = " (the certificate has no communicator id: was rank 0's ready vote sent without one?)" \
            if not comm_id else ""
        raise ValueError(f"comm_id has {len(comm_id)} hex digits, expected {HEX_DIGITS} "
                         f"({UNIQUE_ID_BYTES} bytes){hint}")
    try:
        return bytes.fromhex(comm_id)
    except ValueError:
        raise ValueError(f"comm_id is not hexadecimal: {comm_id[:16]!r}...") from None


def to_bytes(uid: bytes | bytearray | Sequence[int]) -> bytes:
    """Raw bytes of a CuPy 14 bytes id or a CuPy 13 tuple (signed or unsigned chars)."""
    if isinstance(uid, (bytes, bytearray)):
        raw = bytes(uid)
    elif isinstance(uid, str):
        raise ValueError("a unique id string is a comm_id: use decode() for it")
    else:
        raw = bytes(_char_to_byte(v, i) for i, v in enumerate(uid))
    if len(raw) != UNIQUE_ID_BYTES:
        raise ValueError(f"a NCCL unique id has {UNIQUE_ID_BYTES} bytes, got {len(raw)}")
    return raw


def to_cupy(raw: bytes, cupy_major: int, signed_char: bool | None = None) -> CupyUniqueId:
    """The form `NcclCommunicator(ndev, commId, rank)` of this CuPy takes: bytes from 14 on, a tuple before.

    CuPy 13 copies each tuple item into a C `char`, so the items must be in that platform's `char` range;
    `signed_char=None` reads it from the machine (see `char_is_signed`)."""
    raw = to_bytes(raw)
    if cupy_major >= 14:
        return raw
    signed = char_is_signed() if signed_char is None else signed_char
    return tuple(b - 256 if signed and b > 127 else b for b in raw)


def char_is_signed(machine: str | None = None) -> bool:
    """Whether C `char` is signed on this machine (the Linux ABIs: unsigned on Arm, POWER and Z)."""
    return (machine or platform.machine()).lower() not in _UNSIGNED_CHAR_MACHINES


def _char_to_byte(v: object, i: int) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not -128 <= v <= 255:
        raise ValueError(f"unique id item {i} is {v!r}: each item is one C char (-128..255)")
    return v & 0xFF

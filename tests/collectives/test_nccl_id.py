"""The NCCL unique id in a certificate: hex of 128 bytes; CuPy 13 tuples (signed or unsigned chars) and
CuPy 14 bytes round-trip exactly; every malformed input is refused with a message that says why."""

from __future__ import annotations

import os

import pytest

from p2pgen.collectives import nccl_id

pytestmark = pytest.mark.timeout(10)

RAW = bytes(range(128))            # every value 0..127; the high half below
HIGH = bytes(range(128, 256))


@pytest.mark.parametrize("raw", [RAW, HIGH, os.urandom(128)])
def test_every_form_round_trips_to_the_same_bytes(raw):
    signed = tuple(b - 256 if b > 127 else b for b in raw)     # CuPy 13 on x86-64
    unsigned = tuple(raw)                                      # CuPy 13 on aarch64
    hexes = {nccl_id.encode(x) for x in (raw, bytearray(raw), signed, unsigned)}
    assert hexes == {raw.hex()}
    assert len(raw.hex()) == nccl_id.HEX_DIGITS == 256
    assert nccl_id.decode(raw.hex()) == raw


def test_to_cupy_gives_bytes_from_14_and_chars_of_the_platform_before():
    assert nccl_id.to_cupy(HIGH, 14) == HIGH
    signed = nccl_id.to_cupy(HIGH, 13, signed_char=True)
    assert isinstance(signed, tuple) and signed[0] == -128 and signed[-1] == -1
    assert nccl_id.to_cupy(HIGH, 13, signed_char=False) == tuple(HIGH)
    assert nccl_id.to_bytes(signed) == HIGH


def test_char_signedness_follows_the_linux_abi():
    assert nccl_id.char_is_signed("x86_64")
    assert not nccl_id.char_is_signed("aarch64")
    assert not nccl_id.char_is_signed("ppc64le")


@pytest.mark.parametrize("bad, message", [
    ("", "0 hex digits, expected 256.*no communicator id"),
    ("ab" * 127, "254 hex digits"),
    ("zz" * 128, "not hexadecimal"),
    (b"\x00" * 128, "must be a hex string"),
])
def test_decode_refuses_malformed_comm_ids(bad, message):
    with pytest.raises(ValueError, match=message):
        nccl_id.decode(bad)


@pytest.mark.parametrize("bad, message", [
    (b"\x01" * 127, "128 bytes, got 127"),
    (tuple([0] * 129), "128 bytes, got 129"),
    (tuple([0] * 127 + [256]), "item 127 is 256"),
    (tuple([-129] + [0] * 127), "item 0 is -129"),
    (tuple([0.5] * 128), "item 0 is 0.5"),
    ("00" * 128, "use decode"),
])
def test_encode_refuses_what_is_not_a_unique_id(bad, message):
    with pytest.raises(ValueError, match=message):
        nccl_id.encode(bad)

"""Sealed links (`--encrypt`, p2pgen.transport.seal): fuzzed at the frame level (byte flips, truncations,
replays, reorderings, wrong keys) and on real connections of a Transport, where every bad sealed frame is
counted under one reason, names its peer and generation, and never reaches a buffer."""

from __future__ import annotations

import dataclasses
import os
import socket

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pgen.errors import EncryptionMismatch, PeerLost, ProtocolError
from p2pgen.transport import FrameKind, frame, seal
from p2pgen_lab.rigs.rogue import RoguePeer
from tests.transport.conftest import CONFIG, JOB, ROGUE, SECRET, Target

pytestmark = pytest.mark.timeout(30)

KEY = b"k" * 32
BINDING = (b"job", b"5", b"peer0", b"1000", b"peer1", b"2000")
FUZZ = settings(max_examples=60, deadline=None, database=None, derandomize=True)
SEALED = dataclasses.replace(CONFIG, encrypt=True)


def pair(nonce_d: bytes = b"d" * 16, nonce_l: bytes = b"l" * 16, key: bytes = KEY) -> tuple[seal.Seal, seal.Seal]:
    """(dialer's, listener's) seals of one connection."""
    return (seal.Seal(seal.derive_link_keys(key, BINDING, nonce_d, nonce_l, dialer=True)),
            seal.Seal(seal.derive_link_keys(key, BINDING, nonce_d, nonce_l, dialer=False)))


def header_for(payload: bytes, op_seq: int = 0) -> bytes:
    return frame.pack_header(FrameKind.P2P, frame.job_tag("job"), 5, 1000, op_seq, 0, payload, frame.SEALED_DIGEST)


def sealed(tx: seal.Seal, payload: bytes, op_seq: int = 0) -> bytes:
    return b"".join(bytes(b) for b in tx.seal_frame(header_for(payload, op_seq), payload))


def open_wire(rx: seal.Seal, wire: bytes) -> bytes:
    """Open one frame from raw bytes, as a connection reads it (header, then the announced payload)."""
    header = wire[:frame.HEADER_BYTES]
    h = frame.unpack_header(header)
    rest = memoryview(wire)[frame.HEADER_BYTES:]

    def read(view: memoryview) -> None:
        if len(rest) < len(view):
            raise PeerLost(f"stream ended after {len(rest)} of {len(view)} bytes (truncated)")
        view[:] = rest[:len(view)]

    return bytes(rx.open_frame(header, h.length, read))


# ---- the frame level ------------------------------------------------------------------------------
@FUZZ
@given(st.binary(max_size=4096), st.integers(min_value=0, max_value=5))
def test_sealed_frames_round_trip_in_order(payload, count):
    tx, rx = pair()
    for i in range(count):
        assert open_wire(rx, sealed(tx, payload + bytes([i]), op_seq=i)) == payload + bytes([i])
    assert tx.counters[0] == rx.counters[1] == count


@FUZZ
@given(st.binary(min_size=1, max_size=2048), st.data())
def test_any_flipped_byte_fails_the_frame(payload, data):
    tx, rx = pair()
    wire = bytearray(sealed(tx, payload))
    at = data.draw(st.integers(min_value=0, max_value=len(wire) - 1), label="at")
    wire[at] ^= data.draw(st.integers(min_value=1, max_value=255), label="xor")
    with pytest.raises((seal.SealError, ValueError, PeerLost)) as err:   # ValueError: the header no longer parses
        open_wire(rx, bytes(wire))
    if isinstance(err.value, seal.SealError):
        assert err.value.reason in seal.REASONS
    assert rx.counters[1] == 0


@FUZZ
@given(st.binary(min_size=1, max_size=2048), st.data())
def test_a_truncated_frame_is_never_opened(payload, data):
    tx, rx = pair()
    wire = sealed(tx, payload)
    cut = data.draw(st.integers(min_value=frame.HEADER_BYTES, max_value=len(wire) - 1), label="cut")
    with pytest.raises(PeerLost, match="truncated"):
        open_wire(rx, wire[:cut])
    # the rest of the stream shifted in: the next frame's bytes fill the gap, and the tag catches it
    with pytest.raises(seal.SealError):
        open_wire(rx, wire[:cut] + sealed(tx, payload))


@FUZZ
@given(st.lists(st.binary(max_size=256), min_size=2, max_size=6), st.data())
def test_replayed_reordered_or_dropped_frames_fail(payloads, data):
    tx, rx = pair()
    wires = [sealed(tx, p, op_seq=i) for i, p in enumerate(payloads)]
    order = data.draw(st.permutations(range(len(wires))).filter(lambda o: list(o) != sorted(o)), label="order")
    delivered = []
    with pytest.raises(seal.SealError) as err:
        for i in list(order) + [order[0]]:            # a reordering, then a replay of what came first
            delivered.append(open_wire(rx, wires[i]))
    assert err.value.reason == "replayed"
    assert delivered == payloads[:len(delivered)]     # what was opened came in order, unchanged


@FUZZ
@given(st.binary(max_size=1024), st.sampled_from(["key", "dialer_nonce", "listener_nonce", "direction"]))
def test_a_frame_sealed_under_any_other_key_fails(payload, other):
    tx, _ = pair()
    changed = {"key": dict(key=b"K" * 32), "dialer_nonce": dict(nonce_d=b"D" * 16),
               "listener_nonce": dict(nonce_l=b"L" * 16)}
    rx = tx if other == "direction" else pair(**changed[other])[1]   # tx opens with the other direction's key
    with pytest.raises(seal.SealError) as err:
        open_wire(rx, sealed(tx, payload))
    assert err.value.reason == "bad_seal"


def test_keys_differ_per_direction_and_per_connection():
    d = seal.derive_link_keys(KEY, BINDING, b"d" * 16, b"l" * 16, dialer=True)
    listener = seal.derive_link_keys(KEY, BINDING, b"d" * 16, b"l" * 16, dialer=False)
    assert (d.send, d.recv) == (listener.recv, listener.send) and d.send != d.recv
    assert seal.derive_link_keys(KEY, BINDING, os.urandom(16), b"l" * 16, dialer=True).send != d.send
    assert seal.derive_link_keys(KEY, BINDING[:-1] + (b"2001",), b"d" * 16, b"l" * 16, dialer=True).send != d.send
    assert repr(d) == "LinkKeys()"                                               # keys are never printed
    with pytest.raises(ValueError, match="nonces"):
        seal.derive_link_keys(KEY, BINDING, b"", b"l" * 16, dialer=True)


def test_sealed_messages_round_trip_and_fail_when_changed():
    tx, rx = pair()
    wire = tx.seal_message(b"request")
    n = int.from_bytes(wire[:4], "big")
    assert rx.open_message(n, lambda v: v.__setitem__(slice(None), wire[4:4 + len(v)])) == b"request"
    bad = bytearray(tx.seal_message(b"request"))
    bad[-1] ^= 1
    with pytest.raises(seal.SealError, match="failed authentication"):
        rx.open_message(n, lambda v: v.__setitem__(slice(None), bad[4:4 + len(v)]))
    with pytest.raises(seal.SealError, match="shorter"):
        rx.open_message(3, lambda v: None)


# ---- real connections of a Transport --------------------------------------------------------------
@pytest.fixture
def sealed_target():
    target = Target(SEALED)
    try:
        yield target
    finally:
        target.transport.close()


GOOD = np.arange(16, dtype=np.float32).tobytes()
STAMP = range(5, frame.PREFIX_BYTES - 4)         # kind .. chunk: every header byte but magic, version and length


def _admitted(target) -> RoguePeer:
    """A sealed rogue admitted as rank 0 of generation 5 of `target` (it knows the secret: an insider, or a
    stand-in for whoever changes bytes on the way)."""
    target.open(generation=5)
    return RoguePeer(JOB, SECRET, *ROGUE, 5, encrypt=True).dial(target.transport.endpoint())


def _recv_fails(target, rogue: RoguePeer, raw: bytes, close_after: bool = False) -> ProtocolError | PeerLost:
    """The rogue writes `raw`; the target's receive fails, naming the peer and the generation, and the buffer
    is untouched. Returns the error."""
    buf = np.full(16, -1.0, np.float32)
    pending = target.recv_in_thread(buf)
    rogue.send(raw)
    if close_after:
        rogue.sock.shutdown(socket.SHUT_WR)
    with pytest.raises((ProtocolError, PeerLost)) as err:
        pending.result(10)
    assert "peer0" in str(err.value) and "generation 5" in str(err.value)
    assert np.all(buf == -1.0)
    rogue.close()
    return err.value


@settings(max_examples=15, deadline=None, database=None, derandomize=True)
@given(st.data())
def test_a_flipped_byte_on_a_sealed_connection_fails_that_frame_and_is_counted(data):
    target = Target(SEALED)
    try:
        rogue = _admitted(target)
        wire = bytearray(rogue.frame(GOOD))
        positions = list(STAMP) + list(range(frame.PREFIX_BYTES, len(wire)))
        wire[data.draw(st.sampled_from(positions), label="at")] ^= data.draw(st.integers(1, 255), label="xor")
        err = _recv_fails(target, rogue, bytes(wire))
        stats = target.transport.stats()
        assert stats["bad_seal"] + stats["replayed"] == 1, stats
        assert "bad_seal" in str(err) or "replayed" in str(err)
    finally:
        target.transport.close()


@pytest.mark.parametrize("make, reason, close_after", [
    (lambda r: (r.frame(GOOD), r.frame(GOOD))[1], "replayed", False),                  # frame 0 dropped
    (lambda r: (lambda a, b: b + a)(r.frame(GOOD), r.frame(GOOD)), "replayed", False),  # reordered
    (lambda r: r.frame(GOOD)[:-5], "truncated", True),
    (lambda r: RoguePeer.corrupt_payload(r.frame(GOOD)), "bad_seal", False),
], ids=["dropped", "reordered", "truncated", "bad_tag"])
def test_bad_sealed_frames_are_counted_under_one_reason(sealed_target, make, reason, close_after):
    rogue = _admitted(sealed_target)
    _recv_fails(sealed_target, rogue, make(rogue), close_after)
    stats = sealed_target.transport.stats()
    assert stats[reason] == 1 and sum(stats[r] for r in ("bad_seal", "replayed", "truncated")) == 1


def test_a_replayed_sealed_frame_fails_after_the_good_one_was_delivered(sealed_target):
    rogue = _admitted(sealed_target)
    good = rogue.frame(GOOD)
    buf = np.full(16, -1.0, np.float32)
    pending = sealed_target.recv_in_thread(buf)
    rogue.send(good)
    pending.result(10)
    assert buf.tobytes() == GOOD
    err = _recv_fails(sealed_target, rogue, good)      # the same bytes once more
    assert "(replayed)" in str(err) and sealed_target.transport.stats()["replayed"] == 1


def test_a_frame_sealed_with_a_key_of_another_connection_fails(sealed_target):
    rogue = _admitted(sealed_target)
    real, rogue.seal = rogue.seal, pair(key=b"x" * 32)[0]
    forged = rogue.frame(GOOD)
    rogue.seal = real
    err = _recv_fails(sealed_target, rogue, forged)
    assert "(bad_seal)" in str(err) and "another key" in str(err)
    assert sealed_target.transport.stats()["bad_seal"] == 1


@pytest.mark.parametrize("listener_encrypts", [True, False], ids=["plain_dialer", "plain_listener"])
def test_a_mismatched_encrypt_setting_is_refused_naming_the_member_to_restart(listener_encrypts):
    target = Target(SEALED if listener_encrypts else CONFIG)
    listener = target.transport
    try:
        target.open(generation=5)
        rogue = RoguePeer(JOB, SECRET, *ROGUE, 5, encrypt=not listener_encrypts)
        with pytest.raises(EncryptionMismatch) as err:
            rogue.dial(listener.endpoint())
        rogue.close()
        must_restart = "peer0" if listener_encrypts else "peer1"
        assert f"restart {must_restart} with --encrypt" in str(err.value)
        assert listener.stats()["encryption_mismatch"] == 1 and listener.stats()["connections_open"] == 0
    finally:
        listener.close()

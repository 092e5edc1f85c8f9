"""Bad peers and bad frames on real sockets (I2, I3, I8): each is refused and counted, nothing crashes,
and nothing reaches a user buffer."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from p2pgen.errors import AuthenticationError, GenerationChanged, PeerLost, ProtocolError
from p2pgen.testing.ports import open_transport
from p2pgen.transport import FrameKind, TransportConfig
from p2pgen_lab.rigs.rogue import RoguePeer

ROGUE = ("peer0", 1000)   # the identity conftest.Target lists as rank 0

pytestmark = pytest.mark.timeout(20)

GOOD = np.arange(16, dtype=np.float32)
UNTOUCHED = -1.0


def payload(value: float) -> bytes:
    return np.full(16, value, np.float32).tobytes()


def test_stale_generation_and_wrong_incarnation_frames_are_dropped_then_good_frame_delivered(target):
    target.open(generation=5)
    rogue = target.rogue(5).dial(target.transport.endpoint())
    buf = np.full(16, UNTOUCHED, np.float32)
    pending = target.recv_in_thread(buf)
    rogue.send(rogue.frame(payload(4.0), generation=4))           # I2: older generation
    rogue.send(rogue.frame(payload(6.0), generation=6))           # not this connection's generation either
    rogue.send(rogue.frame(payload(9.0), incarnation=ROGUE[1] - 1))  # I3: another incarnation
    rogue.send(rogue.frame(GOOD.tobytes()))
    pending.result(5)
    assert np.array_equal(buf, GOOD)
    stats = target.transport.stats()
    assert stats["stale_generation"] == 2 and stats["wrong_incarnation"] == 1
    rogue.close()


@pytest.mark.parametrize("secret, identity, generation, error, reason", [
    (b"a-wrong-secret", ROGUE, 5, AuthenticationError, "auth_failed"),
    (None, ROGUE, 4, GenerationChanged, "stale_generation"),
    (None, (ROGUE[0], ROGUE[1] + 1), 5, ProtocolError, "wrong_incarnation"),
    (None, ("stranger", 7), 5, ProtocolError, "not_member"),
], ids=["wrong_secret", "stale_generation", "wrong_incarnation", "not_member"])
def test_handshake_refusals_are_counted(target, secret, identity, generation, error, reason):
    target.open(generation=5)
    rogue = target.rogue(generation, secret=secret or b"the-right-secret-0123456789abcdef", identity=identity)
    with pytest.raises(error):
        rogue.dial(target.transport.endpoint())
    rogue.close()
    assert target.transport.stats()[reason] == 1
    assert target.transport.stats()["connections_open"] == 0


def test_garbage_instead_of_a_handshake_is_counted_malformed(target):
    target.open(generation=5)
    ep = target.transport.endpoint()
    with socket.create_connection((ep.host, ep.port), timeout=2) as s:
        s.sendall(b"\x00\x00\x00\x10GET / HTTP/1.1\r\n")
        assert s.recv(100) == b""   # the listener hangs up
    assert target.transport.stats()["malformed"] == 1


def _truncated(rogue):
    raw = rogue.frame(payload(1.0))
    return raw[:len(raw) - 10], PeerLost


def _oversized(rogue):
    return rogue.with_length(rogue.frame(payload(1.0)), 1 << 30), ProtocolError


def _bad_checksum(rogue):
    return rogue.corrupt_payload(rogue.frame(payload(1.0))), ProtocolError


def _malformed(rogue):
    return b"XXXX" + rogue.frame(payload(1.0))[4:], ProtocolError


def _wrong_shape(rogue):
    return rogue.frame(np.ones(8, np.float32).tobytes()), ProtocolError


def _wrong_op_seq(rogue):
    return rogue.frame(payload(1.0), op_seq=3), ProtocolError


def _collective_frame_for_p2p(rogue):
    return rogue.frame(payload(1.0), kind=FrameKind.COLLECTIVE), ProtocolError


@pytest.mark.parametrize("make, reason", [
    (_truncated, "truncated"), (_oversized, "oversized"), (_bad_checksum, "bad_checksum"),
    (_malformed, "malformed"), (_wrong_shape, "malformed"), (_wrong_op_seq, "malformed"),
    (_collective_frame_for_p2p, "malformed"),
], ids=lambda v: getattr(v, "__name__", v))
def test_bad_frame_closes_the_connection_and_delivers_nothing(target, make, reason):
    target.open(generation=5)
    rogue = target.rogue(5).dial(target.transport.endpoint())
    buf = np.full(16, UNTOUCHED, np.float32)
    pending = target.recv_in_thread(buf)
    data, error = make(rogue)
    rogue.send(data)
    if reason == "truncated":
        rogue.close()
    with pytest.raises(error):
        pending.result(5)
    assert np.all(buf == UNTOUCHED), "a rejected frame reached the user buffer"
    assert target.transport.stats()[reason] == 1
    rogue.close()
    # The process keeps running: the next generation works on the same transport.
    target.open(generation=6)
    assert target.transport.stats()["connections_open"] == 0
    good = target.rogue(6).dial(target.transport.endpoint())
    pending = target.recv_in_thread(buf)
    good.send(good.frame(GOOD.tobytes()))
    pending.result(5)
    assert np.array_equal(buf, GOOD)
    good.close()


def test_generations_only_go_up(target):
    target.open(generation=5)
    with pytest.raises(GenerationChanged, match="not newer"):
        target.open(generation=5)
    with pytest.raises(GenerationChanged, match="not newer"):
        target.open(generation=3)


def test_a_connection_parked_for_a_generation_never_opened_is_refused_after_connect_timeout():
    """A dialer of a generation this process has not opened (and never will) is not left waiting until its
    op_timeout: the parked connection is closed once connect_timeout is up, and counted."""
    transport = open_transport("job-under-test", b"the-right-secret-0123456789abcdef", "peer1", 2000,
                               TransportConfig(connect_timeout=0.5, handshake_timeout=2.0))
    try:
        rogue = RoguePeer("job-under-test", b"the-right-secret-0123456789abcdef", ROGUE[0], ROGUE[1], 9)
        rogue.dial(transport.endpoint())                  # handshake done: parked, waiting for generation 9
        rogue.sock.settimeout(10.0)
        assert rogue.sock.recv(1) == b"", "the parked connection was not closed"
        assert transport.stats()["stale_generation"] == 1
        rogue.close()
    finally:
        transport.close()

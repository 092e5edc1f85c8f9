"""Fuzzing the channel receiver (p2pgen.channel.ChannelListener and its receivers).

The listener is ("decode", 1); the honest sender is ("prefill", 1), which opens a new Channel for each
check, sends one message and expects it consumed exactly once. An attacker sends Hypothesis bytes
instead of a handshake, instead of the OPEN frame, and (after a valid OPEN took the channel over)
instead of DATA frames; truncated and oversized frames; OPEN and DATA frames replayed from another
generation, incarnation or job; a replayed handshake proof; dialers of an older generation or a
superseded incarnation. Each refusal is counted once under a reason; nothing unverified is handed to
the application; the honest sender is still served; closing leaves no thread or fd behind.
"""

from __future__ import annotations

import itertools
import socket

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2pgen import auth
from p2pgen.channel import Channel, ChannelConfig, ChannelListener, Endpoint
from p2pgen.channel.receiver import COUNTERS
from p2pgen.channel.wire import DATA, LOG, MAX_CONTROL, OPEN, RAW, Stamp, recv_control, send_control
from p2pgen.errors import P2PGenError
from p2pgen.transport import frame, handshake
from p2pgen_lab.rigs.rogue import RoguePeer
from tests.fuzz.conftest import FUZZ, bind_free_port, raw_connect, send_and_close, total, wait_until

pytestmark = pytest.mark.timeout(60)

JOB, SECRET = "fuzz-channel", b"fuzz-channel-secret-0123456789ab"
KEY = auth.derive_key(SECRET, JOB, "channel")
TAG = frame.job_tag(JOB)
ME, SENDER = ("decode", 1), ("prefill", 1)
CONFIG = ChannelConfig(connect_timeout=5.0, handshake_timeout=1.0, takeover_timeout=5.0, stall_timeout=0.5)
REFUSALS = ("stale_generation", "wrong_incarnation", "superseded", "busy", "bad_checksum", "oversized",
            "truncated", "malformed", "auth_failed")
assert set(REFUSALS) <= set(COUNTERS)


class Rig:
    def __init__(self, log_dir: str) -> None:
        self.listener = bind_free_port(lambda port: ChannelListener(JOB, SECRET, ME, log_dir, port=port,
                                                                    config=CONFIG))
        self.rx = self.listener.receiver(SENDER[0])
        self.messages = itertools.count()

    @property
    def port(self) -> int:
        return self.listener.port

    def endpoint(self) -> Endpoint:
        return Endpoint(ME[0], ME[1], "127.0.0.1", self.port)

    def honest_send(self, generation: int = 0) -> None:
        """A new honest Channel sends one message; the application gets exactly that, once."""
        payload = f"message {next(self.messages)}".encode()
        ch = Channel(JOB, SECRET, SENDER, self.endpoint(), generation=generation, config=CONFIG)
        try:
            seq = ch.send(payload, timeout=5.0)
            msg = self.rx.receive(timeout=5.0)
            assert msg is not None and msg.seq == seq and bytes(msg.payload) == payload
            assert msg.consumed()
            assert ch.flush(timeout=5.0)
        finally:
            ch.close()

    def refused(self) -> int:
        return total(self.listener.stats(), REFUSALS)

    def dial(self, generation: int = 0, identity=SENDER) -> socket.socket:
        s = raw_connect(self.port)
        try:
            handshake.dial(s, KEY, handshake.Hello(JOB, generation, identity, ME, auth.new_nonce()))
        except BaseException:
            s.close()
            raise
        return s

    def take_over(self, generation: int = 0, identity=SENDER) -> socket.socket:
        """A rogue sender that passed the handshake and OPEN, and holds the channel."""
        s = self.dial(generation, identity)
        send_control(s, OPEN, Stamp(TAG, generation, identity[1]), {"mode": "exactly_once"})
        assert "w" in recv_control(s, LOG, Stamp(TAG, generation, ME[1]))
        return s

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def rig(no_leaks, tmp_path):
    r = Rig(str(tmp_path))
    try:
        yield r
    finally:
        r.close()


def expect_one_more(rig: Rig, before: int) -> None:
    wait_until(lambda: rig.refused() >= before + 1, what="the refusal to be counted")
    assert rig.refused() == before + 1, rig.listener.stats()


def send_then_close(s: socket.socket, data: bytes) -> None:
    with s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(5.0)
            while s.recv(65536):
                pass
        except OSError:
            pass


@FUZZ
@given(data=st.binary(max_size=200))
def test_random_bytes_instead_of_a_handshake_are_refused(rig, data):
    before = rig.refused()
    send_and_close(rig.port, data)
    expect_one_more(rig, before)
    rig.honest_send()


@FUZZ
@given(data=st.binary(min_size=1, max_size=200))
def test_random_bytes_instead_of_the_open_frame_are_refused(rig, data):
    before = rig.refused()
    send_then_close(rig.dial(), data)
    expect_one_more(rig, before)
    rig.honest_send()


@FUZZ
@given(data=st.binary(min_size=1, max_size=300))
def test_random_bytes_instead_of_data_frames_are_refused_and_never_delivered(rig, data):
    before = rig.refused()
    delivered = rig.listener.stats()["delivered"]
    send_then_close(rig.take_over(), data)
    expect_one_more(rig, before)
    assert rig.listener.stats()["delivered"] == delivered
    rig.honest_send()


def _frame(kind: int, generation: int = 0, incarnation: int = SENDER[1], job: str = JOB, seq: int = 0,
           payload: bytes = b"hello") -> bytes:
    return RoguePeer(JOB, SECRET, *SENDER, generation).frame(payload, generation=generation, incarnation=incarnation,
                                                              kind=kind, op_seq=seq, chunk=RAW, job=job)


def _open(**kw) -> bytes:
    return _frame(OPEN, payload=msgpack.packb({"mode": "exactly_once"}), **kw)


@pytest.mark.parametrize("data, reason", [
    (_open()[:-3], "truncated"),
    (RoguePeer.with_length(_open(), MAX_CONTROL + 1), "oversized"),
    (RoguePeer.corrupt_payload(_open()), "bad_checksum"),
    (_open(generation=1), "stale_generation"),
    (_open(incarnation=0), "wrong_incarnation"),
    (_open(job="another-job"), "malformed"),
    (_frame(DATA), "malformed"),
], ids=["truncated", "oversized", "bad_checksum", "replayed_other_generation", "replayed_other_incarnation",
        "replayed_other_job", "data_before_open"])
def test_bad_and_replayed_open_frames_are_counted_by_reason(rig, data, reason):
    before = rig.listener.stats()
    send_then_close(rig.dial(), data)
    wait_until(lambda: rig.listener.stats()[reason] == before[reason] + 1, what=reason)
    assert rig.refused() == total(before, REFUSALS) + 1, rig.listener.stats()
    rig.honest_send()


@pytest.mark.parametrize("data, counted, closes", [
    (_frame(DATA, generation=1, seq=100), "stale_generation", False),
    (_frame(DATA, incarnation=0, seq=100), "wrong_incarnation", False),
    (_frame(DATA, job="another-job", seq=100), "malformed", True),
    (RoguePeer.corrupt_payload(_frame(DATA, seq=100)), "bad_checksum", True),
    (RoguePeer.with_length(_frame(DATA, seq=100), CONFIG.max_message_bytes + 1), "oversized", True),
    (_frame(DATA, seq=100)[:-2], "truncated", True),
], ids=["replayed_other_generation", "replayed_other_incarnation", "replayed_other_job", "bad_checksum",
        "oversized", "truncated"])
def test_bad_and_replayed_data_frames_are_counted_and_never_delivered(rig, data, counted, closes):
    before = rig.listener.stats()
    s = rig.take_over()
    if closes:              # the listener closes the connection (a truncated frame ends only when we do)
        send_then_close(s, data)
    else:
        s.sendall(data)
    wait_until(lambda: rig.listener.stats()[counted] == before[counted] + 1, what=counted)
    if not closes:          # a dropped replay leaves the connection usable: a good frame still arrives
        s.sendall(_frame(DATA, seq=101, payload=b"good"))
        msg = rig.rx.receive(timeout=5.0)
        assert msg is not None and msg.seq == 101 and bytes(msg.payload) == b"good"
        msg.consumed()
        send_then_close(s, b"")
    assert rig.listener.stats()["delivered"] == before["delivered"] + (0 if closes else 1)
    rig.honest_send()


def test_a_replayed_consumed_message_is_not_handed_out_again(rig):
    rig.honest_send()
    (w, above) = rig.rx.consumed_numbers()
    s = rig.take_over()
    before = rig.listener.stats()["duplicates_dropped"]
    s.sendall(_frame(DATA, seq=w - 1, payload=b"replayed"))
    assert rig.rx.receive(timeout=1.0) is None
    assert rig.listener.stats()["duplicates_dropped"] == before + 1
    send_then_close(s, b"")
    rig.honest_send()


def test_older_generations_superseded_incarnations_and_replayed_proofs_are_refused(rig):
    rig.listener.on_generation(3)
    before = rig.listener.stats()
    for generation, identity, reason in [(2, SENDER, "stale_generation"), (3, (SENDER[0], 0), "superseded")]:
        if reason == "superseded":
            rig.honest_send(generation=3)       # incarnation 1 owns the channel now
        s = rig.dial(generation, identity)
        send_control(s, OPEN, Stamp(TAG, generation, identity[1]), {"mode": "exactly_once"})
        assert recv_control(s, LOG, Stamp(TAG, generation, ME[1]))["refused"] == reason
        s.close()
        wait_until(lambda: rig.listener.stats()[reason] == before[reason] + 1, what=reason)
    hello = handshake.Hello(JOB, 3, SENDER, ME, auth.new_nonce())
    first = {"m": handshake.PROTOCOL, "job": JOB, "gen": 3, "from": list(SENDER), "to": list(ME), "nc": hello.nonce}
    with raw_connect(rig.port) as s:
        handshake._send(s, first)
        ns = handshake._recv(s)["ns"]
        proof = {"p": auth.prove(KEY, b"dialer", *hello.binding(), hello.nonce, ns)}
    with raw_connect(rig.port) as s:            # the same proof, on a connection with a fresh challenge
        handshake._send(s, first)
        handshake._recv(s)
        handshake._send(s, proof)
        assert handshake._recv(s)["reason"] == "auth_failed"
    wait_until(lambda: rig.listener.stats()["auth_failed"] == before["auth_failed"] + 1, what="auth_failed")
    with raw_connect(rig.port) as s, pytest.raises(P2PGenError):     # a proof made with another job's key
        handshake.dial(s, auth.derive_key(SECRET, "another-job", "channel"), hello)
    wait_until(lambda: rig.listener.stats()["auth_failed"] == before["auth_failed"] + 2, what="auth_failed")
    rig.honest_send(generation=3)

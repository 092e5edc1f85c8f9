"""Fuzzing the data-plane listener (p2pgen.transport.Transport) and its connections.

An honest member (peer0, rank 0) and the target (peer1, rank 1) run real Transports. An attacker sends
the target Hypothesis bytes instead of a handshake, a replayed handshake proof, and, on a connection
that passed the real handshake as peer0, Hypothesis bytes and headers instead of frames, truncated and
oversized frames, and frames replayed from another generation, incarnation or job. Each refusal is
counted once under a reason; the honest member's next exchange with the target succeeds; closing both
transports leaves no thread or fd behind.
"""

from __future__ import annotations

import itertools
import socket
import struct
import threading
import time

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2pgen import auth
from p2pgen.collectives import TcpBackend
from p2pgen.errors import P2PGenError, PeerLost
from p2pgen.transport import REASONS, Group, Transport, TransportConfig, frame, handshake
from p2pgen_lab.rigs.rogue import RoguePeer
from tests.fuzz.conftest import FUZZ, bind_free_port, send_and_close, total, wait_until

pytestmark = pytest.mark.timeout(60)

JOB, SECRET = "fuzz-data", b"fuzz-data-secret-0123456789abcdef"
HONEST, TARGET = ("peer0", 1000), ("peer1", 2000)
CONFIG = TransportConfig(max_frame_bytes=64 << 10, chunk_bytes=16 << 10, connect_timeout=5.0,
                         handshake_timeout=1.0, abort_timeout=5.0)
PAYLOAD = np.arange(16, dtype=np.float32)


class Rig:
    def __init__(self) -> None:
        self.target = bind_free_port(lambda port: Transport(JOB, SECRET, *TARGET, port=port, config=CONFIG))
        self.honest = bind_free_port(lambda port: Transport(JOB, SECRET, *HONEST, port=port, config=CONFIG))
        self.generations = itertools.count(1)
        self.generation = 0
        self.backends: list[TcpBackend] = []

    def open(self, *, honest: bool = True) -> TcpBackend:
        """A new generation [peer0, peer1] on the target (and on the honest member); the target's backend."""
        self.generation = next(self.generations)
        members = [self.honest.endpoint(), self.target.endpoint()]
        tb = TcpBackend(self.target, Group(JOB, self.generation, members, 1))
        self.backends.append(tb)
        if honest:
            self.backends.append(TcpBackend(self.honest, Group(JOB, self.generation, members, 0)))
        return tb

    def honest_exchange(self) -> None:
        """In a fresh generation, the honest member sends the target a message that arrives intact."""
        tb = self.open()
        hb = self.backends[-1]
        got = np.zeros_like(PAYLOAD)
        t = threading.Thread(target=tb.recv, args=(got, 0), daemon=True)
        t.start()
        hb.send(PAYLOAD, 1)
        t.join(10)
        assert not t.is_alive() and np.array_equal(got, PAYLOAD)

    def refused(self) -> int:
        return total(self.target.stats(), REASONS)

    def rogue(self, generation: int | None = None, identity=HONEST, secret: bytes = SECRET) -> RoguePeer:
        """A peer that completed the handshake (retried: on a loaded machine the target, still closing the
        previous example's connection, now and then drops a new one before answering)."""
        gen = self.generation if generation is None else generation
        for attempt in range(3):
            try:
                return RoguePeer(JOB, secret, identity[0], identity[1], gen).dial(self.target.endpoint())
            except PeerLost:
                if attempt == 2:
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        for b in self.backends:
            b.close()
        self.honest.close()
        self.target.close()


@pytest.fixture
def rig(no_leaks):
    r = Rig()
    try:
        yield r
    finally:
        r.close()


def expect_refusals(rig: Rig, before: int, n: int = 1) -> None:
    wait_until(lambda: rig.refused() >= before + n, what=f"{n} refusal(s) to be counted")
    assert rig.refused() == before + n, rig.target.stats()


@FUZZ
@given(data=st.binary(max_size=200))
def test_random_bytes_instead_of_a_handshake_are_refused(rig, data):
    rig.open()
    before = rig.refused()
    send_and_close(rig.target.port, data)
    expect_refusals(rig, before)
    rig.honest_exchange()


@FUZZ
@given(hello=st.dictionaries(st.sampled_from(["m", "job", "gen", "from", "to", "nc", "x"]), st.one_of(
    st.none(), st.integers(-2**63, 2**64 - 1), st.text(max_size=12), st.binary(max_size=16),
    st.lists(st.one_of(st.text(max_size=5), st.integers(0, 5)), max_size=3)), max_size=7))
def test_hand_made_hello_messages_are_refused(rig, hello):
    hello.setdefault("m", handshake.PROTOCOL)
    rig.open()
    body = msgpack.packb(hello)
    before = rig.refused()
    send_and_close(rig.target.port, struct.pack(">I", len(body)) + body)
    expect_refusals(rig, before)
    rig.honest_exchange()


def test_oversized_handshake_message_and_a_replayed_proof_are_refused(rig):
    rig.open(honest=False)
    before = rig.target.stats()
    send_and_close(rig.target.port, struct.pack(">I", handshake.MAX_MESSAGE + 1) + b"\x80" * 64)
    wait_until(lambda: rig.target.stats()["oversized"] == before["oversized"] + 1, what="oversized")
    # Record an accepted handshake (it becomes rank 0's link of this generation), then replay it.
    key = auth.derive_key(SECRET, JOB, "data")
    hello = handshake.Hello(JOB, rig.generation, HONEST, TARGET, auth.new_nonce())
    sent = []
    with socket.create_connection(("127.0.0.1", rig.target.port), timeout=5) as s:
        handshake._send(_Recorder(s, sent), {"m": handshake.PROTOCOL, "job": JOB, "gen": rig.generation,
                                              "from": list(HONEST), "to": list(TARGET), "nc": hello.nonce})
        ns = handshake._recv(s)["ns"]
        handshake._send(_Recorder(s, sent), {"p": auth.prove(key, b"dialer", *hello.binding(), hello.nonce, ns)})
        assert "p" in handshake._recv(s)
    with socket.create_connection(("127.0.0.1", rig.target.port), timeout=5) as s:
        s.sendall(sent[0])
        handshake._recv(s)
        s.sendall(sent[1])
        assert handshake._recv(s)["reason"] == "auth_failed"
    wait_until(lambda: rig.target.stats()["auth_failed"] == before["auth_failed"] + 1, what="auth_failed")
    rig.honest_exchange()


class _Recorder:
    """A socket stand-in that records what is sent and passes it on."""

    def __init__(self, sock: socket.socket, sent: list[bytes]) -> None:
        self.sock, self.sent = sock, sent

    def sendall(self, data: bytes) -> None:
        self.sent.append(data)
        self.sock.sendall(data)


def attack_connection(rig: Rig, data: bytes, rogue: RoguePeer | None = None) -> BaseException | None:
    """The target waits for a frame from rank 0; a rogue peer0 sends `data` and closes. Returns what the
    target's receive raised (None if it received something)."""
    tb = rig.open(honest=False)
    rogue = rogue or rig.rogue()
    errors: list[BaseException] = []

    def receive() -> None:
        try:
            tb.recv(np.zeros_like(PAYLOAD), 0)
        except P2PGenError as e:
            errors.append(e)
    t = threading.Thread(target=receive, daemon=True)
    t.start()
    try:
        rogue.send(data)
        rogue.sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    t.join(10)
    rogue.close()
    assert not t.is_alive(), "the target's receive hung on a bad peer"
    return errors[0] if errors else None


@FUZZ
@given(data=st.binary(min_size=1, max_size=300))
def test_random_bytes_instead_of_frames_are_refused_and_never_delivered(rig, data):
    before = rig.refused()
    assert attack_connection(rig, data) is not None
    expect_refusals(rig, before)
    rig.honest_exchange()


@FUZZ
@given(kind=st.integers(0, 255), generation=st.integers(0, 2**64 - 1), incarnation=st.integers(0, 2**64 - 1),
       op_seq=st.integers(0, 2**64 - 1), chunk=st.integers(0, 2**32 - 1), length=st.integers(0, 2**32 - 1),
       csum=st.integers(0, 2**64 - 1), body=st.binary(max_size=64))
def test_hand_made_headers_are_refused(rig, kind, generation, incarnation, op_seq, chunk, length, csum, body):
    header = struct.pack("<4sBBHQQQQIIQ", frame.MAGIC, frame.VERSION, kind, 0, frame.job_tag(JOB), generation,
                         incarnation, op_seq, chunk, length, csum)
    before = rig.refused()
    assert attack_connection(rig, header + body) is not None
    wait_until(lambda: rig.refused() >= before + 1, what="the refusal to be counted")
    rig.honest_exchange()


def _stamped(rig: Rig, **kw) -> bytes:
    rogue = RoguePeer(JOB, SECRET, *HONEST, rig.generation + 1)     # the generation attack_connection opens
    return rogue.frame(PAYLOAD.tobytes(), **kw)


@pytest.mark.parametrize("make, reasons", [
    (lambda rig, raw: raw[:-5], {"truncated": 1}),
    (lambda rig, raw: RoguePeer.with_length(raw, 1 << 30), {"oversized": 1}),
    (lambda rig, raw: RoguePeer.corrupt_payload(raw), {"bad_checksum": 1}),
    (lambda rig, raw: _stamped(rig, generation=rig.generation), {"stale_generation": 1}),
    (lambda rig, raw: _stamped(rig, incarnation=HONEST[1] - 1), {"wrong_incarnation": 1}),
    (lambda rig, raw: _stamped(rig, job="another-job"), {"malformed": 1}),
    (lambda rig, raw: _stamped(rig, op_seq=7), {"malformed": 1}),
], ids=["truncated", "oversized", "bad_checksum", "replay_other_generation", "replay_other_incarnation",
        "replay_other_job", "replay_other_op"])
def test_bad_and_replayed_frames_are_counted_by_reason(rig, make, reasons):
    raw = _stamped(rig)
    before = rig.target.stats()
    assert attack_connection(rig, make(rig, raw)) is not None
    wait_until(lambda: all(rig.target.stats()[r] == before[r] + n for r, n in reasons.items()),
               what=f"refusals {reasons}")
    assert rig.refused() == total(before, REASONS) + sum(reasons.values()), rig.target.stats()
    rig.honest_exchange()


@pytest.mark.parametrize("identity, generation, reason", [
    (HONEST, -1, "stale_generation"), ((HONEST[0], 999), 0, "wrong_incarnation"), (("stranger", 1), 0, "not_member"),
], ids=["replayed_older_generation", "older_incarnation", "not_member"])
def test_dialers_of_another_generation_or_incarnation_are_refused(rig, identity, generation, reason):
    rig.open(honest=False)
    before = rig.target.stats()
    with pytest.raises(P2PGenError):
        rig.rogue(rig.generation + generation, identity=identity)
    wait_until(lambda: rig.target.stats()[reason] == before[reason] + 1, what=reason)
    rig.honest_exchange()

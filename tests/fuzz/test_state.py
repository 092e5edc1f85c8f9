"""Fuzzing the state server (p2pgen.state.StateServer), the listener members pull state from.

The server serves a small state for generation GEN to the member ("joiner", 7). An attacker sends
Hypothesis bytes instead of a handshake and, after passing the real handshake, instead of requests;
hand-made requests; truncated, oversized and never-finished messages; a replayed handshake proof; and
pullers of another generation or incarnation, or no member at all. Each refusal is counted once under a
reason; an honest pull still reaches the frontier digest; closing the server leaves no thread or fd.
"""

from __future__ import annotations

import socket
import struct

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2pgen import auth
from p2pgen.core.model import Frontier
from p2pgen.errors import P2PGenError
from p2pgen.state import PullConfig, ServerConfig, SharedState, Source, StateServer, pull_state, wire
from p2pgen.transport import handshake
from tests.fuzz.conftest import FUZZ, bind_free_port, raw_connect, send_and_close, total, wait_until

pytestmark = pytest.mark.timeout(60)

JOB, SECRET = "fuzz-state", b"fuzz-state-secret-0123456789abcde"
ME, JOINER, GEN = ("source", 3), ("joiner", 7), 5
KEY = auth.derive_key(SECRET, JOB, wire.KEY_PURPOSE)
CONFIG = ServerConfig(max_frame_bytes=64 << 10, handshake_timeout=0.5, idle_timeout=5.0, wait_for_window=0.5,
                      close_timeout=5.0)
PULL = PullConfig(chunk_bytes=16 << 10, batch_bytes=64 << 10, max_frame_bytes=64 << 10, connect_timeout=5.0,
                  op_timeout=5.0)


def state(revision: int = 10) -> SharedState:
    rng = np.random.default_rng(1)
    return SharedState({"w": rng.standard_normal(20000, dtype=np.float32), "b": np.arange(7)}, {"step": revision},
                       revision=revision)


class Rig:
    def __init__(self) -> None:
        self.state = state()
        self.server = bind_free_port(lambda port: StateServer(
            self.state, job=JOB, secret=SECRET, me=ME, authorize=lambda peer, inc, gen: (peer, inc) == JOINER,
            port=port, config=CONFIG))
        self.window = self.server.serving(GEN)
        self.manifest = self.window.__enter__()

    def honest_pull(self) -> None:
        mine = state(revision=3)
        mine.tensors["w"][:] = 0
        report = pull_state(mine, job=JOB, secret=SECRET, me=JOINER, generation=GEN,
                            frontier=Frontier(self.manifest.revision, self.manifest.digest),
                            sources=[Source(*ME, "127.0.0.1", self.server.port)], config=PULL, progress=False)
        assert mine._manifest().digest == self.manifest.digest, report

    def refused(self) -> int:
        return total(self.server.stats())

    def dial(self, generation: int = GEN, identity=JOINER, target=ME, key: bytes = KEY) -> socket.socket:
        s = raw_connect(self.server.port)
        try:
            handshake.dial(s, key, handshake.Hello(JOB, generation, identity, target, auth.new_nonce()))
        except BaseException:
            s.close()
            raise
        return s

    def close(self) -> None:
        self.window.__exit__(None, None, None)
        self.server.close()


@pytest.fixture
def rig(no_leaks):
    r = Rig()
    try:
        yield r
    finally:
        r.close()


def expect_one_more(rig: Rig, before: int) -> None:
    wait_until(lambda: rig.refused() >= before + 1, what="the refusal to be counted")
    assert rig.refused() == before + 1, rig.server.stats()


@FUZZ
@given(data=st.binary(max_size=200))
def test_random_bytes_instead_of_a_handshake_are_refused(rig, data):
    before = rig.refused()
    send_and_close(rig.server.port, data)
    expect_one_more(rig, before)
    rig.honest_pull()


def request_bytes(rig: Rig, data: bytes) -> bytes:
    """Pass the real handshake as the joiner, send `data`, half-close; what the server answered."""
    with rig.dial() as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            return b""
        s.settimeout(5.0)
        out = bytearray()
        try:
            while chunk := s.recv(65536):
                out += chunk
        except OSError:
            pass
        return bytes(out)


@FUZZ
@given(data=st.binary(min_size=1, max_size=200))
def test_random_bytes_instead_of_requests_are_refused(rig, data):
    before = rig.refused()
    request_bytes(rig, data)
    expect_one_more(rig, before)
    rig.honest_pull()


@FUZZ
@given(req=st.dictionaries(st.sampled_from(["op", "t", "first", "count", "cb", "x"]), st.one_of(
    st.sampled_from(["get", "manifest?", "objects!", "put"]), st.integers(-2**63, 2**64 - 1), st.none(),
    st.binary(max_size=8)), max_size=6))
def test_hand_made_requests_are_refused_with_a_reason(rig, req):
    body = msgpack.packb(req)
    before = rig.refused()
    answer = request_bytes(rig, struct.pack(">I", len(body)) + body)
    expect_one_more(rig, before)
    assert b"reason" in answer          # the puller is told why, in an ERROR frame
    rig.honest_pull()


@pytest.mark.parametrize("data, reason", [
    (struct.pack(">I", wire.MAX_REQUEST + 1) + b"\x80", "oversized"),
    (struct.pack(">I", 40) + b"\x81\xa2op", "truncated"),
    (struct.pack(">I", 1) + b"\xc1", "malformed"),
], ids=["oversized", "truncated", "malformed"])
def test_bad_requests_are_counted_by_reason(rig, data, reason):
    before = rig.server.stats()
    request_bytes(rig, data)
    wait_until(lambda: rig.server.stats()[reason] == before[reason] + 1, what=reason)
    rig.honest_pull()


def test_a_handshake_that_never_finishes_is_cut_off_and_counted(rig):
    before = rig.server.stats()
    with raw_connect(rig.server.port) as s:
        s.sendall(struct.pack(">I", 30) + b"\x81")     # 1 of 30 bytes, then silence
        s.settimeout(5.0)
        assert s.recv(100) == b""                       # the server hangs up after its handshake timeout
    wait_until(lambda: rig.server.stats()["truncated"] == before["truncated"] + 1, what="truncated")
    rig.honest_pull()


@pytest.mark.parametrize("kw, reason", [
    ({"generation": GEN - 1}, "stale_generation"),
    ({"identity": (JOINER[0], JOINER[1] - 1)}, "not_member"),
    ({"identity": ("stranger", 1)}, "not_member"),
    ({"target": (ME[0], ME[1] + 1)}, "wrong_incarnation"),
    ({"key": auth.derive_key(SECRET, "another-job", wire.KEY_PURPOSE)}, "auth_failed"),
], ids=["older_generation", "older_incarnation", "not_member", "wrong_incarnation", "another_jobs_key"])
def test_pullers_of_another_generation_incarnation_or_job_are_refused(rig, kw, reason):
    before = rig.server.stats()
    with pytest.raises(P2PGenError):
        rig.dial(**kw).close()
    wait_until(lambda: rig.server.stats()[reason] == before[reason] + 1, what=reason)
    rig.honest_pull()


def test_a_replayed_handshake_proof_is_refused(rig):
    hello = handshake.Hello(JOB, GEN, JOINER, ME, auth.new_nonce())
    first = {"m": handshake.PROTOCOL, "job": JOB, "gen": GEN, "from": list(JOINER), "to": list(ME), "nc": hello.nonce}
    with raw_connect(rig.server.port) as s:          # an accepted handshake, recorded
        handshake._send(s, first)
        ns = handshake._recv(s)["ns"]
        proof = {"p": auth.prove(KEY, b"dialer", *hello.binding(), hello.nonce, ns)}
        handshake._send(s, proof)
        assert "p" in handshake._recv(s)
    before = rig.server.stats()
    with raw_connect(rig.server.port) as s:
        handshake._send(s, first)
        handshake._recv(s)
        handshake._send(s, proof)
        assert handshake._recv(s)["reason"] == "auth_failed"
    wait_until(lambda: rig.server.stats()["auth_failed"] == before["auth_failed"] + 1, what="auth_failed")
    rig.honest_pull()


def test_a_request_for_a_generation_not_served_is_refused(rig):
    before = rig.server.stats()
    answer = request_bytes(rig, b"")                 # nothing asked: not a refusal
    assert answer == b"" and rig.server.stats() == before
    with rig.dial(generation=GEN + 1) as s:          # a future generation: waits, then not_serving
        wire.send_request(s, {"op": "manifest"})
        s.settimeout(5.0)
        assert b"not_serving" in s.recv(4096)
    wait_until(lambda: rig.server.stats()["not_serving"] == before["not_serving"] + 1, what="not_serving")
    rig.honest_pull()

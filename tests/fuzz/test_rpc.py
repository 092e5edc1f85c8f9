"""Fuzzing the agent's control RPC listener (p2pgen.agent.rpc.RpcServer) on a real socket.

Attacks: Hypothesis bytes in place of the handshake reply and in place of a request, truncated and
oversized frames, a handshake that never finishes, a replayed handshake reply, a proof made for another
job, and malformed requests. After each one an honest client must still be answered, the refusal must
be counted once under a reason, and closing the server must leave no thread or fd behind.
"""

from __future__ import annotations

import socket

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2pgen.agent.rpc import HEADER, MAX_FRAME, REASONS, RpcClient, RpcServer, recv_frame, send_frame
from p2pgen.auth import derive_key, new_nonce, prove
from tests.fuzz.conftest import FUZZ, MSGPACK_INTEGERS, bind_free_port, raw_connect, send_and_close, total, wait_until

pytestmark = pytest.mark.timeout(60)

JOB, SECRET = "fuzz-rpc", b"fuzz-rpc-secret-0123456789abcdef"


class Rig:
    def __init__(self) -> None:
        self.server = bind_free_port(lambda port: RpcServer("127.0.0.1", port, JOB, SECRET,
                                                            {"echo": lambda p: p}, handshake_timeout=0.5))
        self.port = self.server.port
        self.server.start()

    def honest_call(self) -> None:
        with RpcClient(f"127.0.0.1:{self.port}", SECRET, timeout=5.0, expect_job=JOB) as client:
            assert client.call("echo", x=[1, 2, 3]) == {"x": [1, 2, 3]}

    def refused(self) -> int:
        return total(self.server.refusals())

    def expect_one_more(self, before: int, reasons: tuple[str, ...] = REASONS) -> None:
        wait_until(lambda: self.refused() >= before + 1, what="the refusal to be counted")
        counts = self.server.refusals()
        assert self.refused() == before + 1, counts
        assert total(counts, reasons) >= 1, counts

    def authenticated(self) -> socket.socket:
        """A raw socket past the real handshake, ready for hand-made requests."""
        s = raw_connect(self.port)
        hello = recv_frame(s)
        key, nonce_c = derive_key(SECRET, JOB, "control"), new_nonce()
        send_frame(s, {"nonce": nonce_c, "proof": prove(key, b"client", hello["nonce"], nonce_c)})
        assert "proof" in recv_frame(s)
        return s


@pytest.fixture
def rig(no_leaks):
    r = Rig()
    try:
        yield r
    finally:
        r.server.stop()


def frame_of(obj) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    return HEADER.pack(len(body)) + body


@FUZZ
@given(data=st.binary(max_size=200))
def test_random_bytes_instead_of_the_handshake_reply_are_refused_and_counted(rig, data):
    before = rig.refused()
    answer = send_and_close(rig.port, data, read_first=4096)
    rig.expect_one_more(before)
    assert b"proof" not in answer
    rig.honest_call()


@FUZZ
@given(obj=st.recursive(st.none() | st.booleans() | MSGPACK_INTEGERS | st.binary(max_size=20) | st.text(max_size=20),
                        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                                                  max_size=4), max_leaves=12))
def test_well_formed_msgpack_without_a_valid_proof_is_refused(rig, obj):
    before = rig.refused()
    send_and_close(rig.port, frame_of(obj), read_first=4096)
    rig.expect_one_more(before, ("auth_failed", "malformed"))
    rig.honest_call()


@FUZZ
@given(cut=st.integers(min_value=0, max_value=60))
def test_a_truncated_handshake_reply_is_counted_truncated(rig, cut):
    nonce = new_nonce()
    raw = frame_of({"nonce": nonce, "proof": b"\0" * 32})
    before = rig.refused()
    send_and_close(rig.port, raw[:min(cut, len(raw) - 1)], read_first=4096)
    rig.expect_one_more(before, ("truncated",))
    rig.honest_call()


def test_an_oversized_length_prefix_is_refused_before_reading_the_payload(rig):
    for length in (MAX_FRAME + 1, 2**32 - 1):
        before = rig.refused()
        send_and_close(rig.port, HEADER.pack(length) + b"x" * 100, read_first=4096)
        rig.expect_one_more(before, ("oversized",))
    rig.honest_call()


def test_a_handshake_that_never_finishes_is_cut_off_and_counted(rig):
    before = rig.refused()
    with raw_connect(rig.port) as s:
        recv_frame(s)
        s.sendall(HEADER.pack(50) + b"\x82")       # 1 of 50 bytes, then silence
        s.settimeout(5.0)
        assert s.recv(100) == b""                  # the server hangs up after its handshake timeout
    rig.expect_one_more(before, ("truncated",))
    rig.honest_call()


def test_a_replayed_handshake_reply_and_another_jobs_proof_are_refused(rig):
    key = derive_key(SECRET, JOB, "control")
    with raw_connect(rig.port) as s:                # an honest handshake, recorded
        hello = recv_frame(s)
        nonce_c = new_nonce()
        recorded = {"nonce": nonce_c, "proof": prove(key, b"client", hello["nonce"], nonce_c)}
        send_frame(s, recorded)
        assert "proof" in recv_frame(s)
    before = rig.refused()
    assert b"authentication failed" in send_and_close(rig.port, frame_of(recorded), read_first=4096)
    rig.expect_one_more(before, ("auth_failed",))
    other = derive_key(SECRET, "another-job", "control")
    with raw_connect(rig.port) as s:
        hello = recv_frame(s)
        send_frame(s, {"nonce": nonce_c, "proof": prove(other, b"client", hello["nonce"], nonce_c)})
        assert "error" in recv_frame(s)
    wait_until(lambda: rig.server.refusals()["auth_failed"] == 2, what="two auth_failed")
    rig.honest_call()


@FUZZ
@given(data=st.binary(min_size=1, max_size=200))
def test_random_bytes_after_authentication_close_only_that_connection(rig, data):
    before = rig.refused()
    with rig.authenticated() as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:           # the server already hung up (an oversized prefix)
            pass
        s.settimeout(5.0)
        answers = []
        try:
            while True:
                answers.append(recv_frame(s))
        except (ConnectionError, OSError):
            pass
    # Either the bytes held no complete frame (truncated), an unreadable or too long one, or complete
    # frames each answered with an error; any of them is one more refusal, never a success.
    wait_until(lambda: rig.refused() > before, what="the refusal to be counted")
    assert all(not a.get("ok") for a in answers), answers
    rig.honest_call()


@pytest.mark.parametrize("request_, reason", [
    ([1, 2], "malformed"), ({"method": 7}, "malformed"), ({"method": "echo", "params": [1]}, "malformed"),
    ({"method": "nope"}, "unknown_method"), ({"method": "echo", "params": {b"\x00": 1}}, None),
    ({"method": "echo", "params": {(1,): 1}}, None),
], ids=["list", "method_int", "params_list", "unknown", "bytes_key", "unhashable_key"])
def test_malformed_requests_get_an_error_answer_and_are_counted(rig, request_, reason):
    with rig.authenticated() as s:
        before = rig.server.refusals()
        if reason is None:        # a map key msgpack cannot hash: the frame is refused, the connection closed
            body = msgpack.packb({"method": "echo", "params": {"k": 1}}, use_bin_type=True)
            body = body.replace(b"\xa1k", b"\x91\x01")       # the key "k" becomes the list [1]
            s.sendall(HEADER.pack(len(body)) + body)
            s.settimeout(5.0)
            assert s.recv(100) == b""
            wait_until(lambda: rig.server.refusals()["malformed"] == before["malformed"] + 1,
                       what="the unreadable frame to be counted malformed")
        else:
            send_frame(s, request_)
            answer = recv_frame(s)
            assert answer["ok"] is False and answer["error"], answer
            assert rig.server.refusals()[reason] == before[reason] + 1
            send_frame(s, {"method": "echo", "params": {"a": 1}})   # the connection still serves
            assert recv_frame(s) == {"ok": True, "result": {"a": 1}}
    rig.honest_call()


def test_stop_closes_open_connections_and_their_threads(no_leaks):
    rig = Rig()
    idle = [rig.authenticated() for _ in range(3)]
    half = raw_connect(rig.port)
    recv_frame(half)                            # the greeting; the handshake is left unfinished
    rig.server.stop()
    for s in idle + [half]:
        with s:
            s.settimeout(3.0)
            assert s.recv(4096) == b"", "the server left a connection open after stop()"

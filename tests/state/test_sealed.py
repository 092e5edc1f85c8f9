"""Sealed state transfer (`ServerConfig(encrypt=True)` / `PullConfig(encrypt=True)`): a request that was replayed,
or sent in the clear on a sealed connection, is refused and counted; the source says why in a sealed ERROR frame."""

from __future__ import annotations

import socket

import msgpack
import pytest

from p2pgen import auth
from p2pgen.errors import ProtocolError
from p2pgen.state import ServerConfig, wire
from p2pgen.transport import handshake
from p2pgen.transport.seal import Seal
from tests.state.helpers import JOB, SECRET, make_state

pytestmark = pytest.mark.timeout(30)

GEN = 5


@pytest.mark.parametrize("second, reason", [
    (lambda seal, first: first, "replayed"),                                     # the same sealed bytes again
    (lambda seal, first: len(msgpack.packb({"op": "manifest"})).to_bytes(4, "big") + msgpack.packb({"op": "manifest"}),
     "bad_seal"),                                                                # a request in the clear
], ids=["replayed", "plaintext"])
def test_a_bad_request_on_a_sealed_connection_is_refused_and_counted(servers, second, reason):
    server = servers(make_state(1, 1 << 16), ("p0", 1), config=ServerConfig(encrypt=True))
    key = auth.derive_key(SECRET, JOB, wire.KEY_PURPOSE)
    with server.serving(GEN), socket.create_connection((server.host, server.port), timeout=5) as sock:
        hello = handshake.Hello(JOB, GEN, ("joiner", 7), ("p0", 1), auth.new_nonce(), encrypt=True)
        seal = Seal(handshake.dial(sock, key, hello))
        rx = wire.FrameReceiver(sock, JOB, GEN, ("p0", 1), 1 << 20, wire.Counters(), seal=seal)
        first = seal.seal_message(msgpack.packb({"op": "manifest"}))
        sock.sendall(first)
        rx.recv(wire.MANIFEST, 0, 0)                   # the first one is answered
        sock.sendall(second(seal, first))
        with pytest.raises(ProtocolError, match=f"refused: {reason}"):
            rx.recv(wire.MANIFEST, 0, 0)
    assert server.stats()[reason] == 1

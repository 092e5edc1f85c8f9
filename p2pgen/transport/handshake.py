"""Connection handshake: mutual challenge-response over the job's "data" key (I8), binding the connection
to (job, generation, dialer identity, listener identity).

    dialer -> HELLO     {job, gen, from: [peer_id, inc], to: [peer_id, inc], nc}
    listener -> CHALLENGE {ns}
    dialer -> PROOF     {p: HMAC(key, "dialer", binding, nc, ns)}
    listener -> ACCEPT  {p: HMAC(key, "listener", binding, nc, ns)}   or REJECT {reason, detail}

The secret never crosses the wire; both nonces are fresh, and the role label stops a proof from being
reflected back. Invariant: a connection is handed to a communicator only after the dialer's proof
verified and the listener accepted the binding; every refusal is counted under one reason.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

import msgpack

from p2pgen import auth
from p2pgen.errors import AuthenticationError, GenerationChanged, PeerLost, ProtocolError

PROTOCOL = "p2pgen-data/1"
MAX_MESSAGE = 4096
_LEN = struct.Struct(">I")


class HandshakeRejected(Exception):
    """The listener refused a dialer; `reason` is a stats reason."""

    def __init__(self, reason: str, detail: str, tell: bool = False) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.tell = tell   # the dialer is owed a REJECT message (send it with `refuse`)


@dataclass(frozen=True)
class Hello:
    job: str
    generation: int
    dialer: tuple[str, int]
    target: tuple[str, int]
    nonce: bytes

    def binding(self) -> tuple[bytes, ...]:
        return (self.job.encode(), str(self.generation).encode(), self.dialer[0].encode(),
                str(self.dialer[1]).encode(), self.target[0].encode(), str(self.target[1]).encode())


def _send(sock: socket.socket, msg: dict) -> None:
    body = msgpack.packb(msg)
    sock.sendall(_LEN.pack(len(body)) + body)


def refuse(sock: socket.socket, rejected: HandshakeRejected) -> None:
    """Tell the dialer why it was refused; best effort, the dialer may already be gone."""
    if rejected.tell:
        try:
            _send(sock, {"reason": rejected.reason, "detail": rejected.detail})
        except OSError:
            pass


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise HandshakeRejected("truncated", f"connection closed after {got} of {n} handshake bytes")
        got += k
    return bytes(buf)


def _recv(sock: socket.socket) -> dict:
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if n > MAX_MESSAGE:
        raise HandshakeRejected("oversized", f"handshake message of {n} bytes (limit {MAX_MESSAGE})")
    try:
        msg = msgpack.unpackb(_recv_exact(sock, n))
    except (ValueError, msgpack.UnpackException) as e:
        raise HandshakeRejected("malformed", f"handshake message is not msgpack: {e}") from e
    if not isinstance(msg, dict):
        raise HandshakeRejected("malformed", f"handshake message is a {type(msg).__name__}, not a map")
    return msg


def _field(msg: dict, name: str, kind: type):
    value = msg.get(name)
    if not isinstance(value, kind):
        raise HandshakeRejected("malformed", f"handshake field {name!r} missing or not {kind.__name__}")
    return value


def _identity(msg: dict, name: str) -> tuple[str, int]:
    value = _field(msg, name, list)
    if len(value) != 2 or not isinstance(value[0], str) or not isinstance(value[1], int):
        raise HandshakeRejected("malformed", f"handshake field {name!r} is not [peer_id, incarnation]")
    return (value[0], value[1])


def _parse_hello(msg: dict) -> Hello:
    if msg.get("m") != PROTOCOL:
        raise HandshakeRejected("malformed", f"protocol {msg.get('m')!r}, expected {PROTOCOL!r}")
    return Hello(_field(msg, "job", str), _field(msg, "gen", int), _identity(msg, "from"),
                 _identity(msg, "to"), _field(msg, "nc", bytes))


def dial(sock: socket.socket, key: bytes, hello: Hello) -> None:
    """Run the dialer's side on a connected socket; raises on any refusal."""
    try:
        _dial(sock, key, hello)
    except HandshakeRejected as e:
        kind = PeerLost if e.reason == "truncated" else ProtocolError
        raise kind(f"handshake with {hello.target} failed: {e}") from e


def _dial(sock: socket.socket, key: bytes, hello: Hello) -> None:
    _send(sock, {"m": PROTOCOL, "job": hello.job, "gen": hello.generation, "from": list(hello.dialer),
                 "to": list(hello.target), "nc": hello.nonce})
    reply = _recv(sock)
    _raise_if_rejected(reply, hello)
    nonce_s = _field(reply, "ns", bytes)
    _send(sock, {"p": auth.prove(key, b"dialer", *hello.binding(), hello.nonce, nonce_s)})
    reply = _recv(sock)
    _raise_if_rejected(reply, hello)
    if not auth.verify(key, _field(reply, "p", bytes), b"listener", *hello.binding(), hello.nonce, nonce_s):
        raise AuthenticationError(f"listener at {hello.target} did not prove the job secret: "
                                  f"check that every peer of job {hello.job!r} uses the same secret file")


def _raise_if_rejected(reply: dict, hello: Hello) -> None:
    if "reason" not in reply:
        return
    reason, detail = str(reply.get("reason")), str(reply.get("detail"))
    where = f"{hello.target[0]} (incarnation {hello.target[1]}) refused generation {hello.generation}"
    if reason == "auth_failed":
        raise AuthenticationError(f"{where}: {detail}; check the job secret file")
    if reason == "stale_generation":
        raise GenerationChanged(f"{where}: {detail}")
    raise ProtocolError(f"{where}: {reason}: {detail}")


def accept(sock: socket.socket, key: bytes, job: str, me: tuple[str, int], decide) -> Hello:
    """Run the listener's side. `decide(hello)` returns None to accept or (reason, detail) to refuse.

    Raises HandshakeRejected on any refusal; the caller counts it, then calls `refuse` to tell the dialer.
    """
    hello = _parse_hello(_recv(sock))
    nonce_s = auth.new_nonce()
    _send(sock, {"ns": nonce_s})
    proof = _field(_recv(sock), "p", bytes)
    if hello.job != job or not auth.verify(key, proof, b"dialer", *hello.binding(), hello.nonce, nonce_s):
        raise HandshakeRejected("auth_failed", f"dialer claiming {hello.dialer} failed the secret proof",
                                tell=True)
    refusal = decide(hello) if hello.target == me else (
        "wrong_incarnation", f"this listener is {me}, not {hello.target}")
    if refusal is not None:
        raise HandshakeRejected(*refusal, tell=True)
    _send(sock, {"p": auth.prove(key, b"listener", *hello.binding(), hello.nonce, nonce_s)})
    return hello

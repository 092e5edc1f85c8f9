"""Connection handshake: mutual challenge-response over the job's "data" key (I8), binding the connection
to (job, generation, dialer identity, listener identity).

    dialer -> HELLO     {job, gen, from: [peer_id, inc], to: [peer_id, inc], nc}
    listener -> CHALLENGE {ns}
    dialer -> PROOF     {p: HMAC(key, "dialer", binding, nc, ns)}
    listener -> ACCEPT  {p: HMAC(key, "listener", binding, nc, ns)}   or REJECT {reason, detail}

The secret never crosses the wire; both nonces are fresh, and the role label stops a proof from being
reflected back. A dialer that seals its links (`--encrypt`) adds `enc: true` to HELLO and the binding (so
the proofs cover it); both ends then derive the connection's keys from the key and both nonces
(`p2pgen.transport.seal`). A listener whose setting differs refuses the dialer ("encryption_mismatch")
with a message naming the member that runs without `--encrypt`: a job never falls back to plaintext.
Invariant: a connection is handed to a communicator only after the dialer's proof verified, both ends
agreed on sealing and the listener accepted the binding; every refusal is counted under one reason.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field, replace

import msgpack

from p2pgen import auth
from p2pgen.errors import AuthenticationError, EncryptionMismatch, GenerationChanged, PeerLost, ProtocolError
from p2pgen.transport import seal

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
    encrypt: bool = False                  # the dialer seals its links (--encrypt)
    keys: seal.LinkKeys | None = field(default=None, compare=False)   # set by `accept` on a sealed link

    def binding(self) -> tuple[bytes, ...]:
        plain = (self.job.encode(), str(self.generation).encode(), self.dialer[0].encode(),
                 str(self.dialer[1]).encode(), self.target[0].encode(), str(self.target[1]).encode())
        return plain + ((b"enc", seal.CIPHER.encode()) if self.encrypt else ())


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
    encrypt = msg.get("enc", False)
    if not isinstance(encrypt, bool):
        raise HandshakeRejected("malformed", "handshake field 'enc' is not a boolean")
    return Hello(_field(msg, "job", str), _field(msg, "gen", int), _identity(msg, "from"),
                 _identity(msg, "to"), _field(msg, "nc", bytes), encrypt)


def dial(sock: socket.socket, key: bytes, hello: Hello) -> seal.LinkKeys | None:
    """Run the dialer's side on a connected socket; returns the connection's keys if `hello.encrypt`.

    Raises:
        EncryptionMismatch: the listener's `--encrypt` setting differs (the message says who must change).
        AuthenticationError, ProtocolError, GenerationChanged: the listener refused or failed its proof.
        PeerLost: the connection ended during the handshake.
    """
    try:
        nonce_s = _dial(sock, key, hello)
    except HandshakeRejected as e:
        kind = PeerLost if e.reason == "truncated" else ProtocolError
        raise kind(f"handshake with {hello.target} failed: {e}") from e
    if not hello.encrypt:
        return None
    return seal.derive_link_keys(key, hello.binding(), hello.nonce, nonce_s, dialer=True)


def _dial(sock: socket.socket, key: bytes, hello: Hello) -> bytes:
    opening = {"m": PROTOCOL, "job": hello.job, "gen": hello.generation, "from": list(hello.dialer),
               "to": list(hello.target), "nc": hello.nonce}
    if hello.encrypt:
        opening["enc"] = True
    _send(sock, opening)
    reply = _recv(sock)
    _raise_if_rejected(reply, hello)
    nonce_s = _field(reply, "ns", bytes)
    _send(sock, {"p": auth.prove(key, b"dialer", *hello.binding(), hello.nonce, nonce_s)})
    reply = _recv(sock)
    _raise_if_rejected(reply, hello)
    if not auth.verify(key, _field(reply, "p", bytes), b"listener", *hello.binding(), hello.nonce, nonce_s):
        raise AuthenticationError(f"listener at {hello.target} did not prove the job secret: "
                                  f"check that every peer of job {hello.job!r} uses the same secret file")
    return nonce_s


def _raise_if_rejected(reply: dict, hello: Hello) -> None:
    if "reason" not in reply:
        return
    reason, detail = str(reply.get("reason")), str(reply.get("detail"))
    where = f"{hello.target[0]} (incarnation {hello.target[1]}) refused generation {hello.generation}"
    if reason == "auth_failed":
        raise AuthenticationError(f"{where}: {detail}; check the job secret file")
    if reason == "stale_generation":
        raise GenerationChanged(f"{where}: {detail}")
    if reason == "encryption_mismatch":
        raise EncryptionMismatch(f"{where}: {detail}")
    raise ProtocolError(f"{where}: {reason}: {detail}")


def accept(sock: socket.socket, key: bytes, job: str, me: tuple[str, int], decide,
           encrypt: bool = False) -> Hello:
    """Run the listener's side. `decide(hello)` returns None to accept or (reason, detail) to refuse.

    Args:
        encrypt: this listener seals its links; the returned Hello then carries the connection's `keys`.
    Raises:
        HandshakeRejected: any refusal; the caller counts it, then calls `refuse` to tell the dialer.
    """
    hello = _parse_hello(_recv(sock))
    nonce_s = auth.new_nonce()
    _send(sock, {"ns": nonce_s})
    proof = _field(_recv(sock), "p", bytes)
    if hello.job != job or not auth.verify(key, proof, b"dialer", *hello.binding(), hello.nonce, nonce_s):
        raise HandshakeRejected("auth_failed", f"dialer claiming {hello.dialer} failed the secret proof",
                                tell=True)
    if hello.encrypt != encrypt:
        raise HandshakeRejected("encryption_mismatch", mismatch(hello, me, encrypt), tell=True)
    refusal = decide(hello) if hello.target == me else (
        "wrong_incarnation", f"this listener is {me}, not {hello.target}")
    if refusal is not None:
        raise HandshakeRejected(*refusal, tell=True)
    _send(sock, {"p": auth.prove(key, b"listener", *hello.binding(), hello.nonce, nonce_s)})
    if not encrypt:
        return hello
    return replace(hello, keys=seal.derive_link_keys(key, hello.binding(), hello.nonce, nonce_s, dialer=False))


def mismatch(hello: Hello, me: tuple[str, int], encrypt: bool) -> str:
    """Why a listener refuses a dialer whose --encrypt setting differs: names the member that must change
    (the one without --encrypt: one member's missing flag never turns a job's encryption off)."""
    dialer = f"{hello.dialer[0]} (incarnation {hello.dialer[1]})"
    listener = f"{me[0]} (incarnation {me[1]})"
    if encrypt:
        return (f"peer {dialer} joined without --encrypt; this job encrypts its links ({listener} runs with "
                f"--encrypt): restart {hello.dialer[0]} with --encrypt")
    return (f"peer {listener} runs without --encrypt, but {dialer} encrypts its links: restart {me[0]} with "
            f"--encrypt (to run job {hello.job!r} unencrypted, restart every member without --encrypt)")

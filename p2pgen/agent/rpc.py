"""Authenticated request/response RPC between agents, applications and the CLI (control plane).

Owns: framing (4-byte length + msgpack map, bounded size), the mutual challenge-response handshake
and the request loop. Invariant kept (I8): no request is served on a connection whose peer has not
proved knowledge of the job secret, and a client never trusts an agent that has not proved it either.
The secret never crosses the wire; a bad proof closes the connection with a reason both sides can read.
Every connection refused (bad proof, malformed, oversized or truncated frame, a handshake not finished
within `handshake_timeout`) and every malformed request is counted once under a reason (`refusals()`,
shown by `p2pgen show`); closing the server closes its connections and waits for their threads.

Handshake:  server -> {hello, job, nonce_s};  client -> {nonce_c, proof_c = HMAC(k, "client", nonce_s, nonce_c)};
            server -> {proof_s = HMAC(k, "server", nonce_c, nonce_s)} or {error}.
            k = derive_key(secret, job, "control").
"""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Callable
from typing import Any

import msgpack

from p2pgen import faults
from p2pgen.auth import derive_key, insecure_default_secret, new_nonce, prove, verify
from p2pgen.errors import AuthenticationError, P2PGenError, ProtocolError
from p2pgen.listener import Listener
from p2pgen.transport.stats import RejectCounters

log = logging.getLogger(__name__)

MAX_FRAME = 16 * 1024 * 1024
HEADER = struct.Struct(">I")
Handler = Callable[[dict[str, Any]], Any]
REASONS = ("auth_failed", "malformed", "oversized", "truncated", "unknown_method")


class RpcError(P2PGenError):
    """The remote agent refused the request; the message says why."""


class FrameRefused(ProtocolError):
    """A frame this side will not read; `reason` is one of REASONS."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class TruncatedFrame(ConnectionError):
    """The other side closed the connection in the middle of a frame."""


def send_frame(sock: socket.socket, obj: Any) -> None:
    payload = msgpack.packb(obj, use_bin_type=True)
    if len(payload) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(payload)} bytes exceeds the {MAX_FRAME}-byte limit")
    sock.sendall(HEADER.pack(len(payload)) + payload)


def recv_frame(sock: socket.socket) -> Any:
    """The next frame's value. ConnectionError if the other side closed between frames, TruncatedFrame
    (a ConnectionError) if it closed inside one, FrameRefused (a ProtocolError) if the frame is too long
    or not msgpack."""
    (length,) = HEADER.unpack(_recv_exact(sock, HEADER.size, start_of_frame=True))
    if length > MAX_FRAME:
        raise FrameRefused("oversized", f"announced frame of {length} bytes exceeds the {MAX_FRAME}-byte limit")
    try:
        return msgpack.unpackb(_recv_exact(sock, length), raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as e:   # TypeError: a map key that is a map or list
        raise FrameRefused("malformed", f"malformed frame: {e}") from e


def _recv_exact(sock: socket.socket, n: int, start_of_frame: bool = False) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            if start_of_frame and not buf:
                raise ConnectionError("connection closed by the other side")
            raise TruncatedFrame(f"connection closed by the other side inside a frame ({len(buf)} of {n} bytes)")
        buf += chunk
    return bytes(buf)


class RpcServer:
    """Serves `handlers[method](params)` to authenticated clients, one thread per connection."""

    def __init__(self, host: str, port: int, job: str, secret: bytes, handlers: dict[str, Handler],
                 handshake_timeout: float = 5.0) -> None:
        self.job = job
        self.key = derive_key(secret, job, "control")
        self.handlers = handlers
        self.handshake_timeout = handshake_timeout
        self.counters = RejectCounters(REASONS)
        self._listener = Listener(host, port, self._handle, name=f"rpc-{host}:{port}", backlog=5)
        self.port = self._listener.address[1]

    def start(self) -> None:
        self._listener.start()

    def stop(self) -> None:
        """Stop accepting, close every open connection and wait (briefly) for their threads."""
        self._listener.close(timeout=2.0)

    @property
    def refused(self) -> int:
        """Connections and requests refused so far, all reasons together."""
        return sum(self.counters.snapshot().values())

    def refusals(self) -> dict[str, int]:
        """Refused connections and requests by reason."""
        return self.counters.snapshot()

    def _refuse(self, peer: tuple, reason: str, detail: str) -> None:
        """Count the refusal and log it: a warning for what an operator should look at (a wrong secret, a
        malformed request); a handshake cut short is routine under churn (its dialer died or gave up) and is
        logged at INFO, counted all the same (`show` lists every reason)."""
        self.counters.add(reason)
        level = logging.INFO if reason == "truncated" else logging.WARNING
        log.log(level, "refused control connection from %s (%s): %s", peer, reason, detail)

    def _handle(self, sock: socket.socket, peer: tuple) -> None:
        """The accepted connection's thread (run by the Listener)."""
        try:
            self._serve(sock, peer)
        finally:
            sock.close()

    def _serve(self, sock: socket.socket, peer: tuple) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.handshake_timeout)
        try:
            if not self._authenticate(sock, peer):
                return
        except FrameRefused as e:
            return self._refuse(peer, e.reason, str(e))
        except ProtocolError as e:
            return self._refuse(peer, "malformed", str(e))
        except OSError as e:      # ConnectionError, TruncatedFrame, the handshake timeout
            return self._refuse(peer, "truncated", f"handshake not completed: {e!r}")
        sock.settimeout(None)
        try:
            while True:
                request = recv_frame(sock)
                send_frame(sock, self._dispatch(request))
        except FrameRefused as e:
            self._refuse(peer, e.reason, str(e))
        except TruncatedFrame as e:
            self._refuse(peer, "truncated", str(e))
        except OSError:
            return

    def _authenticate(self, sock: socket.socket, peer: tuple) -> bool:
        nonce_s = new_nonce()
        send_frame(sock, {"hello": "p2pgen", "job": self.job, "nonce": nonce_s})
        reply = recv_frame(sock)
        nonce_c, proof = _field(reply, "nonce", bytes), _field(reply, "proof", bytes)
        if not verify(self.key, proof, b"client", nonce_s, nonce_c):
            self._refuse(peer, "auth_failed", "wrong job secret")
            send_frame(sock, {"error": f"authentication failed: you do not hold the secret of job {self.job!r} "
                                       "(check --secret-file)"})
            return False
        send_frame(sock, {"proof": prove(self.key, b"server", nonce_c, nonce_s)})
        return True

    def _dispatch(self, request: Any) -> dict[str, Any]:
        params = (request.get("params") or {}) if isinstance(request, dict) else None
        if not isinstance(params, dict) or not isinstance(request.get("method"), str):
            self.counters.add("malformed")
            return {"ok": False, "error": "a request is a map with a string 'method' and a map 'params'"}
        handler = self.handlers.get(request["method"])
        if handler is None:
            self.counters.add("unknown_method")
            return {"ok": False, "error": f"unknown method {request['method']!r}; known: {sorted(self.handlers)}"}
        try:
            return {"ok": True, "result": handler(params)}
        except (P2PGenError, ValueError, KeyError, TypeError) as e:
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def _field(msg: Any, name: str, kind: type) -> Any:
    if not isinstance(msg, dict) or not isinstance(msg.get(name), kind):
        raise ProtocolError(f"handshake message lacks {name!r} ({kind.__name__})")
    return msg[name]


class RpcClient:
    """One authenticated connection to an agent. Not thread-safe: use one per thread."""

    def __init__(self, addr: str, secret: bytes | None, timeout: float = 5.0, expect_job: str | None = None) -> None:
        """`secret` None means the job's insecure default secret (a job started without --secret-file)."""
        host, port = split_addr(addr)
        self.addr = addr
        faults.refuse_connect(addr)          # an injected partition between this process's agent and addr
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self.job = self._handshake(secret, expect_job)
        except BaseException:
            self._sock.close()
            raise

    def _handshake(self, secret: bytes | None, expect_job: str | None) -> str:
        hello = recv_frame(self._sock)
        job, nonce_s = _field(hello, "job", str), _field(hello, "nonce", bytes)
        if expect_job is not None and job != expect_job:
            raise AuthenticationError(f"{self.addr} serves job {job!r}, not {expect_job!r}")
        key = derive_key(secret if secret is not None else insecure_default_secret(job), job, "control")
        nonce_c = new_nonce()
        send_frame(self._sock, {"nonce": nonce_c, "proof": prove(key, b"client", nonce_s, nonce_c)})
        try:
            answer = recv_frame(self._sock)
        except ConnectionError as e:          # no refusal came: the agent died or gave up on a slow handshake
            raise ConnectionError(f"{self.addr} closed the connection during the handshake without refusing "
                                  "it (the agent stopped, or it was too slow to answer); try again") from e
        if isinstance(answer, dict) and "error" in answer:
            raise AuthenticationError(f"{self.addr}: {answer['error']}")
        if not verify(key, _field(answer, "proof", bytes), b"server", nonce_c, nonce_s):
            raise AuthenticationError(f"{self.addr} did not prove it holds the secret of job {job!r}")
        return job

    def call(self, method: str, **params: Any) -> Any:
        send_frame(self._sock, {"method": method, "params": params})
        reply = recv_frame(self._sock)
        if not reply.get("ok"):
            raise RpcError(f"{self.addr} {method}: {reply.get('error')}")
        return reply["result"]

    def settimeout(self, timeout: float) -> None:
        self._sock.settimeout(timeout)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def split_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"address {addr!r} is not HOST:PORT")
    return host, int(port)

"""Authenticated request/response RPC between agents, applications and the CLI (control plane).

Owns: framing (4-byte length + msgpack map, bounded size), the mutual challenge-response handshake
and the request loop. Invariant kept (I8): no request is served on a connection whose peer has not
proved knowledge of the job secret, and a client never trusts an agent that has not proved it either.
The secret never crosses the wire; a bad proof closes the connection with a reason both sides can read.

Handshake:  server -> {hello, job, nonce_s};  client -> {nonce_c, proof_c = HMAC(k, "client", nonce_s, nonce_c)};
            server -> {proof_s = HMAC(k, "server", nonce_c, nonce_s)} or {error}.  k = derive_key(secret, job, "control").
"""

from __future__ import annotations

import logging
import socket
import socketserver
import struct
import threading
from typing import Any, Callable

import msgpack

from p2pgen import faults
from p2pgen.auth import derive_key, insecure_default_secret, new_nonce, prove, verify
from p2pgen.errors import AuthenticationError, P2PGenError, ProtocolError

log = logging.getLogger(__name__)

MAX_FRAME = 16 * 1024 * 1024
HEADER = struct.Struct(">I")
Handler = Callable[[dict[str, Any]], Any]


class RpcError(P2PGenError):
    """The remote agent refused the request; the message says why."""


def send_frame(sock: socket.socket, obj: Any) -> None:
    payload = msgpack.packb(obj, use_bin_type=True)
    if len(payload) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(payload)} bytes exceeds the {MAX_FRAME}-byte limit")
    sock.sendall(HEADER.pack(len(payload)) + payload)


def recv_frame(sock: socket.socket) -> Any:
    (length,) = HEADER.unpack(_recv_exact(sock, HEADER.size))
    if length > MAX_FRAME:
        raise ProtocolError(f"announced frame of {length} bytes exceeds the {MAX_FRAME}-byte limit")
    try:
        return msgpack.unpackb(_recv_exact(sock, length), raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as e:
        raise ProtocolError(f"malformed frame: {e}") from e


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the other side")
        buf += chunk
    return bytes(buf)


class RpcServer:
    """Serves `handlers[method](params)` to authenticated clients, one thread per connection."""

    def __init__(self, host: str, port: int, job: str, secret: bytes, handlers: dict[str, Handler]) -> None:
        self.job = job
        self.key = derive_key(secret, job, "control")
        self.handlers = handlers
        self.refused = 0            # connections refused for a bad proof (I8)
        server = self

        class _Conn(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                server._serve(self.request, self.client_address)

        class _Server(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True

        self._server = _Server((host, port), _Conn)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"rpc-{host}:{port}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _serve(self, sock: socket.socket, peer: tuple) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if not self._authenticate(sock, peer):
                return
            while True:
                request = recv_frame(sock)
                send_frame(sock, self._dispatch(request))
        except (ConnectionError, OSError):
            return
        except ProtocolError as e:
            log.warning("closing control connection from %s: %s", peer, e)

    def _authenticate(self, sock: socket.socket, peer: tuple) -> bool:
        nonce_s = new_nonce()
        send_frame(sock, {"hello": "p2pgen", "job": self.job, "nonce": nonce_s})
        reply = recv_frame(sock)
        nonce_c, proof = _field(reply, "nonce", bytes), _field(reply, "proof", bytes)
        if not verify(self.key, proof, b"client", nonce_s, nonce_c):
            self.refused += 1
            log.warning("refused control connection from %s: wrong job secret", peer)
            send_frame(sock, {"error": f"authentication failed: you do not hold the secret of job {self.job!r} "
                                       "(check --secret-file)"})
            return False
        send_frame(sock, {"proof": prove(self.key, b"server", nonce_c, nonce_s)})
        return True

    def _dispatch(self, request: Any) -> dict[str, Any]:
        if not isinstance(request, dict) or not isinstance(request.get("method"), str):
            return {"ok": False, "error": "a request is a map with a string 'method' and a map 'params'"}
        handler = self.handlers.get(request["method"])
        if handler is None:
            return {"ok": False, "error": f"unknown method {request['method']!r}; known: {sorted(self.handlers)}"}
        params = request.get("params") or {}
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
        except ConnectionError:
            raise AuthenticationError(f"{self.addr} closed the connection during authentication") from None
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

    def __enter__(self) -> "RpcClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def split_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"address {addr!r} is not HOST:PORT")
    return host, int(port)

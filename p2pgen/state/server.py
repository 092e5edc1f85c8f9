"""StateServer: serves this application's SharedState to members that must catch up.

Owns: the state listener (the agent's "state" address), the handshake of each puller and the answers to
its requests (see `p2pgen.state.wire`).

Invariants:
- Only a puller that proved the job secret (handshake with the "state" key, I8), addressed this exact
  incarnation (I3) and that `authorize(peer_id, incarnation, generation)` accepts as a member of the
  generation being formed is answered; every other connection is refused and counted. With
  `ServerConfig.encrypt` every request and frame is sealed (`p2pgen.transport.seal`) and a puller that
  does not seal is refused ("encryption_mismatch").
- Data is served only inside `serving(generation)`, the window in which the application is quiesced
  and does not touch its state, so every byte sent belongs to the one snapshot whose manifest was
  taken on entry. A torch tensor whose `_version` moved since then is refused ("mutated"); a numpy
  array cannot be checked here, and a puller's digest check catches it. Leaving the window closes
  the window's connections and waits for their threads before the application runs again.
- A chunk that is exactly one digest block is sent with that block's digest from the manifest as its
  payload digest, not a fresh hash of the bytes: the frame then proves end to end that the bytes the
  puller got are the ones the manifest describes (a numpy array changed since fails its checksum).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import msgpack

from p2pgen import auth
from p2pgen.listener import Listener
from p2pgen.state import tensors as tz
from p2pgen.state import wire
from p2pgen.state.shared import Manifest, SharedState, block_of_chunk, objects_bytes
from p2pgen.transport import handshake
from p2pgen.transport.seal import Seal

log = logging.getLogger(__name__)

Authorize = Callable[[str, int, int], bool]


@dataclass(frozen=True)
class ServerConfig:
    max_frame_bytes: int = 16 << 20   # largest chunk a puller may ask for
    handshake_timeout: float = 5.0
    idle_timeout: float = 60.0        # a connection with no request for this long is closed
    wait_for_window: float = 30.0     # how long a request waits for `serving(its generation)`
    close_timeout: float = 10.0       # how long leaving the window waits for sending threads
    encrypt: bool = False             # seal every connection (--encrypt); pullers without it are refused


@dataclass(frozen=True)
class _Window:
    generation: int
    manifest: Manifest
    versions: tuple[int | None, ...]   # torch `_version` of each entry on entry, None for numpy
    objects: bytes
    shards: dict                       # (object id, index) -> (digest, uint8 bytes): the shards held, frozen


class StateServer:
    """Listens on (host, port) from construction; answers authorized pullers inside `serving(generation)`."""

    def __init__(self, state: SharedState, *, job: str, secret: bytes, me: tuple[str, int],
                 authorize: Authorize, host: str = "127.0.0.1", port: int = 0,
                 config: ServerConfig = ServerConfig()) -> None:
        self.state = state
        self.job = job
        self.me = me
        self.config = config
        self.counters = wire.Counters()
        self._key = auth.derive_key(secret, job, wire.KEY_PURPOSE)
        self._authorize = authorize
        self._cond = threading.Condition()
        self._window: _Window | None = None
        self._generations: dict[socket.socket, int] = {}   # the generation each connection's handshake named
        self._closed = False
        self._listener = Listener(host, port, self._handle, name="p2pgen-state", backlog=64).start()
        self.host, self.port = self._listener.address

    def stats(self) -> dict[str, int]:
        return self.counters.snapshot()

    @contextlib.contextmanager
    def serving(self, generation: int) -> Iterator[Manifest]:
        """Serve the current state to members of `generation` until the block exits.

        The caller promises not to modify the state inside the block (the application is quiesced).
        Yields the manifest being served.
        """
        window = self._open_window(generation)
        try:
            yield window.manifest
        finally:
            self._close_window()

    def close(self) -> None:
        self._closed = True
        self._listener.stop()
        self._close_window()

    # ---- window --------------------------------------------------------------------------------
    def _open_window(self, generation: int) -> _Window:
        names = sorted(self.state.tensors)
        window = _Window(generation, self.state._manifest(),
                         tuple(tz.version(self.state.tensors[n]) for n in names),
                         objects_bytes(self.state.objects), _held_shards(self.state))
        with self._cond:
            if self._window is not None:
                raise RuntimeError(f"already serving generation {self._window.generation}")
            self._window = window
            self._cond.notify_all()
        return window

    def _close_window(self) -> None:
        """Close the window and the connections of its generation or older (all when none is open);
        pullers of a later generation keep waiting for theirs."""
        with self._cond:
            closing = self._window.generation if self._window is not None and not self._closed else None
            self._window = None
        self._listener.end(lambda s: closing is None or self._generations.get(s, -1) <= closing,
                           self.config.close_timeout)

    def _window_for(self, generation: int) -> _Window:
        deadline = time.monotonic() + self.config.wait_for_window
        with self._cond:
            while True:
                w = self._window
                if w is not None and w.generation == generation:
                    return w
                if w is not None and w.generation > generation:
                    raise wire.Refused("stale_generation", f"serving generation {w.generation}, "
                                       f"not {generation}")
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    raise wire.Refused("not_serving", f"{self.me} is not serving generation {generation} "
                                       f"(waited {self.config.wait_for_window:.0f}s)")
                self._cond.wait(left)

    # ---- connections ---------------------------------------------------------------------------
    def _handle(self, sock: socket.socket, _peer: tuple) -> None:
        """The accepted connection's thread (run by the Listener): authenticate, then answer requests."""
        try:
            hello = self._handshake(sock)
            if hello is not None:
                self._generations[sock] = hello.generation
                self._answer(sock, hello)
        finally:
            self._generations.pop(sock, None)
            sock.close()

    def _handshake(self, sock: socket.socket) -> handshake.Hello | None:
        sock.settimeout(self.config.handshake_timeout)
        try:
            return handshake.accept(sock, self._key, self.job, self.me, self._decide, self.config.encrypt)
        except handshake.HandshakeRejected as e:
            self.counters.add(e.reason)
            log.warning("state server %s refused a puller: %s", self.me, e)
            handshake.refuse(sock, e)
        except OSError as e:      # the handshake timeout, or a reset: counted like a peer that hung up
            self.counters.add("truncated")
            log.warning("state server %s refused a puller (truncated): handshake not completed: %r", self.me, e)
        return None

    def _decide(self, hello: handshake.Hello) -> tuple[str, str] | None:
        w = self._window
        if w is not None and hello.generation < w.generation:
            return ("stale_generation", f"serving generation {w.generation}, puller asked for {hello.generation}")
        if not self._authorize(hello.dialer[0], hello.dialer[1], hello.generation):
            return ("not_member", f"{hello.dialer} is not a member of generation {hello.generation}")
        return None

    def _answer(self, sock: socket.socket, hello: handshake.Hello) -> None:
        sock.settimeout(self.config.idle_timeout)
        sealed = Seal(hello.keys) if hello.keys is not None else None
        out = wire.FrameSender(sock, self.job, hello.generation, self.me[1], sealed)
        try:
            while (req := wire.recv_request(sock, sealed)) is not None:
                self._serve(out, self._window_for(hello.generation), req)
        except wire.Refused as e:
            self.counters.add(e.reason)
            log.warning("state server %s: refusing %s: %s", self.me, hello.dialer, e)
            out.refuse(e.reason, e.detail)
        except OSError as e:
            log.info("state server %s: connection to %s ended: %r", self.me, hello.dialer, e)

    def _serve(self, out: wire.FrameSender, w: _Window, req: dict) -> None:
        op = req["op"]
        if op == "manifest":
            out.send(wire.MANIFEST, 0, 0, msgpack.packb(w.manifest.to_wire()))
        elif op == "objects":
            out.send(wire.OBJECTS, 0, 0, w.objects)
        elif op == "get":
            self._send_chunks(out, w, req)
        elif op == "shards":
            manifest = [[o, i, d, len(b)] for (o, i), (d, b) in sorted(w.shards.items())]
            out.send(wire.MANIFEST, 0, 0, msgpack.packb(manifest))
        elif op == "shard_get":
            self._send_shard(out, w, req)
        else:
            raise wire.Refused("malformed", f"unknown request op {op!r}")

    def _send_chunks(self, out: wire.FrameSender, w: _Window, req: dict) -> None:
        t, first, count, cb = (req.get(k) for k in ("t", "first", "count", "cb"))
        if not all(isinstance(v, int) for v in (t, first, count, cb)) or not 0 <= t < len(w.manifest.entries):
            raise wire.Refused("malformed", f"bad get request {req!r}")
        entry = w.manifest.entries[t]
        n_chunks = wire.chunk_count(entry.nbytes, cb) if cb > 0 else 0
        if not (0 < cb <= self.config.max_frame_bytes and count > 0 and 0 <= first and first + count <= n_chunks):
            raise wire.Refused("malformed", f"get of chunks {first}+{count} of {cb} bytes from {entry.name!r} "
                               f"({entry.nbytes} bytes, max frame {self.config.max_frame_bytes})")
        data = self._bytes_of(w, t)
        for c in range(first, first + count):
            if self._window is not w:
                raise wire.Refused("not_serving", f"the generation {w.generation} window closed")
            block = block_of_chunk(entry.nbytes, cb, c)     # a chunk that is one block: its digest is known
            out.send(wire.CHUNK, t, c, data[c * cb:(c + 1) * cb], None if block is None else entry.blocks[block])

    def _send_shard(self, out: wire.FrameSender, w: _Window, req: dict) -> None:
        """Chunks of one held shard, frame `op_seq` = the shard index (a puller asks for each shard it must hold)."""
        key, first, count, cb = (req.get("o"), req.get("i")), req.get("first"), req.get("count"), req.get("cb")
        if key not in w.shards or not all(isinstance(v, int) for v in (first, count, cb)):
            raise wire.Refused("malformed", f"shard_get of {key} (held: {sorted(w.shards)}) or bad numbers {req!r}")
        data = w.shards[key][1]
        n_chunks = wire.chunk_count(len(data), cb) if cb > 0 else 0
        if not (0 < cb <= self.config.max_frame_bytes and count > 0 and 0 <= first and first + count <= n_chunks):
            raise wire.Refused("malformed", f"shard_get of chunks {first}+{count} of {cb} bytes from {key}")
        for c in range(first, first + count):
            if self._window is not w:
                raise wire.Refused("not_serving", f"the generation {w.generation} window closed")
            out.send(wire.CHUNK, key[1], c, data[c * cb:(c + 1) * cb])

    def _bytes_of(self, w: _Window, t: int):
        entry = w.manifest.entries[t]
        value = self.state.tensors.get(entry.name)
        if value is None or tz.version(value) != w.versions[t] or tz.nbytes(value) != entry.nbytes:
            raise wire.Refused("mutated", f"tensor {entry.name!r} changed while serving generation "
                               f"{w.generation}: the application must not touch its state in the window")
        return tz.host_bytes(value)


def _held_shards(state: SharedState) -> dict:
    """The shards this member holds, frozen for the window: (object, index) -> (digest, bytes)."""
    return {(o.object_id, i): (o.digest(i), o.shard_bytes(i).copy())
            for o in state.sharded.values() for i in o.owned()}

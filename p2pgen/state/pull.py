"""pull_state: catch a SharedState up to the frontier from the members that hold it.

Owns: one catch-up, as the frontier election ordered it (`core.model.Pull`): which tensors differ, which
source sends which chunks, staging, verification, and the report.

Contract and invariants:
- Only tensors whose digest differs from the source manifest's are fetched; the objects only if theirs
  differs. All sources must announce the frontier digest (else that source is dropped, "wrong_frontier").
- Chunks are split across all live sources (each worker takes the next batch from one queue). When a
  source dies or misbehaves, the chunks it had not delivered go back to the queue and the remaining
  sources continue from there (`PullReport.resumed` counts it).
- A user tensor is written only once all of its bytes arrived in a staging buffer and hash to the
  manifest's digest; then it is copied in place, so optimizer references stay valid. Objects and
  revision are applied last, once every tensor is in.
- `pull_state` returns only when the state's manifest digest equals the frontier digest; otherwise it
  raises StateSyncError (or DigestMismatch) saying which source failed and why. That digest is what
  `state.digest()` would compute, built without hashing the whole state once more: a fetched tensor is
  hashed from its own memory as its verified bytes are copied in (block by block, in cache), a skipped
  one was hashed at the start, and the objects are hashed at the end. Each tensor's staging digest is
  fed chunk by chunk, in order, as chunks land (still in cache), not in one pass over the whole tensor.
"""

from __future__ import annotations

import collections
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import msgpack
import numpy as np
import xxhash

from p2pgen import auth
from p2pgen.core.model import Frontier
from p2pgen.errors import P2PGenError, ProtocolError
from p2pgen.state import tensors as tz
from p2pgen.state import wire
from p2pgen.state.shared import Manifest, SharedState, manifest_digest, tensor_hasher
from p2pgen.state.wire import DigestMismatch, StateSyncError
from p2pgen.transport import handshake


@dataclass(frozen=True)
class Source:
    """An up-to-date member to pull from, and its state address."""

    peer_id: str
    incarnation: int
    host: str
    port: int


@dataclass(frozen=True)
class PullConfig:
    chunk_bytes: int = 4 << 20        # payload bytes per frame; must be <= the sources' max_frame_bytes
    batch_bytes: int = 32 << 20       # bytes requested from one source at a time (the unit of work sharing)
    max_frame_bytes: int = 16 << 20
    connect_timeout: float = 10.0     # connect + handshake
    op_timeout: float = 60.0          # one blocked receive; a stopped source is given up after this


@dataclass(frozen=True)
class PullReport:
    revision: int
    digest: str
    bytes_by_source: dict[str, int]           # chunk payload bytes received from each source, by peer_id
    tensors_fetched: tuple[str, ...]
    tensors_skipped: tuple[str, ...]          # equal digests: not transferred
    objects_fetched: bool
    seconds: float
    resumed: int                              # times a failed source's remaining chunks went to others
    failed_sources: dict[str, str]            # peer_id -> why it was dropped
    refusals: dict[str, int]                  # frames and sources refused, by reason

    @property
    def bytes_total(self) -> int:
        return sum(self.bytes_by_source.values())


OnChunk = Callable[[Source, int], None]


def pull_state(state: SharedState, *, job: str, secret: bytes, me: tuple[str, int], generation: int,
               frontier: Frontier, sources: Sequence[Source], config: PullConfig = PullConfig(),
               progress: bool | None = None, on_chunk: OnChunk | None = None) -> PullReport:
    """Bring `state` to `frontier` by pulling from `sources` (preference order) for `generation`.

    `me` is this process's (peer_id, incarnation); `generation` is the pending generation the sources
    serve. `progress` shows a bar (None: only when stdout is a TTY). `on_chunk(source, nbytes)` is
    called after each verified chunk. The state must not be touched by anyone else meanwhile.
    """
    if not sources:
        raise StateSyncError(f"no source to pull frontier {frontier.digest} (revision {frontier.revision}) from")
    if config.chunk_bytes > config.max_frame_bytes:
        raise ValueError(f"chunk_bytes={config.chunk_bytes} exceeds max_frame_bytes={config.max_frame_bytes}")
    show = sys.stdout.isatty() if progress is None else progress
    return _Pull(state, job, secret, me, generation, frontier, config, on_chunk, show).run(list(sources))


@dataclass
class _Plan:
    manifest: Manifest
    fetch: list[int]                         # manifest indexes of the tensors to fetch
    skipped: tuple[str, ...]
    objects: bool
    remaining: dict[int, int] = field(default_factory=dict)     # tensor index -> chunks not yet received
    staging: dict[int, np.ndarray] = field(default_factory=dict)
    pool: list[np.ndarray] = field(default_factory=list)        # staging buffers of installed tensors, for reuse
    objects_raw: bytes | None = None
    hashers: dict[int, Any] = field(default_factory=dict)       # tensor index -> running digest of its staging
    hashed: dict[int, int] = field(default_factory=dict)        # tensor index -> chunks hashed (in order) so far
    landed: dict[int, set] = field(default_factory=dict)        # tensor index -> chunks arrived, not hashed yet
    hashing: set = field(default_factory=set)                   # tensors a worker is hashing right now
    installed: dict[str, str] = field(default_factory=dict)     # name -> digest of the user tensor's new bytes


class _Pull:
    def __init__(self, state: SharedState, job: str, secret: bytes, me: tuple[str, int], generation: int,
                 frontier: Frontier, config: PullConfig, on_chunk: OnChunk | None, show: bool) -> None:
        self.state, self.job, self.me, self.generation = state, job, me, generation
        self.frontier, self.config, self.on_chunk, self.show = frontier, config, on_chunk, show
        self.key = auth.derive_key(secret, job, wire.KEY_PURPOSE)
        self.counters = wire.Counters()
        self.cond = threading.Condition()
        self.local = state.tensor_digests(threads=_DIGEST_THREADS)
        self.plan: _Plan | None = None
        self.queue: collections.deque = collections.deque()
        self.in_flight = 0
        self.fatal: Exception | None = None
        self.failures: dict[str, Exception] = {}
        self.bytes_by_source: dict[str, int] = {}
        self.resumed = 0
        self.bar = None

    # ---- driver --------------------------------------------------------------------------------
    def run(self, sources: list[Source]) -> PullReport:
        start = time.monotonic()
        workers = [threading.Thread(target=self._worker, args=(s,), name=f"p2pgen-pull-{s.peer_id}", daemon=True)
                   for s in sources]
        try:
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        finally:
            if self.bar is not None:
                self.bar.close()
        self._raise_if_incomplete()
        return self._finish(time.monotonic() - start)

    def _raise_if_incomplete(self) -> None:
        if self.fatal is not None:
            raise self.fatal
        if self.plan is None or self.queue or any(self.plan.remaining.values()) or (
                self.plan.objects and self.plan.objects_raw is None) or len(self.plan.installed) != len(self.plan.fetch):
            detail = "; ".join(f"{p}: {type(e).__name__}: {e}" for p, e in self.failures.items())
            err = StateSyncError(f"could not pull frontier {self.frontier.digest} (revision "
                                 f"{self.frontier.revision}) for generation {self.generation}: every source "
                                 f"failed ({detail})")
            err.failures = dict(self.failures)
            raise err from next(iter(self.failures.values()), None)

    def _finish(self, seconds: float) -> PullReport:
        plan = self.plan
        if plan.objects:
            self.state.load_objects(plan.objects_raw)
        self.state.revision = plan.manifest.revision
        digest = self._final_digest()
        if digest != self.frontier.digest:
            self.counters.add("digest_mismatch")
            raise DigestMismatch(f"after pulling, the state digest is {digest}, not the frontier's "
                                 f"{self.frontier.digest}: was the state modified during the pull?")
        names = [e.name for e in plan.manifest.entries]
        return PullReport(plan.manifest.revision, digest, dict(self.bytes_by_source),
                          tuple(names[t] for t in plan.fetch), plan.skipped, plan.objects, seconds,
                          self.resumed, {p: f"{type(e).__name__}: {e}" for p, e in self.failures.items()},
                          self.counters.snapshot())

    def _final_digest(self) -> str:
        """The state's manifest digest after the pull, as `state.digest()` would compute it, without hashing
        every tensor once more: a fetched tensor's digest was computed from its own memory right after the
        verified bytes were copied in (`_install`, block by block while they were in cache), a skipped one's
        at the start (nobody touches the state during a pull); the objects are hashed now."""
        digests = {name: self.plan.installed.get(name, self.local[name]) for name in self.local}
        return manifest_digest(digests, self.state.objects_digest()[0])

    # ---- one worker per source -----------------------------------------------------------------
    def _worker(self, source: Source) -> None:
        sock = None
        try:
            sock, rx = self._connect(source)
            self._adopt(self._manifest(sock, rx, source))
            while (item := self._take()) is not None:
                self._do(sock, rx, source, item)
        except (P2PGenError, OSError) as e:
            with self.cond:
                self.failures[source.peer_id] = e
                self.cond.notify_all()
        except BaseException as e:   # a bug: stop every worker and re-raise it in the caller
            with self.cond:
                self.fatal = self.fatal or e
                self.cond.notify_all()
        finally:
            if sock is not None:
                sock.close()

    def _connect(self, source: Source) -> tuple[socket.socket, wire.FrameReceiver]:
        sock = socket.create_connection((source.host, source.port), timeout=self.config.connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = handshake.Hello(self.job, self.generation, self.me, (source.peer_id, source.incarnation),
                                    auth.new_nonce())
            handshake.dial(sock, self.key, hello)
            sock.settimeout(self.config.op_timeout)
        except BaseException:
            sock.close()
            raise
        return sock, wire.FrameReceiver(sock, self.job, self.generation, (source.peer_id, source.incarnation),
                                        self.config.max_frame_bytes, self.counters)

    def _manifest(self, sock: socket.socket, rx: wire.FrameReceiver, source: Source) -> Manifest:
        wire.send_request(sock, {"op": "manifest"})
        raw = rx.recv(wire.MANIFEST, 0, 0)
        try:
            manifest = Manifest.from_wire(msgpack.unpackb(raw))
        except (ValueError, msgpack.UnpackException) as e:
            self.counters.add("malformed")
            raise ProtocolError(f"state source {source.peer_id} sent a bad manifest: {e}") from e
        if manifest.digest != self.frontier.digest or manifest.revision != self.frontier.revision:
            self.counters.add("wrong_frontier")
            raise StateSyncError(f"source {source.peer_id} holds revision {manifest.revision} digest "
                                 f"{manifest.digest}, not the frontier (revision {self.frontier.revision}, "
                                 f"digest {self.frontier.digest})")
        return manifest

    def _adopt(self, manifest: Manifest) -> None:
        """The first frontier manifest fixes the plan (every other one has the same digest)."""
        with self.cond:
            if self.plan is not None:
                return
            self.plan = self._make_plan(manifest)
            self.cond.notify_all()

    def _make_plan(self, manifest: Manifest) -> _Plan:
        self._check_layout(manifest)
        fetch = [i for i, e in enumerate(manifest.entries) if self.local[e.name] != e.digest]
        skipped = tuple(e.name for e in manifest.entries if self.local[e.name] == e.digest)
        objects = self.state.objects_digest()[0] != manifest.objects_digest
        plan = _Plan(manifest, fetch, skipped, objects)
        cb = self.config.chunk_bytes
        for t in fetch:
            n = wire.chunk_count(manifest.entries[t].nbytes, cb)
            plan.remaining[t] = n
            e = manifest.entries[t]
            plan.hashers[t], plan.hashed[t], plan.landed[t] = tensor_hasher(e.dtype, e.shape), 0, set()
            self.queue.append((t, 0, n))
        if objects:
            self.queue.append(("objects",))
        self._open_bar(sum(manifest.entries[t].nbytes for t in fetch))
        return plan

    def _check_layout(self, manifest: Manifest) -> None:
        mine = dict(self.state.tensors)
        theirs = {e.name: e for e in manifest.entries}
        if set(mine) != set(theirs):
            err = StateSyncError(f"tensor names differ from the frontier state: missing here "
                                 f"{sorted(set(theirs) - set(mine))}, not in the frontier {sorted(set(mine) - set(theirs))}; "
                                 "every member must register the same tensors before joining")
            self.fatal = err
            raise err
        for name, e in theirs.items():
            here = (tz.dtype_name(mine[name]), tz.shape(mine[name]))
            if here != (e.dtype, e.shape):
                err = StateSyncError(f"tensor {name!r} is {here[0]}{list(here[1])} here but {e.dtype}{list(e.shape)} "
                                     "in the frontier state; it is copied in place, so create it with that "
                                     "dtype and shape before pulling")
                self.fatal = err
                raise err

    def _open_bar(self, total: int) -> None:
        if self.show:
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"pull g{self.generation}")

    def _take(self):
        """The next batch of work for a worker, or None when everything arrived (or a fatal error)."""
        batch = max(1, self.config.batch_bytes // self.config.chunk_bytes)
        with self.cond:
            while self.fatal is None:
                if self.queue:
                    item = self.queue.popleft()
                    if item[0] != "objects" and item[2] > batch:
                        self.queue.appendleft((item[0], item[1] + batch, item[2] - batch))
                        item = (item[0], item[1], batch)
                    self.in_flight += 1
                    return item
                if self.in_flight == 0:
                    return None
                self.cond.wait()
            return None

    def _do(self, sock: socket.socket, rx: wire.FrameReceiver, source: Source, item) -> None:
        done = [0]
        try:
            if item[0] == "objects":
                self._fetch_objects(sock, rx, source)
            else:
                self._fetch_chunks(sock, rx, source, item, done)
        except BaseException:
            with self.cond:
                self.in_flight -= 1
                left = item if item[0] == "objects" else (item[0], item[1] + done[0], item[2] - done[0])
                if self.fatal is None and (left[0] == "objects" or left[2] > 0):
                    self.queue.appendleft(left)
                    self.resumed += 1
                self.cond.notify_all()
            raise
        with self.cond:
            self.in_flight -= 1
            self.cond.notify_all()

    def _fetch_objects(self, sock: socket.socket, rx: wire.FrameReceiver, source: Source) -> None:
        m = self.plan.manifest
        wire.send_request(sock, {"op": "objects"})
        raw = bytes(rx.recv(wire.OBJECTS, 0, 0, memoryview(bytearray(m.objects_nbytes))))
        if xxhash.xxh3_128(raw).hexdigest() != m.objects_digest:
            self._mismatch(f"objects from {source.peer_id} do not hash to the manifest's objects digest")
        self.plan.objects_raw = raw

    def _fetch_chunks(self, sock: socket.socket, rx: wire.FrameReceiver, source: Source, item,
                      done: list[int]) -> None:
        t, first, count = item
        cb = self.config.chunk_bytes
        wire.send_request(sock, {"op": "get", "t": t, "first": first, "count": count, "cb": cb})
        buf = self._staging(t)
        for c in range(first, first + count):
            view = memoryview(buf)[c * cb:(c + 1) * cb]
            rx.recv(wire.CHUNK, t, c, view)
            done[0] += 1
            self._chunk_arrived(t, c, source, len(view))

    def _staging(self, t: int) -> np.ndarray:
        """Tensor t's staging buffer: a pooled one when one is large enough (fresh pages cost a fault each,
        measured here at about 0.15 GB/s, more than the transfer itself), else a new one."""
        with self.cond:
            buf = self.plan.staging.get(t)
            if buf is None:
                n = self.plan.manifest.entries[t].nbytes
                fits = [i for i, b in enumerate(self.plan.pool) if len(b) >= n]
                if fits:   # by index: list.remove would compare arrays elementwise
                    base = self.plan.pool.pop(min(fits, key=lambda i: len(self.plan.pool[i])))
                else:
                    base = np.empty(n, np.uint8)
                buf = self.plan.staging[t] = base[:n]
            return buf

    def _chunk_arrived(self, t: int, c: int, source: Source, nbytes: int) -> None:
        """Chunk c of tensor t verified into staging: count it, and feed the tensor's running digest with
        every chunk now in order (this one first, still in cache). One worker at a time hashes a tensor; the
        one that hashes its last chunk installs it."""
        with self.cond:
            self.bytes_by_source[source.peer_id] = self.bytes_by_source.get(source.peer_id, 0) + nbytes
            self.plan.remaining[t] -= 1
            self.plan.landed[t].add(c)
            if self.bar is not None:
                self.bar.update(nbytes)
            mine = t not in self.plan.hashing
            if mine:
                self.plan.hashing.add(t)
        if mine:
            self._hash_in_order(t)
        if self.on_chunk is not None:
            self.on_chunk(source, nbytes)

    def _hash_in_order(self, t: int) -> None:
        plan, cb = self.plan, self.config.chunk_bytes
        n = wire.chunk_count(plan.manifest.entries[t].nbytes, cb)
        while True:
            with self.cond:
                nxt = plan.hashed[t]
                if nxt not in plan.landed[t]:
                    plan.hashing.discard(t)
                    complete = nxt == n
                    break
                plan.landed[t].discard(nxt)
                buf = plan.staging[t]
            plan.hashers[t].update(buf[nxt * cb:(nxt + 1) * cb])
            with self.cond:
                plan.hashed[t] = nxt + 1
        if complete:
            self._install(t)

    def _install(self, t: int) -> None:
        """The whole tensor is in staging and hashed: if it matches the manifest, copy it in place into the
        user's tensor, hashing the user tensor's bytes block by block right after each block landed."""
        entry = self.plan.manifest.entries[t]
        with self.cond:
            data = self.plan.staging.pop(t)
            digest = self.plan.hashers.pop(t).hexdigest()
        if digest != entry.digest:
            self._mismatch(f"tensor {entry.name!r} does not hash to its manifest digest {entry.digest}; "
                           "it was left untouched")
        installed = _copy_in_and_hash(self.state, entry, data)
        if installed != entry.digest:
            self._mismatch(f"tensor {entry.name!r} hashes to {installed} after its verified bytes were copied in, "
                           f"not {entry.digest}: was the state modified during the pull?")
        with self.cond:
            self.plan.installed[entry.name] = installed
            self.plan.pool.append(data.base if data.base is not None else data)

    def _mismatch(self, detail: str):
        self.counters.add("digest_mismatch")
        err = DigestMismatch(detail)
        with self.cond:
            self.fatal = self.fatal or err
            self.cond.notify_all()
        raise err


_DIGEST_THREADS = 2            # threads hashing the puller's own tensors before the plan (xxhash releases the GIL)
_INSTALL_BLOCK = 1 << 20       # bytes copied into a user tensor, then hashed there, at a time (fits in L2)


def _copy_in_and_hash(state: SharedState, entry, data: np.ndarray) -> str:
    """Copy the verified bytes `data` in place into tensor `entry.name` (so references held elsewhere stay
    valid) and return the digest of the tensor's own bytes afterwards, hashed block by block right after
    each block was written. A tensor with no writable flat byte view (non-contiguous, CUDA) is written by
    `load_tensor` and hashed afterwards."""
    value = state.tensors[entry.name]
    state.touch(entry.name)
    h = tensor_hasher(entry.dtype, entry.shape)
    if tz.is_torch(value):
        torch = sys.modules["torch"]
        if value.device.type != "cpu" or not value.is_contiguous():
            state.load_tensor(entry.name, data)
            h.update(tz.host_bytes(value))
            return h.hexdigest()
        dst_t = value.detach().reshape(-1).view(torch.uint8)    # shares the version counter: copy_ bumps it
        dst, src_t = dst_t.numpy(), torch.from_numpy(data)
        for a in range(0, len(data), _INSTALL_BLOCK):
            b = min(len(data), a + _INSTALL_BLOCK)
            with torch.no_grad():
                dst_t[a:b].copy_(src_t[a:b])
            h.update(dst[a:b])
        return h.hexdigest()
    if not (value.flags.c_contiguous and value.flags.writeable):
        state.load_tensor(entry.name, data)
        h.update(tz.host_bytes(value))
        return h.hexdigest()
    dst = value.reshape(-1).view(np.uint8)
    for a in range(0, len(data), _INSTALL_BLOCK):
        b = min(len(data), a + _INSTALL_BLOCK)
        np.copyto(dst[a:b], data[a:b])
        h.update(dst[a:b])
    return h.hexdigest()

"""pull_state: catch a SharedState up to the frontier from the members that hold it.

Owns: one catch-up, as the frontier election ordered it (`core.model.Pull`): which tensors differ, which
source sends which chunks, staging, verification, and the report.

Contract and invariants:
- Only tensors whose bytes differ from the source manifest's are fetched (found block by block, stopping
  at the first block that differs: a joiner's fresh tensor costs one block of hashing); the objects only
  if their digest differs. All sources must announce the frontier digest (else that source is dropped,
  "wrong_frontier").
- Chunks are split across all live sources (each worker takes the next batch from one queue). When a
  source dies or misbehaves, the chunks it had not delivered go back to the queue and the remaining
  sources continue from there (`PullReport.resumed` counts it).
- Tensors are written in place, so optimizer references stay valid. A contiguous CPU tensor receives
  its chunks straight into its own memory (`PullConfig.in_place`, the default: no staging copy, which
  cost as much as the transfer); any other tensor (CUDA, non-contiguous, or `in_place=False`) lands in
  a staging buffer and is copied in only once all of its bytes hash to the manifest's digest. Objects
  and revision are applied last, once every tensor verified.
- A pull that fails after it wrote any tensor says so: `StateSyncError.changed` names them, and the
  state, a mix of its old revision and the frontier, must not be reported as either (the peer goes back
  to its local copy, or restarts as a new incarnation). One that fails before writing leaves it as it was.
- Every received byte is hashed once. A tensor digest is built from block digests (`state.shared`): a
  chunk that is exactly one block (the default chunk size) gets its block digest from the frame's own
  checksum verification; a block made of other chunks is hashed from staging when its last byte lands.
  The copy into the user's tensor is exact, so the tensor's digest is then the verified one; it is not
  hashed again.
- A pull the caller stops (`stop`, asked every STOP_POLL_S: its generation was abandoned, the job moved on)
  ends within that time, whatever its sources do (one whose host is cut off would hold a connect for up to
  `connect_timeout`), and fails like any other pull (what it wrote is named).
- `pull_state` returns only when the state's manifest digest equals the frontier digest; otherwise it
  raises StateSyncError (or DigestMismatch) saying which source failed and why. That digest is what
  `state.digest()` would compute: a fetched tensor's is its verified digest, a skipped one was found to
  hold the manifest's bytes (nobody touches the state during a pull), the objects are hashed after loading.
"""

from __future__ import annotations

import collections
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgpack
import numpy as np
import xxhash

from p2pgen import auth
from p2pgen.core.model import Frontier
from p2pgen.errors import P2PGenError, ProtocolError
from p2pgen.state import tensors as tz
from p2pgen.state import wire
from p2pgen.state.shared import (
    DIGEST_BLOCK,
    Manifest,
    SharedState,
    block_count,
    block_digests,
    block_of_chunk,
    digest_of_blocks,
    manifest_digest,
)
from p2pgen.state.wire import DigestMismatch, StateSyncError
from p2pgen.transport import handshake
from p2pgen.transport.seal import Seal

STOP_POLL_S = 0.05          # how often a running pull asks its caller whether to stop


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
    in_place: bool = True             # receive straight into contiguous CPU tensors, not into staging
    encrypt: bool = False             # seal the connections to the sources (--encrypt; the sources must too)


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
               progress: bool | None = None, on_chunk: OnChunk | None = None,
               stop: Callable[[], str | None] | None = None) -> PullReport:
    """Bring `state` to `frontier` by pulling from `sources` (preference order) for `generation`.

    `me` is this process's (peer_id, incarnation); `generation` is the pending generation the sources
    serve. `progress` shows a bar (None: only when stdout is a TTY). `on_chunk(source, nbytes)` is
    called after each verified chunk. The state must not be touched by anyone else meanwhile.

    Args:
        stop: asked every STOP_POLL_S while the pull runs (from the pulling thread; it must be cheap):
            why the pull must end now, else None.

    Raises:
        StateSyncError: every source failed, or `stop` gave a reason (`changed` names the tensors written).
        DigestMismatch: the pulled state does not hash to the frontier's digest.
    """
    if not sources:
        raise StateSyncError(f"no source to pull frontier {frontier.digest} (revision {frontier.revision}) from")
    if config.chunk_bytes > config.max_frame_bytes:
        raise ValueError(f"chunk_bytes={config.chunk_bytes} exceeds max_frame_bytes={config.max_frame_bytes}")
    show = sys.stdout.isatty() if progress is None else progress
    return _Pull(state, job, secret, me, generation, frontier, config, on_chunk, show, stop).run(list(sources))


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
    blocks: dict[int, list] = field(default_factory=dict)       # tensor index -> block digests (None: not yet)
    block_left: dict[int, list] = field(default_factory=dict)   # tensor index -> bytes of each block not landed
    unresolved: dict[int, int] = field(default_factory=dict)    # tensor index -> blocks without a digest yet
    installed: set = field(default_factory=set)                 # names of the tensors written and verified
    in_place: set = field(default_factory=set)                  # tensors receiving straight into their memory


class _Pull:
    def __init__(self, state: SharedState, job: str, secret: bytes, me: tuple[str, int], generation: int,
                 frontier: Frontier, config: PullConfig, on_chunk: OnChunk | None, show: bool,
                 stop: Callable[[], str | None] | None = None) -> None:
        self.state, self.job, self.me, self.generation = state, job, me, generation
        self.frontier, self.config, self.on_chunk, self.show = frontier, config, on_chunk, show
        self.stop = stop
        self.key = auth.derive_key(secret, job, wire.KEY_PURPOSE)
        self.counters = wire.Counters()
        self.cond = threading.Condition()
        self.plan: _Plan | None = None
        self.queue: collections.deque = collections.deque()
        self.in_flight = 0
        self.fatal: Exception | None = None
        self.failures: dict[str, Exception] = {}
        self.bytes_by_source: dict[str, int] = {}
        self.resumed = 0
        self.changed: set[str] = set()          # names of the user tensors written so far
        self.bar = None
        self.running = 0                        # workers not yet ended
        self.closing = False                    # the pull settled: workers still running are stopped
        self.socks: dict[int, socket.socket] = {}   # worker index -> its connection, once connected

    # ---- driver --------------------------------------------------------------------------------
    def run(self, sources: list[Source]) -> PullReport:
        start = time.monotonic()
        workers = [threading.Thread(target=self._worker, args=(i, s), name=f"p2pgen-pull-{s.peer_id}", daemon=True)
                   for i, s in enumerate(sources)]
        self.running = len(workers)
        try:
            for w in workers:
                w.start()
            self._wait_until_settled()
        finally:
            self._stop_stragglers(workers)
            if self.bar is not None:
                self.bar.close()
        try:
            self._raise_if_incomplete()
            return self._finish(time.monotonic() - start)
        except StateSyncError as e:
            if self.changed:
                e.changed = tuple(sorted(self.changed))
                e.args = (f"{e.args[0]}; tensors {list(e.changed)} were already written, so this state holds "
                          f"neither its revision {self.state.revision} nor the frontier",)
            raise

    def _wait_until_settled(self) -> None:
        """Until everything arrived, a fatal error, every worker ended, or the caller stops the pull. Not until
        every worker ended: a source that accepted the connection but does not answer (stopped, or closing its
        window) would hold a complete pull for up to `connect_timeout` or `op_timeout`."""
        with self.cond:
            while self.fatal is None and self.running and not self._complete():
                self.cond.wait(STOP_POLL_S if self.stop is not None else None)
                why = self.stop() if self.stop is not None and not self._complete() else None
                if why and self.fatal is None:
                    self.fatal = StateSyncError(f"pull of frontier {self.frontier.digest} (revision "
                                                f"{self.frontier.revision}) for generation {self.generation} "
                                                f"stopped: {why}")

    def _stop_stragglers(self, workers: list[threading.Thread]) -> None:
        """Shut down the connections of workers still running and wait for them (the shutdown ends their
        blocked calls, so none writes a tensor after this returns). A worker still connecting has no
        socket yet; it sees `closing` before it touches anything and ends on its own."""
        with self.cond:
            self.closing = True
            socks = dict(self.socks)
        for sock in socks.values():
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for i, w in enumerate(workers):
            if i in socks:
                w.join()

    def _complete(self) -> bool:
        plan = self.plan
        return (plan is not None and not self.queue and self.in_flight == 0 and not any(plan.remaining.values())
                and (not plan.objects or plan.objects_raw is not None) and len(plan.installed) == len(plan.fetch))

    def _raise_if_incomplete(self) -> None:
        if self.fatal is not None:
            raise self.fatal
        if not self._complete():
            detail = "; ".join(f"{p}: {type(e).__name__}: {e}" for p, e in self.failures.items())
            err = StateSyncError(f"could not pull frontier {self.frontier.digest} (revision "
                                 f"{self.frontier.revision}) for generation {self.generation}: every source "
                                 f"failed ({detail})")
            err.failures = dict(self.failures)
            raise err from next(iter(self.failures.values()), None)

    def _finish(self, seconds: float) -> PullReport:
        plan = self.plan
        if plan.objects:
            self.state._load_objects(plan.objects_raw)
        self.state.revision = plan.manifest.revision
        for t in plan.fetch:           # keyed by the new revision: `synced` hashes none of them again
            self.state._verified(plan.manifest.entries[t].name, plan.manifest.entries[t].blocks)
        digest = self._final_digest()
        if digest != self.frontier.digest:
            self.counters.add("digest_mismatch")
            raise DigestMismatch(f"after pulling, the state digest is {digest}, not the frontier's "
                                 f"{self.frontier.digest}: the pulled objects pickle to other bytes here "
                                 "(they must pickle deterministically), or the state was modified during the pull")
        names = [e.name for e in plan.manifest.entries]
        return PullReport(plan.manifest.revision, digest, dict(self.bytes_by_source),
                          tuple(names[t] for t in plan.fetch), plan.skipped, plan.objects, seconds,
                          self.resumed, {p: f"{type(e).__name__}: {e}" for p, e in self.failures.items()},
                          self.counters.snapshot())

    def _final_digest(self) -> str:
        """The state's manifest digest after the pull, as `state.digest()` would compute it, without hashing
        the tensors once more: a fetched tensor holds exactly its verified bytes, a skipped one was found
        to hold the manifest's at the start (nobody touches the state during a pull); the loaded objects
        are re-pickled and hashed now."""
        digests = {e.name: e.digest for e in self.plan.manifest.entries}
        return manifest_digest(digests, self.state._objects_digest()[0])

    # ---- one worker per source -----------------------------------------------------------------
    def _worker(self, index: int, source: Source) -> None:
        sock = None
        try:
            sock, rx = self._connect(index, source)
            self._adopt(self._manifest(sock, rx, source))
            while (item := self._take()) is not None:
                self._do(sock, rx, source, item)
        except (P2PGenError, OSError) as e:
            with self.cond:
                if not self.closing:        # not an error of the source's: the pull ended without it
                    self.failures[source.peer_id] = e
        except BaseException as e:   # a bug: stop every worker and re-raise it in the caller
            with self.cond:
                self.fatal = self.fatal or e
        finally:
            if sock is not None:
                sock.close()
            with self.cond:
                self.running -= 1
                self.cond.notify_all()

    def _connect(self, index: int, source: Source) -> tuple[socket.socket, wire.FrameReceiver]:
        sock = socket.create_connection((source.host, source.port), timeout=self.config.connect_timeout)
        with self.cond:
            if self.closing:
                sock.close()
                raise StateSyncError(f"the pull ended before source {source.peer_id} answered")
            self.socks[index] = sock
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = handshake.Hello(self.job, self.generation, self.me, (source.peer_id, source.incarnation),
                                    auth.new_nonce(), self.config.encrypt)
            keys = handshake.dial(sock, self.key, hello)
            sock.settimeout(self.config.op_timeout)
        except BaseException:
            sock.close()
            raise
        return sock, wire.FrameReceiver(sock, self.job, self.generation, (source.peer_id, source.incarnation),
                                        self.config.max_frame_bytes, self.counters,
                                        seal=Seal(keys) if keys is not None else None)

    def _manifest(self, sock: socket.socket, rx: wire.FrameReceiver, source: Source) -> Manifest:
        rx.request({"op": "manifest"})
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
            if self.plan is not None or self.closing:
                return
            self.plan = self._make_plan(manifest)
            self.cond.notify_all()

    def _make_plan(self, manifest: Manifest) -> _Plan:
        self._check_layout(manifest)
        held = [self.state._holds(e) for e in manifest.entries]     # stops at a tensor's first differing block
        fetch = [i for i, e in enumerate(manifest.entries) if not held[i]]
        skipped = tuple(e.name for i, e in enumerate(manifest.entries) if held[i])
        objects = self.state._objects_digest()[0] != manifest.objects_digest
        plan = _Plan(manifest, fetch, skipped, objects)
        cb = self.config.chunk_bytes
        for t in fetch:
            nbytes = manifest.entries[t].nbytes
            n = wire.chunk_count(nbytes, cb)
            plan.remaining[t] = n
            blocks = block_count(nbytes)
            plan.blocks[t], plan.unresolved[t] = [None] * blocks, blocks
            plan.block_left[t] = [min(DIGEST_BLOCK, nbytes - b * DIGEST_BLOCK) for b in range(blocks)]
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
                                 f"{sorted(set(theirs) - set(mine))}, not in the frontier "
                                 f"{sorted(set(mine) - set(theirs))}; "
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
        rx.request({"op": "objects"})
        raw = bytes(rx.recv(wire.OBJECTS, 0, 0, memoryview(bytearray(m.objects_nbytes))))
        if xxhash.xxh3_128(raw).hexdigest() != m.objects_digest:
            self._mismatch(f"objects from {source.peer_id} do not hash to the manifest's objects digest")
        self.plan.objects_raw = raw

    def _fetch_chunks(self, sock: socket.socket, rx: wire.FrameReceiver, source: Source, item,
                      done: list[int]) -> None:
        t, first, count = item
        cb = self.config.chunk_bytes
        rx.request({"op": "get", "t": t, "first": first, "count": count, "cb": cb})
        buf = self._staging(t)
        for c in range(first, first + count):
            view = memoryview(buf)[c * cb:(c + 1) * cb]
            _, payload_digest = rx.recv_verified(wire.CHUNK, t, c, view)
            done[0] += 1
            self._chunk_arrived(t, c, payload_digest, source, len(view))

    def _staging(self, t: int) -> np.ndarray:
        """Where tensor t's chunks land: the tensor's own memory when it can take them (in_place), else a
        staging buffer: a pooled one when one is large enough (fresh pages cost a fault each, measured here
        at about 0.15 GB/s, more than the transfer itself), else a new one."""
        with self.cond:
            buf = self.plan.staging.get(t)
            name = self.plan.manifest.entries[t].name
            own = tz.writable_bytes(self.state.tensors[name]) if buf is None and self.config.in_place else None
            if own is not None:
                self.state.touch(name)
                self.changed.add(name)
                self.plan.in_place.add(t)
                buf = self.plan.staging[t] = own
            if buf is None:
                n = self.plan.manifest.entries[t].nbytes
                fits = [i for i, b in enumerate(self.plan.pool) if len(b) >= n]
                if fits:   # by index: list.remove would compare arrays elementwise
                    base = self.plan.pool.pop(min(fits, key=lambda i: len(self.plan.pool[i])))
                else:
                    base = np.empty(n, np.uint8)
                buf = self.plan.staging[t] = base[:n]
            return buf

    def _chunk_arrived(self, t: int, c: int, payload_digest: int, source: Source, nbytes: int) -> None:
        """Chunk c of tensor t verified into staging: count it and resolve the block digests it completes:
        a chunk that is exactly one block gives its digest (verified with the frame), any other block
        completed by this chunk is hashed from staging now (still in cache). The worker that resolves a
        tensor's last block installs it."""
        plan, cb = self.plan, self.config.chunk_bytes
        total = plan.manifest.entries[t].nbytes
        whole = block_of_chunk(total, cb, c)
        with self.cond:
            self.bytes_by_source[source.peer_id] = self.bytes_by_source.get(source.peer_id, 0) + nbytes
            self.plan.remaining[t] -= 1
            if self.bar is not None:
                self.bar.update(nbytes)
            if whole is not None:
                resolved = {whole: payload_digest}
            else:
                resolved = {}
                start, end = c * cb, min((c + 1) * cb, total)
                for b in range(start // DIGEST_BLOCK, -(-end // DIGEST_BLOCK)):
                    left = plan.block_left[t]
                    left[b] -= min(end, (b + 1) * DIGEST_BLOCK) - max(start, b * DIGEST_BLOCK)
                    if left[b] == 0:
                        resolved[b] = None
                buf = plan.staging[t]
        for b in [b for b, d in resolved.items() if d is None]:
            resolved[b] = block_digests(buf, b, 1)[0]
        with self.cond:
            for b, d in resolved.items():
                plan.blocks[t][b] = d
            plan.unresolved[t] -= len(resolved)
            complete = plan.unresolved[t] == 0
        if complete:
            self._install(t)
        if self.on_chunk is not None:
            self.on_chunk(source, nbytes)

    def _install(self, t: int) -> None:
        """Every block of tensor t landed with its digest: if they add up to the manifest's digest, the
        tensor is done (received in place), or its staging is copied in (exactly, so the tensor's digest is
        the verified one)."""
        entry = self.plan.manifest.entries[t]
        with self.cond:
            data = self.plan.staging.pop(t)
            blocks = tuple(self.plan.blocks.pop(t))
            own = t in self.plan.in_place
        if digest_of_blocks(entry.dtype, entry.shape, blocks) != entry.digest:
            self._mismatch(f"tensor {entry.name!r} does not hash to its manifest digest {entry.digest}"
                           + ("" if own else "; it was left untouched"))
        if own:
            tz.mark_written(self.state.tensors[entry.name])     # torch's _version, as copy_ would bump it
        else:
            with self.cond:
                self.changed.add(entry.name)
            self.state._load_tensor(entry.name, data)
        with self.cond:
            self.plan.installed.add(entry.name)
            if not own:
                self.plan.pool.append(data.base if data.base is not None else data)

    def _mismatch(self, detail: str):
        self.counters.add("digest_mismatch")
        err = DigestMismatch(detail)
        with self.cond:
            self.fatal = self.fatal or err
            self.cond.notify_all()
        raise err

"""LocalCopy: a member's committed state, kept on its host outside the application process.

Owns: one folder that the member's agent keeps across the application's incarnations (on tmpfs,
`/dev/shm`, by default): two slot files and a pointer file, `current.json`. A save has two halves:
`snapshot` copies the committed bytes into the slot the pointer does not name (mapped, its blocks
allocated up front), in the thread that committed; `finish` hashes those bytes and replaces the pointer
(write a temporary file, rename it over the old one), in the background writer (`p2pgen.state.writer`)
while the next steps compute. `save` runs both at once. `load_into` checks the copy against the job and
the state, verifies every byte against the digests the pointer recorded, and only then copies it into the
application's tensors.
An application that crashed (CUDA error, OOM, a bug) thus comes back with its last committed
revision, and the frontier election treats it like any other member's state: no pull when its
digest is the frontier, only the tensors that differ otherwise.

Invariants:
- Only a committed revision is ever visible: the pointer names a slot only after every byte of that
  slot was written, and the slot it names is not written again until the pointer has moved to the
  other one. A process killed while saving, at any phase (`PHASE_HOOK` names them), leaves the previous
  copy whole (double buffering); the hash is of the slot's bytes, never of the live tensors, so the next
  step may write those as soon as the snapshot returned.
- Reuse is verified: a copy of another job or job run (`instance`), of another peer, or of another
  layout (tensor names, dtypes, shapes) is ignored; every tensor and the objects are re-hashed and must
  equal the recorded digests, and those must add up to the recorded manifest digest. Nothing is
  written into the state unless all of it verified.
- Sharded objects: the shards the member holds are saved in the same slot, each with its own digest; a
  restore installs exactly those (verified), so a restarted application claims only shards of the copy's
  revision.
- The folder is this peer's alone (its agent names it after the job, the peer and its control port),
  with one writing process at a time; at most two copies of the state live in it (`check_space` refuses
  a state whose two slots do not fit), and a small mark of the revision last committed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from p2pgen.state import tensors as tz
from p2pgen.state.shared import (
    SharedState,
    block_digests,
    digest_of_blocks,
    manifest_digest,
    objects_bytes,
    tensor_digest,
)
from p2pgen.state.staging import CpuStager, HostStager

log = logging.getLogger(__name__)

FORMAT = 2    # 2: tensor digests built from block digests (`state.shared`)
POINTER = "current.json"
MARK = "committed.json"     # the revision the application last committed (may be newer than the copy)
MARK_BYTES = 512
ALIGN = 64

PHASE_HOOK: Callable[[str], None] | None = None     # a seam tests set: called at each phase of a save


def _phase(name: str) -> None:
    if PHASE_HOOK is not None:
        PHASE_HOOK(name)


class LocalCopyError(Exception):
    """A local copy could not be used; the message says why."""


@dataclass(frozen=True)
class CopyInfo:
    """What the pointer says about the copy it names."""

    revision: int
    digest: str
    epoch: int
    generation: int
    incarnation: int
    nbytes: int
    instance: str = ""                   # the run of the job it belongs to


@dataclass
class Snapshot:
    """A save in flight: one revision's bytes in the free slot, not yet hashed nor pointed at."""

    meta: dict[str, Any]                 # the pointer's fields known at the snapshot (owner, revision, slot)
    entries: list[list]                  # [name, dtype, shape, offset, nbytes] per tensor, sorted by name
    objects: list[int]                   # [offset, nbytes] of the pickled objects
    shards: list[list]                   # [object id, index, offset, nbytes, numpy dtype] per held shard
    size: int
    keys: dict[str, tuple | None]        # each tensor's digest-cache key at the snapshot (`SharedState._cache_key`)
    stager: HostStager
    blocks: dict[str, tuple[int, ...]] = field(default_factory=dict)    # known at the snapshot, the rest by `finish`


@dataclass(frozen=True)
class Restored:
    info: CopyInfo
    seconds: float


class LocalCopy:
    """The double-buffered copy in `folder` (created if missing) of one peer's state in one job."""

    def __init__(self, folder: str, job: str, peer_id: str) -> None:
        self.folder, self.job, self.peer_id = folder, job, peer_id
        os.makedirs(folder, exist_ok=True)
        self.saves = 0
        self.bytes_written = 0
        self._maps: dict[int, np.ndarray] = {}      # slot -> its file mapped writable (kept between saves)
        self._named: int | None = None              # the slot the pointer names, once read or written
        self._mark_fd: int | None = None

    # --- writing ------------------------------------------------------------------------------------

    def layout_bytes(self, state: SharedState) -> int:
        """Bytes one slot takes for `state` (tensors, objects and held shards, each 64-byte aligned)."""
        return _layout(state, objects_bytes(state.objects))[3]

    def check_space(self, state: SharedState) -> None:
        """Raise LocalCopyError, naming the size needed and the flags to change, when the two slots of `state`
        do not fit in the folder's filesystem (slot files already there count as room: they are reused)."""
        slot = self.layout_bytes(state)
        held = sum(os.stat(self._slot(i)).st_blocks * 512 for i in (0, 1) if os.path.exists(self._slot(i)))
        fs = os.statvfs(self.folder)
        free = fs.f_bavail * fs.f_frsize
        if 2 * slot - held > free:
            raise LocalCopyError(
                f"the local copy needs {_mib(2 * slot)} in {self.folder} (two slots of {_mib(slot)}: the copy a "
                f"crash resumes from stays whole while the next one is written), and {_mib(free + held)} are free "
                "there: pass --local-state-dir DIR on a filesystem with room, or --no-local-state to run without "
                "a local copy (a crash then resumes from another member or a checkpoint)")

    def save(self, state: SharedState, *, instance: str, incarnation: int, generation: int, epoch: int) -> CopyInfo:
        """Write `state` (quiesced: committed, not being modified) into the free slot, then point at it."""
        return self.finish(self.snapshot(state, instance=instance, incarnation=incarnation, generation=generation,
                                         epoch=epoch))

    def snapshot(self, state: SharedState, *, instance: str, incarnation: int, generation: int, epoch: int,
                 stager: HostStager | None = None) -> Snapshot:
        """Copy the committed bytes of `state` into the free slot (or enqueue their device-to-host copies);
        the first half of a save, in the thread that committed. `finish` publishes it.

        Raises OSError when the slot cannot be allocated (no space left: ENOSPC)."""
        raw_objects = objects_bytes(state.objects)
        entries, objects, shards, size = _layout(state, raw_objects)
        slot = 1 - self._named_slot() if self._named_slot() is not None else 0
        data = self._mapped(slot, size)
        stager = stager or CpuStager()
        keys, known = {}, {}
        for name, _dtype, _shape, off, n in entries:
            stager.start(state.tensors[name], data[off:off + n])
            keys[name] = state._cache_key(name)
            if (blocks := state._cached_blocks(name)) is not None:
                known[name] = blocks            # hashed already at this key (the vote's digest): not again
            _phase("snapshotting")
        off, n = objects
        data[off:off + n] = np.frombuffer(raw_objects, np.uint8)
        for object_id, i, off, n, _dtype in shards:
            np.copyto(data[off:off + n], state.sharded[object_id].shard_bytes(i))
        stager.fence()
        _phase("snapshotted")
        meta = {"format": FORMAT, "job": self.job, "instance": instance, "peer": self.peer_id,
                "incarnation": incarnation, "generation": generation, "epoch": epoch, "slot": slot,
                "revision": state.revision}
        return Snapshot(meta, entries, objects, shards, size, keys, stager, known)

    def finish(self, snap: Snapshot) -> CopyInfo:
        """Hash the snapshot's bytes and move the pointer to its slot: the second half of a save, which the
        background writer runs while the next steps compute. Sets `snap.blocks` (name -> block digests).

        Raises OSError when the pointer cannot be written (the previous copy stays the one named)."""
        snap.stager.wait()
        data = self._maps[snap.meta["slot"]]
        digests, entries = {}, []
        for name, dtype, shape, off, n in snap.entries:
            blocks = snap.blocks.get(name) or tuple(block_digests(data[off:off + n]))
            digests[name] = digest_of_blocks(dtype, tuple(shape), blocks)
            snap.blocks[name] = blocks
            entries.append([name, dtype, shape, off, n, digests[name]])
            _phase("hashing")
        shards = [[object_id, i, off, n, tensor_digest(dtype.name, (n // dtype.itemsize,), data[off:off + n])]
                  for object_id, i, off, n, dtype in snap.shards]
        off, n = snap.objects
        objects_digest = xxhash.xxh3_128(data[off:off + n]).hexdigest()
        _phase("hashed")
        pointer = {**snap.meta, "digest": manifest_digest(digests, objects_digest), "entries": entries,
                   "objects": [off, n, objects_digest], "shards": shards, "nbytes": snap.size,
                   "written_at": time.time()}
        tmp = os.path.join(self.folder, f".{POINTER}.{os.getpid()}.tmp")
        with open(tmp, "w") as f:
            json.dump(pointer, f)
        _phase("pointer-written")
        os.replace(tmp, os.path.join(self.folder, POINTER))
        self._named = int(snap.meta["slot"])
        _phase("moved")
        self.saves += 1
        self.bytes_written += snap.size
        return _info(pointer)

    def drop_free_slot(self) -> None:
        """Remove the slot file the pointer does not name (after a save failed for lack of space)."""
        named = self._named_slot()
        free = 1 - named if named is not None else 0
        self._maps.pop(free, None)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._slot(free))

    def mark_committed(self, revision: int, instance: str, incarnation: int, generation: int) -> None:
        """Record the revision this incarnation last committed and the generation it committed it in (one small
        write, before the commit returns), so that its next incarnation, and its agent, can say which committed
        revisions the copy does not hold (the background save had not finished)."""
        if self._mark_fd is None:
            self._mark_fd = os.open(os.path.join(self.folder, MARK), os.O_RDWR | os.O_CREAT, 0o600)
        record = json.dumps({"revision": revision, "instance": instance, "incarnation": incarnation,
                             "generation": generation}).encode()
        os.pwrite(self._mark_fd, record.ljust(MARK_BYTES), 0)

    def committed_mark(self) -> dict[str, Any] | None:
        """What `mark_committed` last recorded (None: nothing readable)."""
        try:
            with open(os.path.join(self.folder, MARK), "rb") as f:
                return json.loads(f.read(MARK_BYTES).strip() or b"null")
        except (OSError, ValueError):
            return None

    def unsaved_commits(self, info: CopyInfo) -> tuple[int, int] | None:
        """(revision, generation) the incarnation that wrote the mark had committed above the copy `info`
        describes, when its saves had not caught up (None: the copy holds everything the mark names)."""
        mark = self.committed_mark()
        if not isinstance(mark, dict) or not info.instance or mark.get("instance") != info.instance:
            return None
        try:
            revision, generation = int(mark.get("revision", -1)), int(mark.get("generation", info.generation))
        except (TypeError, ValueError):
            return None
        return (revision, generation) if revision > info.revision else None

    def close(self) -> None:
        """Unmap the slots and close the mark (the files stay: they are the copy)."""
        self._maps.clear()
        if self._mark_fd is not None:
            os.close(self._mark_fd)
            self._mark_fd = None

    def _named_slot(self) -> int | None:
        if self._named is None:
            pointer = self._pointer()
            self._named = int(pointer["slot"]) if pointer else None
        return self._named

    def _mapped(self, slot: int, size: int) -> np.ndarray:
        """The slot file mapped writable at `size` bytes, its blocks allocated up front (so a full filesystem
        is an OSError here, never a SIGBUS while the snapshot is copied in)."""
        data = self._maps.get(slot)
        if data is not None and len(data) == size:
            return data
        self._maps.pop(slot, None)
        fd = os.open(self._slot(slot), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size != size:
                os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
        self._maps[slot] = np.memmap(self._slot(slot), dtype=np.uint8, mode="r+", shape=(size,))
        return self._maps[slot]

    # --- reading ------------------------------------------------------------------------------------

    def describe(self) -> CopyInfo | None:
        """The copy the pointer names, without verifying it (None: there is none)."""
        pointer = self._pointer()
        return _info(pointer) if pointer else None

    def load_into(self, state: SharedState, *, instance: str) -> Restored:
        """Verify the copy and write it into `state` (tensors in place, objects, revision).

        Raises LocalCopyError, leaving `state` untouched, if there is no usable copy."""
        started = time.monotonic()
        pointer = self._pointer()
        if not pointer:
            raise LocalCopyError(f"no local copy in {self.folder}")
        self._check_owner(pointer, instance)
        self._check_layout(pointer, state)
        # copy-on-write: never changes the file
        data = np.memmap(self._slot(pointer["slot"]), dtype=np.uint8, mode="c")
        try:
            if len(data) < pointer["nbytes"]:
                raise LocalCopyError(f"slot {pointer['slot']} holds {len(data)} bytes, the copy {pointer['nbytes']}")
            views = self._verified(pointer, data)
            shards = self._verified_shards(pointer, data, state)
            for name, view in views.items():
                state._load_tensor(name, view)
            for obj in state.sharded.values():      # exactly the shards of the copy's revision, no others
                obj.keep_only([])
            for (object_id, i), (view, digest) in shards.items():
                state.sharded[object_id].install(i, view, digest)
            off, n, _ = pointer["objects"]
            state._load_objects(bytes(data[off:off + n]))
            state.revision = int(pointer["revision"])
        finally:
            del data
        return Restored(_info(pointer), time.monotonic() - started)

    def _verified(self, pointer: dict[str, Any], data: np.ndarray) -> dict[str, np.ndarray]:
        views, digests = {}, {}
        for name, dtype, shape, off, n, digest in pointer["entries"]:
            view = data[off:off + n]
            if tensor_digest(dtype, tuple(shape), view) != digest:
                raise LocalCopyError(f"tensor {name!r} of the copy does not hash to its recorded digest")
            views[name], digests[name] = view, digest
        off, n, objects_digest = pointer["objects"]
        if xxhash.xxh3_128(data[off:off + n]).hexdigest() != objects_digest:
            raise LocalCopyError("the objects of the copy do not hash to their recorded digest")
        if manifest_digest(digests, objects_digest) != pointer["digest"]:
            raise LocalCopyError("the recorded digests do not add up to the copy's manifest digest")
        return views

    @staticmethod
    def _verified_shards(pointer: dict[str, Any], data: np.ndarray, state: SharedState) -> dict:
        """The copy's shards of objects this state declares, each verified against its recorded digest."""
        out = {}
        for object_id, i, off, n, digest in pointer.get("shards", []):
            obj = state.sharded.get(object_id)
            if obj is None or not 0 <= i < obj.partition.shards or n != obj.partition.shard_nbytes(i):
                raise LocalCopyError(f"the copy's shard {object_id}[{i}] does not fit this state's sharded objects")
            view = data[off:off + n]
            if tensor_digest(obj.dtype.name, (n // obj.dtype.itemsize,), view) != digest:
                raise LocalCopyError(f"shard {object_id}[{i}] of the copy does not hash to its recorded digest")
            out[(object_id, i)] = (view, digest)
        return out

    def _check_owner(self, pointer: dict[str, Any], instance: str) -> None:
        if pointer.get("format") != FORMAT:
            raise LocalCopyError(f"format {pointer.get('format')!r}, this p2pgen reads {FORMAT}")
        if (pointer["job"], pointer["peer"]) != (self.job, self.peer_id):
            raise LocalCopyError(f"the copy belongs to {pointer['peer']} of job {pointer['job']!r}")
        if pointer["instance"] != instance:
            raise LocalCopyError(f"the copy belongs to another run of job {self.job!r} "
                                 f"({pointer['instance']}, this run is {instance})")

    @staticmethod
    def _check_layout(pointer: dict[str, Any], state: SharedState) -> None:
        theirs = {name: (dtype, tuple(shape)) for name, dtype, shape, *_ in pointer["entries"]}
        mine = {name: (tz.dtype_name(t), tz.shape(t)) for name, t in state.tensors.items()}
        if theirs != mine:
            differ = sorted(n for n in set(theirs) | set(mine) if theirs.get(n) != mine.get(n))
            raise LocalCopyError(f"the copy's tensors differ from this state's: {', '.join(differ)}")

    def _pointer(self) -> dict[str, Any] | None:
        try:
            with open(os.path.join(self.folder, POINTER)) as f:
                return json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("local copy pointer in %s is unreadable (%s): ignoring it", self.folder, e)
            return None

    def _slot(self, slot: int) -> str:
        return os.path.join(self.folder, f"slot-{int(slot)}.bin")


def _info(pointer: dict[str, Any]) -> CopyInfo:
    return CopyInfo(int(pointer["revision"]), str(pointer["digest"]), int(pointer["epoch"]),
                    int(pointer["generation"]), int(pointer["incarnation"]), int(pointer["nbytes"]),
                    str(pointer.get("instance", "")))


def _layout(state: SharedState, raw_objects: bytes) -> tuple[list, list, list, int]:
    """(entries [name, dtype, shape, offset, nbytes], objects [offset, nbytes], shards [object id, index,
    offset, nbytes, numpy dtype], slot size) of `state` in a slot."""
    entries, offset = [], 0
    for name in sorted(state.tensors):
        value = state.tensors[name]
        entries.append([name, tz.dtype_name(value), list(tz.shape(value)), offset, tz.nbytes(value)])
        offset = _aligned(offset + tz.nbytes(value))
    objects = [offset, len(raw_objects)]
    offset = _aligned(offset + len(raw_objects))
    shards = []                 # sharded objects: the shards this member holds, each with its own digest
    for obj in state.sharded.values():
        for i in obj.owned():
            shards.append([obj.object_id, i, offset, obj.shard_bytes(i).nbytes, obj.dtype])
            offset = _aligned(offset + obj.shard_bytes(i).nbytes)
    return entries, objects, shards, max(offset, ALIGN)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB ({n} bytes)"


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN

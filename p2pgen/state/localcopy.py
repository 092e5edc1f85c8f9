"""LocalCopy: a member's committed state, kept on its host outside the application process.

Owns: one folder that the member's agent keeps across the application's incarnations (on tmpfs,
`/dev/shm`, by default): two slot files and a pointer file, `current.json`. `save` writes the state
into the slot the pointer does not name, then replaces the pointer (write a temporary file, rename it
over the old one). `load_into` checks the copy against the job and the state, verifies every byte
against the digests the pointer recorded, and only then copies it into the application's tensors.
An application that crashed (CUDA error, OOM, a bug) thus comes back with its last committed
revision, and the frontier election treats it like any other member's state: no pull when its
digest is the frontier, only the tensors that differ otherwise.

Invariants:
- Only a committed revision is ever visible: the pointer names a slot only after every byte of that
  slot was written, and the slot it names is not written again until the pointer has moved to the
  other one. A process killed while saving leaves the previous copy whole (double buffering).
- Reuse is verified: a copy of another job or job run (`instance`), of another peer, or of another
  layout (tensor names, dtypes, shapes) is ignored; every tensor and the objects are re-hashed and must
  equal the recorded digests, and those must add up to the recorded manifest digest. Nothing is
  written into the state unless all of it verified.
- Sharded objects: the shards the member holds are saved in the same slot, each with its own digest; a
  restore installs exactly those (verified), so a restarted application claims only shards of the copy's
  revision.
- The folder is this peer's alone (its agent names it after the job, the peer and its control port);
  at most two copies of the state live in it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from p2pgen.state import tensors as tz
from p2pgen.state.shared import SharedState, manifest_digest, objects_bytes, tensor_digest

log = logging.getLogger(__name__)

FORMAT = 2    # 2: tensor digests built from block digests (`state.shared`)
POINTER = "current.json"
ALIGN = 64


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

    # --- writing ------------------------------------------------------------------------------------

    def save(self, state: SharedState, *, instance: str, incarnation: int, generation: int, epoch: int) -> CopyInfo:
        """Write `state` (quiesced: committed, not being modified) into the free slot, then point at it."""
        manifest = state._manifest()
        raw_objects = objects_bytes(state.objects)
        current = self._pointer()
        slot = 1 - int(current["slot"]) if current else 0
        entries, offset = [], 0
        for e in manifest.entries:
            entries.append([e.name, e.dtype, list(e.shape), offset, e.nbytes, e.digest])
            offset = _aligned(offset + e.nbytes)
        objects = [offset, len(raw_objects), manifest.objects_digest]
        offset = _aligned(offset + len(raw_objects))
        shards = []                 # sharded objects: the shards this member holds, each with its own digest
        for obj in state.sharded.values():
            for i in obj.owned():
                shards.append([obj.object_id, i, offset, obj.shard_bytes(i).nbytes, obj.digest(i)])
                offset = _aligned(offset + obj.shard_bytes(i).nbytes)
        size = offset
        fd = os.open(self._slot(slot), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size != size:
                os.ftruncate(fd, size)
            for (name, *_rest, off, _n, _d) in entries:
                _pwrite_all(fd, memoryview(state._snapshot_bytes(name)), off)
            _pwrite_all(fd, memoryview(raw_objects), objects[0])
            for object_id, i, off, _n, _d in shards:
                _pwrite_all(fd, memoryview(state.sharded[object_id].shard_bytes(i)), off)
        finally:
            os.close(fd)
        pointer = {"format": FORMAT, "job": self.job, "instance": instance, "peer": self.peer_id,
                   "incarnation": incarnation, "generation": generation, "epoch": epoch, "slot": slot,
                   "revision": state.revision, "digest": manifest.digest, "entries": entries, "objects": objects,
                   "shards": shards,
                   "nbytes": size, "written_at": time.time()}
        tmp = os.path.join(self.folder, f".{POINTER}.{os.getpid()}.tmp")
        with open(tmp, "w") as f:
            json.dump(pointer, f)
        os.replace(tmp, os.path.join(self.folder, POINTER))
        self.saves += 1
        self.bytes_written += size
        return _info(pointer)

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
                    int(pointer["generation"]), int(pointer["incarnation"]), int(pointer["nbytes"]))


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    data = data.cast("B")
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written

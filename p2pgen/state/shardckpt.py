"""Shards in checkpoints: each shard of a sharded object written once, by its first owner, next to the checkpoint.

Owns the layout of checkpointed shards and their completeness rule. Beside the `ckpt-...` folders of
`p2pgen.state.checkpoint` (written by rank 0, which holds the replicated part but not every shard):

    DIR/shards/r<revision, 12 digits>/<object id>-<index>-<digest>.bin     one file per shard

Invariants:
- a shard file appears whole or not at all (written to a hidden temporary name, fsynced, renamed) and names
  its digest, so a reader verifies it against its own name; the same shard at the same revision has the same
  bytes on every owner (they applied the same steps), so a second writer finds the file there and stops;
- a checkpoint of revision R is usable by a sharded state only if every shard of the declared layout has a
  file of revision R (`find_shards`); an incomplete one is never offered (its owners died before writing);
- `load_shards` verifies every file before it installs any.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from p2pgen.core.ownership import Partition
from p2pgen.state.checkpoint import CheckpointError, _fsync_dir, _read_file, _write_file
from p2pgen.state.shared import SharedState, tensor_digest

SHARDS_DIR = "shards"


def shard_dir(root: str | os.PathLike, revision: int) -> Path:
    return Path(root) / SHARDS_DIR / f"r{revision:012d}"


def write_shards(state: SharedState, root: str | os.PathLike, keys: Iterable[tuple[str, int]]) -> int:
    """Write the shards `keys` (held by this member) of `state`'s revision; returns how many were new."""
    folder = shard_dir(root, state.revision)
    folder.mkdir(parents=True, exist_ok=True)
    written = 0
    for object_id, index in keys:
        obj = state.sharded[object_id]
        final = folder / f"{object_id}-{index}-{obj.digest(index)}.bin"
        if final.exists():
            continue
        tmp = folder / f".tmp-{final.name}-{os.getpid()}-{secrets.token_hex(4)}"
        _write_file(tmp, memoryview(obj.shard_bytes(index)))
        os.rename(tmp, final)
        written += 1
    if written:
        _fsync_dir(folder)
    return written


def find_shards(root: str | os.PathLike, revision: int, layout: Sequence[Partition]
                ) -> dict[tuple[str, int], tuple[Path, str]] | None:
    """(object, index) -> (file, digest) for every shard of `layout` at `revision`; None if any is missing."""
    folder = shard_dir(root, revision)
    found: dict[tuple[str, int], tuple[Path, str]] = {}
    if folder.is_dir():
        for path in folder.glob("*.bin"):
            if path.name.startswith("."):
                continue
            object_id, index, digest = path.stem.rsplit("-", 2)
            if index.isdigit():
                found[(object_id, int(index))] = (path, digest)
    wanted = [(p.object_id, i) for p in layout for i in range(p.shards)]
    if not all(k in found for k in wanted):
        return None
    return {k: found[k] for k in wanted}


def load_shards(state: SharedState, root: str | os.PathLike, revision: int) -> int:
    """Verify and install every shard of `state`'s sharded objects at `revision`; returns the bytes loaded."""
    layout = [o.partition for o in state.sharded.values()]
    found = find_shards(root, revision, layout)
    if found is None:
        raise CheckpointError(f"the checkpoint of revision {revision} in {root} lacks shards of "
                              f"{[p.object_id for p in layout]}")
    data = {}
    for (object_id, index), (path, digest) in found.items():
        obj = state.sharded[object_id]
        buf = _read_file(path, obj.partition.shard_nbytes(index))
        if tensor_digest(obj.dtype.name, (len(buf) // obj.dtype.itemsize,), buf) != digest:
            raise CheckpointError(f"{path} does not hash to the digest in its name")
        data[(object_id, index)] = (buf, digest)
    for obj in state.sharded.values():
        obj.keep_only([])
    for (object_id, index), (buf, digest) in data.items():
        state.sharded[object_id].install(index, buf, digest)
    return int(sum(np.asarray(b).nbytes for b, _ in data.values()))


def prune_shards(root: str | os.PathLike, oldest_kept: int) -> None:
    """Remove the shard folders of revisions below `oldest_kept` (the oldest checkpoint still kept)."""
    base = Path(root) / SHARDS_DIR
    if not base.is_dir():
        return
    for folder in base.glob("r*"):
        if folder.name[1:].isdigit() and int(folder.name[1:]) < oldest_kept:
            shutil.rmtree(folder, ignore_errors=True)

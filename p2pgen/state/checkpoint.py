"""Checkpoints: a SharedState written to a folder, whole and verified, never seen torn.

Owns: the checkpoint layout, writing one atomically, listing the complete ones, loading one after
verifying it, and setting a bad one aside. Layout (local files now; every name is a key an object
store could hold, and a checkpoint becomes visible by one last operation, as a manifest put would):

    DIR/ckpt-<revision, 12 digits>-<digest, 16 hex>/
        MANIFEST.json     job, run (instance), state epoch, revision, manifest digest, generation, writer,
                          and one record per object (tensor or the objects pickle): its file, bytes, digest,
                          owners, partition and the rule a reader verifies it by
        t<i>.bin          tensor i of the manifest, its elements in C order
        objects.pkl       the pickled objects

Invariants:
- A checkpoint is written once, by one member (each object once), into a hidden `.tmp-...` folder;
  every file and the folder are fsynced before one rename makes it visible under its `ckpt-` name,
  and the parent folder is fsynced after. A writer killed on the way leaves only a hidden folder,
  which no reader lists (and which a later writer removes once it is an hour old).
- A reader lists only `ckpt-*` folders whose MANIFEST parses; `load_checkpoint` verifies every file
  against the manifest's digests (and those against its manifest digest) before it writes anything
  into the state. A checkpoint that fails is renamed `corrupt-...` so nobody offers it again.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from p2pgen.state import tensors as tz
from p2pgen.state.shared import SharedState, manifest_digest, objects_bytes, tensor_digest

log = logging.getLogger(__name__)

FORMAT = 2    # 2: tensor digests built from block digests (`state.shared`); format 1 is not read
MANIFEST = "MANIFEST.json"
STALE_TMP_S = 3600.0
VERIFY_RULE = ("xxh3-128 over 'dtype|shape|' and the xxh3-64 digests of the bytes' 4 MiB blocks equals digest; "
               "digests add up to the manifest digest")


class CheckpointError(Exception):
    """A checkpoint could not be written or used; the message says which and why."""


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint as its manifest describes it (not verified yet)."""

    path: Path
    revision: int
    digest: str
    epoch: int
    instance: str
    job: str
    manifest: dict[str, Any]


def checkpoint_name(revision: int, digest: str) -> str:
    return f"ckpt-{revision:012d}-{digest[:16]}"


def write_checkpoint(state: SharedState, directory: str | os.PathLike, *, job: str, instance: str, epoch: int,
                     generation: int, writer: tuple[str, int], owners: tuple[str, ...] = (),
                     keep: int = 3) -> Path:
    """Write `state` (quiesced) as a checkpoint under `directory`; keep the newest `keep` ones (0: all).

    Returns the checkpoint's folder. The state must not change meanwhile (call it between steps)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    manifest = state._manifest()
    final = root / checkpoint_name(state.revision, manifest.digest)
    if final.exists():
        return final                       # this revision is already saved (by another writer or earlier)
    tmp = root / f".tmp-{final.name}-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        records = []
        for i, e in enumerate(manifest.entries):
            _write_file(tmp / f"t{i}.bin", memoryview(state._snapshot_bytes(e.name)))
            records.append({"object_id": e.name, "kind": "tensor", "file": f"t{i}.bin", "dtype": e.dtype,
                            "shape": list(e.shape), "nbytes": e.nbytes, "digest": e.digest})
        raw = objects_bytes(state.objects)
        _write_file(tmp / "objects.pkl", memoryview(raw))
        records.append({"object_id": "objects", "kind": "objects", "file": "objects.pkl", "nbytes": len(raw),
                        "digest": manifest.objects_digest})
        for r in records:
            r.update({"application_revision": state.revision, "owners": list(owners), "partition": "whole",
                      "reconstruction_source": "checkpoint", "verification_rule": VERIFY_RULE})
        body = {"format": FORMAT, "job": job, "instance": instance, "epoch": epoch, "revision": state.revision,
                "digest": manifest.digest, "generation": generation, "writer": list(writer),
                "written_at": time.time(), "objects": records}
        _write_file(tmp / MANIFEST, memoryview(json.dumps(body, indent=1).encode()))
        _fsync_dir(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)        # another writer made the same revision visible first
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _prune(root, keep)
    return final


def list_checkpoints(directory: str | os.PathLike) -> list[CheckpointInfo]:
    """The complete checkpoints under `directory`, newest revision first (unverified: see load_checkpoint)."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = []
    for path in root.glob("ckpt-*"):
        try:
            body = json.loads((path / MANIFEST).read_text())
            if body.get("format") != FORMAT:
                log.warning("checkpoint %s is in format %r, this p2pgen reads %d (its digests are computed "
                            "differently): not offered; load it with the p2pgen that wrote it", path,
                            body.get("format"), FORMAT)
                continue
            found.append(CheckpointInfo(path, int(body["revision"]), str(body["digest"]), int(body["epoch"]),
                                        str(body["instance"]), str(body["job"]), body))
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("checkpoint %s has no readable manifest (%s): not offered", path, e)
    return sorted(found, key=lambda c: (c.revision, c.path.name), reverse=True)


def load_checkpoint(state: SharedState, info: CheckpointInfo) -> None:
    """Verify every file of `info` and write it into `state` (tensors in place, objects, revision).

    Raises CheckpointError, leaving `state` untouched, if anything does not verify or fit."""
    records = {r["object_id"]: r for r in info.manifest["objects"] if r["kind"] == "tensor"}
    mine = {name: (tz.dtype_name(t), tz.shape(t)) for name, t in state.tensors.items()}
    theirs = {name: (r["dtype"], tuple(r["shape"])) for name, r in records.items()}
    if mine != theirs:
        differ = sorted(n for n in set(mine) | set(theirs) if mine.get(n) != theirs.get(n))
        raise CheckpointError(f"{info.path}: its tensors differ from this state's: {', '.join(differ)}")
    data, digests = {}, {}
    for name, r in records.items():
        buf = _read_file(info.path / r["file"], r["nbytes"])
        if tensor_digest(r["dtype"], tuple(r["shape"]), buf) != r["digest"]:
            raise CheckpointError(f"{info.path}: tensor {name!r} does not hash to its recorded digest")
        data[name], digests[name] = buf, r["digest"]
    obj = next(r for r in info.manifest["objects"] if r["kind"] == "objects")
    raw = bytes(_read_file(info.path / obj["file"], obj["nbytes"]))
    if xxhash.xxh3_128(raw).hexdigest() != obj["digest"]:
        raise CheckpointError(f"{info.path}: the objects do not hash to their recorded digest")
    if manifest_digest(digests, obj["digest"]) != info.digest:
        raise CheckpointError(f"{info.path}: the recorded digests do not add up to the manifest digest")
    for name, buf in data.items():
        state._load_tensor(name, buf)
    state._load_objects(raw)
    state.revision = info.revision


def quarantine(info: CheckpointInfo, why: str) -> None:
    """Rename a checkpoint that failed to load so that nobody offers it again."""
    target = info.path.with_name(f"corrupt-{info.path.name}-{secrets.token_hex(2)}")
    try:
        os.rename(info.path, target)
        log.error("checkpoint %s set aside as %s: %s", info.path, target.name, why)
    except OSError as e:
        log.error("checkpoint %s failed (%s) and could not be set aside: %s", info.path, why, e)


def _write_file(path: Path, data: memoryview) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        data = data.cast("B")
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_file(path: Path, nbytes: int) -> np.ndarray:
    buf = np.empty(nbytes, np.uint8)
    with open(path, "rb") as f:
        if f.readinto(memoryview(buf)) != nbytes or f.read(1):
            raise CheckpointError(f"{path} does not hold {nbytes} bytes")
    return buf


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _prune(root: Path, keep: int) -> None:
    """Remove all but the newest `keep` checkpoints, and hidden folders of writers long gone."""
    if keep > 0:
        for old in list_checkpoints(root)[keep:]:
            shutil.rmtree(old.path, ignore_errors=True)
    now = time.time()
    for tmp in root.glob(".tmp-ckpt-*"):
        try:
            if now - tmp.stat().st_mtime > STALE_TMP_S:
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass

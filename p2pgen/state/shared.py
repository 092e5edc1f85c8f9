"""SharedState: the named tensors, small objects and revision that the members of a job agree on.

Owns: the per-tensor digests, the objects digest (xxh3-128 over the pickled objects), the manifest
digest over both, and the cache that avoids re-hashing.

A tensor's digest is two-level: its bytes are cut into blocks of DIGEST_BLOCK bytes (the last one
shorter; an empty tensor has one empty block), each block is hashed with xxh3-64 (its "block digest",
the same function as a data frame's payload digest), and the digest is xxh3-128 over "dtype|shape|"
followed by the block digests (u64 little endian). So a frame that carries exactly one block proves that
block's digest as it is verified, with no second pass: a puller hashes each received byte once, and a
source sends the block digests it computed for the manifest instead of hashing its frames again.

Invariants:
- The manifest digest is a function of content only (sorted names, tensor digests, objects digest),
  never of the revision: two states with equal content have equal digests, so "equal revision means
  equal digest" can be checked, not assumed.
- A cached tensor digest is reused only while the tensor provably did not change. How the code knows:
  * torch tensors: the cache entry records the tensor object, its data address, its `_version` (torch's
    counter of in-place writes, shared with its views) and the revision. `_version` catches in-place
    writes within a revision; `step.commit()` invalidates every entry because some writes never bump
    `_version`: fused optimizers (`torch.optim.AdamW(fused=True)`, `SGD(fused=True)`, measured with torch
    2.13 on CPU) and writes through `.data` or a `.numpy()` view. Outside the commit contract, call
    `touch(name)` after such a write.
  * numpy arrays have no such counter: they are re-hashed on every `digest()` (about 9 GB/s here, so
    0.1 s per GB per call, paid once per generation change, not per step).
  * objects are re-pickled on every call (they are small: step, RNG state, data position). They must
    pickle deterministically (no sets of strings: their order depends on the hash seed).
- Replacing or deleting an entry (`state.tensors[name] = t`) drops its cache entry.
- Digests computed elsewhere from a copy of a tensor's bytes (the local copy's background writer) enter
  the cache with the key the tensor had when its bytes were copied (`remember`), so they are used only
  while it provably kept those bytes: the frontier digest a vote needs costs no hashing of state that did
  not change since the last commit's snapshot.
"""

from __future__ import annotations

import pickle
import struct
import threading
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import msgpack
import xxhash

from p2pgen.state import tensors as tz

PICKLE_PROTOCOL = 5
DIGEST_BLOCK = 4 << 20      # bytes per block of a tensor digest (the default catch-up chunk is one block)


def tensor_digest(dtype: str, shape: tuple[int, ...], data) -> str:
    """The digest of a tensor of `dtype` and `shape` whose bytes are `data` (1-D uint8 or bytes-like):
    equal bytes of another dtype or shape differ."""
    return digest_of_blocks(dtype, shape, block_digests(data))


def block_count(nbytes: int) -> int:
    """Blocks of a tensor of `nbytes` (an empty tensor still has one, empty, block)."""
    return max(1, -(-nbytes // DIGEST_BLOCK))


def block_digests(data, first: int = 0, count: int | None = None) -> list[int]:
    """xxh3-64 of blocks first..first+count-1 (default: all) of `data`, a 1-D uint8 array or bytes-like."""
    view = memoryview(data).cast("B")
    last = block_count(len(view)) if count is None else first + count
    return [xxhash.xxh3_64_intdigest(view[b * DIGEST_BLOCK:(b + 1) * DIGEST_BLOCK]) for b in range(first, last)]


def block_of_chunk(nbytes: int, chunk_bytes: int, chunk: int) -> int | None:
    """The block whose bytes are exactly chunk `chunk` of a tensor of `nbytes` cut into `chunk_bytes`
    chunks (so that chunk's payload digest is that block's digest), or None when they differ."""
    start = chunk * chunk_bytes
    if start % DIGEST_BLOCK:
        return None
    block = start // DIGEST_BLOCK
    same_end = min(start + chunk_bytes, nbytes) == min((block + 1) * DIGEST_BLOCK, nbytes)
    return block if same_end else None


def digest_of_blocks(dtype: str, shape: tuple[int, ...], blocks) -> str:
    """The tensor digest from its block digests, in order."""
    prefix = f"{dtype}|{','.join(map(str, shape))}|".encode()
    return xxhash.xxh3_128(prefix + struct.pack(f"<{len(blocks)}Q", *blocks)).hexdigest()


def objects_bytes(objects: Mapping[str, Any]) -> bytes:
    return pickle.dumps(sorted(objects.items()), protocol=PICKLE_PROTOCOL)


def manifest_digest(digests: Mapping[str, str], objects_digest: str) -> str:
    body = msgpack.packb([sorted(digests.items()), objects_digest])
    return xxhash.xxh3_128(body).hexdigest()


@dataclass(frozen=True)
class Entry:
    """One tensor as the manifest describes it, with its block digests (which add up to `digest`)."""

    name: str
    digest: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    blocks: tuple[int, ...]


@dataclass(frozen=True)
class Manifest:
    """What a state holds: revision, entries sorted by name, objects digest and size, manifest digest."""

    revision: int
    entries: tuple[Entry, ...]
    objects_digest: str
    objects_nbytes: int
    digest: str

    def to_wire(self) -> dict:
        return {"revision": self.revision, "objects": [self.objects_digest, self.objects_nbytes],
                "digest": self.digest,
                "entries": [[e.name, e.digest, e.dtype, list(e.shape), e.nbytes, list(e.blocks)] for e in self.entries]}

    @classmethod
    def from_wire(cls, msg: Any) -> Manifest:
        """Parse and check a wire manifest; ValueError if it is malformed or its digest does not add up."""
        try:
            entries = tuple(Entry(str(n), str(d), str(t), tuple(int(x) for x in s), int(b), tuple(int(x) for x in k))
                            for n, d, t, s, b, k in msg["entries"])
            m = cls(int(msg["revision"]), entries, str(msg["objects"][0]), int(msg["objects"][1]),
                    str(msg["digest"]))
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise ValueError(f"malformed manifest: {err!r}") from err
        names = [e.name for e in entries]
        if names != sorted(set(names)):
            raise ValueError("malformed manifest: entry names are not sorted and unique")
        for e in entries:
            if e.nbytes < 0 or len(e.blocks) != block_count(e.nbytes) or not all(0 <= k < 1 << 64 for k in e.blocks):
                raise ValueError(f"malformed manifest: tensor {e.name!r} of {e.nbytes} bytes has {len(e.blocks)} "
                                 "block digests, or one out of range")
            if digest_of_blocks(e.dtype, e.shape, e.blocks) != e.digest:
                raise ValueError(f"malformed manifest: the block digests of {e.name!r} do not add up to its digest")
        if manifest_digest({e.name: e.digest for e in entries}, m.objects_digest) != m.digest:
            raise ValueError("manifest digest does not match its entries")
        return m

    def entry(self, name: str) -> Entry:
        return next(e for e in self.entries if e.name == name)


@dataclass(frozen=True)
class _Cached:
    key: tuple
    digest: str
    blocks: tuple[int, ...]


class _Tensors(MutableMapping):
    """name -> tensor; checks each value and drops the digest cache entry of a replaced name."""

    def __init__(self, cache: dict[str, _Cached]) -> None:
        self._d: dict[str, Any] = {}
        self._cache = cache

    def __getitem__(self, name: str) -> Any:
        return self._d[name]

    def __setitem__(self, name: str, value: Any) -> None:
        if not isinstance(name, str):
            raise TypeError(f"tensor names are strings, got {name!r}")
        tz.check(name, value)
        self._cache.pop(name, None)
        self._d[name] = value

    def __delitem__(self, name: str) -> None:
        self._cache.pop(name, None)
        del self._d[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


class SharedState:
    """Named tensors (updated in place by the user), small picklable objects and a revision.

    Contract: after each optimizer step the application calls `step.commit()` (revision += 1; the only way to
    commit). While the application waits for a new generation it does not touch the state, so a StateServer can
    serve it. The application's API is `tensors`, `objects`, `revision`, `shard()`, `digest()`,
    `tensor_digests()`, `touch()` and `save_checkpoint()`; the methods whose names begin with `_` are the
    protocol the runtime (pulls, local copies, checkpoints, votes) calls.
    """

    def __init__(self, tensors: Mapping[str, Any] | None = None, objects: Mapping[str, Any] | None = None,
                 revision: int = 0) -> None:
        self._cache: dict[str, _Cached] = {}
        self.tensors: MutableMapping[str, Any] = _Tensors(self._cache)
        self.tensors.update(tensors or {})
        self.objects: dict[str, Any] = dict(objects or {})
        self.revision = int(revision)
        self.sharded: dict[str, Any] = {}   # object id -> ShardedObject (held in part; not in the digest)
        self.hashed_bytes = 0   # bytes hashed so far: lets tests and benchmarks see the cache work
        self._count_lock = threading.Lock()

    def shard(self, object_id: str, length: int, shards: int, dtype: Any = "float32", r: int = 2,
              init: float = 0.0) -> Any:
        """Declare a sharded logical object (e.g. ZeRO-1 optimizer moments): a 1-D array of `length` elements
        cut into `shards` pieces, each held by `r` members (`r` >= the world: every member holds all of it).
        Returns the `ShardedObject`; every member must declare the same objects before joining.

        Its shards are not in `digest()` (members hold different ones): the generation's election checks the
        shard digests, chooses who holds which, and moves them before the generation activates."""
        from p2pgen.state.sharded import ShardedObject
        if object_id in self.sharded or object_id in self.tensors:
            raise ValueError(f"{object_id!r} is already declared in this state; pick another object id")
        obj = ShardedObject(object_id, length, shards, dtype, r, init)
        self.sharded[object_id] = obj
        return obj

    def _layout_text(self) -> str:
        """The declared sharded objects, as a vote carries them ("" when none)."""
        from p2pgen.core.ownership import layout_text
        return layout_text([o.partition for o in self.sharded.values()])

    def _shards_text(self) -> str:
        """The shards held and their digests, as a vote carries them ("" when none)."""
        from p2pgen.core.ownership import shards_text
        held: dict[tuple[str, int], str] = {}
        for obj in self.sharded.values():
            held.update(obj.digests())
        return shards_text(held)

    def _commit(self) -> int:
        """Record one committed step (`Step.commit()` calls it): revision += 1; returns the new revision."""
        self.revision += 1
        return self.revision

    def save_checkpoint(self, directory: str, keep: int = 0) -> str:
        """Write this state as a checkpoint under `directory` (atomically; see `p2pgen.state.checkpoint`).

        Outside a job it belongs to no run: start a job from it with `p2pgen join ... --restore DIR`.
        Inside a job, let the agent write them (`--checkpoint-dir DIR --checkpoint-every N`)."""
        from p2pgen.state.checkpoint import write_checkpoint
        return str(write_checkpoint(self, directory, job="", instance="", epoch=1, generation=0, writer=("", 0),
                                    keep=keep))

    def touch(self, name: str | None = None) -> None:
        """Forget the cached digest of `name` (all when None): after a write torch cannot see."""
        if name is None:
            self._cache.clear()
        else:
            self._cache.pop(name, None)

    def tensor_digests(self) -> dict[str, str]:
        """name -> digest, sorted by name."""
        return {name: digest for name, (digest, _) in self._tensor_blocks().items()}

    def _tensor_blocks(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """name -> (digest, block digests), sorted by name; a torch tensor's are cached (see above)."""
        out: dict[str, tuple[str, tuple[int, ...]]] = {}
        for name in sorted(self.tensors):     # one at a time: a CUDA tensor's host copy lives only while hashed
            value = self.tensors[name]
            key, cached = self._cached(name, value)
            if cached is not None:
                out[name] = (cached.digest, cached.blocks)
                continue
            blocks = tuple(block_digests(tz.host_bytes(value)))
            with self._count_lock:
                self.hashed_bytes += tz.nbytes(value)
            digest = digest_of_blocks(tz.dtype_name(value), tz.shape(value), blocks)
            if key is not None:
                self._cache[name] = _Cached(key, digest, blocks)
            out[name] = (digest, blocks)
        return out

    def _objects_digest(self) -> tuple[str, int]:
        """(digest, size) of the pickled objects."""
        raw = objects_bytes(self.objects)
        return xxhash.xxh3_128(raw).hexdigest(), len(raw)

    def digest(self) -> str:
        """The manifest digest (hex): content only, not the revision."""
        return manifest_digest(self.tensor_digests(), self._objects_digest()[0])

    def _manifest(self) -> Manifest:
        hashed = self._tensor_blocks()
        digests = {name: d for name, (d, _) in hashed.items()}
        obj_digest, obj_size = self._objects_digest()
        entries = tuple(Entry(n, d, tz.dtype_name(t), tz.shape(t), tz.nbytes(t), hashed[n][1])
                        for n, d, t in ((n, digests[n], self.tensors[n]) for n in digests))
        return Manifest(self.revision, entries, obj_digest, obj_size, manifest_digest(digests, obj_digest))

    def _holds(self, entry: Entry) -> bool:
        """Whether tensor `entry.name` holds exactly the bytes `entry` describes. Compares block by block
        and stops at the first that differs, so a tensor that differs early (a joiner's fresh one) costs
        one block, not a pass over all of it; a cached digest answers without hashing."""
        value = self.tensors[entry.name]
        if (tz.dtype_name(value), tz.shape(value)) != (entry.dtype, entry.shape):
            return False
        key, cached = self._cached(entry.name, value)
        if cached is not None:
            return cached.digest == entry.digest
        data = tz.host_bytes(value)
        for b, want in enumerate(entry.blocks):
            with self._count_lock:
                self.hashed_bytes += min(DIGEST_BLOCK, len(data) - b * DIGEST_BLOCK)
            if block_digests(data, b, 1)[0] != want:
                return False
        if key is not None:
            self._cache[entry.name] = _Cached(key, entry.digest, entry.blocks)
        return True

    def _snapshot_bytes(self, name: str) -> Any:
        """The bytes of tensor `name` as a 1-D uint8 numpy array (a view for contiguous CPU tensors)."""
        return tz.host_bytes(self.tensors[name])

    def _load_tensor(self, name: str, data: Any) -> None:
        """Copy verified bytes (1-D uint8) into tensor `name` in place; its digest is recomputed next time
        (or taken from `verified`).

        The caller has verified `data` against the source's digest: this is how a pull writes user tensors.
        """
        value = self.tensors[name]
        self._cache.pop(name, None)
        tz.write_in_place(value, data)

    def _verified(self, name: str, blocks: tuple[int, ...]) -> None:
        """Tensor `name` holds bytes the caller verified against these block digests (a pull that wrote it,
        once the revision is applied): a torch tensor's digest is cached from them, so the next `digest()`
        hashes nothing; a numpy array has no change counter and is hashed again anyway."""
        value = self.tensors[name]
        key = self._key(value)
        if key is not None:
            self._cache[name] = _Cached(key, digest_of_blocks(tz.dtype_name(value), tz.shape(value), blocks),
                                        tuple(blocks))

    def _cache_key(self, name: str) -> tuple | None:
        """What proves tensor `name` unchanged later (object, data address, `_version`, revision); None for a
        numpy array, which has no change counter. Taken when its bytes are copied for hashing elsewhere."""
        return self._key(self.tensors[name])

    def _cached_blocks(self, name: str) -> tuple[int, ...] | None:
        """The block digests of tensor `name` if its cache entry is still valid (nothing to hash), else None."""
        return (cached.blocks if (cached := self._cached(name, self.tensors[name])[1]) is not None else None)

    def _remember(self, name: str, key: tuple | None, blocks: tuple[int, ...]) -> bool:
        """Cache the block digests someone computed from tensor `name`'s bytes when its key was `key` (the
        local copy's writer, hashing its snapshot): used only while the tensor still has that key, and never
        over a valid entry. Returns whether they were cached."""
        value = self.tensors.get(name)
        if value is None or key is None or self._key(value) != key or self._cached(name, value)[1] is not None:
            return False
        self._cache[name] = _Cached(key, digest_of_blocks(tz.dtype_name(value), tz.shape(value), blocks),
                                    tuple(blocks))
        return True

    def _load_objects(self, raw: bytes) -> None:
        """Replace the objects with the unpickled `raw` (from an authenticated member only: it is pickle)."""
        self.objects = dict(pickle.loads(raw))

    def _cached(self, name: str, value: Any) -> tuple[tuple | None, _Cached | None]:
        """(cache key of `value`, its cache entry if that entry is still valid, else None)."""
        key, cached = self._key(value), self._cache.get(name)
        return key, (cached if cached is not None and key is not None and cached.key == key else None)

    def _key(self, value: Any) -> tuple | None:
        """The cache key of a torch tensor; None (never cached) for numpy."""
        version = tz.version(value)
        if version is None:
            return None
        return (tz.identity(value), version, self.revision)


"""ShardedObject: a logical 1-D array of the shared state that each member holds only in part.

Owns: the declaration of one sharded logical object (its `Partition`: length, shard count, dtype size,
replication factor r), the shards this member holds now (numpy arrays, one per shard index), their
digests, and installing or dropping shards as the ownership map says. The map itself is chosen by the
core (`p2pgen.core.ownership.plan_ownership`, at each generation's election) and carried by the
certificate; this class never decides who owns what.

Invariants:
- a shard's digest is `tensor_digest(dtype, (n,), bytes)`, a function of content only: the core checks
  that the owners of a shard at one revision agree on it (a revision is the state's, not the shard's);
- a shard is installed only after its bytes hash to the digest its owners agreed on (`install` checks);
- at revision 0 every member holds every shard at its initial value, so the first generation moves
  nothing; after each activation the member drops the shards the certificate does not give it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from p2pgen.core.ownership import Partition
from p2pgen.state.shared import tensor_digest


class ShardMismatch(ValueError):
    """Bytes offered for a shard do not hash to the digest they must have."""


class ShardedObject:
    """One sharded logical object. Create it with `SharedState.shard(...)`, before `p2pgen.join()`."""

    def __init__(self, object_id: str, length: int, shards: int, dtype: Any = "float32", r: int = 2,
                 init: float = 0.0) -> None:
        self.dtype = np.dtype(dtype)
        self.partition = Partition(object_id, int(length), int(shards), self.dtype.itemsize, int(r))
        self.init = init
        self.held: dict[int, np.ndarray] = {i: self.initial(i) for i in range(shards)}

    @property
    def object_id(self) -> str:
        return self.partition.object_id

    @property
    def r(self) -> int:
        return self.partition.r

    def bounds(self, index: int) -> tuple[int, int]:
        """[start, stop) of shard `index` in the logical array."""
        return self.partition.bounds(index)

    def initial(self, index: int) -> np.ndarray:
        start, stop = self.bounds(index)
        return np.full(stop - start, self.init, dtype=self.dtype)

    def owned(self) -> list[int]:
        return sorted(self.held)

    def digest(self, index: int) -> str:
        data = self.held[index]
        return tensor_digest(self.dtype.name, (len(data),), data.view(np.uint8))

    def digests(self) -> dict[tuple[str, int], str]:
        """(object id, index) -> digest of every shard held."""
        return {(self.object_id, i): self.digest(i) for i in self.owned()}

    def shard_bytes(self, index: int) -> np.ndarray:
        """The bytes of shard `index` (a uint8 view)."""
        return self.held[index].view(np.uint8)

    def install(self, index: int, data: np.ndarray | bytes, digest: str = "") -> None:
        """Hold shard `index` with `data` (its raw bytes), after checking them against `digest` (when given)."""
        start, stop = self.bounds(index)
        raw = np.frombuffer(bytes(data), dtype=np.uint8) if isinstance(data, (bytes, bytearray)) else data
        if raw.nbytes != (stop - start) * self.dtype.itemsize:
            raise ShardMismatch(f"{self.object_id}[{index}]: {raw.nbytes} bytes offered, the shard has "
                                f"{(stop - start) * self.dtype.itemsize}")
        if digest and tensor_digest(self.dtype.name, (stop - start,), raw) != digest:
            raise ShardMismatch(f"{self.object_id}[{index}] does not hash to its owners' digest {digest}; "
                                "not installed")
        self.held[index] = raw.view(self.dtype).copy()

    def reset(self, index: int) -> None:
        """Hold shard `index` at its initial value (rebuilt by recomputation at revision 0)."""
        self.held[index] = self.initial(index)

    def keep_only(self, indexes: Iterable[int]) -> list[int]:
        """Drop every shard not in `indexes` (the certificate gave them to others); returns those dropped."""
        keep = set(indexes)
        dropped = [i for i in self.owned() if i not in keep]
        for i in dropped:
            del self.held[i]
        return dropped

    @property
    def nbytes_held(self) -> int:
        return sum(a.nbytes for a in self.held.values())

    def __repr__(self) -> str:
        return (f"ShardedObject({self.object_id!r}, {self.partition.describe()}, r={self.r}, "
                f"held={self.owned()})")

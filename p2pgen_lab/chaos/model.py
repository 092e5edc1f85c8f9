"""The exact mini-training of the chaos benchmark: integer arithmetic, every state known in closed form.

State (two tensors, so that an optimizer step can be cut in half): parameters `w` and momentum `m`,
int64 vectors of SIZE. Step r consumes the global batch of sample ids [r*BATCH, (r+1)*BATCH); member
`rank` of `world` takes the contiguous shard `shard(rank, world)` and contributes the sum of per-sample
gradients over it; an all-reduce SUM gives the same total whatever the world size. The optimizer then
writes `m = (m*7 + g) mod P` and `w = (w*31 + m) mod P`. Neither update commutes with another step's,
so a state equals `reference(r)` only if steps 0..r-1 were each applied exactly once, in order, by a
collective that saw the whole batch of that step (I5).

The sharded variant (`p2pgen chaos --sharded`) also declares SHARDED, a 1-D int64 object of SHARD_LENGTH
elements cut into SHARDS shards, each owned by SHARD_R members (ZeRO-1 style: only a shard's owners hold
and update it). After the all-reduce each owner writes `s_i = (s_i*13 + tile(g)[shard i] + i) mod P` for
every shard i it owns; so shard i's contents after r steps are a closed-form function of r, and a shard
of the wrong revision (or of another index) never has the digest of the right one.

Invariants kept: `reference_digests(n)[r]` is the SharedState manifest digest of the serial state after r
steps, and `reference_shard_digests(n)[r][i]` the digest of shard i after r steps, both computed in one
process with the same SharedState / ShardedObject code the members use.
"""

from __future__ import annotations

import numpy as np

from p2pgen.state import SharedState

SIZE, BATCH, MOD = 16, 12, 2 ** 31 - 1
SHARDED, SHARD_LENGTH, SHARDS, SHARD_R = "s", 64, 4, 2
BUCKETS = 2                      # the gradient is all-reduced in this many collectives (a DDP-style bucket list)


def initial_tensors() -> dict[str, np.ndarray]:
    return {"w": np.arange(SIZE, dtype=np.int64), "m": np.zeros(SIZE, dtype=np.int64)}


def shard(rank: int, world: int) -> tuple[int, int]:
    """The sample offsets [lo, hi) of one member's share of any step's global batch."""
    return rank * BATCH // world, (rank + 1) * BATCH // world


def gradient(revision: int, lo: int, hi: int) -> np.ndarray:
    """Sum of the per-sample gradients of samples [lo, hi) of step `revision`'s batch."""
    ids = np.arange(revision * BATCH + lo, revision * BATCH + hi, dtype=np.int64)
    cols = np.arange(SIZE, dtype=np.int64)
    return ((ids[:, None] * 7919 + cols[None, :] * 104729 + ids[:, None] * cols[None, :]) % 1009).sum(axis=0)


def buckets(grad: np.ndarray) -> list[np.ndarray]:
    """The views of `grad` reduced one collective each, in order."""
    return np.array_split(grad, BUCKETS)


def optimizer_momentum(m: np.ndarray, grad: np.ndarray) -> None:
    np.copyto(m, (m * 7 + grad) % MOD)


def optimizer_weights(w: np.ndarray, m: np.ndarray) -> None:
    np.copyto(w, (w * 31 + m) % MOD)


def declare_shards(state: SharedState) -> None:
    """The sharded variant's object, declared the same way on every member (before `join`)."""
    state.shard(SHARDED, SHARD_LENGTH, SHARDS, dtype="int64", r=SHARD_R, init=0)


def optimizer_shards(obj, grad: np.ndarray) -> None:
    """Update every shard `obj` holds (the owner's part of a ZeRO-1 optimizer step), from the reduced gradient."""
    full = np.resize(grad, SHARD_LENGTH)
    for i in obj.owned():
        lo, hi = obj.bounds(i)
        np.copyto(obj.held[i], (obj.held[i] * 13 + full[lo:hi] + i) % MOD)


def reference_shard_digests(steps: int) -> list[tuple[str, ...]]:
    """Per revision 0..steps: the digest of each shard of the serial sharded object (index order)."""
    state = SharedState(tensors=initial_tensors())
    declare_shards(state)
    obj = state.sharded[SHARDED]
    out = [tuple(obj.digest(i) for i in range(SHARDS))]
    for r in range(steps):
        optimizer_shards(obj, gradient(r, 0, BATCH))
        out.append(tuple(obj.digest(i) for i in range(SHARDS)))
    return out


def reference_digests(steps: int) -> list[str]:
    """Digest of the serial state after 0, 1, ..., steps steps."""
    state = SharedState(tensors=initial_tensors())
    digests = [state.digest()]
    for r in range(steps):
        grad = gradient(r, 0, BATCH)
        optimizer_momentum(state.tensors["m"], grad)
        optimizer_weights(state.tensors["w"], state.tensors["m"])
        state._commit()
        digests.append(state.digest())
    return digests

"""Ownership of sharded state: partition descriptors, the ownership map, and the planner that changes it.

Owns: `Partition` (how a logical object is cut into shards), the text forms that travel in votes
(`layout_text` / `parse_layout`, `shards_text` / `parse_shards`), and `plan_ownership`, a pure function
from (new member set, old map, shard sizes, replication factor) to the new map and the moves it needs.
No I/O, no clock, no threads (DESIGN: core is pure).

Invariants `plan_ownership` keeps (tests/core/test_ownership.py checks each with Hypothesis):
- every shard gets exactly `min(r, world)` distinct owners, all of them live members;
- an owner that survives keeps its shard (up to `min(r, world)` of them): a shard none of whose owners
  died does not move;
- the bytes moved are the least any valid map could move: each shard copies only its missing owners'
  worth (`(min(r, world) - surviving owners) * size`), never more; a shard with no surviving owner is
  `lost` and must be rebuilt from elsewhere (a checkpoint), which the caller decides;
- the result is a function of its arguments only (same input, same map), whatever the order of the
  mappings it is given.
Owners that are not chosen receive shards least-loaded first (bytes owned), ties by member order, so that
memory per member stays near `r / world` of the total as members leave.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

ShardKey = tuple[str, int]          # (object id, shard index)
_FORBIDDEN = set(":; ,=#")
VERIFY_RULE_SHARD = ("xxh3-128 over 'dtype|shape|' and the xxh3-64 digests of the shard's 4 MiB blocks equals "
                     "the shard digest that the "
                     "owners agreed on at the object's revision; the object digest is xxh3-128 over the ordered "
                     "shard digests")


@dataclass(frozen=True, order=True)
class Partition:
    """A logical 1-D object of `length` elements of `itemsize` bytes, cut into `shards` contiguous pieces
    ("even": the first `length % shards` pieces hold one element more), each owned by `r` members."""

    object_id: str
    length: int
    shards: int
    itemsize: int
    r: int = 2

    def __post_init__(self) -> None:
        if not self.object_id or _FORBIDDEN & set(self.object_id):
            raise ValueError(f"object id {self.object_id!r}: must be non-empty, without any of "
                             f"{''.join(sorted(_FORBIDDEN))}")
        if self.length < 1 or self.shards < 1 or self.itemsize < 1 or self.r < 1:
            raise ValueError(f"object {self.object_id!r}: length, shards, itemsize and r must be >= 1, got "
                             f"{self.length}, {self.shards}, {self.itemsize}, {self.r}")
        if self.shards > self.length:
            raise ValueError(f"object {self.object_id!r}: {self.shards} shards of a {self.length}-element object "
                             "would leave empty shards; use at most `length` shards")

    def bounds(self, index: int) -> tuple[int, int]:
        """[start, stop) element range of shard `index`."""
        if not 0 <= index < self.shards:
            raise IndexError(f"object {self.object_id!r} has shards 0..{self.shards - 1}, not {index}")
        base, extra = divmod(self.length, self.shards)
        start = index * base + min(index, extra)
        return start, start + base + (1 if index < extra else 0)

    def shard_nbytes(self, index: int) -> int:
        start, stop = self.bounds(index)
        return (stop - start) * self.itemsize

    def sizes(self) -> dict[ShardKey, int]:
        return {(self.object_id, i): self.shard_nbytes(i) for i in range(self.shards)}

    def describe(self) -> str:
        """The partition descriptor as the manifest records it."""
        return f"even(length={self.length},shards={self.shards},itemsize={self.itemsize})"

    @property
    def nbytes(self) -> int:
        return self.length * self.itemsize


def layout_text(partitions: Sequence[Partition]) -> str:
    """The declared layout as one vote field: `id:length:shards:itemsize:r;...`, sorted by id."""
    return ";".join(f"{p.object_id}:{p.length}:{p.shards}:{p.itemsize}:{p.r}" for p in sorted(partitions))


def parse_layout(text: str) -> tuple[Partition, ...]:
    """Inverse of `layout_text`; ValueError saying what is wrong."""
    if not text:
        return ()
    out = []
    for part in text.split(";"):
        fields = part.split(":")
        if len(fields) != 5 or not all(f.isdigit() for f in fields[1:]):
            raise ValueError(f"layout entry {part!r}: expected 'id:length:shards:itemsize:r' with whole numbers")
        out.append(Partition(fields[0], *(int(f) for f in fields[1:])))
    ids = [p.object_id for p in out]
    if ids != sorted(set(ids)):
        raise ValueError(f"layout {text!r}: object ids must be sorted and unique")
    return tuple(out)


def shards_text(held: Mapping[ShardKey, str]) -> str:
    """Shards held and their digests as one vote field: `id:index:digest,...` in key order."""
    return ",".join(f"{o}:{i}:{d}" for (o, i), d in sorted(held.items()))


def parse_shards(text: str) -> dict[ShardKey, str]:
    """Inverse of `shards_text`; ValueError saying what is wrong."""
    if not text:
        return {}
    out: dict[ShardKey, str] = {}
    for item in text.split(","):
        fields = item.split(":")
        if len(fields) != 3 or not fields[1].isdigit() or not fields[2]:
            raise ValueError(f"shard entry {item!r}: expected 'object:index:digest'")
        key = (fields[0], int(fields[1]))
        if key in out:
            raise ValueError(f"shard {key[0]}[{key[1]}] is listed twice")
        out[key] = fields[2]
    return out


@dataclass(frozen=True)
class Move:
    """One shard copied to a new owner: from its surviving owners, or (`sources` empty) from a rebuild."""

    key: ShardKey
    to: str
    nbytes: int
    sources: tuple[str, ...]


@dataclass(frozen=True)
class OwnershipPlan:
    """The new map (shard -> owners in preference order) and what it takes to get there."""

    owners: tuple[tuple[ShardKey, tuple[str, ...]], ...]     # sorted by shard
    moves: tuple[Move, ...]
    lost: tuple[ShardKey, ...]                                # no surviving owner: rebuild from elsewhere

    def map(self) -> dict[ShardKey, tuple[str, ...]]:
        return dict(self.owners)

    @property
    def bytes_moved(self) -> int:
        """Bytes copied from surviving owners (rebuilds of lost shards not included)."""
        return sum(m.nbytes for m in self.moves if m.sources)

    def load(self, sizes: Mapping[ShardKey, int]) -> dict[str, int]:
        """Bytes owned per member."""
        load: dict[str, int] = {}
        for key, owners in self.owners:
            for o in owners:
                load[o] = load.get(o, 0) + sizes[key]
        return load


def plan_ownership(members: Sequence[str], old_map: Mapping[ShardKey, Sequence[str]],
                   shard_sizes: Mapping[ShardKey, int], r: int | Mapping[str, int] = 2,
                   balance: float | None = None) -> OwnershipPlan:
    """Choose the owners of every shard in `shard_sizes` among `members` (in rank order), keeping
    surviving owners from `old_map` so that as few bytes as possible move (see the module docstring).

    `r` is the replication factor, one for all objects or per object id; `r >= len(members)` means every
    member holds every shard (full replication).

    `balance` (None: off) trades bytes for memory after growth: after the minimal plan, while a member owns
    less than the fair share (total / world) minus `balance` times the largest shard (a joiner), a shard of
    the most loaded member moves to it. Growth then spreads the state over the new members (memory per
    member follows r / world) at the price of those extra moves; a shrink moves more than the minimum only
    when the minimal plan would leave a member that far below the fair share."""
    if not members:
        raise ValueError("plan_ownership: no members to own the shards")
    if len(set(members)) != len(members):
        raise ValueError(f"plan_ownership: members must be distinct, got {list(members)}")
    order = {m: i for i, m in enumerate(members)}
    load = {m: 0 for m in members}
    kept: dict[ShardKey, list[str]] = {}
    for key in sorted(shard_sizes):
        want = _want(r, key[0], len(members))
        survivors = sorted({o for o in old_map.get(key, ()) if o in order}, key=order.__getitem__)
        kept[key] = survivors
    # Too many survivors (r shrank, or the world is smaller than r): drop from the most loaded first.
    for key in _largest_first(shard_sizes):
        for o in kept[key]:
            load[o] += shard_sizes[key]
    for key in _largest_first(shard_sizes):
        want = _want(r, key[0], len(members))
        while len(kept[key]) > want:
            drop = max(kept[key], key=lambda o: (load[o], order[o]))
            kept[key].remove(drop)
            load[drop] -= shard_sizes[key]
    moves: list[Move] = []
    lost: list[ShardKey] = []
    for key in _largest_first(shard_sizes):
        want = _want(r, key[0], len(members))
        sources = tuple(kept[key])
        if not sources:
            lost.append(key)
        while len(kept[key]) < want:
            to = min((m for m in members if m not in kept[key]), key=lambda m: (load[m], order[m]))
            kept[key].append(to)
            load[to] += shard_sizes[key]
            moves.append(Move(key, to, shard_sizes[key], sources))
    if balance is not None:
        _rebalance(members, order, kept, load, shard_sizes, moves, old_map, balance)
    owners = tuple((key, tuple(sorted(kept[key], key=order.__getitem__))) for key in sorted(shard_sizes))
    return OwnershipPlan(owners, tuple(sorted(moves, key=lambda m: (m.key, order[m.to]))), tuple(sorted(lost)))


def _rebalance(members: Sequence[str], order: Mapping[str, int], kept: dict[ShardKey, list[str]],
               load: dict[str, int], sizes: Mapping[ShardKey, int], moves: list[Move],
               old_map: Mapping[ShardKey, Sequence[str]], balance: float) -> None:
    """While some member owns less than the fair share minus `balance` largest shards (a joiner), move a
    shard to it from the most loaded member (see plan_ownership). Each move strictly lowers the sum of
    squared loads, so the loop ends."""
    if not sizes:
        return
    floor = sum(load.values()) / len(members) - balance * max(sizes.values())
    while True:
        to = min(members, key=lambda m: (load[m], order[m]))
        if load[to] >= floor:
            return
        donor = max(members, key=lambda m: (load[m], order[m]))
        key = next((k for k in _largest_first(sizes)
                    if donor in kept[k] and to not in kept[k] and load[to] + sizes[k] < load[donor]), None)
        if key is None:
            return
        kept[key][kept[key].index(donor)] = to
        load[donor] -= sizes[key]
        load[to] += sizes[key]
        planned = next((i for i, mv in enumerate(moves) if mv.key == key and mv.to == donor), None)
        if planned is not None:              # the donor was to receive it in this plan: redirect that copy
            moves[planned] = replace(moves[planned], to=to)
        else:
            holders = tuple(o for o in kept[key] if o != to and o in set(old_map.get(key, ()))) + (donor,)
            moves.append(Move(key, to, sizes[key], tuple(sorted(set(holders), key=order.__getitem__))))


def naive_ownership(members: Sequence[str], shard_sizes: Mapping[ShardKey, int],
                    r: int) -> dict[ShardKey, tuple[str, ...]]:
    """The rank-arithmetic baseline (what most sharded optimizers do): shard i of an object is owned by
    ranks i, i+1, ... i+k-1 modulo the world, recomputed from scratch at every change."""
    world = len(members)
    k = min(r, world)
    return {key: tuple(members[(key[1] + j) % world] for j in range(k)) for key in sorted(shard_sizes)}


def bytes_to_reach(new_map: Mapping[ShardKey, Sequence[str]], old_map: Mapping[ShardKey, Sequence[str]],
                   shard_sizes: Mapping[ShardKey, int]) -> int:
    """Bytes a change from `old_map` to `new_map` copies: each new owner that did not hold the shard."""
    return sum(shard_sizes[k] * len(set(owners) - set(old_map.get(k, ()))) for k, owners in new_map.items())


def _want(r: int | Mapping[str, int], object_id: str, world: int) -> int:
    value = r if isinstance(r, int) else r[object_id]
    if value < 1:
        raise ValueError(f"replication factor of {object_id!r} must be >= 1, got {value}")
    return min(value, world)


def _largest_first(shard_sizes: Mapping[ShardKey, int]) -> list[ShardKey]:
    return sorted(shard_sizes, key=lambda k: (-shard_sizes[k], k))

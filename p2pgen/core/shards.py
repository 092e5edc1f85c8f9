"""Shard election: who holds each shard of the frontier, the next ownership map, and the manifest records.

Owns: `elect_shards`, a pure function run after the frontier election when the job declared sharded
objects (DESIGN "Repartition"). It finds, for every shard, the members that hold it at the frontier
(the frontier's holders that reported it, agreeing on its digest: most held wins, a tie goes to the
smaller digest), asks `plan_ownership` for the new map, and turns its moves into `ShardPull`s that the
generation waits for before it activates (I4 for shards).

Invariants:
- a shard is copied only from a member that holds it at the frontier revision with the agreed digest,
  so an activation never mixes revisions (a stale replica is not a source);
- a shard no frontier holder has is `lost`: the caller must choose a lower frontier (a checkpoint) and
  say so (`regressed_from`), except at revision 0 where it is recomputed from the object's initial value;
- when the frontier comes from a checkpoint, its loaders hold every shard (a checkpoint holds each once);
- objects cut alike (same length, shards and r) are owned together: shard i of each has the same owners
  (`colocated`), and a member counts as a holder of that unit only if it holds all of them;
- the map is balanced (`BALANCE_SLACK`): after a join, shards move to the new members until nobody owns less
  than the fair share minus one largest shard, so memory per member follows r / world both ways (a shrink
  moves more than the shards that lost an owner only when that alone would leave a member that far below).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

import xxhash

from p2pgen.core.model import Election, Member, ObjectRecord, ReadyVote, ShardPull
from p2pgen.core.ownership import VERIFY_RULE_SHARD, Partition, ShardKey, plan_ownership

BALANCE_SLACK = 1.0      # a member below the fair share by more than one largest shard (a joiner) receives shards
OwnerLabels = Mapping[ShardKey, tuple[str, ...]]     # shard -> "peer#incarnation" owners


def object_digest(shard_digests: Sequence[str]) -> str:
    """The logical object's digest: xxh3-128 over its shard digests in index order."""
    return xxhash.xxh3_128(",".join(shard_digests).encode()).hexdigest()


def elect_shards(members: Sequence[Member], votes: Mapping[str, ReadyVote], election: Election,
                 layout: Sequence[Partition], previous: OwnerLabels,
                 previous_layout: Sequence[Partition] = ()) -> Election:
    """`election` extended with the ownership map, the shard pulls and one record per object.

    `previous` is the active certificate's map (owner incarnations), used for the records' old owners
    and to tell a survivor from a replica."""
    sizes: dict[ShardKey, int] = {}
    for p in layout:
        sizes.update(p.sizes())
    holders, digests = _holders(members, votes, election, sizes)
    lost = tuple(k for k in sorted(sizes) if not holders[k])
    label = {m.peer_id: f"{m.peer_id}#{m.incarnation}" for m in members}
    incarnation = {m.peer_id: m.incarnation for m in members}
    groups = colocated(layout)
    unit_sizes = {(gid, i): sum(sizes[(p.object_id, i)] for p in group)
                  for gid, group in groups.items() for i in range(group[0].shards)}
    unit_holders = {(gid, i): [m for m in holders[(group[0].object_id, i)]
                               if all(m in holders[(p.object_id, i)] for p in group)]
                    for gid, group in groups.items() for i in range(group[0].shards)}
    plan = plan_ownership([m.peer_id for m in members], unit_holders, unit_sizes,
                          {gid: group[0].r for gid, group in groups.items()}, balance=BALANCE_SLACK)
    pulls = tuple(ShardPull(mv.to, incarnation[mv.to], p.object_id, mv.key[1], sizes[(p.object_id, mv.key[1])],
                            mv.sources, digests.get((p.object_id, mv.key[1]), ""))
                  for mv in plan.moves for p in groups[mv.key[0]])
    unit_owners = plan.map()
    owners_of = {(p.object_id, i): unit_owners[(gid, i)]
                 for gid, group in groups.items() for p in group for i in range(p.shards)}
    ownership = tuple((k[0], k[1], tuple(label[o] for o in owners_of[k])) for k in sorted(owners_of))
    old_layout = {p.object_id: p for p in previous_layout}
    records = tuple(_record(p, election, previous, ownership, holders, digests, lost, old_layout.get(p.object_id))
                    for p in sorted(layout))
    moved = sum(sp.nbytes for sp in pulls)
    note = f"shards: {len(pulls)} move(s), {moved} byte(s)" + (f"; {len(lost)} shard(s) lost" if lost else "")
    return replace(election, ownership=ownership, shard_pulls=pulls, objects=records, lost_shards=lost,
                   reason=f"{election.reason}; {note}")


def colocated(layout: Sequence[Partition]) -> dict[str, list[Partition]]:
    """Objects cut alike (same length, shard count and r) are owned together, shard i with shard i: the AdamW
    moments of one parameter range live on the same members (ZeRO-1). Keyed by the group's first object id."""
    by_cut: dict[tuple[int, int, int], list[Partition]] = {}
    for p in sorted(layout):
        by_cut.setdefault((p.length, p.shards, p.r), []).append(p)
    return {group[0].object_id: group for group in by_cut.values()}


def _holders(members: Sequence[Member], votes: Mapping[str, ReadyVote], election: Election,
             sizes: Mapping[ShardKey, int]) -> tuple[dict[ShardKey, list[str]], dict[ShardKey, str]]:
    """Per shard: the members holding it at the frontier with the agreed digest, and that digest."""
    holders: dict[ShardKey, list[str]] = {k: [] for k in sizes}
    digests: dict[ShardKey, str] = {}
    if election.source == "checkpoint":
        for k in sizes:
            holders[k] = list(election.holders)          # the loaders: a checkpoint holds every shard
        return holders, digests
    front = election.frontier
    at_frontier = [m for m in members if (votes[m.peer_id].revision, votes[m.peer_id].digest) ==
                   (front.revision, front.digest)]
    held = {m.peer_id: {(o, i): d for o, i, d in votes[m.peer_id].shards} for m in at_frontier}
    for k in sizes:
        counts = Counter(held[m.peer_id][k] for m in at_frontier if k in held[m.peer_id])
        if not counts:
            continue
        digest = min(counts, key=lambda d: (-counts[d], d))
        digests[k] = digest
        holders[k] = [m.peer_id for m in at_frontier if held[m.peer_id].get(k) == digest]
    return holders, digests


def _record(p: Partition, election: Election, previous: OwnerLabels,
            ownership: tuple[tuple[str, int, tuple[str, ...]], ...], holders: Mapping[ShardKey, list[str]],
            digests: Mapping[ShardKey, str], lost: tuple[ShardKey, ...], old: Partition | None) -> ObjectRecord:
    keys = [(p.object_id, i) for i in range(p.shards)]
    shard_digests = tuple((i, digests.get((p.object_id, i), "")) for i in range(p.shards))
    complete = all(d for _, d in shard_digests)
    new_owners = tuple((i, w) for o, i, w in ownership if o == p.object_id)
    old_owners = tuple((i, previous.get(k, ())) for i, k in enumerate(keys))
    if any(k in lost for k in keys):
        source, rule = "recompute", "the object's initial value at revision 0 (nothing survived to verify against)"
    elif election.source == "checkpoint":
        source, rule = "checkpoint", "the checkpoint's MANIFEST digests (verified on load), then " + VERIFY_RULE_SHARD
    else:
        # a replica: an owner of some shard in the last map no longer holds it; the other owners serve it
        dead = any({h.split("#")[0] for h in previous.get(k, ())} - set(holders[k]) for k in keys)
        source = "replica" if dead else "survivor"
        rule = VERIFY_RULE_SHARD
    return ObjectRecord(p.object_id, election.frontier.revision,
                        object_digest([d for _, d in shard_digests]) if complete else "",
                        old_owners, new_owners, (old or p).describe() if previous else "", p.describe(), source,
                        rule, shard_digests)

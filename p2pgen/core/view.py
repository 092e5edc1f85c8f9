"""The job as an application process sees it: the agent's view, parsed once into typed records.

Owns: `JobView`, the one meaning of "view" on the application side: the replicated state (`p2pgen show`'s
JSON, see core.render.state_json) and what the local agent knows of Raft, read once per new view into
frozen records of core's own values (`Member`, `Frontier`, `Pull`, `ShardPull`, `Hold`). Nothing above this
module indexes the JSON by hand.
Invariant: parsing is total on what core.render writes (tests/core/test_view.py renders machines and parses
them back); a view that lacks a field core always writes is a bug and raises KeyError, it is not defaulted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from p2pgen.core.generation import on_branch
from p2pgen.core.model import Frontier, Hold, Member, Pull, ShardPull, Topology

Identity = tuple[str, int]
Ownership = tuple[tuple[str, int, tuple[str, ...]], ...]   # (object id, shard, owner incarnations "peer#inc")


@dataclass(frozen=True)
class ActiveGeneration:
    """The active generation, from its certificate: what a member needs to run it and keep its state."""

    generation: int
    parent: int
    members: tuple[Member, ...]          # rank order, with every address the member registered
    frontier: Frontier
    state_epoch: int
    comm_id: str
    ownership: Ownership
    recovery: str
    regressed_from: int | None
    raft_index: int
    activated_at: float
    topology: Topology | None = None     # why the ranks are in this order; None: nothing was known of the links

    def has(self, identity: Identity) -> bool:
        return any(m.identity == identity for m in self.members)

    def rank_of(self, identity: Identity) -> int | None:
        return next((rank for rank, m in enumerate(self.members) if m.identity == identity), None)

    def hierarchy(self) -> tuple[tuple[int, ...], ...] | None:
        """The ranks of each group when the certificate says all_reduce goes hierarchical, else None."""
        if self.topology is None or not self.topology.hierarchical:
            return None
        rank = {m.peer_id: r for r, m in enumerate(self.members)}
        return tuple(tuple(rank[p] for p in peers) for _, peers in self.topology.groups)

    def shards_owned(self, identity: Identity) -> dict[str, list[int]]:
        """object id -> the shard indexes this certificate gives `identity` (as one of their owners)."""
        me = f"{identity[0]}#{identity[1]}"
        owned: dict[str, list[int]] = {}
        for object_id, shard, owners in self.ownership:
            if me in owners:
                owned.setdefault(object_id, []).append(shard)
        return owned

    @staticmethod
    def from_json(cert: dict[str, Any]) -> ActiveGeneration:
        return ActiveGeneration(
            generation=cert["generation"], parent=cert["parent"],
            members=tuple(_member(m) for m in sorted(cert["members"], key=lambda m: m["rank"])),
            frontier=Frontier(cert["frontier"]["revision"], cert["frontier"]["digest"]),
            state_epoch=cert["state_epoch"], comm_id=cert["comm_id"],
            ownership=tuple((e["object_id"], e["shard"], tuple(e["owners"])) for e in cert.get("ownership", [])),
            recovery=cert["recovery"], regressed_from=cert["regressed_from"], raft_index=cert["raft_index"],
            activated_at=cert["activated_at"],
            topology=_topology(cert["topology"]) if "topology" in cert else None)


@dataclass(frozen=True)
class PendingGeneration:
    """The pending proposal: who is proposed, who voted and synced, and (once every member voted) the
    elected frontier with its pulls, or the hold that keeps it from being elected."""

    generation: int
    parent: int
    members: tuple[Member, ...]          # rank order (identities only: addresses live in JobView.members)
    ready: frozenset[str]
    frontier: Frontier | None            # None until every member voted and the frontier was elected
    pulls: tuple[Pull, ...]
    shard_pulls: tuple[ShardPull, ...]
    synced: frozenset[str]
    hold: Hold | None

    def has(self, identity: Identity) -> bool:
        return any(m.identity == identity for m in self.members)

    def rank_of(self, identity: Identity) -> int | None:
        return next((rank for rank, m in enumerate(self.members) if m.identity == identity), None)

    def pull_for(self, peer_id: str) -> Pull | None:
        return next((p for p in self.pulls if p.peer_id == peer_id), None)

    def shard_pulls_for(self, peer_id: str) -> tuple[ShardPull, ...]:
        return tuple(sp for sp in self.shard_pulls if sp.peer_id == peer_id)

    @staticmethod
    def from_json(p: dict[str, Any]) -> PendingGeneration:
        members = tuple(Member(m["peer_id"], m["incarnation"]) for m in sorted(p["members"], key=lambda m: m["rank"]))
        incarnation = {m.peer_id: m.incarnation for m in members}
        hold = p["hold"]
        return PendingGeneration(
            generation=p["generation"], parent=p["parent"], members=members, ready=frozenset(p["ready"]),
            frontier=Frontier(p["frontier"]["revision"], p["frontier"]["digest"]) if p["frontier"] else None,
            pulls=tuple(Pull(x["peer_id"], incarnation.get(x["peer_id"], 0), tuple(x["sources"]), x["checkpoint"])
                        for x in p["pulls"]),
            shard_pulls=tuple(ShardPull(x["peer_id"], x["incarnation"], x["object_id"], x["shard"], x["nbytes"],
                                        tuple(x["sources"]), x["digest"]) for x in p["shard_pulls"]),
            synced=frozenset(p["synced"]),
            hold=(Hold(hold["since"], hold["until"], hold["certified"],
                       Frontier(hold["best"]["revision"], hold["best"]["digest"]), hold["reason"]) if hold else None))


@dataclass(frozen=True)
class JobView:
    """One view of the job from the local agent: the replicated state at Raft index `index`, whether the
    agent hears a leader, and whether it is proven heard (`heard`: a majority of the agents it watches echoed its
    heartbeats within its lease). `agents`: how many agents the local one knows of (itself included)."""

    job: str
    instance: str
    index: int
    leader: str | None
    agents: int
    members: tuple[Member, ...]
    active: ActiveGeneration | None
    pending: PendingGeneration | None
    tombstones: frozenset[Identity]
    state_epoch: int
    forks: tuple[tuple[int, int], ...]   # (epoch, revision it began at), oldest first
    heard: bool = True

    def member(self, peer_id: str) -> Member | None:
        return next((m for m in self.members if m.peer_id == peer_id), None)

    def evicted(self, identity: Identity) -> bool:
        return identity in self.tombstones

    def on_branch(self, epoch: int, revision: int) -> bool:
        """Core's rule (GenerationMachine.on_branch) on this view: a state of `epoch` at `revision` belongs to
        the job's current history."""
        return on_branch(self.state_epoch, self.forks, epoch, revision)

    @staticmethod
    def from_json(view: dict[str, Any]) -> JobView:
        """Parse the agent's `show` answer ({"state": ..., "raft": ...})."""
        state, raft = view["state"], view["raft"]
        return JobView(
            job=state["job"], instance=state["instance"], index=raft["index"], leader=raft.get("leader"),
            agents=len(raft["agents"]),
            members=tuple(_member(m) for m in state["members"]),
            active=ActiveGeneration.from_json(state["active"]) if state["active"] else None,
            pending=PendingGeneration.from_json(state["pending"]) if state["pending"] else None,
            tombstones=frozenset((t["peer_id"], t["incarnation"]) for t in state["tombstones"]),
            state_epoch=state["state_epoch"], forks=tuple((f["epoch"], f["revision"]) for f in state["forks"]),
            heard=bool(raft.get("heard", True)))


def cut_off(view: JobView) -> str | None:
    """Why a member of this view must stop committing now (the fence), or None. Its agent hears no Raft leader
    (a follower that heard none for longer than an election, or a leader without a quorum); or it hears a leader
    but the job is not proven to hear it (a one-way cut drops what it sends: the job will evict it after the
    detector's floor and go on without it, while it hears everything and would keep committing). Steps are
    committed locally, so either way a member alone in its generation (or a group cut off together) would
    commit steps the job never sees."""
    if view.leader is None:
        return "hears no Raft leader"
    if not view.heard:
        return "is not heard by the job (no round trip with a majority of its lease quorum within the lease)"
    return None


def _member(m: dict[str, Any]) -> Member:
    return Member(m["peer_id"], m["incarnation"], tuple(sorted(m.get("addrs", {}).items())), m.get("zone", ""))


def _topology(t: dict[str, Any]) -> Topology:
    return Topology(t["source"], tuple((g["name"], tuple(g["members"])) for g in t["groups"]), t["crossings"],
                    t["join_crossings"], t["hierarchical"], t["reason"],
                    tuple((r["from"], r["to"], r["mbps"]) for r in t["rates"]))

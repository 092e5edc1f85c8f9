"""Stable text and JSON renderings of core state and effects.

Owns: the one textual form of the state machine used by transcript tests (`tests/core/testdata`),
`p2pgen show` and `p2pgen history`. Output depends only on the state, never on dict or set
iteration order, so equal states render identically on every peer (I1 can be checked by comparing text).
"""

from __future__ import annotations

from typing import Any

from p2pgen.core.generation import GenerationMachine, Proposal
from p2pgen.core.model import (
    Activated,
    ActivationHeld,
    Certificate,
    Effect,
    Election,
    FrontierElected,
    Hold,
    Kept,
    Member,
    MemberEvicted,
    Outcome,
    ProposalAbandoned,
    ProposalOpened,
    Pull,
    RestartRequired,
    ShardPull,
    Topology,
)


def member_list(members: tuple[Member, ...] | list[Member]) -> str:
    return "[" + " ".join(f"{m.peer_id}#{m.incarnation}" for m in members) + "]"


def render_pull(p: Pull) -> str:
    return f"{p.peer_id}<-{'@checkpoint' if p.checkpoint else '/'.join(p.sources)}"


def render_hold(h: Hold) -> str:
    return (f"certified=r{h.certified} best=r{h.best.revision}:{h.best.digest or '-'} since={h.since:g} "
            f"until={h.until:g}: {h.reason}")


def render_election(e: Election) -> str:
    pulls = " ".join(render_pull(p) for p in e.pulls) or "none"
    text = f"frontier r{e.frontier.revision}:{e.frontier.digest or '-'} holders={','.join(e.holders)} pulls={pulls}"
    if e.source != "members":
        text += f" source={e.source}"
    if e.divergence:
        text += " divergence=" + ",".join(f"{p}:{d or '-'}" for p, d in e.divergence)
    if e.regressed_from is not None:
        text += f" regressed_from=r{e.regressed_from}"
    if e.lost_committed is not None:
        text += f" lost_committed=r{e.lost_committed}"
    if e.ownership:
        moves = " ".join(render_shard_pull(sp) for sp in e.shard_pulls) or "none"
        text += f" shard_moves={moves}"
        if e.lost_shards:
            text += " lost=" + ",".join(f"{o}[{i}]" for o, i in e.lost_shards)
    return text


def render_shard_pull(sp: ShardPull) -> str:
    return (f"{sp.object_id}[{sp.index}]->{sp.peer_id}({sp.nbytes}B)<-"
            f"{'/'.join(sp.sources) or ('rebuild' if not sp.digest else '?')}")


def render_ownership(ownership: tuple[tuple[str, int, tuple[str, ...]], ...]) -> str:
    return " ".join(f"{o}[{i}]={','.join(w)}" for o, i, w in ownership)


def render_effect(effect: Effect) -> str:
    match effect:
        case ProposalOpened(generation, parent, members, reason):
            return f"propose g{generation} (parent g{parent}) {member_list(members)}: {reason}"
        case ProposalAbandoned(generation, reason):
            return f"abandon g{generation}: {reason}"
        case MemberEvicted(peer_id, incarnation, reason):
            return f"evict {peer_id}#{incarnation}: {reason}"
        case RestartRequired(peer_id, incarnation, reason):
            return f"restart {peer_id}#{incarnation}: {reason}"
        case FrontierElected(generation, election):
            return f"elect g{generation} {render_election(election)}"
        case ActivationHeld(generation, hold):
            return f"hold g{generation} {render_hold(hold)}"
        case Activated(cert):
            return f"activate g{cert.generation} {member_list(cert.members)} {render_certificate_line(cert)}"
    raise TypeError(f"not an effect: {effect!r}")


def render_certificate_line(cert: Certificate) -> str:
    quiescence = ",".join(f"{p}={q}" for p, _, q in cert.quiescence)
    text = (f"frontier=r{cert.frontier.revision}:{cert.frontier.digest or '-'} quiescence={quiescence} "
            f"owners={','.join(cert.owners)}@v{cert.ownership_version} seq={cert.collective_seq_frontier}")
    if cert.frontier_source != "members":
        text += f" source={cert.frontier_source}"
    if cert.state_epoch != 1:
        text += f" epoch={cert.state_epoch}"
    if cert.ownership:
        text += f" shards={render_ownership(cert.ownership)}"
    return text


def render_topology(t: Topology) -> str:
    groups = " ".join(f"{name}=[{' '.join(peers)}]" for name, peers in t.groups)
    return (f"{t.source} {groups} crossings={t.crossings} (join {t.join_crossings}) "
            f"{'hierarchical' if t.hierarchical else 'ring'}: {t.reason}")


def render_links(links: dict[tuple[str, str], float]) -> str:
    return " ".join(f"{a}->{b}={r:g}" for (a, b), r in sorted(links.items()))


def render_outcome(outcome: Outcome) -> str:
    lines = [("ok: " if outcome.ok else "refused: ") + outcome.reason]
    lines += ["  " + render_effect(e) for e in outcome.effects]
    return "\n".join(lines)


def render_proposal(p: Proposal) -> str:
    votes = " ".join(f"{peer}={v.quiescence}/r{v.revision}:{v.digest or '-'}" for peer, v in sorted(p.votes.items()))
    text = f"pending g{p.generation} (parent g{p.parent}) {member_list(p.members)} votes: {votes or 'none'}"
    if p.election:
        text += f"; {render_election(p.election)}; synced: {','.join(sorted(p.synced)) or 'none'}"
    if p.hold:
        text += f"; HELD {render_hold(p.hold)}"
    if p.topology:
        text += f"\n  topology {render_topology(p.topology)}"
    return text


def render_kept(kept: Kept) -> str:
    """A dead incarnation's copy as the machine waits for it: `b#1 r50 exact@127.0.0.1:7010 (agent lost)`."""
    where = f"@{kept.agent}" if kept.agent else ""
    return (f"{kept.peer_id}#{kept.incarnation} r{kept.revision} {'exact' if kept.exact else 'note'}{where}"
            f"{' (agent lost)' if kept.agent_lost else ''}")


def render_state(m: GenerationMachine) -> str:
    lines = [f"members: {member_list(m.members)}"]
    if m.active:
        lines.append(f"active: g{m.active.generation} {member_list(m.active.members)} "
                     f"{render_certificate_line(m.active)}")
        if m.active.topology:
            lines.append(f"  topology {render_topology(m.active.topology)}")
    else:
        lines.append("active: none")
    lines.append(render_proposal(m.pending) if m.pending else "pending: none")
    if m.links:
        lines.append(f"links: {render_links(m.links)}")
    if m.kept:
        lines.append("kept: " + " ".join(render_kept(k) for k in sorted(m.kept.values(), key=lambda k: k.peer_id)))
    if m.tombstones:
        lines.append("tombstones: " + " ".join(f"{t.peer_id}#{t.incarnation}" for t in m.tombstones))
    return "\n".join(lines)


def proposal_json(p: Proposal) -> dict[str, Any]:
    return {
        "generation": p.generation,
        "parent": p.parent,
        "reason": p.reason,
        "members": [{"rank": i, "peer_id": x.peer_id, "incarnation": x.incarnation} for i, x in enumerate(p.members)],
        "topology": p.topology.to_json() if p.topology else None,
        "ready": sorted(p.votes),
        "frontier": ({"revision": p.election.frontier.revision, "digest": p.election.frontier.digest}
                     if p.election else None),
        "pulls": ([{"peer_id": x.peer_id, "sources": list(x.sources), "checkpoint": x.checkpoint}
                   for x in p.election.pulls] if p.election else []),
        "shard_pulls": ([shard_pull_json(x) for x in p.election.shard_pulls] if p.election else []),
        "ownership": ([{"object_id": o, "shard": i, "owners": list(w)} for o, i, w in p.election.ownership]
                      if p.election else []),
        "synced": sorted(p.synced),
        "hold": ({"since": p.hold.since, "until": p.hold.until, "certified": p.hold.certified,
                  "best": {"revision": p.hold.best.revision, "digest": p.hold.best.digest}, "reason": p.hold.reason}
                 if p.hold else None),
    }


def shard_pull_json(x: ShardPull) -> dict[str, Any]:
    return {"peer_id": x.peer_id, "incarnation": x.incarnation, "object_id": x.object_id, "shard": x.index,
            "nbytes": x.nbytes, "sources": list(x.sources), "digest": x.digest}


def state_json(m: GenerationMachine) -> dict[str, Any]:
    """Everything `p2pgen show --json` prints about the job (see README, 'JSON output')."""
    return {
        "job": m.job,
        "instance": m.instance,
        "rules": {"min_members": m.min_members or 1, "regress_wait": m.regress_wait,
                  "allow_fresh_start": m.allow_fresh_start},
        "state_epoch": m.state_epoch,
        "raft_epoch": m.raft_epoch,
        "kept": [{"peer_id": k.peer_id, "incarnation": k.incarnation, "revision": k.revision, "lineage": k.lineage,
                  "at": k.at, "exact": k.exact, "committed": k.committed, "agent": k.agent,
                  "agent_lost": k.agent_lost} for k in m.kept.values()],
        "forks": [{"epoch": e, "revision": r} for e, r in m.forks],
        "layout": [{"object_id": p.object_id, "length": p.length, "shards": p.shards, "itemsize": p.itemsize,
                    "r": p.r, "partition": p.describe()} for p in m.layout],
        "active": m.active.to_json() if m.active else None,
        "pending": proposal_json(m.pending) if m.pending else None,
        "members": [x.to_json() for x in m.members],
        "links": [{"from": a, "to": b, "mbps": r} for (a, b), r in sorted(m.links.items())],
        "tombstones": [{"peer_id": t.peer_id, "incarnation": t.incarnation, "reason": t.reason, "at": t.at}
                       for t in m.tombstones],
    }


def history_json(m: GenerationMachine) -> list[dict[str, Any]]:
    return [h.to_json() for h in m.history]

"""Values of the generation protocol: members, votes, frontiers, certificates, commands and effects.

Owns: the immutable records that cross the boundary of the pure core. Every record is a frozen
dataclass of plain values (str, int, float, tuples), so it pickles into pysyncobj snapshots, renders
deterministically, and compares by value. Identity is `(peer_id, incarnation)`, never a rank (I3).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

QUIESCENCE_VALUES = ("proved", "rolled_back", "unknown")
DEFAULT_REGRESS_WAIT = 30.0     # seconds a generation that would resume below the certified revision waits
HOLD_FLOOR_S = 2.0              # the shortest wait for steps whose worth bounds it (see GenerationMachine.wait_worth)


@dataclass(frozen=True, order=True)
class Member:
    """One process admitted to the job: a peer_id and the incarnation of its current process."""

    peer_id: str
    incarnation: int
    addrs: tuple[tuple[str, str], ...] = ()   # sorted (name, "host:port") pairs, e.g. ("agent", "127.0.0.1:7000")
    zone: str = ""                            # the zone its operator declared (`join --zone`); "" if none

    @property
    def identity(self) -> tuple[str, int]:
        return (self.peer_id, self.incarnation)

    def addr(self, name: str) -> str | None:
        return dict(self.addrs).get(name)

    @property
    def host(self) -> str:
        """The host of its data-plane address (else of its agent's); "" when it registered neither."""
        addr = self.addr("data") or self.addr("agent") or ""
        return addr.rpartition(":")[0].strip("[]")

    def to_json(self, rank: int | None = None) -> dict[str, Any]:
        data: dict[str, Any] = {} if rank is None else {"rank": rank}
        data.update({"peer_id": self.peer_id, "incarnation": self.incarnation, "addrs": dict(self.addrs)})
        if self.zone:
            data["zone"] = self.zone
        return data


@dataclass(frozen=True)
class Frontier:
    """The (revision, digest) a generation resumes from."""

    revision: int
    digest: str


@dataclass(frozen=True)
class CheckpointRef:
    """A complete checkpoint a member can read: the revision and digest of the state it holds, and the
    state epoch (see `Certificate.state_epoch`) that revision belongs to."""

    revision: int
    digest: str
    epoch: int = 0


@dataclass(frozen=True)
class ReadyVote:
    """What a proposed member reported after quiescing the old generation."""

    quiescence: str
    revision: int
    digest: str
    collective_seq: int
    comm_id: str = ""
    epoch: int = 0                            # state epoch of (revision, digest); 0: not said (the current one)
    checkpoint: CheckpointRef | None = None   # the newest checkpoint this member can load, if any
    shards: tuple[tuple[str, int, str], ...] = ()   # (object id, shard index, digest) held at `revision`
    committed: int = -1                       # the revision its previous incarnation had committed, above
    committed_lineage: int = 0                # `revision` (its copy lagged; -1: none), and in which generation


@dataclass(frozen=True)
class Pull:
    """A member that must fetch the frontier state, and the sources it may fetch from (in preference order);
    with `checkpoint`, it loads the frontier from the checkpoint it reported instead (no sources)."""

    peer_id: str
    incarnation: int
    sources: tuple[str, ...]
    checkpoint: bool = False


@dataclass(frozen=True)
class ShardPull:
    """A shard a member must hold in the new generation and does not: copied from `sources` (its surviving
    owners, in preference order), or rebuilt (`sources` empty: from the checkpoint the member loads, or
    recomputed from the object's initial value when the frontier is revision 0)."""

    peer_id: str
    incarnation: int
    object_id: str
    index: int
    nbytes: int
    sources: tuple[str, ...]
    digest: str = ""                  # the digest it must have ("" when rebuilt: verified by its rebuild)


@dataclass(frozen=True)
class ObjectRecord:
    """The record of one sharded logical object at one activation: its digest, old and new owners and
    partitions, and how it was rebuilt and verified (`objects` in a generation's JSON)."""

    object_id: str
    application_revision: int
    digest: str                                   # xxh3-128 over the ordered shard digests ("" if rebuilt)
    old_owners: tuple[tuple[int, tuple[str, ...]], ...]    # shard index -> owner incarnations ("peer#inc")
    new_owners: tuple[tuple[int, tuple[str, ...]], ...]
    old_partition: str
    new_partition: str
    reconstruction_source: str                    # survivor | replica | checkpoint | recompute
    verification_rule: str
    shard_digests: tuple[tuple[int, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"object_id": self.object_id, "application_revision": self.application_revision,
                "digest": self.digest,
                "old_owner_incarnations": {str(i): list(o) for i, o in self.old_owners},
                "new_owner_incarnations": {str(i): list(o) for i, o in self.new_owners},
                "old_partition_descriptor": self.old_partition, "new_partition_descriptor": self.new_partition,
                "reconstruction_source": self.reconstruction_source, "verification_rule": self.verification_rule,
                "shard_digests": {str(i): d for i, d in self.shard_digests}}


@dataclass(frozen=True)
class Election:
    """Outcome of the frontier election (DESIGN, protocol step 5), with a human-readable reason."""

    frontier: Frontier
    holders: tuple[str, ...]          # members at the frontier with the winning digest: the authoritative copies
    pulls: tuple[Pull, ...]
    divergence: tuple[tuple[str, str], ...]   # (peer_id, digest) of members at the frontier revision that disagree
    regressed_from: int | None        # set when no member holds the last certified revision any more
    reason: str
    source: str = "members"           # where the frontier comes from: "members" (live state) or "checkpoint"
    ownership: tuple[tuple[str, int, tuple[str, ...]], ...] = ()   # sharded objects: (object, shard, owner peer_ids)
    shard_pulls: tuple[ShardPull, ...] = ()
    objects: tuple[ObjectRecord, ...] = ()
    lost_shards: tuple[tuple[str, int], ...] = ()   # shards no live member held at the frontier (they forced it down)
    lost_committed: int | None = None  # a revision known committed on the job's history above the frontier and above
    #                                    `regressed_from`, which no member holds: said, not waited for

    def lost_from(self) -> int | None:
        """The highest committed revision this frontier is below (certified or only known committed), if any."""
        lost = [r for r in (self.regressed_from, self.lost_committed) if r is not None]
        return max(lost, default=None)


@dataclass(frozen=True)
class Hold:
    """A proposal whose frontier would be below the certified revision: it does not activate before
    `until` (DESIGN rule "no silent regression"), and after that only if the fallback is allowed."""

    since: float                      # when the job first found no member holding the certified revision
    until: float                      # since + the wait the missing steps are worth, at most regress_wait
    certified: int                    # the revision the job had certified
    best: Frontier                    # the best state the members can offer now (live or checkpoint)
    reason: str


@dataclass(frozen=True)
class Topology:
    """What the job knew of its links when it chose a rank map (core.topology.ring_order), and what it chose:
    the groups behind slow links, how often the ring crosses one, and whether all_reduce goes hierarchical."""

    source: str                       # "zones" (declared), "measured" (the bandwidth matrix) or "join" (neither)
    groups: tuple[tuple[str, tuple[str, ...]], ...]   # (group name, its peer ids in rank order), in rank order
    crossings: int                    # slow links the chosen ring crosses
    join_crossings: int               # ... and the join order would cross
    hierarchical: bool                # all_reduce reduces within each group first (the rule: core.topology)
    reason: str
    rates: tuple[tuple[str, str, float], ...] = ()   # (host, host, Mbit/s) measured between the members' hosts

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "groups": [{"name": n, "members": list(p)} for n, p in self.groups],
                "crossings": self.crossings, "join_crossings": self.join_crossings,
                "hierarchical": self.hierarchical, "reason": self.reason,
                "rates": [{"from": a, "to": b, "mbps": r} for a, b, r in self.rates]}


@dataclass(frozen=True)
class LogPosition:
    """Where a command sits in the replicated log. (0, 0) when the core runs outside Raft (tests)."""

    term: int = 0
    index: int = 0


@dataclass(frozen=True)
class Certificate:
    """The record that activates a generation. `p2pgen show` prints it."""

    job: str
    generation: int
    parent: int
    members: tuple[Member, ...]                 # rank map: rank i is members[i]
    reason: str
    frontier: Frontier
    quiescence: tuple[tuple[str, int, str], ...]   # (peer_id, incarnation, quiescence of the parent generation)
    revisions: tuple[tuple[str, int], ...]      # revision each member reported at `ready`
    pulled: tuple[Pull, ...]                    # who had to catch up, and from whom
    departed: tuple[tuple[str, int, str], ...]  # parent members not carried over: (peer_id, incarnation, why)
    manifest_digest: str
    owners: tuple[str, ...]                     # members holding the authoritative state at activation
    ownership_version: int
    collective_seq_frontier: int                # highest collective sequence any member reached in the parent
    comm_id: str                                # communicator id (e.g. NCCL unique id, hex) offered by rank 0
    divergence: tuple[tuple[str, str], ...]
    regressed_from: int | None
    proposed_at: float
    activated_at: float
    raft_term: int
    raft_index: int
    state_epoch: int = 1                        # goes up by one at each activation that regressed (a new branch)
    frontier_source: str = "members"            # "members" (a live member held it) or "checkpoint"
    recovery: str = ""                          # loud one-line note: the frontier regressed or came from a checkpoint
    raft_epoch: int = 0                         # the Raft epoch (0, then +1 at each fenced re-form) that certified it
    reformed: str = ""                          # the first generation after a re-form: its epoch, seed and lost agents
    ownership: tuple[tuple[str, int, tuple[str, ...]], ...] = ()   # sharded objects: (object, shard, owners)
    objects: tuple[ObjectRecord, ...] = ()      # per sharded object: its record at this activation
    moved: tuple[ShardPull, ...] = ()           # shards copied or rebuilt before this generation activated
    topology: Topology | None = None            # why the rank map is in this order (None: nothing was known)

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form documented in the README."""
        data = asdict(self)
        data["members"] = [m.to_json(rank=i) for i, m in enumerate(self.members)]
        data["quiescence"] = [{"peer_id": p, "incarnation": i, "quiescence": q} for p, i, q in self.quiescence]
        data["revisions"] = [{"peer_id": p, "revision": r} for p, r in self.revisions]
        data["departed"] = [{"peer_id": p, "incarnation": i, "reason": r} for p, i, r in self.departed]
        data["divergence"] = [{"peer_id": p, "digest": d} for p, d in self.divergence]
        data["owners"] = list(self.owners)
        data["pulled"] = [{"peer_id": p.peer_id, "incarnation": p.incarnation, "sources": list(p.sources),
                           "checkpoint": p.checkpoint} for p in self.pulled]
        data["ownership"] = [{"object_id": o, "shard": i, "owners": list(w)} for o, i, w in self.ownership]
        data["objects"] = [r.to_json() for r in self.objects]
        data["moved"] = [{"object_id": m.object_id, "shard": m.index, "to": f"{m.peer_id}#{m.incarnation}",
                          "nbytes": m.nbytes, "sources": list(m.sources)} for m in self.moved]
        if not self.ownership:          # unsharded jobs: the JSON stays as it was
            for key in ("ownership", "objects", "moved"):
                del data[key]
        if self.topology is None:       # nothing known of the links: the JSON stays as it was
            del data["topology"]
        else:
            data["topology"] = self.topology.to_json()
        data["retired_safely"] = retirement_reason(self)
        return data


def retirement_reason(cert: Certificate) -> str:
    """Why the parent generation was safe to retire, in one sentence built from the certificate."""
    if cert.parent == 0:
        return "first generation of the job: nothing to retire"
    quiesced = ", ".join(f"{p}#{i}={q}" for p, i, q in cert.quiescence)
    pulled = f"; {len(cert.pulled)} member(s) pulled the state first" if cert.pulled else ""
    return (f"every member quiesced generation {cert.parent} ({quiesced}) and holds digest "
            f"{cert.frontier.digest or '<empty>'} at revision {cert.frontier.revision}{pulled}")


@dataclass(frozen=True)
class HistoryEntry:
    """One generation number's fate: activated (with its certificate) or abandoned while pending."""

    generation: int
    outcome: str                      # "activated" | "abandoned"
    reason: str
    members: tuple[Member, ...]
    at: float
    certificate: Certificate | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "outcome": self.outcome,
            "reason": self.reason,
            "members": [{"peer_id": m.peer_id, "incarnation": m.incarnation} for m in self.members],
            "at": self.at,
            "certificate": self.certificate.to_json() if self.certificate else None,
        }


@dataclass(frozen=True)
class Tombstone:
    peer_id: str
    incarnation: int
    reason: str
    at: float


# --- commands --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Configure:
    """Job rules, set once before the job forms: the first generation is proposed only once `min_members`
    have registered; a generation that would resume below the certified revision waits `regress_wait`
    seconds for a holder, a local copy or a checkpoint, and may then resume from revision 0 (nothing
    survived) only when `allow_fresh_start` is 1."""

    min_members: int
    at: float = 0.0
    regress_wait: float = DEFAULT_REGRESS_WAIT
    allow_fresh_start: int = 0


@dataclass(frozen=True)
class Register:
    peer_id: str
    incarnation: int
    addrs: tuple[tuple[str, str], ...] = ()
    at: float = 0.0
    zone: str = ""             # the zone its operator declared (`join --zone`): letters, digits, `._-`


@dataclass(frozen=True)
class Links:
    """Bandwidths measured from host `source` to other hosts (an agent's probe): `rates` is
    "HOST=MBITS HOST=MBITS ..." (Mbit/s). Every agent then holds the same matrix, and the next rank maps
    follow it (core.topology)."""

    source: str
    rates: str
    at: float = 0.0


@dataclass(frozen=True)
class Suspect:
    """`reporter` says `peer_id#incarnation` is gone. When the reporter is the peer's own agent (its application
    died), `kept_revision` >= 0 names the local copy the dead process left on the host (as `Kept` would), in the
    same entry as the removal: a survivor's vote can then never be elected between the two."""

    reporter: str
    peer_id: str
    incarnation: int
    reason: str
    at: float = 0.0
    kept_revision: int = -1    # -1: nothing kept, or not reported here
    kept_digest: str = ""
    kept_lineage: int = 0
    kept_committed: int = -1   # the revision the dead process had committed, above its copy's (-1: none or not)
    kept_committed_lineage: int = 0   # the generation it committed that revision in


@dataclass(frozen=True)
class Leave:
    peer_id: str
    incarnation: int
    at: float = 0.0


@dataclass(frozen=True)
class Reform:
    generation: int
    peer_id: str
    incarnation: int
    reason: str
    at: float = 0.0


@dataclass(frozen=True)
class Ready:
    generation: int
    peer_id: str
    incarnation: int
    quiescence: str
    revision: int
    digest: str
    collective_seq: int = 0
    comm_id: str = ""          # rank 0 offers the new generation's communicator id (e.g. NCCL unique id)
    at: float = 0.0
    epoch: int = 0             # state epoch of (revision, digest); 0: not said (taken as the current one)
    ckpt_revision: int = -1    # the newest checkpoint this member can load (-1: none), its digest and epoch
    ckpt_digest: str = ""
    ckpt_epoch: int = 0
    lineage: int = 0           # the generation the state belongs to (last activated or committed in); 0: not said
    layout: str = ""           # sharded objects declared (core.ownership.layout_text); the same on every member
    shards: str = ""           # shards held at `revision` and their digests (core.ownership.shards_text)
    committed: int = -1        # the revision the incarnation whose local copy it restored had committed, when
    committed_lineage: int = 0  # above `revision` (that copy lagged; -1: none), and the generation it was in


@dataclass(frozen=True)
class Fallback:
    """A member of a held proposal asks the job to resume below the certified revision, now that the
    wait is over (`at` is past the hold's `until`)."""

    generation: int
    peer_id: str
    incarnation: int
    at: float = 0.0


@dataclass(frozen=True)
class Synced:
    generation: int
    peer_id: str
    incarnation: int
    digest: str
    at: float = 0.0
    shards: str = ""           # the shards it now holds (core.ownership.shards_text): must cover its shard pulls


@dataclass(frozen=True)
class Kept:
    """An agent whose application died found the local copy it left on this host: the peer's next incarnation
    (restarted there) comes back holding (revision, digest) of generation `lineage`. So the job waits for it
    (bounded, like a regression) instead of resuming below it.

    Not `exact`: the machine's own note that the last member of the active generation was lost with its agent
    (a host lost or stalled). It committed steps nobody else holds, how many is unknown: at least `revision`
    (the generation's frontier), perhaps more, kept on that host's disk if the host comes back. The job waits
    for the peer's next incarnation the same way, since no one else can hold more.

    `agent_lost`: an exact copy whose own agent another agent then reported lost (its host stalled, cut off or
    dead): no agent is there to restart the application, so the job waits for the copy only as long as its steps
    are worth, as for a note."""

    peer_id: str
    incarnation: int           # the incarnation that died
    revision: int
    digest: str
    lineage: int
    at: float = 0.0
    exact: bool = True
    committed: int = -1        # the revision the dead incarnation had committed above `revision` (-1: none)
    committed_lineage: int = 0  # the generation it committed that revision in
    agent: str = ""            # the control address of the agent on whose host the copy lies ("": not known)
    agent_lost: bool = False   # that agent was lost too: the copy comes back only if its host does


@dataclass(frozen=True)
class Reformed:
    """The first entry of a new Raft epoch (`p2pgen recover`, after a majority of voters was lost for good):
    the job continues from `base`, the replicated state of the survivor that had applied the most (`seed`, its
    agent), without the members of the agents named `gone`. Only the agents submit it, never the wire."""

    epoch: int
    seed: str
    gone: tuple[str, ...]
    base: Any                                   # a GenerationMachine (typed loosely: core.generation imports this)
    at: float = 0.0


Command = Configure | Register | Suspect | Leave | Reform | Ready | Synced | Fallback | Kept | Links | Reformed
COMMAND_TYPES: dict[str, type] = {
    c.__name__.lower(): c for c in (Configure, Register, Suspect, Leave, Reform, Ready, Synced, Fallback, Kept,
                                    Links)}


# --- effects ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProposalOpened:
    generation: int
    parent: int
    members: tuple[Member, ...]
    reason: str


@dataclass(frozen=True)
class ProposalAbandoned:
    generation: int
    reason: str


@dataclass(frozen=True)
class MemberEvicted:
    peer_id: str
    incarnation: int
    reason: str


@dataclass(frozen=True)
class RestartRequired:
    peer_id: str
    incarnation: int
    reason: str


@dataclass(frozen=True)
class FrontierElected:
    generation: int
    election: Election


@dataclass(frozen=True)
class ActivationHeld:
    generation: int
    hold: Hold


@dataclass(frozen=True)
class Activated:
    certificate: Certificate


Effect = (ProposalOpened | ProposalAbandoned | MemberEvicted | RestartRequired | FrontierElected | ActivationHeld
          | Activated)


@dataclass(frozen=True)
class Outcome:
    """Result of applying one command: accepted or refused (with the reason), and the effects. `replayed`: accepted
    because it repeats what the state already holds (an agent resubmitting a command whose first copy committed
    while it waited); it changed nothing, so it is no new registration, vote or report."""

    ok: bool
    reason: str
    effects: tuple[Effect, ...] = field(default=())
    replayed: bool = False

    @staticmethod
    def refused(reason: str) -> Outcome:
        return Outcome(False, reason)

    @staticmethod
    def replay(reason: str) -> Outcome:
        return Outcome(True, f"{reason} (replay)", replayed=True)

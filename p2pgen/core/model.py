"""Values of the generation protocol: members, votes, frontiers, certificates, commands and effects.

Owns: the immutable records that cross the boundary of the pure core. Every record is a frozen
dataclass of plain values (str, int, float, tuples), so it pickles into pysyncobj snapshots, renders
deterministically, and compares by value. Identity is `(peer_id, incarnation)`, never a rank (I3).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Union

QUIESCENCE_VALUES = ("proved", "rolled_back", "unknown")


@dataclass(frozen=True, order=True)
class Member:
    """One process admitted to the job: a peer_id and the incarnation of its current process."""

    peer_id: str
    incarnation: int
    addrs: tuple[tuple[str, str], ...] = ()   # sorted (name, "host:port") pairs, e.g. ("agent", "127.0.0.1:7000")

    @property
    def identity(self) -> tuple[str, int]:
        return (self.peer_id, self.incarnation)

    def addr(self, name: str) -> str | None:
        return dict(self.addrs).get(name)


@dataclass(frozen=True)
class Frontier:
    """The (revision, digest) a generation resumes from."""

    revision: int
    digest: str


@dataclass(frozen=True)
class ReadyVote:
    """What a proposed member reported after quiescing the old generation."""

    quiescence: str
    revision: int
    digest: str
    collective_seq: int
    comm_id: str = ""


@dataclass(frozen=True)
class Pull:
    """A member that must fetch the frontier state, and the sources it may fetch from (in preference order)."""

    peer_id: str
    incarnation: int
    sources: tuple[str, ...]


@dataclass(frozen=True)
class Election:
    """Outcome of the frontier election (DESIGN, protocol step 5), with a human-readable reason."""

    frontier: Frontier
    holders: tuple[str, ...]          # members at the frontier with the winning digest: the authoritative copies
    pulls: tuple[Pull, ...]
    divergence: tuple[tuple[str, str], ...]   # (peer_id, digest) of members at the frontier revision that disagree
    regressed_from: int | None        # set when no member holds the last certified revision any more
    reason: str


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

    def rank_of(self, peer_id: str) -> int | None:
        for rank, member in enumerate(self.members):
            if member.peer_id == peer_id:
                return rank
        return None

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form documented in the README."""
        data = asdict(self)
        data["members"] = [
            {"rank": i, "peer_id": m.peer_id, "incarnation": m.incarnation, "addrs": dict(m.addrs)}
            for i, m in enumerate(self.members)
        ]
        data["quiescence"] = [{"peer_id": p, "incarnation": i, "quiescence": q} for p, i, q in self.quiescence]
        data["revisions"] = [{"peer_id": p, "revision": r} for p, r in self.revisions]
        data["pulled"] = [{"peer_id": p.peer_id, "incarnation": p.incarnation, "sources": list(p.sources)}
                          for p in self.pulled]
        data["departed"] = [{"peer_id": p, "incarnation": i, "reason": r} for p, i, r in self.departed]
        data["divergence"] = [{"peer_id": p, "digest": d} for p, d in self.divergence]
        data["owners"] = list(self.owners)
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
    """Job formation rule: the first generation is proposed only once `min_members` have registered."""

    min_members: int
    at: float = 0.0


@dataclass(frozen=True)
class Register:
    peer_id: str
    incarnation: int
    addrs: tuple[tuple[str, str], ...] = ()
    at: float = 0.0


@dataclass(frozen=True)
class Suspect:
    reporter: str
    peer_id: str
    incarnation: int
    reason: str
    at: float = 0.0


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


@dataclass(frozen=True)
class Synced:
    generation: int
    peer_id: str
    incarnation: int
    digest: str
    at: float = 0.0


Command = Union[Configure, Register, Suspect, Leave, Reform, Ready, Synced]
COMMAND_TYPES: dict[str, type] = {
    c.__name__.lower(): c for c in (Configure, Register, Suspect, Leave, Reform, Ready, Synced)}


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
class Activated:
    certificate: Certificate


Effect = Union[ProposalOpened, ProposalAbandoned, MemberEvicted, RestartRequired, FrontierElected, Activated]


@dataclass(frozen=True)
class Outcome:
    """Result of applying one command: accepted or refused (with the reason), and the effects."""

    ok: bool
    reason: str
    effects: tuple[Effect, ...] = field(default=())

    @staticmethod
    def refused(reason: str) -> "Outcome":
        return Outcome(False, reason)

"""The heartbeat verdicts an agent's shells act on, as pure functions: whether a lost agent is acted on, whether
an agent that hears none of its peers may blame any of them, and which agents' heartbeats an agent judges.

Owns no state: the heartbeat runner (`p2pgen.agent.heartbeat`) and the agent's heartbeat callback
(`p2pgen.agent.agent.Agent._agent_lost`) gather the facts and call these. Invariants kept:
- a silence judged while this agent has no Raft node is never acted on (it could not know the job then, and what
  it heard says more about itself than about the others); a proof (a refusal, a new process at the address) is;
- an agent that suddenly hears none of at least two peers blames none of them: its own deafness is likelier than
  their failing together;
- `watched` is a function of the agent and the sets only, so agents that know the same job agree on who watches
  whom: in a job of more than WATCH_FANOUT other agents, each agent is watched by its WATCH_FANOUT neighbours in
  the job's fixed ring order (the relation is symmetric), by every agent when it runs a voter, and always by the
  Raft leader's agent (which watches every agent: its caller passes no ring); up to WATCH_FANOUT others, every
  agent watches every other, as before;
- `heard_by_quorum` counts only round trips: hearing a peer says nothing about whether it hears us (a one-way
  cut drops what we send and leaves what we receive), so an agent is heard only while a majority of its lease
  quorum (`lease_quorum`: the voters' agents, as Raft counts a quorum) echoed, within the lease, heartbeats it
  sent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

__all__ = ["WATCH_FANOUT", "acts_on_loss", "heard_by_quorum", "hears_no_one", "lease_quorum", "lease_runs_out",
           "watched"]

WATCH_FANOUT = 8        # ring neighbours an agent judges once the job has more other agents than this


def acts_on_loss(has_node: bool, proven: bool) -> bool:
    """Whether a lost agent reported by the heartbeats is acted on (queued for the driver, the voter manager
    poked).

    Args:
        has_node: this agent has a Raft node now (not joining, nor re-joining after a stop or a removal).
        proven: the loss is a proof (its host refused our heartbeats, or a new process announced itself at its
            address), not a silence.
    """
    return has_node or proven


def hears_no_one(others: int, quiet_for: float, floor: float) -> bool:
    """Whether this agent hears none of its peers: at least two others (not suspected) are there to hear and
    none was heard for half the detector's floor. It then blames none of them.

    Args:
        others: the heartbeat targets not suspected already.
        quiet_for: seconds since the newest heartbeat taken from any agent.
        floor: the detector's floor (seconds).
    """
    return others >= 2 and quiet_for > floor / 2


def lease_quorum(me: str, judged: Iterable[str], ring: Iterable[str] | None = None,
                 voters: Iterable[str] | None = None) -> tuple[frozenset[str], bool]:
    """Whose echoes renew this agent's lease, and whether it counts for itself: a Raft quorum's worth of the
    job's hearing. A voter's agent: the other voters' agents (every agent judges a voter's agent). Another
    agent: the voters' agents among its ring neighbours (those judge it back; all of them in a job of at most
    WATCH_FANOUT others), not counting itself, since it has no vote. Where it knows no voters, or no voter's
    agent reads its heartbeats (beyond the fanout, none in its ring neighbourhood), the agents it judges, itself
    counted.

    Args:
        me: this agent's control address.
        judged: the agents whose heartbeats it judges now.
        ring: the job's agents from the committed log (None: not known yet).
        voters: the voters' agents from the committed log (None: not known yet).
    """
    if ring is not None and voters is not None:
        voters = frozenset(voters)
        if me in voters:
            return voters - {me}, True
        near_voters = voters & watched(me, ring, ())
        if near_voters:
            return near_voters, False
    return frozenset(judged) - {me}, True


def lease_runs_out(echoed: Mapping[str, float], quorum: Iterable[str], counts_itself: bool, lease: float) -> float:
    """When this agent stops being proven heard unless another echo comes: more than half of `quorum` (and of
    itself, when it counts) must have echoed, in their own heartbeats, a heartbeat of this agent sent at most
    `lease` seconds earlier. Only a round trip renews the lease; the agents it merely hears renew nothing.
    Infinite when it needs no echo (alone in the job).

    Args:
        echoed: agent -> when (this agent's clock) it sent the newest of its heartbeats that agent echoed; an agent
            not judged long enough to answer is given the time it was first judged (a full lease of grace).
        quorum, counts_itself: from `lease_quorum`.
        lease: seconds a round trip proves this agent heard (the detector's stalled floor: the shortest silence
            after which any agent may suspect it).
    """
    others = frozenset(quorum)
    needed = (len(others) + counts_itself) // 2 + 1 - counts_itself     # echoes for a strict majority
    if needed <= 0:
        return float("inf")
    newest_first = sorted((echoed.get(agent, float("-inf")) for agent in others), reverse=True)
    return newest_first[needed - 1] + lease if needed <= len(newest_first) else float("-inf")


def heard_by_quorum(echoed: Mapping[str, float], quorum: Iterable[str], counts_itself: bool, now: float,
                    lease: float) -> bool:
    """Whether the job is proven to hear this agent at `now` (this agent's clock): `lease_runs_out` not passed."""
    return now <= lease_runs_out(echoed, quorum, counts_itself, lease)


def _ring_key(agent: str) -> bytes:
    """The agent's place in the ring: a hash of its address, so that neighbours in the ring are spread over the
    address space (the agents of one rack or one subnet do not watch only each other)."""
    return hashlib.blake2b(agent.encode(), digest_size=8).digest()


def watched(me: str, ring: Iterable[str], always: Iterable[str], fanout: int = WATCH_FANOUT) -> frozenset[str]:
    """The agents of the job whose heartbeats `me` judges.

    Args:
        me: this agent's control address (in `ring` or not).
        ring: the job's agents, as every agent reads them from the committed log.
        always: agents watched whatever the ring (the voters' agents).
        fanout: ring neighbours watched once `ring` holds more than this many others (even; at least 2).

    Raises:
        ValueError: `fanout` is odd or below 2 (the relation must be symmetric).
    """
    if fanout < 2 or fanout % 2:
        raise ValueError(f"fanout must be an even number of at least 2, got {fanout}")
    others = frozenset(ring) - {me}
    near = others
    if len(others) > fanout:
        order = sorted(others | {me}, key=lambda agent: (_ring_key(agent), agent))
        at, size = order.index(me), len(order)
        near = frozenset(order[(at + step) % size] for step in range(-fanout // 2, fanout // 2 + 1) if step)
    return near | (frozenset(always) - {me})

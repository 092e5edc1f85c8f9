"""Who votes in the job's Raft group: the pure decision the leader's agent acts on, one change at a time.

Owns: the voter-count rule (`target_voters`), the quorum rule (`majority_up`) and `plan_voters`, a function of
what the leader's agent knows (the
voters in the configuration, the agents it hears, which voters are old enough to judge) that returns one
decision with its reason. No I/O, no clock: the agent passes everything in.

Rules, in order:
1. A voter whose agent is unreachable, or whose agent now announces another Raft node (a new process at that
   address, or the same agent under a new identity after it was cut off), is dead: remove it, first thing.
   The leader never removes itself (it transfers leadership and removes itself when it leaves), and a voter
   is judged only once it has been in the configuration for a grace period (its agent may not have announced
   it yet). Only while the voters left after the removal have a live majority: pysyncobj applies a change
   when it is appended, so a removal without one can never commit, nor can anything after it (with one voter
   dead and another just back from a partition, unheard for a moment, removing the second left the job
   needing the dead one for ever). Such a removal waits, and so does every promotion, until another voter is
   heard again or removed.
2. While there are fewer voters than `target_voters(live agents)`, promote an eligible non-voting member (one
   at a time; the agent adds its fresh node id by a committed Raft add).
3. Never more than `MAX_VOTERS`; live voters are never demoted to reach a smaller target (a removal is a risk
   of its own, and a larger odd-or-even set tolerates as many losses).
Invariants kept: at most one change per decision; a removal names exactly one node id, never an address.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_VOTERS = 5


def target_voters(agents: int) -> int:
    """The largest odd number <= min(agents, MAX_VOTERS), at least 1: 1 agent -> 1, 2 -> 1, 3-4 -> 3, 5+ -> 5.
    An even count tolerates no more losses than the odd count below it (docs/design/pysyncobj.md, pitfall 18)."""
    n = max(1, min(agents, MAX_VOTERS))
    return n if n % 2 else n - 1


def majority_up(voters: int, down: int) -> bool:
    """Whether `voters` voters with `down` of them down still have a quorum (a strict majority up). The one
    rule every fault injector keeps (`p2pgen chaos`, `p2pgen stress`): never more than a minority down."""
    return 2 * (voters - down) > voters


@dataclass(frozen=True)
class Voter:
    node: str                   # Raft node id host:port/nonce
    agent: str                  # control address of the agent that runs it


@dataclass(frozen=True)
class AgentStatus:
    """What the leader's agent knows of one agent (from its heartbeats, or of itself)."""

    addr: str                   # control address
    node: str                   # voter node id it announces, "" for a non-voting member
    eligible: bool              # caught-up non-voting member, not leaving: may be promoted


@dataclass(frozen=True)
class VoterDecision:
    action: str                 # "remove" | "promote" | "keep"
    target: str                 # node id to remove, agent address to promote, "" to keep
    reason: str


def plan_voters(voters: tuple[Voter, ...], leader: str, live: tuple[AgentStatus, ...],
                judged: frozenset[str], held_back: frozenset[str] = frozenset(),
                leaving: bool = False) -> VoterDecision:
    """One decision for the leader `leader` (a node id). `live`: the agents currently heard (the leader's own
    included); `judged`: voter ids in the configuration long enough to be judged; `held_back`: agent addresses
    not to promote now (a recent promotion of theirs failed); `leaving`: the leader's own agent is leaving, so its
    voter goes soon: the others are planned as if it were gone (a promotion only, never a removal: the leave
    removes this voter itself, once a successor is in)."""
    if leaving:
        return _successor(voters, leader, live, held_back)
    by_addr = {a.addr: a for a in live}
    stuck: list[str] = []
    for voter in sorted(voters, key=lambda v: v.node):
        if voter.node == leader or voter.node not in judged or _runs(by_addr, voter):
            continue
        if not _left_with_majority(voters, voter, leader, by_addr):
            stuck.append(voter.node)
            continue
        agent = by_addr.get(voter.agent)
        if agent is None:
            return VoterDecision("remove", voter.node, f"voter {voter.node}: its agent {voter.agent} is unreachable")
        now_runs = f"runs voter {agent.node}" if agent.node else "is a non-voting member"
        return VoterDecision("remove", voter.node, f"voter {voter.node}: its agent {voter.agent} now {now_runs} "
                                                   "(a new process, or a new identity)")
    if stuck:
        return VoterDecision("keep", "", f"voter(s) {', '.join(stuck)} down, but the voters left after removing one "
                                         "would lack a live majority: waiting for a voter to be heard again")
    return _promotion(voters, len(voters), len(live), live, held_back)


def _successor(voters: tuple[Voter, ...], leader: str, live: tuple[AgentStatus, ...],
               held_back: frozenset[str]) -> VoterDecision:
    """The plan while the leader's own agent leaves: the target of the other live agents, counted without it."""
    others = sum(1 for v in voters if v.node != leader)
    decision = _promotion(voters, others, len(live) - 1, live, held_back)
    if decision.action == "keep":
        return decision
    return VoterDecision("promote", decision.target, f"this agent leaves: {decision.reason}")


def _promotion(voters: tuple[Voter, ...], counted: int, agents: int, live: tuple[AgentStatus, ...],
               held_back: frozenset[str]) -> VoterDecision:
    """Promote an eligible non-voting member while the `counted` voters are fewer than the target of `agents`."""
    target = target_voters(agents)
    if counted >= target:
        return VoterDecision("keep", "", f"{counted} voter(s) for {agents} live agent(s) (target {target})")
    voter_agents = {v.agent for v in voters}
    candidates = sorted(a.addr for a in live
                        if a.eligible and not a.node and a.addr not in voter_agents and a.addr not in held_back)
    if not candidates:
        return VoterDecision("keep", "", f"{counted} voter(s), target {target}: no eligible non-voting member")
    return VoterDecision("promote", candidates[0], f"{counted} voter(s) for {agents} live agent(s) "
                                                   f"(target {target}): promote {candidates[0]}")


def _runs(by_addr: dict[str, AgentStatus], voter: Voter) -> bool:
    """The voter's agent is heard and still announces that voter node."""
    agent = by_addr.get(voter.agent)
    return agent is not None and agent.node == voter.node


def _left_with_majority(voters: tuple[Voter, ...], gone: Voter, leader: str, by_addr: dict[str, AgentStatus]) -> bool:
    """Whether the voters left after removing `gone` have a live majority: the leader, and the voters whose agents
    are heard running them."""
    left = [v for v in voters if v.node != gone.node]
    return majority_up(len(left), sum(v.node != leader and not _runs(by_addr, v) for v in left))

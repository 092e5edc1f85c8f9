"""Hypothesis stateful and property tests of the pure core (I1-I4).

`GenerationProtocol` drives one `GenerationMachine` with random joins, restarts, suspicions (of current,
stale and future incarnations), applications dying with a local copy (reported with the removal or later,
their agents then lost too), leaves, ready votes and syncs in any order (right and wrong digests),
reforms, configure, duplicated commands and replays of any earlier command from the log. A replica is fed
the same log at the same positions (I1: same log, same state, same outcomes).

The checks do not trust the machine's own bookkeeping: the test keeps its own record built only from the
commands it sent and the outcomes/effects it got back (which identities were admitted and evicted, which
proposals were opened and abandoned, which votes and syncs were accepted, which frontiers were elected),
and checks every activation against that record:

- I1: a generation number gets exactly one member set (the one it was proposed with); activated
  certificates never conflict; a number is never proposed twice; history entries agree with it.
- I2: the active generation only goes up; a pending generation is above it; the frontier revision only
  goes down when the certificate says `regressed_from`, no member reported the old revision (live or as
  a checkpoint), the wait the missing steps are worth had passed since the state was first found missing
  (the time since the job last activated a generation at or below the best state left, at least
  HOLD_FLOOR_S, at most the job's regress_wait; the test's own record of activations), and the
  new frontier is above revision 0 unless the job allows a fresh start. Such an activation opens a new
  state epoch, and a vote for a state of a branch the job left is refused. When another agent reports
  the active generation's last current member, the steps it committed since exist only on its host: a
  proposal at or below that generation's frontier, without that peer's vote, is held (never elected) from
  the report for the wait those steps are worth (the time since that generation activated, bounded the
  same way), even when it would not regress below the certified revision.
- Kept copies: an application's own agent reports the exact local copy its dead incarnation left (in the
  `Suspect` that removes it, or as `Kept` once the removal is recorded). A proposal whose frontier is below
  such a copy, its peer not voting, is held (never elected, fallback refused) until regress_wait after the
  death; once another agent reports that incarnation again (the copy's agent is lost too), only as long as
  the copy's steps are worth, and a proposal held then is elected again at once (a repeated report is
  refused). A vote of the peer's new incarnation drops the copy; a leave of the peer with no member current
  forgets it. Every hold's (since, until) and every fallback's acceptance are the test's own figures, the
  certified revision's wait counted from the job's first hold since the last activation; the machine's kept
  copies and notes (and their deadlines) equal the test's record after every step. A copy counts as said for
  "every possible holder said what it holds", and its revision (and the commits it missed) as known committed.
- I3: an incarnation is admitted only if it is higher than every one seen for that peer; members are never
  evicted identities; a pending proposal's votes all come from its members' current incarnations.
- I4: an activation happened only after an accepted, not-`unknown` vote from every member and an accepted
  `synced` with the frontier digest from every puller; the elected frontier equals a naive re-election
  over the votes the test saw accepted.
- Rank maps: core.topology's order of the members in admission order, from the links measured when the
  generation was proposed; so, while nothing is known of the links, survivors of the parent certificate keep
  their relative order and joiners follow in admission order.
- A refused command changes nothing (rendered state, JSON state, history and internal counters), and a
  command applied twice in a row has no effect the second time.

`test_elect_frontier_matches_naive` checks `elect_frontier` against a naive reference written here.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from copy import deepcopy

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from p2pgen.core import (
    DEFAULT_REGRESS_WAIT,
    HOLD_FLOOR_S,
    Activated,
    ActivationHeld,
    CheckpointRef,
    Configure,
    Election,
    Fallback,
    Frontier,
    FrontierElected,
    GenerationMachine,
    Kept,
    Leave,
    Links,
    LogPosition,
    Member,
    MemberEvicted,
    ProposalAbandoned,
    ProposalOpened,
    Pull,
    Ready,
    ReadyVote,
    Reform,
    Register,
    RestartRequired,
    Suspect,
    Synced,
    elect_frontier,
)
from p2pgen.core.generation import HISTORY_LIMIT
from p2pgen.core.render import render_state, state_json
from p2pgen.core.topology import ring_order

PEERS = ("a", "b", "c", "d", "e")
QUIESCENCE = st.sampled_from(("proved",) * 5 + ("rolled_back",) * 2 + ("unknown",))
ZONES = st.sampled_from(("",) * 10 + ("x", "y"))       # most members declare no zone


# --- the naive reference for the frontier election -------------------------------------------------

def naive_elect(members: list[Member], votes: dict[str, ReadyVote], last: Frontier | None) -> Election:
    """DESIGN, protocol step 5, written the slow and obvious way (reason left empty). A member whose
    digest is empty holds no state and is a candidate only if nobody holds any."""
    candidates = [m for m in members if votes[m.peer_id].quiescence != "unknown" and votes[m.peer_id].digest != ""]
    if not candidates:
        candidates = [m for m in members if votes[m.peer_id].quiescence != "unknown"]
    top = -1
    for m in candidates:
        if votes[m.peer_id].revision > top:
            top = votes[m.peer_id].revision
    at_top = [m for m in candidates if votes[m.peer_id].revision == top]
    best, best_count = None, -1
    for digest in sorted({votes[m.peer_id].digest for m in at_top}):   # ascending: a tie keeps the smaller
        count = sum(1 for m in at_top if votes[m.peer_id].digest == digest)
        if count > best_count:
            best, best_count = digest, count
    checkpoint = naive_checkpoint(members, votes, top)
    if checkpoint is not None:
        (rev, digest), loaders = checkpoint
        others = [m for m in members if m.peer_id not in loaders]
        pulls = [Pull(m.peer_id, m.incarnation, (), checkpoint=True) for m in members if m.peer_id in loaders]
        pulls += naive_spread(others, loaders)
        regressed = last.revision if last is not None and rev < last.revision else None
        return Election(Frontier(rev, digest), tuple(loaders), tuple(pulls), (), regressed, "", "checkpoint")
    holders = [m.peer_id for m in at_top if votes[m.peer_id].digest == best]
    divergence = [(m.peer_id, votes[m.peer_id].digest) for m in at_top if votes[m.peer_id].digest != best]
    pulls = naive_spread([x for x in members if x.peer_id not in holders], holders)
    regressed = last.revision if last is not None and top < last.revision else None
    return Election(Frontier(top, best), tuple(holders), tuple(pulls), tuple(divergence), regressed, "")


def naive_spread(pullers: list[Member], holders: list[str]) -> list[Pull]:
    pulls = []
    for i, m in enumerate(pullers):
        k = len(holders)
        pulls.append(Pull(m.peer_id, m.incarnation, tuple(holders[(i + j) % k] for j in range(k))))
    return pulls


def naive_checkpoint(members: list[Member], votes: dict[str, ReadyVote], live_top: int):
    """((revision, digest), loaders) of a checkpoint newer than every live state, or None."""
    refs = {}
    for m in members:
        v = votes[m.peer_id]
        if v.quiescence != "unknown" and v.checkpoint is not None and v.checkpoint.digest \
                and v.checkpoint.revision > live_top:
            refs[m.peer_id] = (v.checkpoint.revision, v.checkpoint.digest)
    if not refs:
        return None
    top = max(r for r, _ in refs.values())
    tally = Counter(d for r, d in refs.values() if r == top)
    best = sorted(tally, key=lambda d: (-tally[d], d))[0]
    return (top, best), [p for p, ref in refs.items() if ref == (top, best)]


def same_election(fast: Election, naive: Election) -> bool:
    return (fast.frontier, fast.holders, fast.pulls, fast.divergence, fast.regressed_from, fast.source,
            fast.lost_committed) == (naive.frontier, naive.holders, naive.pulls, naive.divergence,
                                     naive.regressed_from, naive.source, naive.lost_committed)


def fingerprint(m: GenerationMachine) -> tuple:
    """Everything observable about a machine, to prove that a command changed nothing."""
    pending = None
    if m.pending is not None:
        p = m.pending
        pending = (p.generation, p.parent, p.members, p.reason, p.opened_at, sorted(p.votes.items()),
                   p.election, sorted(p.synced), p.hold)
    # the history is compared as values (frozen dataclasses); its JSON form is slow to build every step
    return (render_state(m), json.dumps(state_json(m), sort_keys=True), tuple(m.members), m.active, pending,
            m.last_generation, sorted(m.last_incarnation.items()),
            m.ownership_version, m.min_members, tuple(m.tombstones), tuple(m.history), m.regress_wait,
            m.allow_fresh_start, m.instance, m.state_epoch, m.forks, m.hold_since)


def vote_of(command: Ready, resumes: list[tuple[int, int]]) -> ReadyVote:
    """The vote the core must record for an accepted `ready`: a state left behind by a later resumption
    (`resumes`: (generation, frontier revision) of every activation) counts as holding nothing."""
    checkpoint = (CheckpointRef(command.ckpt_revision, command.ckpt_digest, command.ckpt_epoch)
                  if command.ckpt_revision >= 0 and command.ckpt_digest else None)
    if command.lineage > 0 and any(g > command.lineage and f < command.revision for g, f in resumes):
        return ReadyVote(command.quiescence, 0, "", command.collective_seq, command.comm_id, 0, checkpoint)
    return ReadyVote(command.quiescence, command.revision, command.digest, command.collective_seq,
                     command.comm_id, command.epoch, checkpoint, committed=command.committed,
                     committed_lineage=command.committed_lineage)


@dataclasses.dataclass(frozen=True)
class KeptRecord:
    """The test's own record of what a dead incarnation left on its host (one per peer, as the machine keeps it):
    an exact local copy its own agent reported (in its `Suspect`, or as `Kept`), or, not `exact`, the note of the
    active generation's last member lost with its agent (at least the active frontier)."""

    incarnation: int
    revision: int
    digest: str
    lineage: int
    at: float
    exact: bool
    agent: str = ""
    agent_lost: bool = False      # another agent then reported the copy's own agent lost
    committed: int = -1
    committed_lineage: int = 0


# --- the stateful test -----------------------------------------------------------------------------

class GenerationProtocol(RuleBasedStateMachine):

    def __init__(self) -> None:
        super().__init__()
        self.m = GenerationMachine("job")
        self.replica = GenerationMachine("job")
        self.snapshot: tuple[GenerationMachine, dict] | None = None   # the last step's, and what it held then
        self.log: list = []                     # every command sent, in order
        self.term = 1
        # the test's own record, built from commands and outcomes only
        self.min_members: int | None = None
        self.max_inc: dict[str, int] = {}       # highest incarnation admitted per peer
        self.admitted: dict[tuple[str, int], int] = {}   # identity -> admission order
        self.evicted: set[tuple[str, int]] = set()
        self.proposed: dict[int, tuple[Member, ...]] = {}
        self.proposal_parent: dict[int, int] = {}
        self.proposal_links: dict[int, dict] = {}       # generation -> the measured links when it was proposed
        self.abandoned: set[int] = set()
        self.activated: dict[int, object] = {}
        self.votes: dict[int, dict[str, tuple[int, ReadyVote]]] = {}
        self.elections: dict[int, Election] = {}
        self.synced: dict[int, set[tuple[str, int]]] = {}
        self.active_cert = None                 # last activated certificate, from Activated effects
        self.active_stopped: float | None = None   # when that generation stopped making steps (the first
        #                                            eviction, abandon or proposal after it activated)
        self.seen_active_generation = 0
        self.activations = 0
        self.now = 0.0                          # the time every command carries (`at`)
        self.regress_wait, self.fresh = DEFAULT_REGRESS_WAIT, False
        self.forks: list[tuple[int, int]] = []  # (epoch, revision it began at), from regressed activations
        self.resumes: list[tuple[int, int]] = []  # (generation, frontier revision) of every activation
        # when the job first held a proposal below the certified revision since the last activation (the clock of
        # the regression's wait; a regression elected at once starts none, should its proposal be abandoned)
        self.missing_since: float | None = None
        # peer -> what its dead incarnation left on its host: an exact copy its own agent reported, or the note of
        # the active generation's last member when another agent reported it (its steps since the activation
        # exist only on its host)
        self.kept: dict[str, KeptRecord] = {}
        self.agent_addr: dict[tuple[str, int], str] = {}   # identity -> the agent address it registered with
        # (generation, "activated" | "abandoned", at, frontier revision or None): the fates the machine's bounded
        # history remembers, from the effects, so that a wait's worth is judged from what the machine can know
        self.fates: list[tuple[int, str, float, int | None]] = []

    # --- sending commands ------------------------------------------------------------------------

    def send(self, command, stamp: bool = True):
        """Apply `command` (stamped with the current time unless `stamp` is False) to both replicas."""
        if stamp:
            command = dataclasses.replace(command, at=self.now)
        position = LogPosition(self.term, len(self.log) + 1)
        before = fingerprint(self.m)
        outcome = self.m.apply(command, position)
        assert self.replica.apply(command, position) == outcome, "I1: a replica fed the same log disagreed"
        self.log.append(command)
        if outcome.ok:
            self.observe(command, outcome, position)
        else:
            assert outcome.effects == (), outcome
            assert fingerprint(self.m) == before, f"refused command changed the state: {command} ({outcome.reason})"
        return outcome

    def member(self, peer_id: str) -> Member | None:
        return self.m.member(peer_id)

    # --- observing outcomes (the independent record) ---------------------------------------------

    def observe(self, command, outcome, position: LogPosition) -> None:
        self.track_kept(command)
        at = getattr(command, "at", self.now)
        if isinstance(command, Register):
            identity = (command.peer_id, command.incarnation)
            if identity not in self.admitted:
                assert command.incarnation > self.max_inc.get(command.peer_id, -1), f"I3: {identity} re-admitted"
                self.admitted[identity] = len(self.admitted)
                self.agent_addr[identity] = dict(command.addrs).get("agent", "")
                self.max_inc[command.peer_id] = command.incarnation
            else:
                assert outcome.effects == (), "a register replay must have no effect"
        if isinstance(command, Configure):
            self.min_members = command.min_members
            self.regress_wait, self.fresh = command.regress_wait, bool(command.allow_fresh_start)
        if isinstance(command, Ready) and command.quiescence != "unknown":
            assert self.on_branch(command.epoch, command.revision), "a vote for a dead branch was accepted"
            assert self.on_branch(command.ckpt_epoch, command.ckpt_revision), "a dead-branch checkpoint was accepted"
            vote = vote_of(command, self.resumes)
            if vote.revision == 0 and command.revision > 0 and not vote.digest:
                event("a vote of a state left behind counted as holding nothing")
            recorded = self.votes.setdefault(command.generation, {}).setdefault(
                command.peer_id, (command.incarnation, vote))
            assert recorded == (command.incarnation, vote), "an accepted ready differs from the vote on record"
        if isinstance(command, Ready) and command.quiescence == "unknown":
            first = outcome.effects[0]
            assert isinstance(first, RestartRequired), "an unknown quiescence must ask for a restart first"
            assert (first.peer_id, first.incarnation) == (command.peer_id, command.incarnation)
            assert (command.peer_id, command.incarnation) in {(e.peer_id, e.incarnation) for e in outcome.effects
                                                              if isinstance(e, MemberEvicted)}
        if isinstance(command, Synced):
            election = self.elections.get(command.generation)
            assert election is not None, "synced accepted before the frontier was elected"
            if any(p.peer_id == command.peer_id for p in election.pulls):
                assert command.digest == election.frontier.digest, "synced accepted with a wrong digest"
                self.synced.setdefault(command.generation, set()).add((command.peer_id, command.incarnation))

        for effect in outcome.effects:
            if isinstance(effect, (MemberEvicted, ProposalAbandoned, ProposalOpened)) and \
                    self.active_cert is not None and self.active_stopped is None:
                self.active_stopped = at           # its members quiesce, or none is left
            if isinstance(effect, RestartRequired):
                assert isinstance(command, Ready) and command.quiescence == "unknown"
                event("restart required")
                assert (effect.peer_id, effect.incarnation) == (command.peer_id, command.incarnation)
            elif isinstance(effect, MemberEvicted):
                identity = (effect.peer_id, effect.incarnation)
                assert identity in self.admitted and identity not in self.evicted
                self.evicted.add(identity)
            elif isinstance(effect, ProposalAbandoned):
                event("proposal abandoned")
                assert effect.generation in self.proposed and effect.generation not in self.activated
                assert effect.generation not in self.abandoned
                self.abandoned.add(effect.generation)
                self.fates.append((effect.generation, "abandoned", at, None))
            elif isinstance(effect, ProposalOpened):
                g = effect.generation
                assert g not in self.proposed, f"I1: generation {g} proposed twice"
                assert g > max(self.proposed, default=0), "I2: proposals must go up"
                assert g > self.seen_active_generation
                assert effect.parent == (self.active_cert.generation if self.active_cert else 0)
                assert sorted(effect.members) == sorted(self.m.members), "a proposal is the current membership"
                assert effect.members == ring_order(self.m.members, self.m.links)[0], "in the topology order"
                if self.active_cert is None and not self.proposed and self.min_members:
                    assert len(effect.members) >= self.min_members, "first proposal below min_members"
                self.proposed[g] = effect.members
                self.proposal_parent[g] = effect.parent
                self.proposal_links[g] = dict(self.m.links)
            elif isinstance(effect, FrontierElected):
                g = effect.generation
                assert g not in self.elections
                assert self.awaited_copy(g, effect.election.frontier.revision, at) is None, \
                    "elected below a local copy or a lost last member's steps, before the wait for it was over"
                naive = self.naive_election(g)
                assert same_election(effect.election, naive), (effect.election, naive)
                if naive.regressed_from is not None:
                    since = self.now if self.missing_since is None else self.missing_since
                    until = since + self.wait_worth(since, self.reached_at(naive.frontier.revision))
                    assert self.now >= until or self.holders_heard(g), \
                        "regressed before the wait was over, while a possible holder had not said what it holds"
                    if self.now < since + self.regress_wait and not self.holders_heard(g):
                        event("regressed before regress_wait: the missing steps were worth less")
                    if self.now < until:
                        event("regressed early: every possible holder said what it holds")
                        if any(r.exact for r in self.kept.values()):
                            event("regressed early: a dead incarnation's copy counted as said")
                    assert naive.frontier.revision > 0 or self.fresh, "fresh start without the allowance"
                self.elections[g] = effect.election
            elif isinstance(effect, ActivationHeld):
                g = effect.generation
                event("activation held")
                naive = self.naive_election(g)
                awaited = self.awaited_copy(g, naive.frontier.revision, at)
                if awaited is not None:
                    what = ("a lost last member's steps" if not awaited.exact else
                            "an exact copy whose agent is lost" if awaited.agent_lost else "an exact local copy")
                    event(f"held for {what} ({'below' if naive.regressed_from is not None else 'at'}"
                          " the certified revision)")
                    assert effect.hold.best == naive.frontier and effect.hold.certified == awaited.revision
                    if naive.regressed_from is not None and self.missing_since is None:
                        self.missing_since = awaited.at
                    until = self.copy_deadline(awaited, naive.frontier.revision)
                    if naive.regressed_from is not None:    # and then the certified revision's own wait
                        until = max(until, self.missing_since + self.wait_worth(
                            self.missing_since, self.reached_at(naive.frontier.revision)))
                    assert (effect.hold.since, effect.hold.until) == (awaited.at, until)
                    continue
                assert naive.regressed_from is not None, "held a proposal that would not regress"
                assert effect.hold.best == naive.frontier and effect.hold.certified == naive.regressed_from
                if self.missing_since is None:
                    self.missing_since = self.now
                assert effect.hold.since == self.missing_since
                assert effect.hold.until == self.missing_since + self.wait_worth(
                    self.missing_since, self.reached_at(naive.frontier.revision))
                assert self.now < effect.hold.until or (naive.frontier.revision == 0 and not self.fresh)
                assert not self.holders_heard(g) or (naive.frontier.revision == 0 and not self.fresh), \
                    "held although every incarnation that could hold the certified revision said what it holds"
            elif isinstance(effect, Activated):
                self.check_activation(effect.certificate, position)
                self.active_stopped = None
                self.fates.append((effect.certificate.generation, "activated", at,
                                   effect.certificate.frontier.revision))

    def track_kept(self, command) -> None:
        """The test's own record of what dead incarnations left on their hosts (DESIGN: no silent regression), from
        accepted commands only, in the order the rules apply:

        - another agent's `Suspect` of a dead incarnation whose exact copy is recorded (and not yet marked so):
          that copy's own agent is lost too; it changes nothing else;
        - a `Suspect` that removes the current incarnation: by its own agent with a copy, that exact copy; by
          another agent, of the active generation's last current member, a note at the active frontier;
        - `Kept` (a dead incarnation, its own agent reporting the copy after the removal): the copy, unless an
          exact one of a later incarnation, or of the same one at or above its revision, is recorded already;
        - a `Leave` of the peer, or its first accepted vote in a proposal (a new incarnation's vote says what it
          restored), drops the record."""
        if isinstance(command, Suspect):
            identity = (command.peer_id, command.incarnation)
            held = self.kept.get(command.peer_id)
            if command.reporter != command.peer_id and held is not None and held.exact and not held.agent_lost \
                    and held.incarnation == command.incarnation and not self.is_current(identity):
                self.kept[command.peer_id] = dataclasses.replace(held, agent_lost=True)
            elif command.reporter == command.peer_id and command.kept_revision >= 0:
                self.kept[command.peer_id] = KeptRecord(
                    command.incarnation, command.kept_revision, command.kept_digest, command.kept_lineage, command.at,
                    True, self.agent_addr.get(identity, ""), committed=command.kept_committed,
                    committed_lineage=command.kept_committed_lineage)
            elif command.reporter != command.peer_id and self.active_cert is not None:
                members = {m.identity for m in self.active_cert.members}
                if identity in members and not any(self.is_current(m) for m in members - {identity}):
                    frontier = self.active_cert.frontier
                    self.kept[command.peer_id] = KeptRecord(command.incarnation, frontier.revision, frontier.digest,
                                                            self.active_cert.generation, command.at, False)
        elif isinstance(command, Kept):
            held = self.kept.get(command.peer_id)
            if held is None or not held.exact or \
                    (held.incarnation, held.revision) < (command.incarnation, command.revision):
                self.kept[command.peer_id] = KeptRecord(
                    command.incarnation, command.revision, command.digest, command.lineage, command.at, command.exact,
                    command.agent, command.agent_lost, command.committed, command.committed_lineage)
        elif isinstance(command, Leave) or (isinstance(command, Ready) and command.quiescence != "unknown"
                                            and command.peer_id not in self.votes.get(command.generation, {})):
            self.kept.pop(command.peer_id, None)

    def holders_heard(self, g: int) -> bool:
        """The test's own rule: every member of the active generation, and every parent member it saw depart, has
        a vote with a state (non-empty digest) in proposal g, or an exact copy of it or of a later incarnation of
        its peer is recorded (its own agent said what it left)."""
        if self.active_cert is None:
            return False
        votes = self.votes.get(g, {})
        possible = [m.identity for m in self.active_cert.members] + [(p, i) for p, i, _ in self.active_cert.departed]
        for peer, inc in possible:
            copy = self.kept.get(peer)
            if not (peer in votes and votes[peer][1].digest) and \
                    not (copy is not None and copy.exact and copy.incarnation >= inc):
                return False
        return True

    def is_current(self, identity: tuple[str, int]) -> bool:
        return identity in self.admitted and identity not in self.evicted and self.max_inc[identity[0]] == identity[1]

    def left_behind(self, lineage: int, revision: int) -> bool:
        """A state of generation `lineage` at `revision` lies above a later resumption (lineage 0: not said)."""
        return lineage > 0 and any(g > lineage and f < revision for g, f in self.resumes)

    def awaited_copy(self, g: int, frontier: int, at: float) -> KeptRecord | None:
        """The best record proposal g must wait for at time `at` (by revision, then peer), or None: its peer not
        voting, an exact copy above the frontier or a note at or above it, not left behind by a later resumption,
        its deadline (`copy_deadline`) not passed."""
        voting = {m.peer_id for m in self.proposed[g]}
        waiting = [(copy.revision, peer, copy) for peer, copy in self.kept.items()
                   if peer not in voting and copy.revision >= frontier + copy.exact
                   and at < self.copy_deadline(copy, frontier) and not self.left_behind(copy.lineage, copy.revision)]
        return max(waiting, key=lambda w: w[:2], default=(None, None, None))[2]

    def remembered(self) -> list[tuple[int, str, float, int | None]]:
        """The fates the machine's history still holds (its last HISTORY_LIMIT)."""
        return self.fates[-HISTORY_LIMIT:]

    def wait_worth(self, lost_at: float, made_since: float | None) -> float:
        """The test's own rule: steps lost at `lost_at`, made from `made_since` on, are waited for as long as they
        took to make, at least HOLD_FLOOR_S, at most regress_wait (unknown start: regress_wait)."""
        if made_since is None:
            return self.regress_wait
        return min(self.regress_wait, max(HOLD_FLOOR_S, lost_at - made_since))

    def reached_at(self, revision: int) -> float | None:
        """When the job last activated a generation whose frontier is at or below `revision`, if remembered."""
        return next((at for _, fate, at, frontier in reversed(self.remembered())
                     if fate == "activated" and frontier is not None and frontier <= revision), None)

    def copy_deadline(self, copy: KeptRecord, frontier: int | None = None) -> float:
        """Until when a record is waited for: an exact copy whose own agent lives (it restarts the application on
        its host), regress_wait after the death; a note, as long as the steps made since its generation activated
        are worth; an exact copy whose agent was lost, as long as the steps above `frontier` (what the job would
        resume from without it) are worth, made since the job last stood at or below it (unknown `frontier`: since
        the copy's generation activated), counted from when its generation stopped making steps."""
        if copy.exact and not copy.agent_lost:
            return copy.at + self.regress_wait
        activated = next((at for g, fate, at, _ in reversed(self.remembered())
                          if fate == "activated" and g == copy.lineage), None)
        if not copy.exact:
            return copy.at + self.wait_worth(copy.at, activated)
        start = min(copy.at, self.stopped_at(copy.lineage))
        made_since = activated if frontier is None else self.reached_at(frontier)
        return start + self.wait_worth(start, made_since)

    def stopped_at(self, generation: int) -> float:
        """The test's own rule: when `generation` stopped making steps (an exact copy whose agent is lost is
        waited for from then): the active one at its first eviction, abandon or proposal after it activated;
        an older one by the next activation the history remembers; infinite when neither is known."""
        if self.active_cert is not None and generation == self.active_cert.generation:
            return math.inf if self.active_stopped is None else self.active_stopped
        return min((at for g, fate, at, _ in self.remembered() if fate == "activated" and g > generation),
                   default=math.inf)

    def naive_election(self, g: int) -> Election:
        votes = self.votes.get(g, {})
        members = list(self.proposed[g])
        assert sorted(votes) == sorted(m.peer_id for m in members), "elected or held before every member voted"
        naive = naive_elect(members, {p: v for p, (_, v) in votes.items()},
                            self.active_cert.frontier if self.active_cert else None)
        # steps known committed above the frontier, on the history (a voter's previous incarnation above its copy;
        # a dead incarnation's copy, or its commits above it): a loss said, not waited for
        known = [(v.committed, v.committed_lineage) for _, v in votes.values()]
        known += [(c.committed, c.committed_lineage) for c in self.kept.values()]
        known += [(c.revision, c.lineage) for c in self.kept.values()]
        marks = [r for r, lineage in known if r > naive.frontier.revision and not self.left_behind(lineage, r)]
        if marks and (naive.regressed_from is None or max(marks) > naive.regressed_from):
            naive = dataclasses.replace(naive, lost_committed=max(marks))
        return naive

    def on_branch(self, epoch: int, revision: int) -> bool:
        """The test's own rule: a state of `epoch` at `revision` is on the current branch."""
        current = 1 + len(self.forks)
        return revision < 0 or epoch == 0 or (epoch <= current and all(revision <= start for e, start in self.forks
                                                                        if e > epoch))

    def check_activation(self, cert, position: LogPosition) -> None:
        g = cert.generation
        parent = self.active_cert
        # I1
        assert g in self.proposed and g not in self.abandoned and g not in self.activated
        assert cert.members == self.proposed[g], "I1: activated with another member set than proposed"
        assert cert.parent == self.proposal_parent[g] == (parent.generation if parent else 0)
        assert (cert.raft_term, cert.raft_index) == (position.term, position.index)
        # I2
        assert g > self.seen_active_generation
        # I4: every member voted (current incarnation, not unknown), every puller synced the frontier
        votes = self.votes.get(g, {})
        assert sorted(votes) == sorted(m.peer_id for m in cert.members)
        for m in cert.members:
            inc, vote = votes[m.peer_id]
            assert inc == m.incarnation and vote.quiescence != "unknown"
        election = self.elections[g]
        assert cert.frontier == election.frontier and cert.pulled == election.pulls
        assert cert.manifest_digest == election.frontier.digest
        for m in cert.members:
            _, vote = votes[m.peer_id]
            holds = (vote.revision, vote.digest) == (cert.frontier.revision, cert.frontier.digest)
            assert holds or m.identity in self.synced.get(g, set()), f"I4: {m.identity} activated without the frontier"
        assert cert.quiescence == tuple((m.peer_id, m.incarnation, votes[m.peer_id][1].quiescence)
                                        for m in cert.members)
        assert cert.revisions == tuple((m.peer_id, votes[m.peer_id][1].revision) for m in cert.members)
        assert cert.collective_seq_frontier == max(v.collective_seq for _, v in votes.values())
        # members that hold state (a non-empty digest); without any, everyone is a candidate
        stateful = [v for _, v in votes.values() if v.digest] or [v for _, v in votes.values()]
        assert all(v.revision <= cert.frontier.revision for v in stateful)
        # I2: the frontier only regresses when the certificate says so, nobody had the old revision (live
        # or as a checkpoint), and only after the wait (checked when elected); it opens a new state epoch
        epoch = parent.state_epoch if parent else 1
        if parent is not None and cert.frontier.revision < parent.frontier.revision:
            assert cert.regressed_from == max(parent.frontier.revision, election.lost_committed or 0)
            assert all(v.revision < parent.frontier.revision for v in stateful)
            assert all(v.checkpoint is None or v.checkpoint.revision < parent.frontier.revision
                       for _, v in votes.values())
            assert cert.state_epoch == epoch + 1 and "REGRESSED" in cert.recovery
            self.forks.append((cert.state_epoch, cert.frontier.revision))
        elif election.lost_committed is not None:
            # committed steps above the certified revision that no voter holds: said, a new branch
            event("activation below steps known committed")
            assert cert.regressed_from == election.lost_committed > cert.frontier.revision
            assert all(v.revision < election.lost_committed for v in stateful)
            assert cert.state_epoch == epoch + 1 and "REGRESSED" in cert.recovery
            self.forks.append((cert.state_epoch, cert.frontier.revision))
        else:
            assert cert.regressed_from is None and cert.state_epoch == epoch
        assert cert.frontier_source == election.source
        self.missing_since = None
        # later votes of states above it, from before it, hold nothing
        self.resumes.append((g, cert.frontier.revision))
        # rank map: the topology order of the members in admission order; so, while nothing is known of the
        # links, survivors keep their relative order and joiners follow in admission order
        before = parent.members if parent else ()
        kept = {m.identity for m in cert.members}
        survivors = [m for m in before if m.identity in kept]
        admitted = tuple(sorted(cert.members, key=lambda m: self.admitted[m.identity]))
        order, topology = ring_order(admitted, self.proposal_links[g])
        assert (cert.members, cert.topology) == (order, topology), "the rank map must be the topology order"
        event(f"activated with {topology.source if topology else 'no'} topology, "
              f"{len(topology.groups) if topology else 1} group(s)")
        if all(c.topology is None or len(c.topology.groups) < 2 for c in (cert, parent) if c is not None):
            assert list(cert.members[:len(survivors)]) == survivors, "survivors must keep their ranks' order"
            joiners = cert.members[len(survivors):]
            assert not any(m in before for m in joiners)
            assert [self.admitted[m.identity] for m in joiners] == sorted(self.admitted[m.identity] for m in joiners)
        assert [(p, i) for p, i, _ in cert.departed] == [m.identity for m in before if m.identity not in kept]
        assert all(identity in self.evicted for identity in ((p, i) for p, i, _ in cert.departed))
        # ownership version: bumps exactly when the owner set changes
        if parent is None:
            assert cert.ownership_version == 1 and not self.activated
        elif set(parent.owners) == set(cert.owners):
            assert cert.ownership_version == parent.ownership_version
        else:
            assert cert.ownership_version == parent.ownership_version + 1
        assert set(cert.owners) == set(election.holders)
        event("activation")
        if cert.regressed_from is not None:
            event("activation with regressed frontier")
        if cert.divergence:
            event("activation with divergence")
        if cert.pulled:
            event("activation with pulls")
        if cert.departed:
            event("activation with departed members")
        self.activated[g] = cert
        self.active_cert = cert
        self.seen_active_generation = g
        self.activations += 1

    # --- helpers for drawing arguments -----------------------------------------------------------

    def draw_incarnation(self, data, peer: str) -> int:
        """The current incarnation, a stale one, or one never seen (future)."""
        member = self.member(peer)
        last = self.max_inc.get(peer, 0)
        choices = [last + 1, max(0, last - 1)]
        if member is not None:
            choices += [member.incarnation] * 3
        return data.draw(st.sampled_from(choices))

    def draw_voter(self, data, peer: str) -> str:
        """Mostly a proposed member that has something left to do (a vote, or a pull), else `peer`."""
        p = self.m.pending
        if p is None or not data.draw(st.integers(0, 3)):
            return peer
        busy = [m.peer_id for m in p.members if m.peer_id not in p.votes] or \
               [x.peer_id for x in (p.election.pulls if p.election else ()) if x.peer_id not in p.synced]
        return data.draw(st.sampled_from(busy or [m.peer_id for m in p.members]))

    def draw_vote_values(self, data, behind: bool = False) -> tuple[int, str]:
        """A revision near the certified frontier (below it when `behind`) and a digest: usually the
        one every holder of that revision has, sometimes another (a divergence) or an empty one."""
        base = self.active_cert.frontier.revision if self.active_cert else 0
        revision = max(0, base + data.draw(st.integers(-2, -1) if behind else st.integers(-1, 2)))
        digest = data.draw(st.sampled_from((f"h{revision}", f"h{revision}", f"x{revision}", "")))
        return revision, digest

    def draw_state_fields(self, data, revision: int, on_branch: bool = True) -> dict:
        """The epoch of the reported state and, sometimes, a checkpoint: near the certified frontier,
        of the current epoch or 0 (not said); unless `on_branch`, possibly of an older or unknown epoch."""
        base = self.active_cert.frontier.revision if self.active_cert else 0
        current = 1 + len(self.forks)
        epochs = (0, current) if on_branch else (0, current, current - 1, current + 1)
        fields = {"epoch": data.draw(st.sampled_from(epochs)),
                  "lineage": data.draw(st.sampled_from((0, self.m.active_generation,
                                                        max(0, self.m.active_generation - 2))))}
        if data.draw(st.integers(0, 3)) == 0:      # its previous incarnation committed more than its copy holds
            fields.update(committed=revision + data.draw(st.integers(1, 3)),
                          committed_lineage=data.draw(st.sampled_from((fields["lineage"], self.m.active_generation))))
        if data.draw(st.integers(0, 3)) == 0:
            ckpt = max(0, base + data.draw(st.integers(-2, 2)))
            fields.update(ckpt_revision=ckpt, ckpt_digest=data.draw(st.sampled_from((f"c{ckpt}", f"c{ckpt}", "k"))),
                          ckpt_epoch=data.draw(st.sampled_from(epochs)))
        if on_branch and not (self.on_branch(fields["epoch"], revision)
                              and self.on_branch(fields.get("ckpt_epoch", 0), fields.get("ckpt_revision", -1))):
            fields.update(epoch=0, ckpt_epoch=0)
        return fields

    def draw_generation(self, data) -> int:
        pending = self.m.pending.generation if self.m.pending else None
        other = data.draw(st.integers(0, max(self.proposed, default=0) + 1))
        return pending if pending is not None and data.draw(st.booleans()) else other

    # --- rules -----------------------------------------------------------------------------------

    @initialize(min_members=st.sampled_from((None, 1, 2, 3)), first=st.lists(st.sampled_from(PEERS), max_size=4,
                                                                             unique=True),
                rules=st.sampled_from((None, (0.0, 0), (0.0, 1), (5.0, 0), (5.0, 1))))
    def start(self, min_members, first, rules):
        """Optionally the formation rule, then a few first peers."""
        if min_members is not None or rules is not None:
            wait, fresh = rules or (DEFAULT_REGRESS_WAIT, 0)
            assert self.send(Configure(min_members or 1, regress_wait=wait, allow_fresh_start=fresh)).ok
        for peer in first:
            assert self.send(Register(peer, 1, (("data", f"{peer}:7100"),))).ok
            assert self.max_inc[peer] == 1

    @rule(peer=st.sampled_from(PEERS), bump=st.integers(1, 3), data=st.data())
    def join_or_restart(self, peer, bump, data):
        """A new process: a first join, or a restart with a higher incarnation (evicting the old one)."""
        addrs = data.draw(st.permutations((("agent", f"{peer}:7000"), ("data", f"{peer}:7100"))))
        zone = data.draw(ZONES)
        old = self.member(peer)
        outcome = self.send(Register(peer, self.max_inc.get(peer, 0) + bump, tuple(addrs), zone=zone))
        assert outcome.ok, outcome.reason
        if old is not None:
            assert MemberEvicted(old.peer_id, old.incarnation, outcome.effects[0].reason) == outcome.effects[0]

    @precondition(lambda self: self.max_inc)
    @rule(data=st.data())
    def register_seen_incarnation(self, data):
        """I3: an incarnation at or below the last one seen is refused, unless it is an exact replay."""
        peer = data.draw(st.sampled_from(sorted(self.max_inc)))
        inc = data.draw(st.integers(0, self.max_inc[peer]))
        member = self.member(peer)
        same = member is not None and data.draw(st.booleans())
        addrs, zone = (member.addrs, member.zone) if same else ((), "")
        outcome = self.send(Register(peer, inc, addrs, zone=zone))
        is_replay = (member is not None and member.identity == (peer, inc)
                     and (member.addrs, member.zone) == (addrs, zone))
        assert outcome.ok == is_replay, outcome.reason

    @rule(source=st.sampled_from(PEERS), data=st.data())
    def report_links(self, source, data):
        """An agent's probe: the rates from host `source` to some others; a reorder of the active generation's
        members may be proposed (checked like any proposal, and at its activation)."""
        hosts = [p for p in PEERS if p != source]
        others = data.draw(st.one_of(st.just(hosts), st.lists(st.sampled_from(hosts), min_size=1, unique=True)))
        rates = " ".join(f"{host}={data.draw(st.sampled_from((200, 9000, 10000)))}" for host in others)
        assert self.send(Links(source, rates)).ok

    @rule(reporter=st.sampled_from(PEERS + ("detector",)), peer=st.sampled_from(PEERS), graceful=st.booleans(),
          data=st.data())
    def suspect_or_leave(self, reporter, peer, graceful, data):
        """Removal of the current, a stale or a never-seen incarnation: only the current one is removed. A leave of
        a peer with no member, at or above the incarnation of a copy or last-holder note the test recorded for it,
        forgets that record (its agent deleted the host's copy: nothing can come back from there). Another agent's
        suspicion of the dead incarnation whose exact copy is recorded says that copy's agent is lost too."""
        inc = self.draw_incarnation(data, peer)
        current = self.m.is_current(peer, inc)
        copy = self.kept.get(peer)
        forgets = graceful and self.m.member(peer) is None and copy is not None and inc >= copy.incarnation
        news = not graceful and self.agent_lost_news(reporter, peer, inc)
        held = self.m.pending is not None and self.m.pending.hold is not None
        outcome = self.send(Leave(peer, inc) if graceful else Suspect(reporter, peer, inc, "no heartbeat"))
        assert outcome.ok == (current or forgets or news), outcome.reason
        if forgets:
            event(f"a leave with no member forgot {'an exact copy' if copy.exact else 'a last holder note'}")
            assert not held or outcome.effects, "a held proposal was not elected again when a copy was forgotten"
        if current:
            assert outcome.effects[0] == MemberEvicted(peer, inc, outcome.effects[0].reason)

    @rule(peer=st.sampled_from(PEERS), data=st.data())
    def ready(self, peer, data):
        peer = self.draw_voter(data, peer)
        inc = self.draw_incarnation(data, peer)
        generation = self.draw_generation(data)
        revision, digest = self.draw_vote_values(data)
        command = Ready(generation, peer, inc, data.draw(QUIESCENCE), revision, digest, data.draw(st.integers(0, 5)),
                        **self.draw_state_fields(data, revision, on_branch=False))
        p = self.m.pending
        proposed = p is not None and p.generation == generation and p.member(peer) is not None \
            and p.member(peer).incarnation == inc
        previous = p.votes.get(peer) if proposed else None
        outcome = self.send(command)
        if not proposed:
            assert not outcome.ok, "I2/I3: a vote for another generation or incarnation was accepted"
        elif previous is not None:
            same = previous == vote_of(command, self.resumes)
            assert outcome.ok == same and outcome.effects == ()
        elif command.quiescence == "unknown":
            assert outcome.ok, outcome.reason
        else:
            valid = self.on_branch(command.epoch, revision) and self.on_branch(command.ckpt_epoch,
                                                                                command.ckpt_revision)
            assert outcome.ok == valid, outcome.reason

    @precondition(lambda self: self.m.pending is not None)
    @rule(data=st.data(), behind=st.booleans(), then_sync=st.booleans())
    def ready_everyone(self, data, behind, then_sync):
        """Every proposed member that has not voted yet votes (quiesced), in a random order; `behind`:
        everyone reports a revision below the certified frontier (as when all its holders died). With
        `then_sync`, every puller then syncs: the generation activates."""
        p = self.m.pending
        for member in data.draw(st.permutations(p.members)):
            if member.peer_id in p.votes:
                continue
            revision, digest = self.draw_vote_values(data, behind)
            quiescence = data.draw(st.sampled_from(("proved", "rolled_back")))
            copy = self.kept.get(member.peer_id)
            assert self.send(Ready(p.generation, member.peer_id, member.incarnation, quiescence, revision,
                                   digest, data.draw(st.integers(0, 5)), **self.draw_state_fields(data, revision))).ok
            if copy is not None and copy.exact:
                event("a new incarnation's vote dropped an exact copy")
        if then_sync and self.m.pending is p and p.hold is not None:
            self.now = max(self.now, p.hold.until)                 # the wait is over: ask to fall back
            may = self.fallback_expected(p.generation)
            outcome = self.send(Fallback(p.generation, p.members[0].peer_id, p.members[0].incarnation))
            assert outcome.ok == may, outcome.reason
            if may:
                event("fallback accepted")
        if then_sync and self.m.pending is p and p.election is not None:
            self.sync_everyone(data)
            assert self.m.active_generation == p.generation

    @rule(peer=st.sampled_from(PEERS), data=st.data())
    def synced(self, peer, data):
        peer = self.draw_voter(data, peer)
        inc = self.draw_incarnation(data, peer)
        generation = self.draw_generation(data)
        p = self.m.pending
        frontier = p.election.frontier.digest if p is not None and p.election else "h0"
        digest = data.draw(st.sampled_from((frontier, "wrong")))
        proposed = p is not None and p.generation == generation and p.member(peer) is not None \
            and p.member(peer).incarnation == inc
        outcome = self.send(Synced(generation, peer, inc, digest))
        if not proposed or p.election is None:
            assert not outcome.ok, "synced accepted outside an elected pending proposal of this incarnation"
        elif any(x.peer_id == peer for x in p.election.pulls):
            assert outcome.ok == (digest == frontier), outcome.reason

    @precondition(lambda self: self.m.pending is not None)
    @rule(data=st.data())
    def finish_round(self, data):
        """Votes and syncs until the pending generation activates. (Hypothesis switches random subsets of
        rules off per test case; this second way to progress keeps activations frequent.)"""
        self.ready_everyone(data, behind=False, then_sync=True)

    @precondition(lambda self: self.m.pending is not None and self.m.pending.election is not None)
    @rule(data=st.data())
    def sync_everyone(self, data):
        """Every puller reports the frontier digest, in a random order."""
        p = self.m.pending
        for pull in data.draw(st.permutations(p.election.pulls)):
            if self.m.pending is not p:
                break
            assert self.send(Synced(p.generation, pull.peer_id, pull.incarnation, p.election.frontier.digest)).ok

    @rule(seconds=st.sampled_from((0.5, 2.0, 5.0, 30.0)))
    def tick(self, seconds):
        self.now += seconds

    @precondition(lambda self: self.m.pending is not None)
    @rule(data=st.data())
    def fallback(self, data):
        """A member asks a pending proposal to fall back below the certified revision: accepted only for a
        held proposal once the wait is over, and to revision 0 only with the allowance."""
        p = self.m.pending
        member = data.draw(st.sampled_from(p.members))
        hold = p.hold
        may = hold is None or self.fallback_expected(p.generation)
        outcome = self.send(Fallback(p.generation, member.peer_id, member.incarnation))
        assert outcome.ok == may, outcome.reason
        if hold is None:
            assert outcome.effects == ()
        elif may:
            event("fallback accepted")

    def fallback_expected(self, g: int) -> bool:
        """The test's own rule for a `fallback` of held proposal g now: refused while a copy or a lost last member's
        steps above its frontier may still come back (`awaited_copy`); accepted when the hold was for those only;
        else once the wait the certified revision's missing steps are worth has passed since they were first found
        missing, or every incarnation that could hold them said what it holds, and to revision 0 only with the
        allowance."""
        naive = self.naive_election(g)
        best = naive.frontier
        awaited = self.awaited_copy(g, best.revision, self.now)
        if awaited is not None:
            event(f"fallback refused: {'an exact copy' if awaited.exact else 'a last holder note'} is awaited")
            return False
        if naive.regressed_from is None:
            return True
        since = self.missing_since
        assert since is not None, "held below the certified revision, but the test never saw it missing"
        worth = self.wait_worth(since, self.reached_at(best.revision))
        return (self.now >= since + worth or self.holders_heard(g)) and (best.revision > 0 or self.fresh)

    def agent_lost_news(self, reporter: str, peer: str, inc: int) -> bool:
        """Whether another agent's `Suspect` of peer#inc tells that the agent of an exact copy it left is lost: the
        test records that copy, not marked yet, of that incarnation, which is not current."""
        copy = self.kept.get(peer)
        return reporter != peer and copy is not None and copy.exact and not copy.agent_lost \
            and copy.incarnation == inc and not self.is_current((peer, inc))

    def draw_copy(self, data) -> KeptRecord:
        """A local copy a dead incarnation could have left (its `at` is stamped when sent): of the active generation
        at or above its frontier (the activation's save is waited for; steps committed since), or of an older
        generation near it (left behind by a later resumption when above it); sometimes with commits its last
        save missed."""
        base = self.active_cert.frontier.revision if self.active_cert else 0
        g = self.seen_active_generation
        lineage = data.draw(st.sampled_from((g, g, max(min(g, 1), g - 2))))
        revision = max(0, base + data.draw(st.integers(0 if lineage == g else -1, 3)))
        committed = revision + data.draw(st.integers(1, 2)) if data.draw(st.integers(0, 3)) == 0 else -1
        return KeptRecord(-1, revision, f"h{revision}", lineage, self.now, True, committed=committed,
                          committed_lineage=lineage if committed >= 0 else 0)     # the command names the incarnation

    @rule(peer=st.sampled_from(PEERS), survivors_vote=st.booleans(), data=st.data())
    def application_died(self, peer, survivors_vote, data):
        """A peer's application dies and its own agent reports it with the local copy it left, in the same
        `Suspect` (mostly of a current member): only the current incarnation is removed, and then the copy is
        recorded; with `survivors_vote`, the other members then vote at once (possibly behind the certified
        revision). Another agent naming a copy is refused (only the peer's own agent knows what it left)."""
        members = [m.peer_id for m in self.m.members]
        if members and data.draw(st.integers(0, 7)):
            peer = data.draw(st.sampled_from(members))
        member = self.m.member(peer)
        inc = member.incarnation if member is not None and data.draw(st.integers(0, 7)) else \
            self.draw_incarnation(data, peer)
        own = data.draw(st.integers(0, 7)) > 0
        reporter = peer if own else data.draw(st.sampled_from([p for p in PEERS + ("detector",) if p != peer]))
        copy = self.draw_copy(data)
        current = self.m.is_current(peer, inc)
        outcome = self.send(Suspect(reporter, peer, inc, "killed", kept_revision=copy.revision,
                                    kept_digest=copy.digest, kept_lineage=copy.lineage,
                                    kept_committed=copy.committed, kept_committed_lineage=copy.committed_lineage))
        assert outcome.ok == (own and current), outcome.reason
        if outcome.ok:
            event("an application died leaving a local copy (reported in its Suspect)")
            assert outcome.effects[0] == MemberEvicted(peer, inc, outcome.effects[0].reason)
            if survivors_vote and self.m.pending is not None:
                self.ready_everyone(data, behind=data.draw(st.booleans()), then_sync=False)
                if data.draw(st.booleans()):           # and then its host is lost too
                    self.lose_copy_agent(peer, data)

    @precondition(lambda self: self.evicted)
    @rule(data=st.data())
    def copy_reported_late(self, data):
        """A dead incarnation's own agent reports the local copy it left after the removal was recorded (`Kept`):
        mostly the peer's last dead incarnation; refused for the current one or one never seen."""
        peer = data.draw(st.sampled_from(sorted({p for p, _ in self.evicted})))
        dead = max(i for p, i in self.evicted if p == peer)
        inc = data.draw(st.sampled_from((dead, dead, dead, max(0, dead - 1), self.max_inc[peer],
                                         self.max_inc[peer] + 1)))
        copy = self.draw_copy(data)
        before = self.kept.get(peer)
        may = inc <= self.max_inc[peer] and not self.is_current((peer, inc))
        pending = self.m.pending
        held = pending is not None and pending.hold is not None and pending.election is None
        outcome = self.send(Kept(peer, inc, copy.revision, copy.digest, copy.lineage, committed=copy.committed,
                                 committed_lineage=copy.committed_lineage, agent=f"{peer}:7000"))
        assert outcome.ok == may, outcome.reason
        assert outcome.effects == () or (held and self.kept[peer] != before), \
            "only a new copy reported during a hold elects the held proposal again"
        if may:
            event("a local copy reported after the removal (Kept)" if self.kept[peer] != before else
                  "a local copy reported again (Kept, already known)")
            if outcome.effects:
                event("a copy reported during a hold elected the held proposal again")

    @precondition(lambda self: any(copy.exact for copy in self.kept.values()))
    @rule(data=st.data())
    def copy_agent_lost(self, data):
        """Another agent reports the agent of a dead incarnation whose exact copy is recorded (it stopped answering):
        that copy is then waited for only as long as its steps are worth, and a proposal held for it is elected
        again at once (held again, elected, or activated). A repeated report is refused."""
        self.lose_copy_agent(data.draw(st.sampled_from(sorted(p for p, copy in self.kept.items() if copy.exact))),
                             data)

    def lose_copy_agent(self, peer: str, data) -> None:
        """Another agent reports peer's dead incarnation (mostly the one whose copy is recorded), a little later."""
        copy = self.kept[peer]
        self.now += data.draw(st.sampled_from((0.0, 0.5, 2.0, 5.0)))   # how long its agent took to be found lost
        reporter = data.draw(st.sampled_from([p for p in PEERS + ("detector",) if p != peer]))
        inc = data.draw(st.sampled_from((copy.incarnation,) * 4 + (copy.incarnation + 1, self.max_inc[peer])))
        news = self.agent_lost_news(reporter, peer, inc)
        current = self.m.is_current(peer, inc)
        held = self.m.pending is not None and self.m.pending.hold is not None
        outcome = self.send(Suspect(reporter, peer, inc, "agent silent"))
        assert outcome.ok == (news or current), outcome.reason
        if news:
            event("an exact copy's agent was reported lost")
            if held:                        # held again (checked like any hold), elected, or activated
                kinds = sorted({type(e).__name__ for e in outcome.effects})
                assert kinds, "a held proposal was not elected again when a copy's agent was lost"
                event(f"a held proposal was elected again when a copy's agent was lost: {kinds}")
        elif copy.agent_lost and inc == copy.incarnation and not current:
            event("a repeated report of a lost copy's agent was refused")

    @rule(peer=st.sampled_from(PEERS), data=st.data())
    def reform(self, peer, data):
        inc = self.draw_incarnation(data, peer)
        generation = data.draw(st.sampled_from((self.m.active_generation,) * 3 + (self.m.active_generation - 1,
                                                                                  self.m.last_generation + 1)))
        current = self.m.is_current(peer, inc)
        had_pending = self.m.pending is not None
        outcome = self.send(Reform(generation, peer, inc, "collective failed"))
        if not current:
            assert not outcome.ok
        elif had_pending:
            assert outcome.ok and outcome.effects == ()
        else:
            assert outcome.ok == (self.m.active is not None and generation == self.m.active_generation)

    @precondition(lambda self: not self.activated)   # afterwards it is always refused (replays aside)
    @rule(min_members=st.integers(0, 3))
    def configure_later(self, min_members):
        same = self.min_members is not None and (min_members, DEFAULT_REGRESS_WAIT, False) == (
            self.min_members, self.regress_wait, self.fresh)
        expected = min_members >= 1 and (same or (self.min_members is None and not self.proposed))
        assert self.send(Configure(min_members)).ok == expected

    @precondition(lambda self: self.log)
    @rule(data=st.data(), last=st.booleans())
    def replay(self, data, last):
        """A command again (Raft redelivery, a retried client). Any earlier one is checked like any other
        command; the one just applied (`last`), applied twice in a row, must change nothing the second
        time and have no effect."""
        if not last:
            self.send(data.draw(st.sampled_from(self.log)), stamp=False)
            return
        before = fingerprint(self.m)
        outcome = self.send(self.log[-1], stamp=False)
        assert outcome.effects == ()
        assert fingerprint(self.m) == before

    # --- invariants ------------------------------------------------------------------------------

    @invariant()
    def kept_as_recorded(self):
        """The copies and notes the machine waits for are exactly the test's record: recorded, marked agent-lost,
        dropped and forgotten when the test says."""
        kept = {p: KeptRecord(k.incarnation, k.revision, k.digest, k.lineage, k.at, k.exact, k.agent, k.agent_lost,
                              k.committed, k.committed_lineage) for p, k in self.m.kept.items()}
        assert kept == self.kept and all(k.peer_id == p for p, k in self.m.kept.items())
        for peer, copy in self.kept.items():
            assert self.m.kept_deadline(self.m.kept[peer]) == self.copy_deadline(copy)
            if copy.agent_lost and self.copy_deadline(copy) < copy.at + self.regress_wait:
                event("a lost agent's copy is waited for less than regress_wait")

    @invariant()
    def replicas_agree(self):
        assert render_state(self.replica) == render_state(self.m)
        assert self.replica.active == self.m.active
        assert list(self.replica.history) == list(self.m.history)

    @invariant()
    def monotone_generations(self):
        # I2
        assert self.m.active_generation == self.seen_active_generation
        assert self.m.active == self.active_cert
        if self.m.pending is not None:
            assert self.m.pending.generation > self.m.active_generation
            assert self.m.pending.generation == max(self.proposed)
            assert self.m.pending.parent == self.m.active_generation

    @invariant()
    def identities(self):
        # I3
        peer_ids = [x.peer_id for x in self.m.members]
        assert len(peer_ids) == len(set(peer_ids))
        for x in self.m.members:
            assert x.identity in self.admitted and x.identity not in self.evicted
            assert x.incarnation == self.max_inc[x.peer_id]
        for stone in self.m.tombstones:
            assert (stone.peer_id, stone.incarnation) in self.evicted
        p = self.m.pending
        if p is not None:
            assert p.members == ring_order(self.m.members, self.proposal_links[p.generation])[0]
            for peer, vote in p.votes.items():
                member = p.member(peer)
                assert member is not None
                assert self.votes[p.generation][peer] == (member.incarnation, vote)
            assert p.synced <= {x.peer_id for x in p.members}

    @invariant()
    def a_snapshot_reads_as_the_machine_did_whatever_it_applied_since(self):
        """The Raft thread publishes `snapshot()` after each applied batch and goes on applying: the last step's
        snapshot still holds what the machine held then, and a fresh one holds what it holds now."""
        if self.snapshot is not None:
            snapshot, then = self.snapshot
            assert vars(snapshot) == then
        now = deepcopy(vars(self.m))
        snapshot = self.m.snapshot()
        assert vars(snapshot) == now and render_state(snapshot) == render_state(self.m)
        self.snapshot = (snapshot, now)

    @invariant()
    def the_job_waits_only_for_members_it_needs(self):
        """`awaited` names the pending members that have not voted, or, once the frontier is elected, that must
        pull and have not synced; a pending generation that awaits no one is held for a state (nothing else keeps
        it from activating)."""
        p, awaited = self.m.pending, self.m.awaited()
        if p is None:
            assert awaited == ()
            return
        assert set(awaited) <= set(p.members)
        if p.election is None:
            assert {m.peer_id for m in awaited} == ({m.peer_id for m in p.members} - set(p.votes)
                                                    if p.hold is None else set())
        else:
            pulling = {x.peer_id for x in p.election.pulls} | {x.peer_id for x in p.election.shard_pulls}
            assert {m.peer_id for m in awaited} == pulling - p.synced
        if not awaited:
            assert p.hold is not None
            event("a pending generation that awaits no member is held")

    @invariant()
    def one_view_per_generation(self):
        # I1
        generations = [h.generation for h in self.m.history]
        assert len(generations) == len(set(generations)) and generations == sorted(generations)
        assert len(self.m.history) <= HISTORY_LIMIT
        for h in self.m.history:
            assert h.members == self.proposed[h.generation]
            if h.outcome == "activated":
                assert h.certificate == self.activated[h.generation]
            else:
                assert h.outcome == "abandoned" and h.generation in self.abandoned and h.certificate is None
        assert not (self.abandoned & set(self.activated))


TestGenerationProtocol = GenerationProtocol.TestCase
TestGenerationProtocol.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.filter_too_much])
TestGenerationProtocol = pytest.mark.timeout(120)(TestGenerationProtocol)   # ~10 s of CPU; wall time on a loaded box


# --- frontier election against the naive reference ---------------------------------------------------

@st.composite
def election_inputs(draw):
    peers = draw(st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=7, unique=True))
    members = [Member(p, draw(st.integers(0, 3))) for p in peers]
    checkpoints = st.none() | st.builds(CheckpointRef, st.integers(0, 6), st.sampled_from(("", "k", "q")))
    votes = {m.peer_id: ReadyVote(draw(QUIESCENCE), draw(st.integers(0, 4)), draw(st.sampled_from(("", "x", "y", "z"))),
                                  draw(st.integers(0, 9)), checkpoint=draw(checkpoints))
             for m in members}
    last = draw(st.none() | st.builds(Frontier, st.integers(0, 5), st.sampled_from(("x", "y"))))
    return members, votes, last


@pytest.mark.timeout(120)
@settings(max_examples=300, deadline=None)
@given(election_inputs())
def test_elect_frontier_matches_naive(inputs):
    members, votes, last = inputs
    if all(v.quiescence == "unknown" for v in votes.values()):
        with pytest.raises(ValueError):
            elect_frontier(members, votes, last)
        return
    fast = elect_frontier(members, votes, last)
    naive = naive_elect(members, votes, last)
    assert same_election(fast, naive), (fast, naive)
    # properties that do not depend on either implementation
    ids = [m.peer_id for m in members]
    loaders = [p for p in fast.pulls if p.checkpoint]
    if fast.source == "checkpoint":     # the readers of the winning checkpoint load it, the others pull from them
        assert sorted(p.peer_id for p in loaders) == sorted(fast.holders) and not any(p.sources for p in loaders)
        assert sorted(p.peer_id for p in fast.pulls) == sorted(ids)
    else:
        assert not loaders and sorted(list(fast.holders) + [p.peer_id for p in fast.pulls]) == sorted(ids)
    copies = [p for p in fast.pulls if not p.checkpoint]
    assert fast.holders and all(sorted(p.sources) == sorted(fast.holders) for p in copies)
    firsts = Counter(p.sources[0] for p in copies)
    assert not firsts or max(firsts.values()) - min(firsts.get(h, 0) for h in fast.holders) <= 1
    assert ("DIVERGENCE" in fast.reason) == bool(fast.divergence)
    assert ("STATE LOST" in fast.reason) == (fast.regressed_from is not None)


@pytest.mark.timeout(30)
def test_naive_reference_breaks_ties_towards_the_smaller_digest():
    """The reference itself, on the DESIGN example, so a wrong reference cannot agree with a wrong core."""
    members = [Member("a", 1), Member("b", 1), Member("c", 1), Member("d", 1)]
    votes = {"a": ReadyVote("proved", 3, "q", 0), "b": ReadyVote("proved", 3, "p", 0),
             "c": ReadyVote("unknown", 9, "zz", 0), "d": ReadyVote("rolled_back", 1, "o", 0)}
    e = naive_elect(members, votes, Frontier(4, "w"))
    assert e.frontier == Frontier(3, "p") and e.holders == ("b",) and e.divergence == (("a", "q"),)
    assert [p.peer_id for p in e.pulls] == ["a", "c", "d"] and e.regressed_from == 4

"""Hypothesis stateful and property tests of the pure core (I1-I4).

`GenerationProtocol` drives one `GenerationMachine` with random joins, restarts, suspicions (of current,
stale and future incarnations), leaves, ready votes and syncs in any order (right and wrong digests),
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
from collections import Counter

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


# --- the stateful test -----------------------------------------------------------------------------

class GenerationProtocol(RuleBasedStateMachine):

    def __init__(self) -> None:
        super().__init__()
        self.m = GenerationMachine("job")
        self.replica = GenerationMachine("job")
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
        self.seen_active_generation = 0
        self.activations = 0
        self.now = 0.0                          # the time every command carries (`at`)
        self.regress_wait, self.fresh = DEFAULT_REGRESS_WAIT, False
        self.forks: list[tuple[int, int]] = []  # (epoch, revision it began at), from regressed activations
        self.resumes: list[tuple[int, int]] = []  # (generation, frontier revision) of every activation
        self.missing_since: float | None = None   # first hold (or regressed election) since the last activation
        # peer -> (incarnation, revision, lineage, at): the inexact copy the active generation's last member left
        # when another agent reported it (its steps since the activation exist only on its host)
        self.kept_notes: dict[str, tuple[int, int, int, float]] = {}
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
        self.track_kept_notes(command)
        at = getattr(command, "at", self.now)
        if isinstance(command, Register):
            identity = (command.peer_id, command.incarnation)
            if identity not in self.admitted:
                assert command.incarnation > self.max_inc.get(command.peer_id, -1), f"I3: {identity} re-admitted"
                self.admitted[identity] = len(self.admitted)
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
                assert self.awaited_note(g, effect.election.frontier.revision, at) is None, \
                    "elected below the steps a lost last member may bring back, before the wait was over"
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
                    assert naive.frontier.revision > 0 or self.fresh, "fresh start without the allowance"
                    if self.missing_since is None:
                        self.missing_since = self.now
                self.elections[g] = effect.election
            elif isinstance(effect, ActivationHeld):
                g = effect.generation
                event("activation held")
                naive = self.naive_election(g)
                awaited = self.awaited_note(g, naive.frontier.revision, at)
                if awaited is not None:
                    event("held for a lost last member's steps "
                          f"({'below' if naive.regressed_from is not None else 'at'}"
                          " the certified revision)")
                    revision, _, _, noted_at, _ = awaited
                    assert effect.hold.best == naive.frontier and effect.hold.certified == revision
                    if naive.regressed_from is not None and self.missing_since is None:
                        self.missing_since = noted_at
                    until = self.note_deadline(awaited)
                    if naive.regressed_from is not None:    # and then the certified revision's own wait
                        until = max(until, self.missing_since + self.wait_worth(
                            self.missing_since, self.reached_at(naive.frontier.revision)))
                    assert (effect.hold.since, effect.hold.until) == (noted_at, until)
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
                self.fates.append((effect.certificate.generation, "activated", at,
                                   effect.certificate.frontier.revision))

    def track_kept_notes(self, command) -> None:
        """The test's own record of the last-holder notes (DESIGN: no silent regression), from accepted
        commands only: another agent's `Suspect` of the active generation's last current member notes its
        copy at the active frontier; a `Leave` or an accepted vote of that peer drops it."""
        if isinstance(command, Suspect) and command.reporter != command.peer_id and self.active_cert is not None:
            identity = (command.peer_id, command.incarnation)
            members = {m.identity for m in self.active_cert.members}
            if identity in members and not any(self.is_current(m) for m in members - {identity}):
                self.kept_notes[command.peer_id] = (command.incarnation, self.active_cert.frontier.revision,
                                                    self.active_cert.generation, command.at)
        elif isinstance(command, Leave) or (isinstance(command, Ready) and command.quiescence != "unknown"):
            self.kept_notes.pop(command.peer_id, None)

    def holders_heard(self, g: int) -> bool:
        """The test's own rule: every member of the active generation, and every parent member it saw depart, has
        a vote with a state (non-empty digest) in proposal g (the test sends no copies of dead incarnations)."""
        if self.active_cert is None:
            return False
        votes = self.votes.get(g, {})
        possible = [m.peer_id for m in self.active_cert.members] + [p for p, _, _ in self.active_cert.departed]
        return all(peer in votes and votes[peer][1].digest for peer in possible)

    def is_current(self, identity: tuple[str, int]) -> bool:
        return identity in self.admitted and identity not in self.evicted and self.max_inc[identity[0]] == identity[1]

    def awaited_note(self, g: int, frontier: int, at: float):
        """(revision, peer, incarnation, noted at, lineage) of the best last-holder note proposal g must wait for
        at time `at`: its peer not voting, at or above the frontier, not left behind by a later resumption, its
        deadline (`note_deadline`) not passed; None if there is none."""
        voting = {m.peer_id for m in self.proposed[g]}
        waiting = [(revision, peer, inc, noted_at, lineage)
                   for peer, (inc, revision, lineage, noted_at) in self.kept_notes.items()
                   if peer not in voting and revision >= frontier
                   and at < self.note_deadline((revision, peer, inc, noted_at, lineage))
                   and not any(g2 > lineage and f < revision for g2, f in self.resumes)]
        return max(waiting, key=lambda w: (w[0], w[1]), default=None)

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

    def note_deadline(self, note) -> float:
        """Until when a last-holder note is waited for: its steps were made since its generation activated."""
        _, _, _, noted_at, lineage = note
        activated = next((at for g, fate, at, _ in reversed(self.remembered()) if fate == "activated" and g == lineage),
                         None)
        return noted_at + self.wait_worth(noted_at, activated)

    def naive_election(self, g: int) -> Election:
        votes = self.votes.get(g, {})
        members = list(self.proposed[g])
        assert sorted(votes) == sorted(m.peer_id for m in members), "elected or held before every member voted"
        naive = naive_elect(members, {p: v for p, (_, v) in votes.items()},
                            self.active_cert.frontier if self.active_cert else None)
        # steps a voter's previous incarnation committed above its copy, on the history: a loss said, not waited for
        marks = [v.committed for _, v in votes.values() if v.committed > naive.frontier.revision
                 and not any(g2 > v.committed_lineage > 0 and f < v.committed for g2, f in self.resumes)]
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
        a peer with no member, at or above the incarnation of a last-holder note the test recorded for it, forgets
        that note (its agent deleted the host's copy: nothing can come back from there)."""
        inc = self.draw_incarnation(data, peer)
        current = self.m.is_current(peer, inc)
        note = self.kept_notes.get(peer)
        forgets = graceful and self.m.member(peer) is None and note is not None and inc >= note[0]
        outcome = self.send(Leave(peer, inc) if graceful else Suspect(reporter, peer, inc, "no heartbeat"))
        assert outcome.ok == (current or forgets), outcome.reason
        if forgets:
            event("a leave with no member forgot a last holder's note")
            assert peer not in self.m.kept
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
            assert self.send(Ready(p.generation, member.peer_id, member.incarnation, quiescence, revision,
                                   digest, data.draw(st.integers(0, 5)), **self.draw_state_fields(data, revision))).ok
        if then_sync and self.m.pending is p and p.hold is not None:
            self.now = max(self.now, p.hold.until)                 # the wait is over: ask to fall back
            if self.send(Fallback(p.generation, p.members[0].peer_id, p.members[0].incarnation)).ok:
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
        outcome = self.send(Fallback(p.generation, member.peer_id, member.incarnation))
        if hold is None:
            assert outcome.ok and outcome.effects == ()
            return
        naive = self.naive_election(p.generation)
        best = naive.frontier
        if self.awaited_note(p.generation, best.revision, self.now) is not None:
            may = False                     # a lost last member's steps may still come back
        elif naive.regressed_from is None:
            may = True                      # the hold was for such steps only, and the wait is over
        else:
            worth = self.wait_worth(hold.since, self.reached_at(best.revision))
            may = self.now >= hold.since + worth and (best.revision > 0 or self.fresh)
        assert outcome.ok == may, outcome.reason
        if may:
            event("fallback accepted")

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

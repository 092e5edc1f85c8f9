"""The generation state machine: commands in, new state and effects out. No I/O, no clock, no threads.

Owns: the replicated state of one job (DESIGN, "The generation protocol"): members with
incarnations (and zones), the active certificate, the pending proposal, tombstones, the last incarnation seen
per peer, the link rates the agents measured, and a bounded history. Every peer applies the same commands in the
same (Raft log) order and so
holds the same state (I1).

Invariants kept (checked by tests/core after every step):
- I1: one member set and rank map per generation number; a number is never reused. The rank map is
  core.topology.ring_order of the members in join order and the measured links (the join order while nothing
  is known to be slow); a `Links` report after which the active members would be ordered or grouped otherwise
  proposes the same members again, under the next number.
- I2: the active generation only goes up; proposals are always above it.
- I3: an incarnation once seen for a peer_id is never admitted again; votes of any other incarnation
  than the current member's are refused.
- I4: a generation is activated only when every proposed member voted `ready` with its quiescence
  and holds the elected frontier digest.
- No silent regression: a proposal whose elected frontier is below the certified revision is *held*
  (no election, no pull) until a membership change brings a holder, a local copy or a checkpoint, or
  until the wait the missing steps are worth has passed since the job first found the state missing (the
  time the job took to make them, at least HOLD_FLOOR_S, at most `regress_wait`: `wait_worth`, a ski
  rental: waiting and then redoing never costs more than twice the better of the two); only then does a `fallback`
  command let it resume from the best state left, and from revision 0 only when the job allows a fresh
  start. Such an activation opens a new state epoch (a new branch of history): a vote for a state of an
  older epoch above the revision where a later epoch began is refused, so a state of a dead branch (an
  old local copy or checkpoint) can never be mixed into the new one.
- Lineage: every activation records where the job resumed; a `ready` whose state belongs to an older
  generation and lies above a later resumption (a local copy of steps the job never continued) counts as
  holding nothing: that member pulls, and such a state never becomes a frontier (I5: one serial history).
- Kept copies: an agent whose application died reports the local copy it left (in its `Suspect`, so that no
  vote is elected between the removal and the report, or later as `Kept`); a proposal whose
  frontier is below such a copy (on the history, its peer not voting yet) is held, for at most `regress_wait`
  after the death, until the peer's new incarnation votes with what it restored. When another agent reports
  the active generation's last current member (its own agent is gone), the machine notes an inexact copy for
  it (at least the frontier: the steps it committed since exist only on its host), so the job waits for that
  peer instead of resuming below steps it may yet bring back, as long as those steps are worth
  (`kept_deadline`: they were made since its generation activated). A `leave` of that peer with no
  current member (its agent leaves between two incarnations, and deletes the local copy first) forgets the
  copy at once: nothing newer can come back from that host, so a proposal held for it is elected again.
- Re-form (`Reformed`, the first entry of a new Raft epoch after a majority of voters was lost for good):
  the job continues from the state of the survivor that applied the most, so generation and incarnation
  numbers keep going up; the members of the lost agents are evicted and the survivors proposed.
An invalid command changes nothing and returns the reason (`Outcome.ok is False`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from p2pgen.core.frontier import elect_frontier
from p2pgen.core.model import (
    DEFAULT_REGRESS_WAIT,
    HOLD_FLOOR_S,
    QUIESCENCE_VALUES,
    Activated,
    ActivationHeld,
    Certificate,
    CheckpointRef,
    Command,
    Configure,
    Effect,
    Election,
    Fallback,
    FrontierElected,
    HistoryEntry,
    Hold,
    Kept,
    Leave,
    Links,
    LogPosition,
    Member,
    MemberEvicted,
    Outcome,
    ProposalAbandoned,
    ProposalOpened,
    Ready,
    ReadyVote,
    Reform,
    Reformed,
    Register,
    RestartRequired,
    Suspect,
    Synced,
    Tombstone,
    Topology,
)
from p2pgen.core.ownership import Partition, parse_layout, parse_shards
from p2pgen.core.shards import elect_shards
from p2pgen.core.topology import check_zone, parse_rates, ring_order

HISTORY_LIMIT = 64
LINKS_LIMIT = 4096          # measured (from, to) host pairs kept; the oldest report goes first
RESUMES_KEPT = 256
TOMBSTONE_LIMIT = 256


def on_branch(state_epoch: int, forks: tuple[tuple[int, int], ...], epoch: int, revision: int) -> bool:
    """Whether a state of `epoch` at `revision` belongs to the history whose current epoch is `state_epoch` and
    whose later epochs began where `forks` says ((epoch, revision) pairs). Epoch 0 means "the current one"."""
    if epoch == 0:
        return True
    return epoch <= state_epoch and all(revision <= start for e, start in forks if e > epoch)


@dataclass
class Proposal:
    """A pending generation: its members in rank order, their votes, and (once all voted) the election."""

    generation: int
    parent: int
    members: tuple[Member, ...]
    reason: str
    opened_at: float
    votes: dict[str, ReadyVote] = field(default_factory=dict)
    election: Election | None = None
    synced: set[str] = field(default_factory=set)
    hold: Hold | None = None          # every member voted, but the frontier would regress: not elected yet
    topology: Topology | None = None  # why `members` is in this order (core.topology.ring_order)

    def member(self, peer_id: str) -> Member | None:
        return next((m for m in self.members if m.peer_id == peer_id), None)


class GenerationMachine:
    """Deterministic state machine of one job. `apply` is the only way to change it."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.members: list[Member] = []             # current membership, in join order (see core.topology)
        self.active: Certificate | None = None
        self.pending: Proposal | None = None
        self.last_generation = 0                    # highest generation number ever proposed
        self.last_incarnation: dict[str, int] = {}  # peer_id -> highest incarnation ever seen
        self.ownership_version = 0
        self.min_members: int | None = None         # formation rule, set once by Configure (None: 1)
        self.regress_wait = DEFAULT_REGRESS_WAIT    # regression rule, set once by Configure
        self.allow_fresh_start = False
        self.instance = ""                          # names this run of the job: set by the first registration
        self.state_epoch = 1                        # branch of the state history; +1 at each regressed activation
        self.forks: tuple[tuple[int, int], ...] = ()   # (epoch, revision it began at), oldest first
        self.hold_since: float | None = None        # when the certified state was first found missing
        self.active_until: float | None = None      # when the active generation stopped making steps (its
        #                                             membership changed: its members quiesce); None until then
        self.tombstones: deque[Tombstone] = deque(maxlen=TOMBSTONE_LIMIT)
        self.history: deque[HistoryEntry] = deque(maxlen=HISTORY_LIMIT)
        self.resumes: deque[tuple[int, int]] = deque(maxlen=RESUMES_KEPT)   # (generation, frontier revision)
        self.kept: dict[str, Kept] = {}             # peer_id -> the local copy its dead incarnation left
        self.raft_epoch = 0                         # +1 at each fenced re-form (`Reformed`)
        self.reform_note = ""                       # carried by the next certificate, then cleared
        self.layout: tuple[Partition, ...] = ()     # sharded objects the members declared (set by the first vote)
        self.links: dict[tuple[str, str], float] = {}   # (from host, to host) -> Mbit/s, as the agents measured

    def snapshot(self) -> GenerationMachine:
        """An independent copy, for readers on other threads while this one goes on applying commands. Everything
        the machine holds is immutable (frozen dataclasses, tuples, strings, numbers), a container of such values
        (list, dict, set, deque) or the open `Proposal`: containers are copied one level deep, the proposal with
        its own votes and synced set, the values shared. About a hundred times cheaper than `copy.deepcopy`, which
        the Raft thread paid after every applied batch (4 ms at the median in a stress run, 25 ms at p90, on the
        path of every commit's answer)."""
        copied = object.__new__(GenerationMachine)
        copied.__dict__.update({name: _copied(value) for name, value in self.__dict__.items()})
        return copied

    # --- queries -----------------------------------------------------------------------------------

    @property
    def active_generation(self) -> int:
        return self.active.generation if self.active else 0

    def member(self, peer_id: str) -> Member | None:
        return next((m for m in self.members if m.peer_id == peer_id), None)

    def is_current(self, peer_id: str, incarnation: int) -> bool:
        member = self.member(peer_id)
        return member is not None and member.incarnation == incarnation

    def was_evicted(self, peer_id: str, incarnation: int) -> bool:
        """True if this incarnation was seen and is no longer a member (it must restart as a new one)."""
        return incarnation <= self.last_incarnation.get(peer_id, -1) and not self.is_current(peer_id, incarnation)

    def left_behind(self, lineage: int, revision: int) -> tuple[int, int] | None:
        """A state at `revision` that belongs to generation `lineage` is off the job's history when a later
        generation resumed below it: the steps above that resumption were never continued (they were
        committed by members that died before the next change, and the job went on without them). Returns
        that (generation, frontier revision), or None. `lineage` 0 (not said) is taken as current."""
        if lineage <= 0:
            return None
        for generation, frontier in self.resumes:
            if generation > lineage and frontier < revision:
                return generation, frontier
        if self.resumes and len(self.resumes) == RESUMES_KEPT and lineage < self.resumes[0][0] \
                and revision > self.resumes[0][1]:
            return self.resumes[0]            # older than what is remembered: not provably on the history
        return None

    def on_branch(self, epoch: int, revision: int) -> bool:
        """Whether a state of `epoch` at `revision` belongs to the current history: every later epoch
        began at or above it (a prefix shared by both branches). Epoch 0 means "the current one"."""
        return on_branch(self.state_epoch, self.forks, epoch, revision)

    # --- the one entry point -----------------------------------------------------------------------

    def apply(self, command: Command, position: LogPosition = LogPosition()) -> Outcome:
        handler = _HANDLERS.get(type(command))
        if handler is None:
            return Outcome.refused(f"unknown command {type(command).__name__}")
        return handler(self, command, position)

    # --- membership commands -----------------------------------------------------------------------

    def _configure(self, cmd: Configure, position: LogPosition) -> Outcome:
        if cmd.min_members < 1:
            return Outcome.refused(f"configure: min_members must be >= 1, got {cmd.min_members}")
        if not 0 <= cmd.regress_wait <= 86400:
            return Outcome.refused(f"configure: regress_wait must be within 0..86400 s, got {cmd.regress_wait}")
        if cmd.allow_fresh_start not in (0, 1):
            return Outcome.refused(f"configure: allow_fresh_start must be 0 or 1, got {cmd.allow_fresh_start}")
        rules = (cmd.min_members, cmd.regress_wait, bool(cmd.allow_fresh_start))
        if self.min_members is not None and rules == (self.min_members, self.regress_wait, self.allow_fresh_start):
            return Outcome.replay(f"job already configured with {self._rules()}")
        if self.min_members is not None:
            return Outcome.refused(f"configure: job already configured with {self._rules()}; start every agent "
                                   f"with the same --min-members, --regress-wait and --allow-fresh-start")
        if self.active is not None or self.history or self.pending is not None:
            # A pending proposal means the first generation was already proposed under the default rule
            # (min_members=1); accepting now would not hold it back, and the next change would count as
            # "formed" anyway, so the new rule would be silently ignored.
            return Outcome.refused("configure: the job has already formed; min_members only governs formation")
        self.min_members = cmd.min_members
        self.regress_wait, self.allow_fresh_start = cmd.regress_wait, bool(cmd.allow_fresh_start)
        effects: list[Effect] = []
        if self.pending is None and self._formation_complete():
            self._open(f"{len(self.members)} member(s) registered", cmd.at, effects)
        return Outcome(True, f"configured {self._rules()}", tuple(effects))

    def _rules(self) -> str:
        return (f"min_members={self.min_members}, regress_wait={self.regress_wait:g}, "
                f"allow_fresh_start={int(self.allow_fresh_start)}")

    def _formation_complete(self) -> bool:
        """The first generation waits for `min_members`; once the job formed, any change proposes."""
        return self.active is not None or len(self.members) >= (self.min_members or 1)

    def _register(self, cmd: Register, position: LogPosition) -> Outcome:
        if not cmd.peer_id:
            return Outcome.refused("register: empty peer_id")
        if cmd.incarnation < 0:
            return Outcome.refused(f"register {cmd.peer_id}: incarnation must be >= 0, got {cmd.incarnation}")
        bad_zone = check_zone(cmd.zone)
        if bad_zone:
            return Outcome.refused(f"register {cmd.peer_id}: {bad_zone}")
        addrs = tuple(sorted(cmd.addrs))   # members store addrs sorted; compare like with like on replay
        current = self.member(cmd.peer_id)
        if current is not None and current.incarnation == cmd.incarnation and current.addrs == addrs \
                and current.zone == cmd.zone:
            return Outcome.replay(f"{cmd.peer_id}#{cmd.incarnation} is already registered")
        last = self.last_incarnation.get(cmd.peer_id)
        if last is not None and cmd.incarnation <= last:
            return Outcome.refused(
                f"register {cmd.peer_id}#{cmd.incarnation}: incarnation already seen (last {last}); "
                "a restarted process must register with a new, higher incarnation (I3)")
        effects: list[Effect] = []
        if current is not None:
            self._evict(current, f"replaced by incarnation {cmd.incarnation}", cmd.at, effects)
        self.last_incarnation[cmd.peer_id] = cmd.incarnation
        if not self.instance:
            self.instance = f"{cmd.peer_id}#{cmd.incarnation}@{cmd.at:.6f}"
        self.members.append(Member(cmd.peer_id, cmd.incarnation, addrs, cmd.zone))
        self._membership_changed(f"{cmd.peer_id}#{cmd.incarnation} joined", cmd.at, effects)
        return Outcome(True, f"registered {cmd.peer_id}#{cmd.incarnation}", tuple(effects))

    def _suspect(self, cmd: Suspect, position: LogPosition) -> Outcome:
        if not cmd.reporter:
            return Outcome.refused("suspect: empty reporter")
        if cmd.kept_revision >= 0 and cmd.reporter != cmd.peer_id:
            return Outcome.refused(f"suspect: only {cmd.peer_id}'s own agent can report the local copy it kept")
        if min(cmd.kept_revision, cmd.kept_committed) < -1 or min(cmd.kept_lineage, cmd.kept_committed_lineage) < 0:
            return Outcome.refused("suspect: kept_revision and kept_committed must be >= -1, their lineages >= 0")
        held = self.kept.get(cmd.peer_id)
        if cmd.reporter != cmd.peer_id and held is not None and held.exact and not held.agent_lost and \
                held.incarnation == cmd.incarnation and not self.is_current(cmd.peer_id, cmd.incarnation):
            return self._copy_agent_lost(held, cmd, position)
        member = self.member(cmd.peer_id)
        agent = (member.addr("agent") or "") if member is not None else ""
        own_copy = (Kept(cmd.peer_id, cmd.incarnation, cmd.kept_revision, cmd.kept_digest, cmd.kept_lineage, cmd.at,
                         committed=cmd.kept_committed, committed_lineage=cmd.kept_committed_lineage, agent=agent)
                    if cmd.kept_revision >= 0 else None)
        last_holder = (self._last_holder_note(cmd.peer_id, cmd.incarnation, cmd.at)
                       if cmd.reporter != cmd.peer_id else None)   # its own agent reports what it kept
        outcome = self._remove(cmd.peer_id, cmd.incarnation, f"suspected by {cmd.reporter}: {cmd.reason}", cmd.at)
        kept = own_copy or last_holder
        if outcome.ok and kept is not None:
            self.kept[cmd.peer_id] = kept   # its agent, if it lives, replaces a note with the copy
        return outcome

    def _copy_agent_lost(self, kept: Kept, cmd: Suspect, position: LogPosition) -> Outcome:
        """Another agent reports the agent of a dead incarnation that left an exact local copy: that agent is lost
        too, so nothing restarts the application on that host until the host is back. The copy is waited for only
        as long as its steps are worth (`kept_deadline`); a proposal held for it is elected again (the wait may
        already have been worth more than the steps)."""
        self.kept[kept.peer_id] = dataclasses.replace(kept, agent_lost=True)
        effects = self._elect_held_again(cmd.at, position)
        return Outcome(True, f"{kept.peer_id}#{kept.incarnation}'s agent is lost too ({cmd.reason}): its local copy "
                             f"of revision {kept.revision} comes back only with its host, and is waited for only as "
                             "long as its steps are worth", tuple(effects))

    def _last_holder_note(self, peer_id: str, incarnation: int, at: float) -> Kept | None:
        """When another agent reports the active generation's last current member (its own agent is lost,
        stalled or replaced), every step it committed since the activation exists only on its host: an inexact
        `Kept` at least at the generation's frontier."""
        active = self.active
        if active is None or (peer_id, incarnation) not in {m.identity for m in active.members}:
            return None
        if any(m.identity != (peer_id, incarnation) and self.is_current(*m.identity) for m in active.members):
            return None
        return Kept(peer_id, incarnation, active.frontier.revision, active.frontier.digest, self.active_generation,
                    at, exact=False)

    def _leave(self, cmd: Leave, position: LogPosition) -> Outcome:
        kept = self.kept.get(cmd.peer_id)
        if self.member(cmd.peer_id) is None and kept is not None and cmd.incarnation >= kept.incarnation:
            return self._forget_kept(kept, cmd.at, position)
        outcome = self._remove(cmd.peer_id, cmd.incarnation, "left gracefully", cmd.at)
        if outcome.ok:
            self.kept.pop(cmd.peer_id, None)   # its agent removes its local copy when it leaves
        return outcome

    def _forget_kept(self, kept: Kept, at: float, position: LogPosition) -> Outcome:
        """The peer's agent left with no member of it current: it deleted the copy `kept` names (or the host's
        copy an inexact note stands for) before saying so, so nothing newer can come back from it. A proposal
        held for it is elected again (it may activate, or stay held for another reason)."""
        del self.kept[kept.peer_id]
        what = (f"its local copy of revision {kept.revision}" if kept.exact else
                f"the steps {kept.peer_id}#{kept.incarnation} committed after revision {kept.revision}")
        effects = self._elect_held_again(at, position)
        return Outcome(True, f"{kept.peer_id} left with no member: its agent deleted {what}, which cannot come "
                             "back", tuple(effects))

    def _remove(self, peer_id: str, incarnation: int, why: str, at: float) -> Outcome:
        refusal = self._check_current(peer_id, incarnation)
        if refusal:
            return Outcome.refused(refusal)
        effects: list[Effect] = []
        member = self.member(peer_id)
        assert member is not None              # _check_current found it
        self._evict(member, why, at, effects)
        self._membership_changed(f"{peer_id}#{incarnation} removed ({why})", at, effects)
        return Outcome(True, f"removed {peer_id}#{incarnation}: {why}", tuple(effects))

    def _reform(self, cmd: Reform, position: LogPosition) -> Outcome:
        refusal = self._check_current(cmd.peer_id, cmd.incarnation)
        if refusal:
            return Outcome.refused(refusal)
        if self.pending is not None:
            return Outcome(True, f"generation {self.pending.generation} is already pending; nothing to reform")
        if self.active is None:
            # Nothing ran yet, so no collective can have failed; and opening a proposal here would
            # bypass the formation rule (min_members).
            return Outcome.refused(f"reform of generation {cmd.generation}: no generation is active yet")
        if cmd.generation != self.active_generation:
            return Outcome.refused(f"reform of generation {cmd.generation}: the active generation is "
                                   f"{self.active_generation} (stale request, I2)")
        effects: list[Effect] = []
        self._open(f"reform requested by {cmd.peer_id}: {cmd.reason}", cmd.at, effects)
        return Outcome(True, f"reforming generation {self.active_generation}", tuple(effects))

    def _links(self, cmd: Links, position: LogPosition) -> Outcome:
        if not cmd.source or any(c.isspace() or c == "=" for c in cmd.source):
            return Outcome.refused(f"links: source host {cmd.source!r} must be a host name or address")
        try:
            rates = parse_rates(cmd.rates)
        except ValueError as e:
            return Outcome.refused(f"links from {cmd.source}: {e}")
        if not rates or cmd.source in rates:
            return Outcome.refused(f"links from {cmd.source}: name at least one other host (HOST=MBITS ...)")
        if all(self.links.get((cmd.source, host)) == r for host, r in rates.items()):
            return Outcome.replay(f"links from {cmd.source} already recorded")
        for host, r in sorted(rates.items()):
            self.links.pop((cmd.source, host), None)        # re-inserted: the newest report is kept longest
            self.links[(cmd.source, host)] = r
        while len(self.links) > LINKS_LIMIT:
            del self.links[next(iter(self.links))]
        effects: list[Effect] = []
        self._reorder_if_due(f"links measured from {cmd.source}", cmd.at, effects)
        return Outcome(True, f"links from {cmd.source} to {len(rates)} host(s) recorded", tuple(effects))

    def _reorder_if_due(self, why: str, at: float, effects: list[Effect]) -> None:
        """With the active generation's members and nothing pending: propose them again when what is known of
        the links now orders or groups them otherwise (a generation of the same members, in the new order)."""
        if self.pending is not None or self.active is None or not self.members:
            return
        order, topology = ring_order(self.members, self.links)
        if (order, _plan(topology)) != (self.active.members, _plan(self.active.topology)):
            self._open(f"rank order: {why} ({topology.reason if topology else 'nothing known'})", at, effects)

    # --- proposal commands -------------------------------------------------------------------------

    def _ready(self, cmd: Ready, position: LogPosition) -> Outcome:
        refusal = self._check_vote(cmd.generation, cmd.peer_id, cmd.incarnation)
        if refusal:
            return Outcome.refused(refusal)
        if cmd.quiescence not in QUIESCENCE_VALUES:
            return Outcome.refused(f"ready: quiescence must be one of {', '.join(QUIESCENCE_VALUES)}, "
                                   f"got {cmd.quiescence!r}")
        if cmd.revision < 0 or cmd.collective_seq < 0 or cmd.epoch < 0 or cmd.ckpt_epoch < 0:
            return Outcome.refused("ready: revision, collective_seq and epochs must be >= 0")
        if cmd.committed < -1 or cmd.committed_lineage < 0:
            return Outcome.refused("ready: committed must be >= -1 and committed_lineage >= 0")
        proposal = self._open_proposal()
        checkpoint = (CheckpointRef(cmd.ckpt_revision, cmd.ckpt_digest, cmd.ckpt_epoch)
                      if cmd.ckpt_revision >= 0 and cmd.ckpt_digest else None)
        layout, shards, refusal = self._check_shards(cmd.peer_id, cmd.layout, cmd.shards)
        if refusal:
            return Outcome.refused(refusal)
        vote = ReadyVote(cmd.quiescence, cmd.revision, cmd.digest, cmd.collective_seq, cmd.comm_id, cmd.epoch,
                         checkpoint, shards, cmd.committed, cmd.committed_lineage)
        behind = self.left_behind(cmd.lineage, cmd.revision)
        if behind is not None:            # it holds nothing the job can resume from: it must pull
            vote = ReadyVote(cmd.quiescence, 0, "", cmd.collective_seq, cmd.comm_id, 0, checkpoint)
        previous = proposal.votes.get(cmd.peer_id)
        if previous is not None:
            if previous == vote:
                return Outcome.replay(f"{cmd.peer_id} already voted ready for generation {cmd.generation}")
            return Outcome.refused(f"ready: {cmd.peer_id}#{cmd.incarnation} already voted differently for "
                                   f"generation {cmd.generation}")
        effects: list[Effect] = []
        if cmd.quiescence == "unknown":
            member = proposal.member(cmd.peer_id)
            assert member is not None          # _check_vote found it in the proposal
            why = f"cannot prove quiescence of generation {proposal.parent}: must restart as a new incarnation"
            effects.append(RestartRequired(member.peer_id, member.incarnation, why))
            self._evict(member, why, cmd.at, effects)
            self._membership_changed(f"{member.peer_id}#{member.incarnation} reported quiescence unknown",
                                     cmd.at, effects)
            return Outcome(True, f"{cmd.peer_id}#{cmd.incarnation} evicted: {why}", tuple(effects))
        refusal = self._check_branch(cmd)
        if refusal:
            return Outcome.refused(refusal)
        proposal.votes[cmd.peer_id] = vote
        self.layout = self.layout or layout
        self.kept.pop(cmd.peer_id, None)   # a new incarnation's vote says what it holds: no copy to wait for
        if len(proposal.votes) == len(proposal.members):
            self._elect(self._election(), cmd.at, position, effects)
        if behind is not None:
            return Outcome(True, f"{cmd.peer_id} ready for generation {cmd.generation}, holding nothing: its state at "
                                 f"revision {cmd.revision} (generation {cmd.lineage}) was left behind when generation "
                                 f"{behind[0]} resumed from revision {behind[1]}", tuple(effects))
        return Outcome(True, f"{cmd.peer_id} ready for generation {cmd.generation}", tuple(effects))

    def _check_branch(self, cmd: Ready) -> str | None:
        """A vote for a state (or checkpoint) of a dead branch of history is refused (see `on_branch`)."""
        for what, epoch, revision in (("state", cmd.epoch, cmd.revision),
                                      ("checkpoint", cmd.ckpt_epoch, cmd.ckpt_revision)):
            if revision >= 0 and not self.on_branch(epoch, revision):
                return (f"ready: {cmd.peer_id}'s {what} at revision {revision} belongs to state epoch {epoch}, a "
                        f"branch the job left (current epoch {self.state_epoch}, forks "
                        f"{', '.join(f'epoch {e} at r{r}' for e, r in self.forks) or 'none'}); vote without it")
        return None

    def _check_shards(self, peer_id: str, layout_text: str, shards_text: str
                      ) -> tuple[tuple[Partition, ...], tuple[tuple[str, int, str], ...], str | None]:
        """Parse a vote's layout and held shards; (layout, shards, None) or ((), (), why it is refused)."""
        try:
            layout, held = parse_layout(layout_text), parse_shards(shards_text)
        except ValueError as e:
            return (), (), f"ready: {peer_id}'s sharded state is malformed: {e}"
        if layout and self.layout and layout != self.layout:
            return (), (), (f"ready: {peer_id} declares sharded objects {_layout_line(layout)}, the job's are "
                            f"{_layout_line(self.layout)}; every member must declare the same ones")
        known = {p.object_id: p for p in (layout or self.layout)}
        for (obj, index) in held:
            if obj not in known or index >= known[obj].shards:
                return (), (), f"ready: {peer_id} reports shard {obj}[{index}], which the layout does not declare"
        return layout, tuple((o, i, d) for (o, i), d in sorted(held.items())), None

    def _election(self) -> Election:
        p = self._open_proposal()
        last = self.active.frontier if self.active else None
        election = self._with_lost_commits(elect_frontier(p.members, p.votes, last))
        if not self.layout:
            return election
        previous = {(o, i): w for o, i, w in self.active.ownership} if self.active else {}
        sharded = elect_shards(p.members, p.votes, election, self.layout, previous, self.layout)
        if not sharded.lost_shards or election.source != "members" or election.frontier.revision == 0:
            return sharded
        # A shard no frontier holder has: this revision cannot be rebuilt whole. Resume from what holds every
        # shard (a checkpoint), or nothing; never mix revisions.
        lost = ", ".join(f"{o}[{i}]" for o, i in sharded.lost_shards)
        demoted = {k: ReadyVote(v.quiescence, 0, "", v.collective_seq, v.comm_id, 0, v.checkpoint)
                   for k, v in p.votes.items()}
        lower = elect_shards(p.members, demoted, elect_frontier(p.members, demoted, last), self.layout, previous,
                             self.layout)
        regressed = lower.regressed_from if lower.regressed_from is not None else (
            election.frontier.revision if lower.frontier.revision < election.frontier.revision else None)
        return self._with_lost_commits(dataclasses.replace(
            lower, regressed_from=regressed, lost_shards=sharded.lost_shards,
            reason=f"every owner of shard(s) {lost} at revision {election.frontier.revision} is gone; {lower.reason}"))

    def _with_lost_commits(self, election: Election) -> Election:
        """Say which committed steps a frontier gives up beyond the certified revision: the highest revision known
        committed on the job's history (a voter's previous incarnation whose local copy lagged its commits, a
        dead incarnation's copy or commits) above the frontier. Not waited for (the kept-copy and certified rules
        decide the waits); said, so that no committed revision is lost silently."""
        proposal = self._open_proposal()
        known = [(v.committed, v.committed_lineage) for v in proposal.votes.values()]
        known += [(k.committed, k.committed_lineage) for k in self.kept.values()]
        known += [(k.revision, k.lineage) for k in self.kept.values()]
        floor = max((r for r, lineage in known if r > election.frontier.revision
                     and self.left_behind(lineage, r) is None), default=None)
        if floor is None or (election.regressed_from is not None and floor <= election.regressed_from):
            return election
        return dataclasses.replace(election, lost_committed=floor, reason=(
            f"{election.reason}; STEPS LOST: revisions {election.frontier.revision + 1}..{floor} were committed "
            f"and no member, local copy or checkpoint holds them"))

    def _elect(self, election: Election, at: float, position: LogPosition, effects: list[Effect]) -> None:
        """Every member voted: elect, or hold the proposal if its frontier would regress and may not yet."""
        proposal = self._open_proposal()
        awaited = self._awaited_copy(election, at)
        if awaited is not None:
            copy_ = awaited
            what = (f"{copy_.peer_id}'s local copy holds revision {copy_.revision} (its agent was lost too: it "
                    f"comes back only with its host)" if copy_.exact and copy_.agent_lost else
                    f"{copy_.peer_id}'s local copy holds revision {copy_.revision} (its application restarts on "
                    f"its host)" if copy_.exact else
                    f"{copy_.peer_id}#{copy_.incarnation}, the last member of generation {copy_.lineage}, was lost "
                    f"with its agent; the steps it committed after revision {copy_.revision} exist only on its "
                    f"host (its next incarnation restores them if the host comes back)")
            if election.regressed_from is not None and self.hold_since is None:
                self.hold_since = copy_.at          # one wait: the state went missing when that copy's holder died
            until = self.kept_deadline(copy_, election.frontier.revision)
            if election.regressed_from is not None and self.hold_since is not None:
                until = max(until, self.hold_since + self._regression_wait(election, self.hold_since))
            proposal.hold = Hold(copy_.at, until, copy_.revision, election.frontier,
                                 f"{what}; waiting until {until:.3f} for it")
            effects.append(ActivationHeld(proposal.generation, proposal.hold))
            return
        if election.regressed_from is not None:
            since = self.hold_since if self.hold_since is not None else at
            refusal = self._regression_refusal(election, since, at)
            if refusal is not None:
                self.hold_since = since
                proposal.hold = Hold(since, since + self._regression_wait(election, since), election.regressed_from,
                                     election.frontier, refusal)
                effects.append(ActivationHeld(proposal.generation, proposal.hold))
                return
        proposal.hold = None
        proposal.election = election
        effects.append(FrontierElected(proposal.generation, election))
        self._maybe_activate(at, position, effects)

    def _awaited_copy(self, election: Election, at: float) -> Kept | None:
        """The best local copy a dead incarnation left above this frontier, still worth waiting for: on the job's
        history, its peer not voting in this proposal (a new incarnation's vote says what it restored), and
        its deadline (`kept_deadline`) not passed."""
        voting = {m.peer_id for m in self._open_proposal().members}
        frontier = election.frontier.revision
        waiting = [k for k in self.kept.values()
                   if k.peer_id not in voting and (k.revision > frontier or (not k.exact and k.revision >= frontier))
                   and at < self.kept_deadline(k, frontier) and self.left_behind(k.lineage, k.revision) is None]
        return max(waiting, key=lambda k: (k.revision, k.peer_id), default=None)

    def kept_deadline(self, kept: Kept, frontier: int | None = None) -> float:
        """Until when the job waits for a dead incarnation's copy. An exact copy (its own agent lives and restarts
        the application on that host): `regress_wait` after the death. The note of a last holder lost with its
        agent: the steps only that host may hold were made since its generation activated, and the job waits for
        them no longer than that took (`wait_worth`). An exact copy whose agent was lost after it: it holds every
        step above `frontier` (the revision the job would resume from otherwise), made since the job last stood
        at or below it, and the job waits for them no longer than that took, counted from when the copy's
        generation stopped making steps (the job has waited for them since).

        Args:
            kept: the copy or note, as `self.kept` holds it.
            frontier: the revision the job would resume from without the copy (None: not known yet; the steps
                made since the copy's generation activated are counted then).
        """
        if kept.exact and not kept.agent_lost:
            return kept.at + self.regress_wait
        if kept.exact:
            start = min(kept.at, self._stopped_at(kept.lineage))
            made_since = self._activated_at(kept.lineage) if frontier is None else self._reached_at(frontier)
            return start + self.wait_worth(start, made_since)
        return kept.at + self.wait_worth(kept.at, self._activated_at(kept.lineage))

    def awaited(self) -> tuple[Member, ...]:
        """The members the pending generation waits for now: those that have not voted `ready`, and, once its
        frontier is elected, those that must pull and have not reported `synced`. Empty with no pending
        generation, and while a held one waits for a state rather than for a member."""
        proposal = self.pending
        if proposal is None:
            return ()
        election = proposal.election
        if election is None:
            return () if proposal.hold is not None else \
                tuple(m for m in proposal.members if m.peer_id not in proposal.votes)
        pulling = {p.peer_id for p in election.pulls} | {sp.peer_id for sp in election.shard_pulls}
        return tuple(m for m in proposal.members if m.peer_id in pulling - proposal.synced)

    def wait_worth(self, lost_at: float, made_since: float | None) -> float:
        """How long the job waits for steps lost at `lost_at` that it made from `made_since` on: as long as they
        took to make (redoing them costs that much again), at least HOLD_FLOOR_S, at most `regress_wait`. A ski
        rental: whether the steps come back or not, waiting this long and then redoing them never costs more
        than twice the better choice made in hindsight. Unknown `made_since`: `regress_wait`.

        Args:
            lost_at: when the holder of the missing steps was lost (the wait counts from there).
            made_since: when the job last stood below the missing steps (None: not known).
        """
        if made_since is None:
            return self.regress_wait
        return min(self.regress_wait, max(HOLD_FLOOR_S, lost_at - made_since))

    def _regression_wait(self, election: Election, since: float) -> float:
        """The wait for the certified revision, missing since `since`: worth the steps above the best state left,
        made since the job last activated a generation at or below it."""
        return self.wait_worth(since, self._reached_at(election.frontier.revision))

    def _stopped_at(self, generation: int) -> float:
        """When `generation` stopped making steps: the first change of membership after it activated (its members
        quiesce then, or none is left), or the next activation; infinite while it makes them or when the history
        forgot it."""
        if generation == self.active_generation:
            return math.inf if self.active_until is None else self.active_until
        later = [e.at for e in self.history if e.outcome == "activated" and e.generation > generation]
        return min(later, default=math.inf)

    def _activated_at(self, generation: int) -> float | None:
        """When `generation` activated, while the history remembers it."""
        for entry in reversed(self.history):
            if entry.outcome == "activated" and entry.generation == generation:
                return entry.at
        return None

    def _reached_at(self, revision: int) -> float | None:
        """When the job last activated a generation whose frontier is at or below `revision` (every step above
        it was made since), while the history remembers one."""
        for entry in reversed(self.history):
            if entry.outcome == "activated" and entry.certificate is not None and \
                    entry.certificate.frontier.revision <= revision:
                return entry.at
        return None

    def _possible_holders_heard(self) -> bool:
        """Whether every incarnation that could hold the certified revision (the active generation's members, and
        the parent's members it saw depart) has said what it holds: its peer votes a state in this proposal (a
        restarted incarnation votes what it restored on that host; an agent's vote for an application not attached
        yet says nothing), or its own agent reported the copy it left. Then nothing the wait could bring back is
        left (the copies lagged the commits) and the job need not wait."""
        if self.active is None:
            return False
        votes = self._open_proposal().votes
        possible = [m.identity for m in self.active.members] + [(p, i) for p, i, _ in self.active.departed]
        for peer_id, incarnation in possible:
            vote, kept = votes.get(peer_id), self.kept.get(peer_id)
            if not (vote is not None and vote.digest) and not (kept is not None and kept.exact
                                                               and kept.incarnation >= incarnation):
                return False
        return True

    def _regression_refusal(self, election: Election, since: float, at: float) -> str | None:
        """Why a frontier below the certified revision may not be used at time `at` (None: it may)."""
        certified = election.regressed_from
        best = f"revision {election.frontier.revision} ({election.source})"
        if election.lost_shards:
            lost = ", ".join(f"{o}[{i}]" for o, i in election.lost_shards)
            best += f"; every owner of shard(s) {lost} is gone"
        until = since + self._regression_wait(election, since)
        if at < until and (election.lost_shards or not self._possible_holders_heard()):
            return (f"no member holds certified revision {certified} (best: {best}); waiting until "
                    f"{until:.3f} for a holder, a local copy or a checkpoint")
        if election.frontier.revision == 0 and not self.allow_fresh_start:
            return (f"STATE LOST: no holder, local copy or checkpoint of certified revision {certified} came back "
                    f"within {until - since:g} s and only revision 0 is left; the job was not started with "
                    f"--allow-fresh-start: bring back a member's state, or start the job again from a checkpoint "
                    f"(--restore DIR)")
        return None

    def _kept(self, cmd: Kept, position: LogPosition) -> Outcome:
        last = self.last_incarnation.get(cmd.peer_id)
        if last is None or cmd.incarnation > last:
            return Outcome.refused(f"kept: {cmd.peer_id}#{cmd.incarnation} was never registered")
        if cmd.revision < 0 or cmd.lineage < 0 or cmd.committed < -1 or cmd.committed_lineage < 0:
            return Outcome.refused("kept: revision and lineage must be >= 0, committed >= -1")
        if self.is_current(cmd.peer_id, cmd.incarnation):
            return Outcome.refused(f"kept: {cmd.peer_id}#{cmd.incarnation} is still a member: its vote says what "
                                   "it holds")
        held = self.kept.get(cmd.peer_id)
        if held is not None and held.exact and (held.incarnation, held.revision) >= (cmd.incarnation, cmd.revision):
            return Outcome.replay(f"{cmd.peer_id}'s local copy at revision {held.revision} is already known")
        self.kept[cmd.peer_id] = cmd
        return Outcome(True, f"{cmd.peer_id}#{cmd.incarnation} left a local copy of revision {cmd.revision}",
                       tuple(self._elect_held_again(cmd.at, position)))

    def _elect_held_again(self, at: float, position: LogPosition) -> list[Effect]:
        """What the job waits for changed (a copy reported, its agent lost, or forgotten): a held proposal is
        elected again now, so its hold names what it waits for and until when, or it activates when nothing is
        left to wait for."""
        effects: list[Effect] = []
        proposal = self.pending
        if proposal is not None and proposal.hold is not None and proposal.election is None:
            self._elect(self._election(), at, position, effects)
        return effects

    def _fallback(self, cmd: Fallback, position: LogPosition) -> Outcome:
        refusal = self._check_vote(cmd.generation, cmd.peer_id, cmd.incarnation)
        if refusal:
            return Outcome.refused(refusal)
        proposal = self._open_proposal()
        if proposal.hold is None:
            return Outcome(True, f"generation {cmd.generation} is not held: nothing to fall back from")
        election = self._election()
        # the certified revision's wait counts from when the job first found it missing, as the hold's `until` does
        # (a hold for a copy says since when that copy is waited for); a hold for a copy alone has no such clock
        since = self.hold_since if self.hold_since is not None else proposal.hold.since
        awaited = self._awaited_copy(election, cmd.at)
        if awaited is not None:
            what = (f"{awaited.peer_id}'s local copy of revision {awaited.revision}" if awaited.exact else
                    f"the steps {awaited.peer_id}#{awaited.incarnation} committed after revision {awaited.revision}")
            return Outcome.refused(f"fallback for generation {cmd.generation}: {what} may still come back (until "
                                   f"{self.kept_deadline(awaited, election.frontier.revision):.3f})")
        refusal = (self._regression_refusal(election, since, cmd.at) if election.regressed_from is not None
                   else None)
        if refusal is not None:
            return Outcome.refused(f"fallback for generation {cmd.generation}: {refusal}")
        effects: list[Effect] = []
        self._elect(election, cmd.at, position, effects)
        return Outcome(True, f"generation {cmd.generation} falls back to revision {election.frontier.revision} "
                             f"after waiting {cmd.at - since:.1f} s", tuple(effects))

    def _synced(self, cmd: Synced, position: LogPosition) -> Outcome:
        refusal = self._check_vote(cmd.generation, cmd.peer_id, cmd.incarnation)
        if refusal:
            return Outcome.refused(refusal)
        proposal = self._open_proposal()
        election = proposal.election
        if election is None:
            return Outcome.refused(f"synced: the frontier of generation {cmd.generation} is not elected yet "
                                   "(wait until every member is ready)")
        shard_pulls = [sp for sp in election.shard_pulls if sp.peer_id == cmd.peer_id]
        if not any(p.peer_id == cmd.peer_id for p in election.pulls) and not shard_pulls:
            return Outcome(True, f"{cmd.peer_id} already holds the frontier (nothing to sync)")
        missing = self._missing_shards(shard_pulls, cmd.shards)
        if missing:
            return Outcome.refused(f"synced: {cmd.peer_id} does not hold {missing} yet; pull them first")
        if cmd.digest != election.frontier.digest:
            return Outcome.refused(f"synced: {cmd.peer_id} holds digest {cmd.digest or '<empty>'}, the frontier is "
                                   f"{election.frontier.digest or '<empty>'}; pull again")
        if cmd.peer_id in proposal.synced:
            return Outcome.replay(f"{cmd.peer_id} already synced")
        proposal.synced.add(cmd.peer_id)
        effects: list[Effect] = []
        self._maybe_activate(cmd.at, position, effects)
        return Outcome(True, f"{cmd.peer_id} synced to generation {cmd.generation}", tuple(effects))

    @staticmethod
    def _missing_shards(shard_pulls: list, shards_text: str) -> str:
        """The shards (with their agreed digests) a `synced` does not show; "" when it shows them all."""
        try:
            held = parse_shards(shards_text)
        except ValueError as e:
            return f"any shard it can name ({e})"
        missing = [f"{sp.object_id}[{sp.index}]" for sp in shard_pulls
                   if (sp.object_id, sp.index) not in held
                   or (sp.digest and held[(sp.object_id, sp.index)] != sp.digest)]
        return ", ".join(missing)

    # --- validation helpers ------------------------------------------------------------------------

    def _open_proposal(self) -> Proposal:
        """The pending proposal, which the caller's checks (`_check_vote`, a vote just counted) proved open."""
        assert self.pending is not None, "no pending proposal"
        return self.pending

    def _check_current(self, peer_id: str, incarnation: int) -> str | None:
        member = self.member(peer_id)
        if member is None:
            if peer_id in self.last_incarnation:
                return f"{peer_id}#{incarnation} is not a member (already removed)"
            return f"unknown peer {peer_id!r}"
        if member.incarnation != incarnation:
            return (f"{peer_id}#{incarnation} is a stale incarnation: the member is {peer_id}#{member.incarnation} "
                    "(I3)")
        return None

    def _check_vote(self, generation: int, peer_id: str, incarnation: int) -> str | None:
        if self.pending is None or self.pending.generation != generation:
            pending = self.pending.generation if self.pending else "none"
            return f"generation {generation} is not pending (pending: {pending}, active: {self.active_generation})"
        member = self.pending.member(peer_id)
        if member is None:
            return f"{peer_id} is not a proposed member of generation {generation}"
        if member.incarnation != incarnation:
            return (f"{peer_id}#{incarnation} is not the proposed incarnation {peer_id}#{member.incarnation} "
                    f"of generation {generation} (I3)")
        return None

    # --- transitions -------------------------------------------------------------------------------

    def _evict(self, member: Member, why: str, at: float, effects: list[Effect]) -> None:
        self.members.remove(member)
        self.tombstones.append(Tombstone(member.peer_id, member.incarnation, why, at))
        effects.append(MemberEvicted(member.peer_id, member.incarnation, why))

    def _membership_changed(self, why: str, at: float, effects: list[Effect]) -> None:
        self._active_stops(at)
        if self.pending is not None:
            abandoned = self.pending
            self.history.append(HistoryEntry(abandoned.generation, "abandoned", why, abandoned.members, at))
            effects.append(ProposalAbandoned(abandoned.generation, why))
            self.pending = None
        if self.members and self._formation_complete():
            self._open(why, at, effects)

    def _active_stops(self, at: float) -> None:
        """The active generation makes no step from `at` on (a proposal opens: its members quiesce; or its
        membership changed and no member may be left to propose)."""
        if self.active is not None and self.active_until is None:
            self.active_until = at

    def _open(self, why: str, at: float, effects: list[Effect]) -> None:
        self._active_stops(at)
        self.last_generation += 1
        order, topology = ring_order(self.members, self.links)
        self.pending = Proposal(self.last_generation, self.active_generation, order, why, at, topology=topology)
        effects.append(ProposalOpened(self.pending.generation, self.pending.parent, self.pending.members, why))

    def _maybe_activate(self, at: float, position: LogPosition, effects: list[Effect]) -> None:
        proposal = self._open_proposal()
        election = proposal.election
        if election is None:
            return
        pulling = [p.peer_id for p in election.pulls] + [sp.peer_id for sp in election.shard_pulls]
        if any(peer_id not in proposal.synced for peer_id in pulling):
            return
        parent = self.active
        self.resumes.append((proposal.generation, election.frontier.revision))
        if election.lost_from() is not None:
            self.state_epoch += 1
            self.forks += ((self.state_epoch, election.frontier.revision),)
        recovery = self._recovery_note(election, at)
        self.hold_since = self.active_until = None
        if parent is None or set(parent.owners) != set(election.holders) or parent.ownership != election.ownership:
            self.ownership_version += 1
        kept = {m.identity for m in proposal.members}
        departed = tuple((m.peer_id, m.incarnation, self._tombstone_reason(m))
                         for m in (parent.members if parent else ()) if m.identity not in kept)
        cert = Certificate(
            job=self.job, generation=proposal.generation, parent=self.active_generation,
            members=proposal.members, reason=proposal.reason, frontier=election.frontier,
            quiescence=tuple((m.peer_id, m.incarnation, proposal.votes[m.peer_id].quiescence)
                             for m in proposal.members),
            revisions=tuple((m.peer_id, proposal.votes[m.peer_id].revision) for m in proposal.members),
            pulled=election.pulls, departed=departed, manifest_digest=election.frontier.digest,
            owners=election.holders, ownership_version=self.ownership_version,
            collective_seq_frontier=max(v.collective_seq for v in proposal.votes.values()),
            comm_id=proposal.votes[proposal.members[0].peer_id].comm_id,
            divergence=election.divergence, regressed_from=election.lost_from(),
            proposed_at=proposal.opened_at, activated_at=at, raft_term=position.term, raft_index=position.index,
            state_epoch=self.state_epoch, frontier_source=election.source, recovery=recovery,
            raft_epoch=self.raft_epoch, reformed=self.reform_note,
            ownership=election.ownership, objects=election.objects, moved=election.shard_pulls,
            topology=proposal.topology,
        )
        self.reform_note = ""
        self.active = cert
        self.pending = None
        self.history.append(HistoryEntry(cert.generation, "activated", cert.reason, cert.members, at, cert))
        effects.append(Activated(cert))
        self._reorder_if_due("links measured while it was pending", at, effects)

    def _recovery_note(self, election: Election, at: float) -> str:
        """The loud line a certificate carries when its frontier regressed or came from a checkpoint."""
        frontier = election.frontier
        source = "a checkpoint" if election.source == "checkpoint" else "the members' own state"
        lost = election.lost_from()
        if lost is None:
            return f"resumed from {source} at revision {frontier.revision}" if election.source == "checkpoint" else ""
        if election.regressed_from is None:
            return (f"REGRESSED from committed revision {lost} to revision {frontier.revision} "
                    f"({lost - frontier.revision} committed step(s) lost: their only holders died before their local "
                    f"copies were saved), from {source}; new state epoch {self.state_epoch}")
        since = self.hold_since if self.hold_since is not None else at
        waited = (f"after waiting {at - since:.1f} s for a holder, a local copy or a checkpoint"
                  if at >= since + self._regression_wait(election, since) else
                  f"after {at - since:.1f} s, when every incarnation that could hold it had said what it holds")
        above = f" (committed up to revision {lost})" if lost > election.regressed_from else ""
        return (f"REGRESSED from certified revision {election.regressed_from}{above} to revision {frontier.revision} "
                f"({lost - frontier.revision} committed step(s) lost), from {source}, {waited}; new state epoch "
                f"{self.state_epoch}")

    def _tombstone_reason(self, member: Member) -> str:
        for stone in reversed(self.tombstones):
            if (stone.peer_id, stone.incarnation) == member.identity:
                return stone.reason
        return "removed"


def _plan(topology: Topology | None) -> tuple:
    """What a rank map's topology makes the members do: the groups, and whether all_reduce goes hierarchical."""
    if topology is None or len(topology.groups) < 2:
        return ((), False)
    return (topology.groups, topology.hierarchical)


def _layout_line(layout: tuple[Partition, ...]) -> str:
    return ", ".join(f"{p.object_id}({p.describe()}, r={p.r})" for p in layout)


def _copied(value: Any) -> Any:
    """`value` as a snapshot holds it (see GenerationMachine.snapshot)."""
    if isinstance(value, Proposal):
        return dataclasses.replace(value, votes=dict(value.votes), synced=set(value.synced))
    if isinstance(value, deque):
        return deque(value, maxlen=value.maxlen)
    if isinstance(value, (list, dict, set)):
        return type(value)(value)
    return value


def _reformed(self: GenerationMachine, cmd: Reformed, position: LogPosition) -> Outcome:
    """Adopt the seed agent's state as the first entry of a new Raft epoch, then drop the lost agents' members
    and propose the survivors: generation and incarnation numbers continue above every one the seed had seen."""
    if not isinstance(cmd.base, GenerationMachine) or cmd.base.job != self.job:
        return Outcome.refused("reformed: the base is not a replicated state of this job")
    if cmd.epoch <= cmd.base.raft_epoch:
        return Outcome.refused(f"reformed: epoch {cmd.epoch} is not above the base's epoch {cmd.base.raft_epoch}")
    fresh = self.last_generation == 0 and not self.history and not self.members and not self.last_incarnation
    if self.raft_epoch == cmd.epoch and not fresh:
        return Outcome.replay(f"already re-formed in epoch {cmd.epoch}")
    if not fresh:
        return Outcome.refused(f"reformed: epoch {cmd.epoch} must be the first entry of a new Raft log")
    self.__dict__.update(copy.deepcopy(cmd.base.__dict__))
    self.raft_epoch = cmd.epoch
    lost = ", ".join(cmd.gone) or "none named"
    self.reform_note = f"re-formed in Raft epoch {cmd.epoch} from seed agent {cmd.seed} (lost for good: {lost})"
    effects: list[Effect] = []
    gone = set(cmd.gone)
    for member in [m for m in self.members if m.addr("agent") in gone]:
        self._evict(member, f"its agent {member.addr('agent')} is gone for good ({self.reform_note})", cmd.at,
                    effects)
    self._membership_changed(self.reform_note, cmd.at, effects)
    return Outcome(True, self.reform_note, tuple(effects))


_HANDLERS: dict[type, Callable[[GenerationMachine, Any, LogPosition], Outcome]] = {
    Reformed: _reformed,
    Kept: GenerationMachine._kept,
    Links: GenerationMachine._links,
    Configure: GenerationMachine._configure,
    Register: GenerationMachine._register,
    Suspect: GenerationMachine._suspect,
    Leave: GenerationMachine._leave,
    Reform: GenerationMachine._reform,
    Ready: GenerationMachine._ready,
    Synced: GenerationMachine._synced,
    Fallback: GenerationMachine._fallback,
}

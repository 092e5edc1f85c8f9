"""What one member does next: the follower's decisions between (and at the edges of) generations, as a pure
state machine. etcd-raft's `Ready`/`Advance` is the model: the shell (`p2pgen.peer.Peer`) gathers a `Local`
snapshot, asks `Follower.decide(view, local)` for one action, performs it, and reports the result with
`Follower.advance(action, ok)`. No I/O, no clock (time comes in the snapshot), no threads.

The actions, in the order a member meets them around one generation change:
    RunStep      -> the running generation is healthy: run the application's next step in it
    Retire       -> leave it (a collective failed, or a step boundary moved this member to a newer proposal):
                    abort the communicator and learn its quiescence
    AskReform    -> a collective failed and the job proposes nothing: ask for a new generation of the same members
                    (not while the fence holds, `core.view.cut_off`: such a generation would only be retired again;
                    a member the fence retired asks as soon as it lifts, not after REFORM_AFTER_S, even when it
                    lifted before the member's next decision)
    Vote         -> serve the state frozen as it is and vote `ready` for the pending generation
    Fetch        -> pull the elected frontier from its holders (or load it from a checkpoint this member offered)
    FetchShards  -> copy or rebuild the shards the election gave this member
    ReportSynced -> tell the job this member now holds the frontier (and its shards)
    NoteHold / AskFallback -> the proposal is held (its frontier would regress): say so once; past the hold's
                    deadline ask, about once a second, to fall back to the best state left
    Activate     -> the certificate names this member and the generation it voted for: build its communicator
    Wait         -> nothing to do until the view changes
    Exit         -> this incarnation must end (evicted, or quiescence unknown); its agent restarts it
    Stop         -> the application's loop ends normally (closed, or the harness's stop revision)
Invariants kept:
- I4: `Activate` only for a certificate naming this member of a generation it voted `ready` for (a vote whose
  answer was lost counts once the certificate names it), so never before every member quiesced and holds the
  frontier (core activates nothing else); and always then, even when a newer proposal is pending: the other
  members of that generation wait for this one in its first collective;
- I3: a tombstoned identity is told to `Exit` before anything else, and so is one that voted with an unknown
  quiescence: its old communicator may still be moving data it cannot account for;
- one vote per pending generation: a vote that the agent took is never repeated; one the agent could not take
  is retried on the next decision;
- a member reports `synced` only after its fetches for that generation succeeded, and a refused report makes it
  fetch again (the job holds a different digest than it pulled).
A `FollowerPolicy` turns the same machine into the chaos benchmark's baselines (`comm-only`: votes with no
state, so nobody pulls; `restart-all`: exits at every generation change, and votes only once every live agent's
process is proposed, as torchrun's rendezvous does).
"""

from __future__ import annotations

from dataclasses import dataclass

from p2pgen.core.model import Hold, Pull, ShardPull
from p2pgen.core.view import ActiveGeneration, Identity, JobView, PendingGeneration, cut_off

REFORM_AFTER_S = 1.5         # a failed collective with no membership change known: ask for a reform this often
FALLBACK_EVERY_S = 1.0       # a held proposal past its deadline: ask to fall back this often


@dataclass(frozen=True)
class FollowerPolicy:
    """How a member takes part. The default is p2pgen's (`certified`)."""

    report_state: bool = True         # False: vote revision 0 with no digest (nobody is ever told to pull)
    restart_on_change: bool = False   # True: a member that ran a generation exits at the next change
    rendezvous_s: float = 0.0         # > 0: vote only once every live agent's process is proposed, or after this
    last_call_s: float = 0.0          # ... and not before this (a view only says which agents it heard then)


CERTIFIED = FollowerPolicy()


@dataclass(frozen=True)
class Local:
    """What the member knows of itself at one decision. `now`: wall-clock seconds (hold deadlines are wall
    clock in the replicated state); `clock`: monotonic seconds, for this member's own intervals."""

    now: float
    clock: float
    running: int | None = None        # the generation whose communicator this member holds (None: none)
    failed: bool = False              # that communicator failed (a member left, a peer died, it was aborted)
    fenced: str = ""                  # why the fence aborted it (`core.view.cut_off`), when that was its failure
    switch_to: int | None = None      # a step boundary asked this member to move to this newer generation
    closed: bool = False
    at_stop: bool = False             # the state reached the revision a harness asked every member to end at


# --- actions ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunStep:
    generation: int


@dataclass(frozen=True)
class Retire:
    generation: int
    reason: str
    fence: str = ""                   # the fence aborted it, for this reason: a reform is owed once it lifts


@dataclass(frozen=True)
class AskReform:
    generation: int
    reason: str


@dataclass(frozen=True)
class Vote:
    generation: int
    quiescence: str
    collective_seq: int
    report_state: bool = True         # False: revision 0 and no digest (FollowerPolicy.report_state)


@dataclass(frozen=True)
class Fetch:
    generation: int
    pull: Pull                        # pull.checkpoint: load the frontier from the checkpoint this member offered


@dataclass(frozen=True)
class FetchShards:
    generation: int
    frontier_revision: int
    shard_pulls: tuple[ShardPull, ...]


@dataclass(frozen=True)
class ReportSynced:
    generation: int


@dataclass(frozen=True)
class NoteHold:
    generation: int
    hold: Hold


@dataclass(frozen=True)
class AskFallback:
    generation: int
    first: bool                       # the first ask for this generation (a refusal of it is worth an error line)


@dataclass(frozen=True)
class Activate:
    active: ActiveGeneration


@dataclass(frozen=True)
class Wait:
    reason: str


@dataclass(frozen=True)
class Exit:
    reason: str


@dataclass(frozen=True)
class Stop:
    reason: str


Action = (RunStep | Retire | AskReform | Vote | Fetch | FetchShards | ReportSynced | NoteHold | AskFallback | Activate
          | Wait | Exit | Stop)


@dataclass
class _Progress:
    """What this member did towards the next generation since it last left one."""

    since: float                      # clock when it started waiting for a generation
    quiescence: str = "proved"        # of the generation it left ("proved" when it left none)
    collective_seq: int = 0
    voted: int | None = None
    vote_unanswered: int | None = None   # generation of a vote it sent whose answer was lost (it may have committed)
    fetched: int | None = None        # generation whose frontier it holds after a pull or checkpoint load
    shards_fetched: int | None = None
    synced: int | None = None
    held: int | None = None           # generation whose hold it announced
    fallback_at: float | None = None  # clock of its last fallback ask (for `held`)
    last_reform: float = 0.0
    rendezvous: tuple[int, float] | None = None    # (generation, clock) it began waiting to vote for
    reform_owed: str = ""             # a reform to ask for before anything else (set by `owe_reform`)


class Follower:
    """One incarnation's decisions. `identity`: its (peer_id, incarnation)."""

    def __init__(self, identity: Identity, clock: float, policy: FollowerPolicy = CERTIFIED,
                 reform_after: float = REFORM_AFTER_S) -> None:
        self.identity, self.policy, self.reform_after = identity, policy, reform_after
        self.progress = _Progress(since=clock, last_reform=clock)
        self.exit_reason = ""

    @property
    def peer_id(self) -> str:
        return self.identity[0]

    def owe_reform(self, reason: str) -> None:
        """Ask for a reform of the active generation before voting (its agent voted on its behalf before this
        process attached: the job's generation is built on a vote this process did not make)."""
        self.progress.reform_owed = reason

    # --- deciding -----------------------------------------------------------------------------------------

    def decide(self, view: JobView, local: Local) -> Action:
        if self.exit_reason:
            return Exit(self.exit_reason)
        if local.closed:
            return Stop("the peer was closed")
        if local.at_stop:               # before anything else: every member ends at that revision, in any state
            return Stop("the state reached the revision the harness stops at")
        if view.evicted(self.identity):
            return Exit(f"{self.identity[0]}#{self.identity[1]} was evicted from job {view.job}")
        if local.running is not None:
            return self._while_running(local)
        return self._between(view, local)

    def _while_running(self, local: Local) -> Action:
        assert local.running is not None
        if local.switch_to is None and not local.failed:
            return RunStep(local.running)
        if self.policy.restart_on_change:
            return Exit(f"restart-all: generation {local.running} changed; every process restarts")
        if local.switch_to is not None:
            return Retire(local.running, f"joining generation {local.switch_to} at a step boundary")
        return Retire(local.running, "generation changed", fence=local.fenced)

    def _between(self, view: JobView, local: Local) -> Action:
        p, active, pending = self.progress, view.active, view.pending
        fenced = cut_off(view)
        if fenced is not None and active and active.has(self.identity) and p.voted is None:
            p.reform_owed = p.reform_owed or f"the fence lifted (its agent {fenced})"   # asked once it lifts
        if p.reform_owed and fenced is None:  # owed once, at the first decision between generations
            reason, p.reform_owed = p.reform_owed, ""
            if active and active.has(self.identity) and pending is None:
                return AskReform(active.generation, reason)
        if active and active.has(self.identity) and active.generation in (p.voted, p.vote_unanswered):
            # Before any newer proposal: its members may wait for us in it. A vote whose answer was lost counts
            # when the certificate names us: only our own Ready puts an attached incarnation into a generation.
            return Activate(active)
        if pending and pending.has(self.identity):
            return self._towards(pending, view, local)
        if fenced is not None and p.reform_owed:
            return Wait(f"this member's agent {fenced}: the reform waits until it hears the job and is heard")
        if active and active.has(self.identity) and p.voted is None and pending is None \
                and local.clock - p.last_reform > self.reform_after:
            return AskReform(active.generation, "collective failed with no membership change known")
        return Wait("no proposal names this member yet")

    def _towards(self, pending: PendingGeneration, view: JobView, local: Local) -> Action:
        p, g = self.progress, pending.generation
        if p.voted != g:
            if self._rendezvous_open(pending, view, local):
                return Wait(f"rendezvous: {len(pending.members)} of {view.agents} agents' processes proposed")
            return Vote(g, p.quiescence, p.collective_seq, self.policy.report_state)
        if pending.frontier is not None and p.synced != g:
            action = self._sync_step(pending)
            if action is not None:
                return action
        if pending.hold is not None:
            return self._held(pending, pending.hold, local)
        return Wait(f"generation {g}: waiting for the other members")

    def _sync_step(self, pending: PendingGeneration) -> Action | None:
        p, g = self.progress, pending.generation
        pull, shard_pulls = pending.pull_for(self.peer_id), pending.shard_pulls_for(self.peer_id)
        if pull is not None and p.fetched != g:
            return Fetch(g, pull)
        if shard_pulls and not (pull is not None and pull.checkpoint) and p.shards_fetched != g:
            assert pending.frontier is not None
            return FetchShards(g, pending.frontier.revision, shard_pulls)
        if pull is not None or shard_pulls:
            return ReportSynced(g)
        return None                           # it holds the frontier and every shard it is given

    def _held(self, pending: PendingGeneration, hold: Hold, local: Local) -> Action:
        p, g = self.progress, pending.generation
        if p.held != g:
            return NoteHold(g, hold)
        if local.now < hold.until:
            return Wait(f"generation {g} is held until {hold.until:.3f}")
        if p.fallback_at is not None and local.clock - p.fallback_at < FALLBACK_EVERY_S:
            return Wait(f"generation {g}: fallback asked {local.clock - p.fallback_at:.2f} s ago")
        return AskFallback(g, first=p.fallback_at is None)

    def _rendezvous_open(self, pending: PendingGeneration, view: JobView, local: Local) -> bool:
        """restart-all, as torchrun's rendezvous: wait until the proposal holds a process of every live agent and
        the last call is over, or until `rendezvous_s`. The last call matters: a process that just started decides
        on a view taken a moment ago, which may not count an agent that came back since (whose process is then
        left out, and its registration restarts everyone again)."""
        if self.policy.rendezvous_s <= 0:
            return False
        p = self.progress
        if p.rendezvous is None or p.rendezvous[0] != pending.generation:
            p.rendezvous = (pending.generation, local.clock)
        waited = local.clock - p.rendezvous[1]
        if waited >= self.policy.rendezvous_s:
            return False
        return waited < self.policy.last_call_s or len(pending.members) < view.agents

    # --- advancing ----------------------------------------------------------------------------------------

    def advance(self, action: Action, ok: bool | None, clock: float, quiescence: str = "proved",
                collective_seq: int = 0) -> None:
        """Record the result of `action`: `ok` True when done, False when the job refused it, None when it could
        not be done now (the agent could not take the command, a pull failed): it is decided again. `clock`:
        monotonic seconds when it finished. For `Retire`: the quiescence the retired communicator proved and the
        highest collective sequence it reached (both go into the next vote)."""
        p = self.progress
        match action:
            case Retire(fence=fence):
                self.progress = _Progress(since=clock, quiescence=quiescence, collective_seq=collective_seq,
                                          last_reform=clock,
                                          reform_owed=f"the fence lifted (its agent {fence})" if fence else "")
            case Vote(generation=generation, quiescence=voted_quiescence):
                if ok is not None:
                    p.voted = generation
                else:
                    p.vote_unanswered = generation
                if voted_quiescence == "unknown":
                    self.exit_reason = "could not prove quiescence of the old generation: restart as a new incarnation"
            case AskReform():
                p.last_reform = clock
            case Fetch(generation=generation) if ok:
                p.fetched = generation
            case FetchShards(generation=generation) if ok:
                p.shards_fetched = generation
            case ReportSynced(generation=generation):
                if ok:
                    p.synced = generation
                elif ok is False:             # the job holds another digest than it fetched: fetch again
                    p.fetched = p.shards_fetched = None
            case NoteHold(generation=generation):
                p.held, p.fallback_at = generation, None
            case AskFallback():
                p.fallback_at = clock
            case Activate():
                self.progress = _Progress(since=clock, last_reform=clock)


__all__ = [
    "Action", "Activate", "AskFallback", "AskReform", "CERTIFIED", "Exit", "Fetch", "FetchShards", "Follower",
    "FollowerPolicy", "Local", "NoteHold", "ReportSynced", "Retire", "RunStep", "Stop", "Vote", "Wait",
]

"""What an agent's driver does next about its own peer's member, as a pure state machine: the follower's model
(`p2pgen.core.follower`) for the agent. The shell (`p2pgen.agent.agent.Agent`) gathers an `AgentView` (the Raft
view's relevant parts, its application's and standby's status, elapsed times as numbers), folds it into its memory
(`observe`), asks `decide(view, local)` for one action, performs it (a Raft submit, a process launch or kill, a
rejoin) and records the result with `advance(local, action, outcome)`. No I/O, no clock, no threads.

A driver turn (`begin_turn`, then observe/decide/perform/advance until a resting action: `Wait`, `HandOver`,
`AwaitApp`) performs each kind of action at most once, as the level-triggered reconcile always did: what could
not be done (no quorum answered in time) is decided again on the next turn, never twice in one.

The actions, in the order a turn considers them:
    ReportDeath / StandbyLost / NoteLost / Reform / Leave -> an event, decided first: the application died (tell
                      the job, with the local copy it left; relaunch it later) or finished (leave), the standby
                      died, another agent is lost, `p2pgen recover` asked a re-form, the application stopped at a
                      drain's boundary
    Leave          -> the application failed more than --max-restarts times: record the leave and go
    Launch / PromoteStandby / Renumber -> admit this peer's member: start its application (or the agent's own
                      member) under a new incarnation
    AskMembership / Rejoin -> find out whether this agent's Raft node still belongs to the job; rejoin if not
    Configure / Register -> record the job's rules, then register the incarnation to register
    Launch / PromoteStandby -> relaunch a dead application once its incarnation retired (or the wait is over)
    StartStandby   -> start a warm standby (`--standby 1`)
    EvictLost      -> suspect the members of the agents reported lost
    KillApp        -> report and kill an application stopped for longer than the detector's timeout
    Evicted        -> this peer's member was evicted (or its registration refused): a new incarnation
    VoteReady      -> vote `ready` for this peer's member (an agent's own member, or an application that did
                      not attach within the grace)
    HandOver / StopApp / AwaitApp / Leave -> a drain's step (`steward.drain_step`)
Invariants kept:
- I3: every incarnation handed out is new: above every one the job saw and every one this agent handed to a
  process (one that died before it registered included); an incarnation evicted is never registered again: its
  application is killed, once, and the relaunch that follows its exit is the only one for that incarnation;
- at most one registration in flight: one incarnation to register at a time, retried (the same number) until
  an answer says it committed or was refused, or its process died;
- the agent votes at most once per (pending generation, incarnation), only for its own current member;
- `Leave` is final: once performed, the machine decides nothing but `Wait`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from p2pgen.core.generation import GenerationMachine
from p2pgen.core.model import Outcome
from p2pgen.core.steward import Drain, alone_active, drain_step, hand_over_due, relaunch_due, standby_due, vote_owed

STANDBY_QUIET_S = 1.0           # a standby starts once the application ran this long in the active generation,
STANDBY_SETTLE_S = 10.0         # ... or this long after it started
STANDBY_REPLACEMENTS = 3        # standbys that died waiting, in a row, after which the agent keeps none
MEMBERSHIP_CHECK_S = 1.0        # live members are asked whether this agent's voter is still one at most this often
TURN_S = 0.25                   # the driver's longest wait while a rule may act on the clock alone (`turn_wait`)
SETTLED_TURN_S = 1.0            # ... while none can: what it waits for wakes it (an event, a new Raft view)
DONE = Outcome(True, "done")    # the outcome of an action that is no Raft command, performed


# --- what the driver knows ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class AgentRules:
    """The agent's configuration, as far as its decisions go."""

    peer_id: str
    supervises: bool = False          # it runs an application (`--command`); else its member is the agent itself
    configured: bool = True           # the job's rules need no `Configure` (one member, no state rules)
    attach_grace: float = float("inf")   # an application not attached by then gets the agent's vote
    max_restarts: int = 10
    retire_wait: float = 5.0          # longest wait for a dead incarnation's generation to retire
    standby: bool = False             # keep a warm standby of the application
    detector_timeout: float = 1.5     # an application stopped this long is reported; twice: long leaderless


@dataclass(frozen=True)
class AppStatus:
    """This peer's current application process (the last one started or promoted)."""

    incarnation: int | None
    attached: bool = False            # it called `p2pgen.join()` and attached
    age: float = 0.0                  # seconds since it started
    exited: bool = False
    stopped_for: float | None = None  # seconds since it was stopped (SIGSTOP), None while it runs


@dataclass(frozen=True)
class StandbyStatus:
    """The warm standby kept by the agent, not yet promoted."""

    exited: bool = False
    stopped: bool = False             # stopped (SIGSTOP) while it waited: it would never attach


@dataclass(frozen=True)
class AppExited:
    """The current application exited (`clean`: with code 0)."""

    incarnation: int
    why: str
    clean: bool = False


@dataclass(frozen=True)
class StandbyExited:
    """The waiting standby died."""

    pid: int
    why: str


@dataclass(frozen=True)
class AppStoppedAtBoundary:
    """The current application stopped at a step boundary, as the drain asked, and is exiting."""

    incarnation: int


@dataclass(frozen=True)
class AgentLost:
    """The heartbeats say another agent is gone (`instance` "": any process at that address)."""

    addr: str
    instance: str
    why: str


@dataclass(frozen=True)
class ReformAsked:
    """`p2pgen recover` asked this agent to move to Raft epoch `epoch`, seeded by the agent at `seed`."""

    epoch: int
    seed: str
    gone: tuple[str, ...] = ()


Event = AppExited | StandbyExited | AppStoppedAtBoundary | AgentLost | ReformAsked


@dataclass(frozen=True)
class AgentView:
    """What the driver gathered for one decision. `clock`: monotonic seconds; `wall`: seconds since the epoch
    (the replicated state's `Kept` notes are wall clock)."""

    clock: float
    wall: float = 0.0
    machine: GenerationMachine | None = None   # the replicated state; None while the agent has no Raft node
    leader: bool = True               # a Raft leader is heard
    voter: bool = False               # the agent's node is a voter
    removed: bool = False             # its voter applied its own removal
    removed_reason: str | None = None  # why its voter is no voter any more, as far as it can tell by itself
    stalled: bool = False             # the driver's last turn came late (the agent was stopped or starved)
    app: AppStatus | None = None
    standby: StandbyStatus | None = None
    heard: tuple[tuple[str, str], ...] = ()    # (control address, instance) of every agent heard
    leaving: bool = False             # a leave was requested
    drain: Drain | None = None        # the drain under way (with `leaving`)
    local_copy: tuple[int, int] | None = None  # (revision, generation) of the local copy here, while draining
    pending_voter: bool = False       # a voter node is being prepared for this agent (the turn promotes it)
    event: Event | None = None


@dataclass(frozen=True)
class Relaunch:
    """An application that exited, to be restarted once its incarnation retired (or at `due`, monotonic)."""

    incarnation: int
    due: float


@dataclass(frozen=True)
class AgentLocal:
    """The driver's own memory, replaced (never changed) by `observe`, `begin_turn` and `advance`."""

    rules: AgentRules
    admitted: bool = False            # its first member was started
    configured: bool = False          # the job's rules are recorded (or need no recording)
    incarnation: int | None = None    # the incarnation of this peer's member, registered
    to_register: int | None = None    # an incarnation to register (retried each turn until an answer comes)
    handed_out: int = 0               # the highest incarnation number handed to a process
    refused: str = ""                 # why the last registration was refused (a new incarnation follows)
    voted: tuple[int, int] | None = None      # (generation, incarnation) it last voted ready for
    relaunch: Relaunch | None = None
    killing: tuple[int, bool] | None = None   # (incarnation of the application being killed, counts as a failure)
    restarts: int = 0                 # application failures counted against --max-restarts
    give_up: str = ""                 # why the agent must leave (its application failed too often)
    exit_code: int = 0
    standby_deaths: int = 0           # standbys that died while waiting, in a row
    active_seen: tuple[int | None, float] = (None, 0.0)   # (active generation, clock when first seen)
    lost: tuple[tuple[tuple[str, str], str], ...] = ()   # ((agent address, instance), why it is lost)
    leaderless_since: float | None = None
    last_membership_check: float = 0.0
    rejoin_owed: str = ""             # a live member said this agent's voter is out: rejoin for this reason
    drain_said: str = ""              # the drain's last reason, as logged
    left: bool = False
    done: frozenset[str] = field(default_factory=frozenset)   # kinds of action performed this turn

    @classmethod
    def start(cls, rules: AgentRules) -> AgentLocal:
        """The memory of an agent that just joined the job."""
        return cls(rules, configured=rules.configured)


# --- actions -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Configure:
    """Record the job's rules (minimum members, regression rules) before the first registration."""


@dataclass(frozen=True)
class Register:
    incarnation: int


@dataclass(frozen=True)
class Renumber:
    """The agent's own member (no application) takes a new incarnation, to register."""

    incarnation: int


@dataclass(frozen=True)
class Launch:
    """Start a new application process as `incarnation` (first killing a stopped standby, `kill_standby`)."""

    incarnation: int
    kill_standby: bool = False


@dataclass(frozen=True)
class PromoteStandby:
    """The waiting standby becomes the application, as `incarnation` (it did its imports already)."""

    incarnation: int


@dataclass(frozen=True)
class StartStandby:
    pass


@dataclass(frozen=True)
class StandbyLost:
    """The standby died waiting: forget it; `deaths` in a row now (it is replaced below STANDBY_REPLACEMENTS)."""

    pid: int
    why: str
    deaths: int


@dataclass(frozen=True)
class VoteReady:
    generation: int
    incarnation: int


@dataclass(frozen=True)
class KillApp:
    """Kill the application of `incarnation` (`report`: first tell the job it is gone, `why`); `counted`: its
    exit counts as a failure."""

    incarnation: int
    why: str
    counted: bool
    report: bool


@dataclass(frozen=True)
class ReportDeath:
    """The application died: tell the job, with the local copy it left; `counted` against --max-restarts; its
    next incarnation starts once it retired or at `relaunch_at`."""

    incarnation: int
    why: str
    counted: bool
    relaunch_at: float


@dataclass(frozen=True)
class Evicted:
    """This peer's member `incarnation` was evicted (None: a registration was refused): it is forgotten, and
    its successor comes as `renumber` (the agent's own member) or from killing the application `kill`."""

    incarnation: int | None
    why: str
    renumber: int | None = None
    kill: int | None = None


@dataclass(frozen=True)
class NoteLost:
    addr: str
    instance: str
    why: str


@dataclass(frozen=True)
class EvictLost:
    """Suspect the members of lost agents, `suspects` (peer, incarnation, reason); forget the lost agents of
    `forget` (no member of theirs is left, or they were heard again)."""

    suspects: tuple[tuple[str, int, str], ...]
    forget: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class AskMembership:
    """Ask live members whether this agent's voter is still one (`voter` False: a non-voter asks nobody)."""

    why: str | None
    at: float
    voter: bool


@dataclass(frozen=True)
class Rejoin:
    """Drop this agent's Raft node and join again as a non-voting member; `at`: the clock of the membership check
    this concludes (None: no check was needed)."""

    why: str | None
    at: float | None = None


@dataclass(frozen=True)
class Reform:
    epoch: int
    seed: str
    gone: tuple[str, ...]


@dataclass(frozen=True)
class HandOver:
    """Drain: stay, training on, while this peer alone holds steps another member can take (`where`)."""

    why: str
    say: bool
    where: str


@dataclass(frozen=True)
class StopApp:
    """Drain: ask the application to stop at its next step boundary."""

    why: str
    say: bool


@dataclass(frozen=True)
class AwaitApp:
    """Drain: the application was asked to stop and finishes its step in flight."""

    why: str
    say: bool


@dataclass(frozen=True)
class Leave:
    """Leave the job (final). `app_stopping`: the application stopped at a boundary and exits by itself; `say`:
    `why` is to be logged (a drain's reason is logged once)."""

    why: str
    exit_code: int = 0
    app_stopping: bool = False
    say: bool = True


@dataclass(frozen=True)
class Wait:
    reason: str


Action = (Configure | Register | Renumber | Launch | PromoteStandby | StartStandby | StandbyLost | VoteReady | KillApp
          | ReportDeath | Evicted | NoteLost | EvictLost | AskMembership | Rejoin | Reform | HandOver | StopApp
          | AwaitApp | Leave | Wait)
RESTING = (Wait, HandOver, AwaitApp)   # a turn ends with one of these


# --- observing ----------------------------------------------------------------------------------------------

def begin_turn(local: AgentLocal) -> AgentLocal:
    """A new driver turn: every kind of action may be performed once again (the same memory after a turn that
    only waited: most turns of an idle agent)."""
    return replace(local, done=frozenset()) if local.done else local


def observe(local: AgentLocal, view: AgentView) -> AgentLocal:
    """Fold what the view shows into the driver's memory: since when no Raft leader is heard, and since when
    the active generation is the one it is now (the standby's quiet).

    Args:
        local: the driver's memory.
        view: what it gathered now (nothing is folded while it has no Raft node).
    """
    if view.machine is None:
        return local
    since = None if view.leader else (local.leaderless_since if local.leaderless_since is not None else view.clock)
    active = view.machine.active
    generation = active.generation if active is not None else None
    seen = local.active_seen if local.active_seen[0] == generation else (generation, view.clock)
    if (since, seen) == (local.leaderless_since, local.active_seen):
        return local
    return replace(local, leaderless_since=since, active_seen=seen)


# --- deciding -----------------------------------------------------------------------------------------------

def decide(view: AgentView, local: AgentLocal) -> Action:
    """The driver's next action for this view (an event in it first), of a kind not yet performed this turn.

    Args:
        view: what the driver gathered, `observe`d into `local`.
        local: the driver's memory.
    """
    if local.left:
        return Wait("this agent left the job")
    if view.event is not None:
        return _on_event(view.event, view, local)
    for rule in RULES:
        action = rule(view, local)
        if action is not None and type(action).__name__ not in local.done:
            return action
    return Wait("nothing to do until the view changes")


def turn_wait(view: AgentView, local: AgentLocal) -> float:
    """How long the driver may wait for an event after a turn that rested on `view`: SETTLED_TURN_S when no rule
    can act on the clock alone (`settled`), else TURN_S.

    Args:
        view: the view the turn's resting action was decided on.
        local: the driver's memory after that action.
    """
    return SETTLED_TURN_S if settled(view, local) else TURN_S


def settled(view: AgentView, local: AgentLocal) -> bool:
    """No rule can act on the clock alone: the member is registered and running, a leader is heard, nothing is
    lost, relaunched, drained, stopped, suspected of removal or waiting for a standby, a voter in preparation or
    an attach grace to run out, and the next turn would not try again what this one could not do (a vote or a
    registration that found no quorum). Whatever ends this comes as an event or a new Raft view (which wake the
    driver), or as the driver's own lateness (`stalled`, judged against the wait it planned).

    Args:
        view: what the driver gathered.
        local: the driver's memory.
    """
    app, rules = view.app, local.rules
    if view.machine is None or not view.leader or view.removed or view.removed_reason is not None or view.stalled \
            or view.leaving or view.pending_voter:
        return False
    if not local.admitted or local.to_register is not None or local.refused or local.relaunch is not None or \
            local.lost or local.rejoin_owed or local.give_up:
        return False
    if app is not None and (app.exited or app.stopped_for is not None or
                            (not app.attached and app.age <= rules.attach_grace < float("inf"))):
        return False
    wants_standby = rules.standby and rules.supervises and local.standby_deaths < STANDBY_REPLACEMENTS
    if wants_standby and view.standby is None:
        return False
    return isinstance(decide(view, begin_turn(local)), RESTING)


def next_incarnation(machine: GenerationMachine, local: AgentLocal) -> int:
    """A number no process of this peer ever had: above every one the job saw and every one this agent handed
    out (a process that died before it registered included), so no two processes share it (I3).

    Args:
        machine: the replicated state (its `last_incarnation` of the peer).
        local: the driver's memory (what it handed out, registers, registered).
    """
    seen = machine.last_incarnation.get(local.rules.peer_id, 0)
    return max(seen, local.to_register or 0, local.incarnation or 0, local.handed_out) + 1


def _on_event(event: Event, view: AgentView, local: AgentLocal) -> Action:
    rules = local.rules
    match event:
        case AppExited(incarnation, why, clean):
            killing = local.killing
            counted = killing is None or killing[0] != incarnation or killing[1]
            if clean:
                return Leave("application finished cleanly; leaving the job")
            return ReportDeath(incarnation, f"application {why}", counted, view.clock + rules.retire_wait)
        case StandbyExited(pid, why):
            return StandbyLost(pid, why, local.standby_deaths + 1)
        case AppStoppedAtBoundary():
            return Leave("draining: the application stopped at a step boundary; recording the leave while it "
                         "exits", local.exit_code, app_stopping=True)
        case AgentLost(addr, instance, why):
            return NoteLost(addr, instance, why)
        case ReformAsked(epoch, seed, gone):
            return Reform(epoch, seed, gone)


def _give_up(view: AgentView, local: AgentLocal) -> Action | None:
    """An application that failed more than --max-restarts times ends this agent's part in the job."""
    return Leave(local.give_up, local.exit_code) if local.give_up else None


def _admit(view: AgentView, local: AgentLocal) -> Action | None:
    """This peer's first member: the application's incarnation, or the agent's own."""
    if local.admitted or view.machine is None:
        return None
    number = next_incarnation(view.machine, local)
    return Launch(number) if local.rules.supervises else Renumber(number)


def _membership(view: AgentView, local: AgentLocal) -> Action | None:
    """Whether this agent's Raft node still belongs to the job. Certain: its voter applied its own removal.
    Asked of live members (at most once a second): after its own stall, when the others refuse its voter, or when
    no leader was heard for long. A non-voting member without a leader for long rebuilds its node from fresh
    hellos (the voters it knew may be gone)."""
    if view.machine is None:
        return None
    if local.rejoin_owed:
        return Rejoin(local.rejoin_owed)
    long_leaderless = (local.leaderless_since is not None
                       and view.clock - local.leaderless_since > 2 * local.rules.detector_timeout)
    why = view.removed_reason
    if view.removed:
        return Rejoin(why)
    if why is None and not view.stalled and not long_leaderless:
        return None
    if view.clock - local.last_membership_check < MEMBERSHIP_CHECK_S:
        return None
    if not view.voter and long_leaderless:
        return Rejoin("no leader heard for a long time", view.clock)
    return AskMembership(why, view.clock, view.voter)


def _register(view: AgentView, local: AgentLocal) -> Action | None:
    """Register the incarnation to register, once its application may become a member; a refusal means a new
    incarnation (`_evicted`)."""
    if view.machine is None:
        return None
    if local.refused:
        return _evicted(view.machine, view, local, None, local.refused)
    incarnation = local.to_register
    if incarnation is None or not _ready_to_register(view, local, incarnation):
        return None
    return Register(incarnation) if local.configured else Configure()


def _ready_to_register(view: AgentView, local: AgentLocal, incarnation: int) -> bool:
    """An application becomes a member once it attached (`p2pgen.join()`, after its imports and setup), or
    once the attach grace is over for one that does not speak p2pgen. Until then the others keep forming
    generations without it, instead of waiting in every proposal for a process still starting up."""
    app = view.app
    if app is None or app.incarnation != incarnation or app.attached:
        return True
    return app.age >= local.rules.attach_grace


def _relaunch(view: AgentView, local: AgentLocal) -> Action | None:
    """Relaunch once the others certified a generation without the dead incarnation (bounded wait: if nobody
    else can form one, go on): the warm standby promoted if one waits alive (a stopped one is killed), else a
    new process. Either way the number is new and registers through Raft."""
    relaunch, machine = local.relaunch, view.machine
    if relaunch is None or machine is None:
        return None
    if not relaunch_due(machine, (local.rules.peer_id, relaunch.incarnation), view.clock, relaunch.due):
        return None
    number, spare = next_incarnation(machine, local), view.standby
    if spare is not None and not spare.stopped and not spare.exited:
        return PromoteStandby(number)
    return Launch(number, kill_standby=spare is not None and spare.stopped)


def _standby(view: AgentView, local: AgentLocal) -> Action | None:
    """Start a standby when the job wants one and none is waiting: once the application ran a second in the
    active generation (or a while after it started; `standby_due`), so its imports never slow down the start
    and first steps of the incarnation it would replace. Not while leaving, and not after STANDBY_REPLACEMENTS
    died in a row."""
    rules, machine, app = local.rules, view.machine, view.app
    if (machine is None or not rules.standby or not rules.supervises or view.standby is not None or view.leaving
            or local.standby_deaths >= STANDBY_REPLACEMENTS):
        return None
    live = app is not None and not app.exited and app.incarnation is not None and local.incarnation == app.incarnation
    identity = (rules.peer_id, app.incarnation) if live and app is not None and app.incarnation is not None else None
    if not standby_due(machine, identity, app.age if app is not None else 0.0, STANDBY_SETTLE_S,
                       view.clock - local.active_seen[1], STANDBY_QUIET_S):
        return None
    return StartStandby()


def _evict_lost(view: AgentView, local: AgentLocal) -> Action | None:
    """Suspect every member run by an agent reported lost, at every turn until none is left in the job (a Suspect
    that found no quorum is not dropped) or that process is heard again. A member registered by a newer process at
    that address (another agent instance) is left alone; an empty instance (an agent never heard) means any
    process there. An exact local copy a dead incarnation left on that agent's host is reported too (its
    incarnation suspected again) unless another agent process is heard at that address: with no agent to
    restart the application there, the job waits for it only as long as its steps are worth."""
    if not local.lost or view.machine is None:
        return None
    heard = dict(view.heard)
    suspects: list[tuple[str, int, str]] = []
    forget: list[tuple[str, str]] = []
    for (addr, instance), why in local.lost:
        back = heard.get(addr)
        heard_again = back is not None and (not instance or back == instance)
        doomed = [m for m in view.machine.members if m.addr("agent") == addr
                  and (not instance or m.addr("agent_instance") in (None, instance))]
        stranded = [k for k in view.machine.kept.values() if k.agent == addr and k.exact and not k.agent_lost
                    and back is None]                   # a new agent heard there restarts the application
        if not (doomed or stranded) or heard_again:
            forget.append((addr, instance))
            continue
        suspects += [(m.peer_id, m.incarnation, f"agent {addr} {why}") for m in doomed]
        suspects += [(k.peer_id, k.incarnation, f"agent {addr} {why}") for k in stranded]
    return EvictLost(tuple(suspects), tuple(forget))


def _stopped(view: AgentView, local: AgentLocal) -> Action | None:
    """An application stopped (SIGSTOP) for longer than the detector's timeout is reported and killed, unless it
    is being killed already or has exited (the job evicted it: that kill does not count against --max-restarts)."""
    app, timeout = view.app, local.rules.detector_timeout
    if view.machine is None or app is None or app.incarnation is None or app.stopped_for is None \
            or app.stopped_for <= timeout or app.exited:
        return None
    if local.killing is not None and local.killing[0] == app.incarnation:
        return None
    return KillApp(app.incarnation, f"application stopped for more than {timeout:.2f} s", counted=True, report=True)


def _eviction(view: AgentView, local: AgentLocal) -> Action | None:
    """This peer's member was evicted by the job: never registered again (I3)."""
    machine, incarnation = view.machine, local.incarnation
    if machine is None or incarnation is None or not machine.was_evicted(local.rules.peer_id, incarnation):
        return None
    return _evicted(machine, view, local, incarnation, f"{local.rules.peer_id}#{incarnation} was evicted by the job")


def _evicted(machine: GenerationMachine, view: AgentView, local: AgentLocal, incarnation: int | None,
             why: str) -> Evicted:
    """The agent's own member registers again as a new incarnation; an application is killed (its exit relaunches
    it as a new incarnation), unless it is being killed already."""
    app = view.app
    if app is None:
        return Evicted(incarnation, why, renumber=next_incarnation(machine, replace(local, incarnation=None)))
    killing = local.killing is not None and local.killing[0] == app.incarnation
    return Evicted(incarnation, why, kill=None if killing else app.incarnation)


def _vote(view: AgentView, local: AgentLocal) -> Action | None:
    """The agent votes for its own member, or for an application that did not attach within the grace."""
    machine, incarnation, app = view.machine, local.incarnation, view.app
    if machine is None or incarnation is None:
        return None
    generation = vote_owed(machine, local.rules.peer_id, incarnation, local.voted)
    if generation is None or (app is not None and (app.attached or app.age <= local.rules.attach_grace)):
        return None
    return VoteReady(generation, incarnation)


def _drain(view: AgentView, local: AgentLocal) -> Action | None:
    """A drain's turn (`drain_step`): hand the state over first if this peer alone holds steps another member can
    take (it is the whole active generation, or its dead application left the local copy the job waits for: the
    agent goes on as before, its application training or restarting to restore that copy, at most
    --regress-wait); then ask the application to stop at its next step boundary (it exits on its own, and its exit
    leaves the job); then leave, by the drain's deadline whatever happens."""
    drain = view.drain
    if drain is None or not view.leaving:
        return None
    app, machine = view.app, view.machine
    identity = (local.rules.peer_id, local.incarnation)
    stoppable = app is not None and app.attached and not app.exited
    hand_over = machine is not None and app is not None and hand_over_due(machine, identity, view.wall,
                                                                           view.local_copy)
    move, why = drain_step(drain, view.clock, hand_over, stoppable)
    say = why != local.drain_said
    if move == "stay":
        alone = machine is not None and alone_active(machine, identity)
        return HandOver(why, say, "its member alone is the active generation" if alone else
                        "the local copy its application left on this host, which the job waits for")
    if move == "stop_app":
        return StopApp(why, say)
    if move == "wait_app":
        return AwaitApp(why, say)
    return Leave(f"draining: {why}", local.exit_code, say=say)


RULES: tuple[Callable[[AgentView, AgentLocal], Action | None], ...] = (
    _give_up, _admit, _membership, _register, _relaunch, _standby, _evict_lost, _stopped, _eviction, _vote, _drain)


# --- advancing ----------------------------------------------------------------------------------------------

def advance(local: AgentLocal, action: Action, outcome: Outcome | None) -> AgentLocal:
    """What the agent remembers after performing `action`.

    Args:
        local: the driver's memory when it decided `action`.
        action: what it performed.
        outcome: the job's answer to the command it submitted (DONE for an action that submits none; for
            `AskMembership`, ok when a live member says this voter is out), None when it could not be done now
            (no quorum answered in time, or the answer was lost: it may have committed).
    """
    if isinstance(action, Wait):
        return local          # it changes nothing; `done` screens the rules' actions, and no rule waits
    local = replace(local, done=local.done | {type(action).__name__})
    match action:
        case Configure():
            return replace(local, configured=outcome is not None)
        case Register(incarnation):
            if outcome is None:
                return local
            if not outcome.ok:
                return replace(local, to_register=None, refused=f"registration refused ({outcome.reason})")
            return replace(local, to_register=None, incarnation=incarnation)
        case Renumber(incarnation):
            return replace(local, admitted=True, to_register=incarnation, handed_out=incarnation)
        case Launch(incarnation):
            return replace(local, admitted=True, relaunch=None, to_register=incarnation, handed_out=incarnation)
        case PromoteStandby(incarnation):
            return replace(local, admitted=True, relaunch=None, to_register=incarnation, handed_out=incarnation,
                           standby_deaths=0)
        case StandbyLost(deaths=deaths):
            return replace(local, standby_deaths=deaths)
        case VoteReady(generation, incarnation):
            return local if outcome is None else replace(local, voted=(generation, incarnation))
        case KillApp(incarnation, counted=counted):
            return replace(local, killing=(incarnation, counted))
        case ReportDeath():
            return _after_death(local, action)
        case Evicted(incarnation, renumber=renumber, kill=kill):
            local = replace(local, refused="", incarnation=None if incarnation is not None else local.incarnation)
            if renumber is not None:
                local = replace(local, to_register=renumber, handed_out=renumber)
            return replace(local, killing=(kill, False)) if kill is not None else local
        case NoteLost(addr, instance, why):
            return replace(local, lost=_with(local.lost, (addr, instance), why))
        case EvictLost(forget=forget):
            return replace(local, lost=tuple((k, why) for k, why in local.lost if k not in forget))
        case AskMembership(why, at):
            owed = (why or "a live member says this voter is no longer in the configuration") \
                if outcome is not None and outcome.ok else ""
            return replace(local, last_membership_check=at, rejoin_owed=owed)
        case Rejoin(at=at):   # what was judged before the rejoin is judged afresh, as the heartbeats are
            checked = local.last_membership_check if at is None else at
            return replace(local, leaderless_since=None, lost=(), rejoin_owed="", last_membership_check=checked)
        case Reform():
            ok = outcome is not None and outcome.ok
            return replace(local, leaderless_since=None, lost=()) if ok else local
        case HandOver(why) | StopApp(why) | AwaitApp(why):
            return replace(local, drain_said=why)
        case Leave(exit_code=exit_code):
            return replace(local, left=True, exit_code=exit_code)
    return local


def _after_death(local: AgentLocal, death: ReportDeath) -> AgentLocal:
    """A dead application counts against --max-restarts (unless the agent killed it for the job) and is relaunched
    as a new incarnation, once, after its incarnation retired."""
    restarts = local.restarts + int(death.counted)
    local = replace(local, killing=None, restarts=restarts)
    if restarts > local.rules.max_restarts:
        return replace(local, exit_code=1, give_up=f"application failed {restarts} times (--max-restarts "
                                                     f"{local.rules.max_restarts}); leaving the job")
    inc = death.incarnation
    return replace(local, incarnation=None if local.incarnation == inc else local.incarnation,
                   to_register=None if local.to_register == inc else local.to_register,
                   relaunch=Relaunch(inc, death.relaunch_at))


def _with(pairs: tuple[tuple[tuple[str, str], str], ...], key: tuple[str, str],
          value: str) -> tuple[tuple[tuple[str, str], str], ...]:
    if any(k == key for k, _ in pairs):
        return tuple((k, value if k == key else v) for k, v in pairs)
    return (*pairs, (key, value))


__all__ = [
    "Action", "AgentLocal", "AgentLost", "AgentRules", "AgentView", "AppExited", "AppStatus", "AppStoppedAtBoundary",
    "AskMembership", "AwaitApp", "Configure", "DONE", "Event", "EvictLost", "Evicted", "HandOver", "KillApp",
    "Launch", "Leave", "NoteLost", "PromoteStandby", "RESTING", "ReformAsked", "Reform", "Register", "Rejoin",
    "Relaunch", "Renumber", "ReportDeath", "STANDBY_QUIET_S", "STANDBY_REPLACEMENTS", "STANDBY_SETTLE_S",
    "StandbyExited", "StandbyLost", "StandbyStatus", "StartStandby", "StopApp", "VoteReady", "Wait", "advance",
    "begin_turn", "decide", "next_incarnation", "observe",
]

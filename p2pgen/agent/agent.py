"""The per-host agent: Raft membership, failure detector, supervision of the application, control API.

Owns: one peer's participation in the job. It joins the Raft group (through any live member; no member is
special; `raftmember`), registers the peer's current incarnation, votes `ready` for an application that does
not speak the protocol itself, reports deaths (of its own application at once, from the OS; of other hosts from
missed heartbeats or from a new process announcing itself at their address), restarts its application as a new
incarnation (the warm standby promoted when it keeps one, `--standby 1`), keeps the voter set healthy while
its node leads (`voters`), measures the links from its host to the job's other hosts (`probe`), and serves
`show`, `history` and the application's local API.

Threads: the RPC server (one thread per connection), the Raft node(s), the heartbeat runner, the voter manager,
the link prober, waitpid waiters, and the *driver*, the only thread that decides about this peer's member
(register it, relaunch its application, vote for an application that did not attach, react to its eviction): it
consumes events and the latest Raft view, level-triggered (it compares the replicated state with what it wants,
every turn). Its decisions are the pure machine `p2pgen.core.agentmachine`: each turn it gathers a view, asks
the machine, performs what it decided and records the result (gather, decide, perform, advance). Other threads
act on Raft too, on request: an RPC thread submits its application's commands and prepares a voter node when the
leader's voter manager asks (`prepare_voter`), the voter manager changes the voter set while this agent's node
leads, and the link prober records the rates it measured. The driver never blocks for long: registrations, votes
and relaunches are retried on its next turn, so an event (a leave, an exit) is always handled within a turn.
Invariants kept:
- I3: every incarnation this agent registers is new (the last one seen in the replicated state + 1); an
  incarnation it learns was evicted is never used again: the application is killed and restarted once;
- I7: nothing here is special to one agent; any live agent can admit a joiner or evict a dead peer, and the
  voter set is repaired by whichever agent's node leads;
- I8: every control connection, heartbeat and Raft connection is authenticated with the job secret;
- no transient loss makes the agent exit: it retries, says so once in its log and in `show` (`waiting`).
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import tempfile
import threading
import time
from dataclasses import dataclass, field

from p2pgen import faults
from p2pgen.agent import notice
from p2pgen.agent.client import STANDBY_POLL_S
from p2pgen.agent.heartbeat import Announcement, HeartbeatRunner, WatchPlan
from p2pgen.agent.probe import PROBE_BYTES, LinkProber, serve_probe
from p2pgen.agent.raftmember import JoinError, RaftMembership, control_addr_of
from p2pgen.agent.rpc import RpcServer, split_addr
from p2pgen.agent.statedir import StateDirConfig
from p2pgen.agent.supervisor import Application
from p2pgen.agent.voters import VoterManager
from p2pgen.agent.wire import command_from_wire
from p2pgen.auth import derive_key
from p2pgen.core import Command, Configure, Kept, Leave, Links, Outcome, Ready, Suspect
from p2pgen.core import Register as RegisterCommand
from p2pgen.core import agentmachine as am
from p2pgen.core.agentmachine import (
    DONE,
    STANDBY_REPLACEMENTS,
    AgentLocal,
    AgentRules,
    advance,
    begin_turn,
    decide,
    observe,
)
from p2pgen.core.heartbeats import acts_on_loss
from p2pgen.core.leaving import (
    NO_SUCCESSOR,
    VOTERS_DOWN,
    Said,
    leave_plan,
    said_after_asking,
    said_without_quorum,
    shrink_plan,
)
from p2pgen.core.render import history_json, state_json
from p2pgen.core.steward import Drain, drain_asked
from p2pgen.detect import DetectorConfig
from p2pgen.errors import P2PGenError
from p2pgen.raft.node import RaftTiming, RaftUnavailable, RaftView
from p2pgen.raft.trace import ENV_DIR, Trace
from p2pgen.transport import seal

log = logging.getLogger(__name__)

__all__ = ["Agent", "AgentConfig", "JoinError", "PORTS_PER_AGENT", "port_of"]

SUBMIT_TIMEOUT_S = 5.0          # an application's command waits this long for a Raft quorum (the RaftNode default)
STALL_LEASE_S = 0.3            # a stall report holds this long (the application repeats it every 0.05 s)
PORT_OFFSETS = {"agent": 0, "raft": 1, "data": 2, "state": 3, "channel": 4}   # from the control port (README)
PORTS_PER_AGENT = len(PORT_OFFSETS)
SUBMIT_TIMEOUT_S = 1.0          # one driver turn's wait for a commit; the next turn retries


def port_of(control_addr: str, role: str) -> str:
    """The address of one of an agent's ports: control (agent), Raft, data plane, state transfer, channels."""
    host, port = split_addr(control_addr)
    return f"{host}:{port + PORT_OFFSETS[role]}"


def raft_trace_dir(flag: str) -> str:
    """Where the agent writes its Raft trace: --trace-dir, else $P2PGEN_TRACE_DIR/raft (the applications' own
    traces live in $P2PGEN_TRACE_DIR itself), else nowhere."""
    if flag:
        return flag
    shared = os.environ.get(ENV_DIR, "")
    return os.path.join(shared, "raft") if shared else ""


@dataclass
class AgentConfig:
    job: str
    peer_id: str
    listen: str                                   # control address HOST:PORT; see PORT_OFFSETS
    secret: bytes
    secret_file: str | None = None                # handed to the application (None: insecure demo secret)
    peers: list[str] = field(default_factory=list)
    command: list[str] | None = None
    max_restarts: int = 10
    min_members: int = 1
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    raft: RaftTiming = field(default_factory=RaftTiming)
    retire_wait: float = 5.0                      # max wait for the dead incarnation's generation to retire
    channel_dir: str = ""                         # consumption logs of this peer's channels (kept across incarnations)
    attach_grace: float = float("inf")           # an application not attached by then gets our vote (inf: never)
    trace_dir: str = ""                           # Raft safety trace (default: $P2PGEN_TRACE_DIR/raft, else none)
    state: StateDirConfig = field(default_factory=StateDirConfig)   # local copy, checkpoints, regression rule
    standby: int = 0                              # warm standby processes of the application kept ready (0 or 1)
    zone: str = ""                                # the zone this host is in (`--zone`), registered with the member
    probe_bytes: int = PROBE_BYTES                # first payload of a link probe request (0: never probe)
    drain_timeout: float = 25.0                   # a drain (SIGTERM, a notice) ends with the agent gone by then
    notice_file: str | None = None                # a spot notice appears here (None: not watched)
    notice_url: str | None = None                 # a spot-notice endpoint, polled (None: nothing is polled)
    notice_interval: float = 1.0                  # seconds between two readings of the notice source
    encrypt: bool = False                         # the application seals its links (--encrypt: $P2PGEN_ENCRYPT=1)


LEAVE_VOTERS_WAIT_S = 10.0  # a leaving voter waits this long for down voters to be removed before its own goes
LEAVE_VOTERS_POLL_S = 0.5
LEAVE_SETTLE_S = 1.5       # a leaving agent waits this long for the job to finish (every member gone)


def _job_finished(view: RaftView | None) -> bool:
    """Every member left (the job is over): a leaving agent then has nothing to hand over or record, and
    the agents leaving last would wait in vain for a quorum of agents that have already gone."""
    return view is not None and not view.machine.members


def _say(said: Said, *args: object) -> None:
    """Log a sentence the pure leave plan chose."""
    log.log(logging.getLevelName(said.level.upper()), said.text, *args)


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        if not config.channel_dir:
            safe = config.peer_id.replace("/", "_")
            config.channel_dir = os.path.join(tempfile.gettempdir(), f"p2pgen-{config.job}-{safe}-channels")
        self.addr = config.listen
        faults.set_local_agent(self.addr)         # partition rules ($P2PGEN_FAULTS) name this process by it
        self.instance = secrets.token_hex(4)
        self.trace = Trace(raft_trace_dir(config.trace_dir), config.peer_id, self.addr, self.instance)
        self._leave_requested = threading.Event()
        self.membership = RaftMembership(config.job, self.addr, config.peers, config.secret, config.raft, self.trace,
                                         stopping=self._leave_requested.is_set)
        self._view_wake = threading.Event()       # a "view" event is queued and not yet taken by the driver
        self.membership.on_view = self._wake_driver
        self._local = AgentLocal.start(AgentRules(             # the driver's memory (agentmachine)
            config.peer_id, supervises=bool(config.command),
            configured=config.min_members <= 1 and not config.state.sets_job_rules, attach_grace=config.attach_grace,
            max_restarts=config.max_restarts, retire_wait=config.retire_wait, standby=config.standby >= 1,
            detector_timeout=config.detector.timeout))
        self.app: Application | None = None
        self.app_attached = False
        self._events: queue.Queue[tuple] = queue.Queue()
        self._leaving = threading.Event()
        self._drain: Drain | None = None           # asked to leave: the drain under way (monotonic clock)
        self._drain_info: dict | None = None       # what `show` says of it: why, and the wall time it leaves by
        self._stopped = threading.Event()
        self._stopped_app: tuple[Application, float] | None = None   # (app, when it was stopped: SIGSTOP)
        self._wait = am.TURN_S          # how long the driver may wait for an event after its last turn
        self._standby: Application | None = None    # the warm standby, not yet promoted (--standby 1)
        self._agents: frozenset[str] = frozenset()    # heartbeat targets (see _heartbeat_targets)
        self._agents_lock = threading.Lock()
        self._known: tuple[RaftView | None, WatchPlan] = (None, (frozenset(), frozenset()))   # see _watch_plan_of
        self._announced = Announcement(self.instance, "", False)    # the last one made (see _announce)
        host, port = split_addr(self.addr)
        self.rpc = RpcServer(host, port, config.job, config.secret, self._handlers())
        self.heartbeats = HeartbeatRunner(host, port, derive_key(config.secret, config.job, "heartbeat"),
                                          config.job, self.addr, config.detector, self._heartbeat_targets,
                                          lambda peer, inst, why: self._agent_lost(peer, inst, why),
                                          self._announce,
                                          lambda peer, old, new: self._agent_lost(
                                              peer, old, f"replaced by a new agent process ({new})", proven=True),
                                          on_refused=lambda peer, inst, why: self._agent_lost(peer, inst, why,
                                                                                              proven=True),
                                          watch=self._heartbeat_watch, on_heard=self._heard_changed,
                                          lease_plan=self._lease_plan)
        self.membership.on_link_lost = self._raft_link_lost
        grace = config.detector.timeout + 2 * config.detector.heartbeat_interval
        self.voters = VoterManager(self.membership, config.secret, config.job, grace, self.heartbeats.heard,
                                   self._leaving.is_set)
        self.prober = LinkProber(self.addr, config.secret, config.job, self._machine, self._submit_links,
                                 nbytes=config.probe_bytes)
        self.notices = notice.watcher(config.notice_file, config.notice_url, config.notice_interval,
                                      self._on_notice)

    @property
    def node(self):
        return self.membership.node

    # --- lifecycle ---------------------------------------------------------------------------------

    def run(self) -> int:
        """Join (or start) the job and serve until asked to leave. Returns the process exit code."""
        self.rpc.start()
        if self.notices is not None:
            self.notices.start()
        try:
            self.heartbeats.start()
            self.membership.join()
            self.heartbeats.reset()         # silences judged while joining were not acted on: judge afresh
            if self._leave_requested.is_set():
                return self.exit_code
            self.voters.start()
            self.prober.start()
            self._drive()
        finally:
            self._shutdown()
        return self.exit_code

    def request_leave(self, why: str = "asked to leave", at: float | None = None) -> None:
        """Drain and leave the job gracefully (SIGTERM, the `leave` RPC, a spot notice): callable from any thread.
        The agent is gone within `drain_timeout` seconds, or before `at` (wall time the machine goes) if earlier;
        a second request can only bring the deadline forward.

        Args:
            why: said in the log and in `show`.
            at: when the machine is taken (seconds since the epoch), if the notice said.
        """
        now, wall = time.monotonic(), time.time()
        drain = drain_asked(self._drain, now, self.config.drain_timeout, None if at is None else at - wall,
                            self.config.state.regress_wait)
        if drain is not None:
            self._drain, leaves_by = drain, wall + drain.deadline - now
            self._drain_info = {"why": why, "leaves_by": leaves_by, "since": wall}
            log.warning("draining (%s): this agent leaves the job by %s", why,
                        time.strftime("%H:%M:%S", time.localtime(leaves_by)))
        self._leave_requested.set()
        self._events.put(("leave",))          # wakes the driver, whose turn decides when (a drain's step)

    def _on_notice(self, found: notice.Notice) -> None:
        self.request_leave(f"termination notice from {self.notices.source if self.notices else '?'}: {found.text}",
                           found.at)

    @property
    def leaving(self) -> bool:
        """This agent is on its way out of the job: a leave was asked for (SIGTERM, a notice, the `leave` RPC; a
        drain may keep it a while) or its driver decided one (the application finished cleanly, or failed more
        than --max-restarts times). Its voter goes soon, so it is never promoted, and `show` says so."""
        return self._leave_requested.is_set() or self._leaving.is_set()

    def _shutdown(self) -> None:
        if self.notices is not None:
            self.notices.stop()
        self._drop_standby()
        if self.app is not None:
            self.app.terminate(grace=2.0)
        self.voters.stop()
        self.prober.stop()
        self.heartbeats.stop()
        self.membership.stop()
        self.rpc.stop()
        self.trace.flush()
        self._stopped.set()

    # --- the driver: gather, decide, perform, advance ----------------------------------------------------

    @property
    def incarnation(self) -> int | None:
        """The incarnation of this peer's current member (registered)."""
        return self._local.incarnation

    @property
    def restarts(self) -> int:
        return self._local.restarts

    @property
    def exit_code(self) -> int:
        return self._local.exit_code

    def _drive(self) -> None:
        """Turn at every event (a new Raft view is one) and at least every `agentmachine.turn_wait` seconds. A turn
        that starts later than the timeout past its planned wait is the agent's own stall (`AgentView.stalled`)."""
        event: tuple | None = None
        last = time.monotonic()
        while not self._stopped.is_set():
            now = time.monotonic()
            stalled = now - last > self.config.detector.timeout + self._wait - am.TURN_S
            last = now
            if self._turn(event, stalled):
                return
            try:
                event = self._events.get(timeout=self._wait)
            except queue.Empty:
                event = None

    def _turn(self, event: tuple | None, stalled: bool) -> bool:
        """One driver turn: the event (if any), then every rule of the machine (`agentmachine.decide`) until it
        rests, each kind of action performed at most once; the machine then names how long the driver may wait
        (`_wait`). True once the agent left."""
        self._local = begin_turn(self._local)
        happened = self._event_of(event) if event is not None else None
        if happened is not None:
            self._step(self._gather(stalled, happened))
        if self.node is not None and not self._local.left:
            try:
                self.membership.settle_pending()
            except RaftUnavailable as e:
                self.membership.wait_because(f"no Raft quorum: {e}")
        self._wait = am.TURN_S
        while not self._local.left:
            view = self._gather(stalled)
            if isinstance(self._step(view), am.RESTING):
                self._wait = am.turn_wait(view, self._local)
                break
        return self._local.left

    def _step(self, view: am.AgentView) -> am.Action:
        self._local = observe(self._local, view)
        action = decide(view, self._local)
        try:
            outcome = self._perform(action)
        except RaftUnavailable as e:
            self.membership.wait_because(f"no Raft quorum: {e}")
            outcome = None
        self._local = advance(self._local, action, outcome)
        return action

    def _event_of(self, event: tuple) -> am.Event | None:
        """What a queued event says to the machine (None: nothing; the turn looks at the view anyway). Exits of
        a process that is neither the current application nor the waiting standby are of no concern."""
        kind = event[0]
        if kind == "view":
            self._view_wake.clear()
        elif kind == "app_exited":
            app, why, clean = event[1:]
            if not app.promoted.is_set():         # a standby (never an incarnation): not an application exit
                return am.StandbyExited(app.pid, why) if app is self._standby else None
            return am.AppExited(app.incarnation, why, clean) if app is self.app else None
        elif kind == "app_stopped":
            self._stopped_app = (event[1], event[2])
        elif kind == "app_continued":
            self._stopped_app = None
        elif kind == "app_stopped_at_boundary" and event[1] is self.app:
            return am.AppStoppedAtBoundary(event[1].incarnation)
        elif kind == "agent_lost":
            return am.AgentLost(*event[1:])
        elif kind == "reform":
            return am.ReformAsked(*event[1:])
        return None

    def _gather(self, stalled: bool, event: am.Event | None = None) -> am.AgentView:
        """What the machine decides on: the Raft view, the processes' status, the agents heard, the drain."""
        view, now, app, spare = self.membership.view(), time.monotonic(), self.app, self._standby
        status = None
        if app is not None:
            stopped = self._stopped_app
            status = am.AppStatus(app.incarnation, self.app_attached, now - app.started, app.exited.is_set(),
                                  now - stopped[1] if stopped is not None and stopped[0] is app else None)
        leaving = self._leave_requested.is_set()
        drain = self._drain if leaving else None
        return am.AgentView(
            clock=now, wall=time.time(), machine=view.machine if view is not None else None,
            leader=view is None or view.leader is not None, voter=view is not None and view.voter,
            removed=view is not None and view.removed, removed_reason=self.membership.removed_reason(),
            stalled=stalled, app=status,
            standby=am.StandbyStatus(spare.exited.is_set(), spare.stopped) if spare is not None else None,
            heard=tuple((addr, a.instance) for addr, a in self.heartbeats.heard().items()),
            leaving=leaving, drain=drain,
            local_copy=self._local_copy() if drain is not None and app is not None else None,
            pending_voter=self.membership.preparing_voter, event=event)

    def _local_copy(self) -> tuple[int, int] | None:
        copy_ = self.config.state.describe_local(self.config.job, self.config.peer_id, self.addr)
        return (copy_.revision, copy_.generation) if copy_ is not None and copy_.revision > 0 else None

    def _perform(self, action: am.Action) -> Outcome | None:
        """Do what the machine decided; the job's answer (DONE for what is no command), None for no answer."""
        peer = self.config.peer_id
        match action:
            case am.Configure():
                rules = Configure(self.config.min_members, at=time.time(), regress_wait=self.config.state.regress_wait,
                                  allow_fresh_start=int(self.config.state.allow_fresh_start))
                return self._submit(rules, "configure")
            case am.Register(incarnation):
                return self._register(incarnation)
            case am.Renumber() | am.NoteLost() | am.Wait():
                return DONE
            case am.Launch(incarnation, kill_standby):
                self._launch_app(incarnation, kill_standby)
            case am.PromoteStandby(incarnation):
                self._promote_standby(incarnation)
            case am.StartStandby():
                self._standby = self._start_process(None, standby=secrets.token_hex(8))
                log.info("started standby pid %d for %s", self._standby.pid, peer)
            case am.StandbyLost(pid, why, deaths):
                self._standby = None
                if deaths >= STANDBY_REPLACEMENTS:
                    log.error("standby pid %d %s while waiting (%d in a row): keeping no standby any more", pid, why,
                              deaths)
                else:
                    log.warning("standby pid %d %s while waiting; replacing it (not counted as a restart)", pid, why)
            case am.VoteReady(generation, incarnation):
                outcome = self._submit(Ready(generation, peer, incarnation, "proved", 0, "", 0, at=time.time()),
                                       f"ready for g{generation}")
                if outcome is not None:
                    log.info("ready for g%d: %s", generation, outcome.reason)
                return outcome
            case am.KillApp(incarnation, why):
                assert self.app is not None
                self._stopped_app = None
                self._report_app(incarnation, why)
                self.app.kill()
            case am.ReportDeath(incarnation, why):
                self._report_app(incarnation, why, with_copy=True)
            case am.Evicted(_, why, renumber, kill):
                if renumber is not None:
                    log.warning("%s: registering again as a new incarnation", why)
                elif kill is not None and self.app is not None:
                    log.warning("%s: restarting the application as a new incarnation", why)
                    self._stopped_app = None        # the kill ends a stop (SIGKILL reaches a stopped process)
                    self.app.kill()                 # its exit event relaunches it as a new incarnation
            case am.EvictLost(suspects):
                self._suspect(suspects)
            case am.AskMembership(voter=voter):
                known = self._known_agents(self.membership.view())
                answer = self.membership.confirm_not_voter(known) if voter else None
                return None if answer is None else Outcome(answer, "out of the configuration" if answer else "a voter")
            case am.Rejoin(why):
                self.membership.rejoin_as_nonvoter(why, self._known_agents(self.membership.view()))
                self.heartbeats.reset()
            case am.Reform(epoch, seed, gone):
                return self._reform(epoch, seed, gone)
            case am.HandOver(why, say, where):
                if say and self._drain is not None:
                    log.info("draining: %s (%s); it stays until another member holds them (at most %.0f s)", why,
                             where, self._drain.hand_over_wait)
            case am.StopApp(why, say) | am.AwaitApp(why, say):
                if say:
                    log.info("draining: %s", why)
                if isinstance(action, am.StopApp):
                    self._ask_app_to_stop()
            case am.Leave(why, exit_code, app_stopping, say):
                if say:
                    (log.error if exit_code else log.info)("%s", why)
                self._leave(app_stopping)
        return DONE

    def _ask_app_to_stop(self) -> None:
        """The application's watch (a `wait` call) sees the drain's ask at once."""
        drain = self._drain
        if drain is None:
            return
        self._drain = Drain(drain.since, drain.deadline, drain.hand_over_wait, time.monotonic())
        if self.node is not None:
            self.node.wake_waiters()

    def _member_addrs(self) -> tuple[tuple[str, str], ...]:
        roles = ("agent", "data", "state", "channel") if self.config.command else ("agent",)
        return tuple((role, port_of(self.addr, role)) for role in roles) + (("agent_instance", self.instance),)

    def _register(self, incarnation: int) -> Outcome | None:
        peer = self.config.peer_id
        outcome = self._submit(RegisterCommand(peer, incarnation, self._member_addrs(), at=time.time(),
                                               zone=self.config.zone), f"register {peer}#{incarnation}")
        if outcome is not None and not outcome.ok:
            log.warning("registration of %s#%d refused: %s; trying a new incarnation", peer, incarnation,
                        outcome.reason)
        elif outcome is not None:
            log.info("registered %s#%d", peer, incarnation)
        return outcome

    def _submit(self, command: Command, what: str) -> Outcome | None:
        """Submit within one driver turn; None (and the reason in `waiting`) when no quorum answered in time."""
        try:
            outcome = self.node.submit(command, timeout=SUBMIT_TIMEOUT_S)
        except RaftUnavailable as e:
            self.membership.wait_because(f"{what}: no Raft quorum yet ({e}); retrying")
            return None
        if self.membership.waiting and self.membership.waiting.startswith(what):
            self.membership.done_waiting()
        return outcome

    def _machine(self):
        """The latest replicated state (None before this agent is part of the job)."""
        view = self.membership.view()
        return view.machine if view is not None else None

    def _submit_links(self, command: Links) -> Outcome:
        """The prober's report, through Raft (its own thread; RaftUnavailable when no quorum answers)."""
        node = self.node
        if node is None:
            raise RaftUnavailable("this agent has no Raft node right now")
        return node.submit(command, timeout=3 * SUBMIT_TIMEOUT_S)

    def _app_env(self, incarnation: int | None, standby: str | None = None) -> dict[str, str | None]:
        """The application's environment; a standby's has no incarnation yet, and names itself by its token."""
        env: dict[str, str | None] = {
            "P2PGEN_JOB": self.config.job, "P2PGEN_PEER_ID": self.config.peer_id,
            "P2PGEN_INCARNATION": str(incarnation) if incarnation is not None else None, "P2PGEN_AGENT": self.addr,
            "P2PGEN_DATA_ADDR": port_of(self.addr, "data"), "P2PGEN_STATE_ADDR": port_of(self.addr, "state"),
            "P2PGEN_CHANNEL_ADDR": port_of(self.addr, "channel"), "P2PGEN_CHANNEL_DIR": self.config.channel_dir,
            "P2PGEN_STANDBY": standby, seal.ENV: "1" if self.config.encrypt else None}
        env.update(self.config.state.app_env(self.config.job, self.config.peer_id, self.addr))
        if self.config.secret_file:
            env["P2PGEN_SECRET_FILE"] = self.config.secret_file
        return env

    def _start_process(self, incarnation: int | None, standby: str | None = None) -> Application:
        """Start the application's command (on the driver thread: PDEATHSIG follows the thread that forks). A
        standby's stops and continues are not the application's until it is promoted."""
        def stopped(app: Application) -> None:
            if app.promoted.is_set():
                self._events.put(("app_stopped", app, time.monotonic()))

        def continued(app: Application) -> None:
            if app.promoted.is_set():
                self._events.put(("app_continued", app))

        return Application(self.config.command, incarnation, self._app_env(incarnation, standby),
                           on_stop=stopped, on_continue=continued,
                           on_exit=lambda app, why, clean: self._events.put(("app_exited", app, why, clean)),
                           standby=standby)

    def _launch_app(self, incarnation: int, kill_standby: bool) -> None:
        """Start the application's incarnation as a new process; the standby is dropped (killed when it was
        stopped while it waited: it would never attach)."""
        self.app_attached = False
        spare, self._standby = self._standby, None
        if kill_standby and spare is not None:
            log.warning("standby pid %d is stopped: killing it and starting the application instead", spare.pid)
            spare.kill()                       # its exit is not an application's (never promoted)
        self.app = self._start_process(incarnation)
        log.info("started application pid %d as %s#%d", self.app.pid, self.config.peer_id, incarnation)

    def _promote_standby(self, incarnation: int) -> None:
        """The waiting standby becomes the application's incarnation (one that died since the view was taken is
        replaced by a new process)."""
        spare = self._standby
        if spare is None or spare.exited.is_set():
            self._launch_app(incarnation, kill_standby=False)
            return
        self.app_attached = False
        self._standby = None
        self.app = spare                    # before promote(): its attach names the current application
        spare.promote(incarnation)
        log.info("promoted standby pid %d to %s#%d", spare.pid, self.config.peer_id, incarnation)

    def _drop_standby(self) -> None:
        """Kill the waiting standby (leaving, shutting down) and wait for it to be gone."""
        spare, self._standby = self._standby, None
        if spare is not None:
            spare.kill()
            spare.exited.wait(5)

    def _agent_lost(self, peer: str, instance: str, why: str, proven: bool = False) -> None:
        """The heartbeats say another agent is gone: its members are for the driver, its voter (if the
        node here leads) for the voter manager, both at once. If it ran the Raft leader this node follows, the
        node campaigns soon rather than after its election timeout: nothing the agents decide about the loss can
        commit before a new leader is elected. `proven`: its host refused our heartbeats (no process holds its
        port) or a new process announced itself at its address; else it fell silent past the detector's verdict.

        A silence judged while this agent has no Raft node (joining, or re-joining after a stop or a
        removal) is not acted on: what this agent heard then says more about itself than about the others
        (a stress run: an agent's 10.8 s re-join left three live members' agents silent to it, and the
        suspicions it queued then evicted them once it was back). The heartbeats are reset when the node
        is there, so a peer that is really gone is judged again within the timeout. Proofs (a refusal, a
        new process at the address) are acted on whenever they come (`p2pgen.core.heartbeats.acts_on_loss`)."""
        node = self.node          # the heartbeat thread calls this: between two Raft nodes there is none
        if not acts_on_loss(node is not None, proven):
            log.info("not acting on %s (%s): judged while this agent has no Raft node; judged afresh once it has",
                     peer, why)
            return
        self._events.put(("agent_lost", peer, instance, why))
        self.voters.poke()
        view = node.view() if node is not None else None
        if view is not None and view.leader is not None and control_addr_of(view.leader) == peer and \
                not self._leaving.is_set():          # a leaving agent would only hand the leadership over again
            node.hasten_election(view.leader)

    def _raft_link_lost(self, node_id: str) -> None:
        """A working Raft link of ours to `node_id` closed (its process may have died: its kernel closes the
        link at once): the heartbeats probe its agent now. A hint only; a refusal is the proof."""
        self.heartbeats.hint(control_addr_of(node_id), "its Raft link to this agent closed")

    def _wake_driver(self) -> None:
        """A node published a new view (an entry applied, a leader or term change): the driver and the voter
        manager look now, and the heartbeats learn which agents the pending generation waits for. At most one
        driver wake-up is queued at a time."""
        view = self.membership.view()
        if view is not None:
            self.heartbeats.awaited({a for a in (m.addr("agent") for m in view.machine.awaited()) if a})
        self.voters.poke()
        self.prober.poke()
        if not self._view_wake.is_set():
            self._view_wake.set()
            self._events.put(("view",))

    def _reform(self, epoch: int, seed: str, gone: tuple[str, ...]) -> Outcome:
        """`p2pgen recover` asked this agent to move to a new Raft epoch: as its seed, or by joining it."""
        view = self.membership.view()
        known = self._known_agents(view) if view is not None else ()
        try:
            if seed == self.addr:
                self.membership.reform_as_seed(epoch, gone)
            else:
                self.membership.reform_as_follower(epoch, seed, tuple(a for a in known if a not in gone))
        except P2PGenError as e:
            log.error("re-form to epoch %d refused: %s", epoch, e)
            return Outcome.refused(str(e))
        self.heartbeats.reset()
        return DONE

    def _known_agents(self, view: RaftView | None) -> tuple[str, ...]:
        if view is None:
            return ()
        agents = {control_addr_of(n) for n in view.nodes}
        agents |= {m.addr("agent") for m in view.machine.members if m.addr("agent")}
        return tuple(sorted(agents - {self.addr}))

    def _report_app(self, incarnation: int, why: str, with_copy: bool = False) -> None:
        """Tell the job the application is gone; `with_copy` (it died): also what it left in its local copy on
        this host, which the next incarnation restores, so a generation that would resume below it waits for that
        one (bounded). The copy goes in the same entry as the removal (no survivor's vote can be elected between
        the two), or, when the removal was already recorded, as `Kept`."""
        peer = self.config.peer_id
        copy_ = self.config.state.describe_local(self.config.job, peer, self.addr) if with_copy else None
        if copy_ is not None and copy_.revision <= 0:
            copy_ = None
        unsaved = self.config.state.unsaved_commits(self.config.job, peer, self.addr, copy_) if copy_ else None
        committed, committed_lineage = unsaved if unsaved is not None else (-1, 0)
        kept = {"kept_revision": copy_.revision, "kept_digest": copy_.digest, "kept_lineage": copy_.generation,
                "kept_committed": committed, "kept_committed_lineage": committed_lineage} if copy_ is not None else {}
        outcome = self._submit(Suspect(peer, peer, incarnation, why, at=time.time(), **kept),
                               f"report {peer}#{incarnation}")
        if outcome is None:
            return
        log.info("reported %s#%d: %s", peer, incarnation, outcome.reason)
        if copy_ is not None and outcome.ok:
            log.info("%s#%d left a local copy of revision %d", peer, incarnation, copy_.revision)
        elif copy_ is not None:
            outcome = self._submit(Kept(peer, incarnation, copy_.revision, copy_.digest, copy_.generation,
                                        at=time.time(), committed=committed, committed_lineage=committed_lineage,
                                        agent=self.addr),
                                   f"report the local copy of {peer}#{incarnation}")
            if outcome is not None:
                log.info("%s", outcome.reason)

    def _suspect(self, suspects: tuple[tuple[str, int, str], ...]) -> None:
        """Suspect the members of lost agents (each turn, until none is left in the job)."""
        for peer_id, incarnation, why in suspects:
            outcome = self._submit(Suspect(self.config.peer_id, peer_id, incarnation, why, at=time.time()),
                                   f"suspect {peer_id}#{incarnation}")
            if outcome is not None:
                log.info("suspected %s#%d: %s", peer_id, incarnation, outcome.reason)

    def _leave(self, app_stopping: bool = False) -> None:
        """Leave the job: stop the application, delete its local copy, record the leave, give up leadership and
        the Raft voter. `app_stopping`: the application stopped at a step boundary and is exiting by itself (a
        drain): the leave is recorded first, so the others go on at once, and the application is given until
        the drain's deadline to finish (it still serves its state meanwhile). The steps and what is said are the
        pure plan's (`p2pgen.core.leaving`); this performs them."""
        plan = leave_plan(self.app is not None, app_stopping, self.node is not None, self.incarnation is not None)
        leaving_app = self.app.incarnation if self.app is not None else None
        self._leaving.set()
        self._drop_standby()
        if plan.stop_app:
            self._stop_app()
        if not plan.raft:
            return
        recorded = not plan.record      # no member to record the leave of
        incarnation = self.incarnation if self.incarnation is not None else leaving_app
        try:
            try:
                if plan.record and incarnation is not None:
                    self.node.submit(Leave(self.config.peer_id, incarnation, at=time.time()), timeout=3.0)
                    recorded = True
            finally:
                if plan.await_app:
                    self._await_app_exit()
            view = self.node.wait_view(_job_finished, LEAVE_SETTLE_S) or self.node.view()
            deadline = time.monotonic() + LEAVE_VOTERS_WAIT_S
            while True:
                others_heard = len(set(self.heartbeats.heard()) - {self.addr})
                shrink = shrink_plan(_job_finished(view), view.voter, len(view.nodes), view.is_leader,
                                     len(self._live_other_voters(view)), others_heard)
                if shrink.said is not None:
                    _say(shrink.said)
                    return
                if shrink.transfer_leadership:
                    self.node.transfer_leadership()
                    self.node.wait_view(lambda v: not v.is_leader and v.leader is not None, 2.0)
                if not (shrink.wait_for_voters or shrink.wait_for_successor) or time.monotonic() >= deadline:
                    break
                self.voters.poke()           # the last voter's manager promotes a successor
                nodes = view.nodes           # the leader removes the down voter meanwhile (this node acks)
                view = self.node.wait_view(lambda v: v.nodes != nodes, LEAVE_VOTERS_POLL_S) or self.node.view()
            if shrink.wait_for_voters:
                down = sorted(set(view.nodes) - {view.node_id} - set(self._live_other_voters(view)))
                _say(VOTERS_DOWN, f"voter(s) {', '.join(down)} still down after {LEAVE_VOTERS_WAIT_S:.0f} s")
            elif shrink.wait_for_successor:
                _say(NO_SUCCESSOR, f"none within {LEAVE_VOTERS_WAIT_S:.0f} s")
            elif shrink.remove_voter:
                self.node.remove_node(view.node_id, timeout=3.0)
        except RaftUnavailable as e:
            others_heard = bool(set(self.heartbeats.heard()) - {self.addr})
            said = said_without_quorum(_job_finished(self.node.view()), others_heard, recorded)
            if said is None:
                said = said_after_asking(self.membership.confirm_not_voter(self._known_agents(self.node.view())))
            _say(said, e)

    def _live_other_voters(self, view: RaftView) -> list[str]:
        """The voters other than this agent's whose agents its heartbeats hear."""
        heard = set(self.heartbeats.heard())
        return [n for n in view.nodes if n != view.node_id and control_addr_of(n) in heard]

    def _await_app_exit(self) -> None:
        """A drained application exits by itself: wait for it until the drain's deadline, then stop it."""
        assert self.app is not None
        drain = self._drain
        self.app.exited.wait(max(0.0, drain.leave_by - time.monotonic()) if drain is not None else 2.0)
        self._stop_app()

    def _stop_app(self) -> None:
        assert self.app is not None
        self.app.terminate(grace=2.0)
        self.config.state.remove_local(self.config.job, self.config.peer_id, self.addr)

    # --- heartbeats ----------------------------------------------------------------------------------

    def _heartbeat_targets(self) -> frozenset[str]:
        """Every agent of the job: the voters' and the members' agents, and any agent heard as one of them
        before and not suspected since (an agent between two incarnations of its member stays a target)."""
        current = self._watch_plan_of(self.membership.view())[0]
        suspected = self.heartbeats.suspected()
        with self._agents_lock:
            if not current <= self._agents or not suspected.isdisjoint(self._agents):
                self._agents = (self._agents - suspected) | current
            return self._agents

    def _heartbeat_watch(self) -> WatchPlan | None:
        """What the heartbeats choose the agents they judge from (`p2pgen.core.heartbeats.watched`): the job's
        agents and the voters' agents, from the committed log. None (judge every agent) while this agent has no
        view, and while its node leads: the leader's agent watches every agent, so each one is judged by an agent
        whose suspicion can commit whichever of its ring neighbours failed with it."""
        view = self.membership.view()
        if view is None or view.is_leader:
            return None
        return self._watch_plan_of(view)

    def _lease_plan(self) -> WatchPlan | None:
        """The job's agents and the voters' agents from the committed log, whoever leads (the heartbeats choose
        whose echoes renew this agent's lease from them); None while this agent has no view."""
        view = self.membership.view()
        return None if view is None else self._watch_plan_of(view)

    def _watch_plan_of(self, view: RaftView | None) -> WatchPlan:
        """(the job's other agents, `_known_agents(view)`; the voters' agents) of `view`, computed once per view
        (the heartbeats ask every round; the same plan object while the view stands)."""
        last, plan = self._known
        if view is not last:
            voters = frozenset(control_addr_of(n) for n in view.nodes) if view is not None else frozenset()
            plan = (frozenset(self._known_agents(view)), voters)
            self._known = (view, plan)
        return plan

    def live_agents(self) -> list[str]:
        """Control addresses of the agents this one currently hears, itself included."""
        return sorted(set(self.heartbeats.heard()) | {self.addr})

    def _announce(self) -> Announcement:
        """What this agent's heartbeats say of it (the same object while that does not change)."""
        view = self.membership.view()
        eligible = (view is not None and not view.voter and self.membership.caught_up()
                    and not self.leaving)   # a Raft participant: its application does not matter
        node, last = self.membership.announced_node(), self._announced
        if last.node != node or last.eligible != eligible:
            self._announced = Announcement(self.instance, node, eligible)
        return self._announced

    # --- control API -------------------------------------------------------------------------------

    def _handlers(self) -> dict:
        return {
            "hello": self._rpc_hello, "membership": self._rpc_membership, "prepare_voter": self._rpc_prepare_voter,
            "reform": self._rpc_reform,
            "show": self._rpc_show, "history": self._rpc_history, "submit": self._rpc_submit,
            "wait": self._rpc_wait, "attach": self._rpc_attach, "leave": self._rpc_leave,
            "standby": self._rpc_standby, "stopped": self._rpc_stopped, "stalled": self._rpc_stalled,
            "probe": serve_probe,
        }

    def _require_view(self) -> RaftView:
        view = self.membership.view()
        if view is None:
            raise P2PGenError(f"agent {self.addr} is not part of the job yet ({self.membership.waiting}); "
                              "ask another member")
        return view

    def _rpc_hello(self, params: dict) -> dict:
        return {**self.membership.hello(), "job": self.config.job, "peer_id": self.config.peer_id}

    def _rpc_membership(self, params: dict) -> dict:
        view = self._require_view()
        node = str(params["node"])
        return {"voter": node in view.nodes, "leader": view.leader, "voters": list(view.nodes)}

    def _rpc_prepare_voter(self, params: dict) -> str:
        if self.leaving:
            raise P2PGenError(f"agent {self.addr} is leaving the job")
        return self.membership.prepare_voter([str(v) for v in params["voters"]])

    def _rpc_reform(self, params: dict) -> dict:
        """Move to Raft epoch `epoch` (from `p2pgen recover`, which checked that the old epoch lost its majority
        for good): the agent named `seed` starts it from its own state, every other one joins it."""
        epoch, seed = int(params["epoch"]), str(params["seed"])
        gone = tuple(str(a) for a in params.get("gone", ()))
        if epoch <= self.membership.epoch:
            raise P2PGenError(f"epoch {epoch} is not above this agent's Raft epoch {self.membership.epoch}")
        split_addr(seed)
        self._events.put(("reform", epoch, seed, gone))
        return {"accepted": True, "role": "seed" if seed == self.addr else "follower"}

    def _rpc_show(self, params: dict) -> dict:
        view = self._require_view()
        voters = [{"node": n, "agent": control_addr_of(n)} for n in view.nodes]
        voter_agents = {v["agent"] for v in voters}
        nonvoters = sorted({m.addr("agent") for m in view.machine.members if m.addr("agent")} - voter_agents)
        decision = self.voters.last_decision
        return {
            "state": state_json(view.machine),
            "raft": {"term": view.term, "index": view.version, "epoch": view.epoch,
                     "applied": [view.log_hash[1], view.log_hash[0]], "leader": view.leader,
                     "leader_agent": control_addr_of(view.leader) if view.leader else None,
                     "heard": self.heartbeats.heard_by_job(),
                     "nodes": list(view.nodes), "self": view.node_id, "voter": view.voter,
                     "voters": voters, "nonvoters": nonvoters, "agents": self.live_agents(),
                     "hash": [list(c) for c in view.checkpoints[-8:]] + [list(view.log_hash)],
                     "refused": dict(view.refused),
                     "voter_decision": decision.reason if decision and view.is_leader else None},
            "agent": {"peer_id": self.config.peer_id, "addr": self.addr, "instance": self.instance,
                      "incarnation": self.incarnation, "app_pid": self.app.pid if self.app else None,
                      "standby_pid": self._standby.pid if self._standby else None,
                      "standby_ready": self._standby.waiting if self._standby else False,
                      "restarts": self.restarts, "leaving": self.leaving,
                      "draining": self._drain_json(),
                      "refused_connections": self.rpc.refused,
                      "refusals": {"rpc": self.rpc.refusals(), "heartbeat": self.heartbeats.refusals()},
                      "waiting": self.membership.waiting},
        }

    def _rpc_history(self, params: dict) -> list:
        return history_json(self._require_view().machine)

    def _rpc_submit(self, params: dict) -> dict:
        """Submit an application's command through this agent's Raft node, once more through the node that replaced
        it if that one stopped meanwhile (a promotion to voter, a rejoin): a command is idempotent (a repeated one
        is answered as a replay), and the application learns nothing of the switch."""
        self._require_view()
        command, deadline = command_from_wire(params.get("command")), time.monotonic() + SUBMIT_TIMEOUT_S
        node = self.node
        if node is None:
            raise P2PGenError(f"agent {self.addr} is switching its Raft node; ask again")
        while True:
            try:
                outcome = node.submit(command, timeout=max(0.1, deadline - time.monotonic()))
                return {"ok": outcome.ok, "reason": outcome.reason}
            except RaftUnavailable:
                replaced = self.node
                if replaced is None or replaced is node or time.monotonic() >= deadline:
                    raise
                node = replaced

    def _rpc_wait(self, params: dict) -> dict:
        """The view once an entry after `after_version` is applied, or (given `leader`, the leader the caller
        saw last) once this node's leader changes (lost or another), or (given `heard`) once whether the job is
        proven to hear this agent changes, or after `timeout` seconds."""
        after = int(params.get("after_version", -1))
        timeout = min(float(params.get("timeout", 5.0)), 30.0)
        self._require_view()
        watch_leader, seen = "leader" in params, params.get("leader")
        watch_heard, heard_seen = "heard" in params, bool(params.get("heard", True))
        stop_seen = bool(params.get("stop_at_boundary", False))
        self.node.wait_view(lambda v: v.version > after or (watch_leader and v.leader != seen)
                            or (watch_heard and self.heartbeats.heard_by_job() != heard_seen)
                            or self._app_stop_asked() != stop_seen, timeout)
        return self._rpc_show(params)

    def _heard_changed(self, heard: bool) -> None:
        """The heartbeats' round trips start or stop proving that the job hears this agent: wake the application's
        watcher (its `wait`), which fences its member while it is not heard. A warning while an application runs
        here (it is fenced); otherwise, as when the job ends and the other agents leave first, only a note."""
        if not heard:
            app = self.app
            running = app is not None and not app.exited.is_set()
            log.log(logging.WARNING if running else logging.INFO,
                    "the job is not proven to hear this agent (too few of the agents it watches echoed its heartbeats "
                    "within %.2f s): %s", self.config.detector.stalled_floor,
                    "its member stops committing" if running else "no application runs here, nothing is fenced")
        node = self.node
        if node is not None:
            node.wake_waiters()

    def _app_stop_asked(self) -> bool:
        return self._drain is not None and self._drain.app_asked is not None

    def _drain_json(self) -> dict | None:
        if self._drain_info is None:
            return None
        return {**self._drain_info, "stop_at_boundary": self._app_stop_asked()}

    def _rpc_attach(self, params: dict) -> dict:
        app = self.app
        if app is None or params.get("incarnation") != app.incarnation:
            raise ValueError(f"incarnation {params.get('incarnation')} is not this agent's current application "
                             f"({app.incarnation if app else 'none'}): a stale process must exit (I3)")
        self.app_attached = True
        self._events.put(("attached",))           # wakes the driver: it registers the member now
        voted = self._local.voted is not None and self._local.voted[1] == app.incarnation
        return {"peer_id": self.config.peer_id, "incarnation": app.incarnation, "agent_voted": voted}

    def _rpc_stalled(self, params: dict) -> dict:
        """The application's collective in `generation` has received nothing for `stalled_s` seconds: the
        detector judges the other members' agents of that (active) generation from its stalled floor for the
        next STALL_LEASE_S (the application repeats the report while the stall lasts)."""
        app = self.app
        if app is None or params.get("incarnation") != app.incarnation:
            raise ValueError(f"incarnation {params.get('incarnation')} is not this agent's current application "
                             f"({app.incarnation if app else 'none'}): a stale process must exit (I3)")
        active = self._require_view().machine.active
        if active is None or active.generation != params.get("generation"):
            return {"agents": []}
        waited_for = sorted({m.addr("agent") for m in active.members if m.addr("agent")} - {self.addr})
        self.heartbeats.stalled(waited_for, STALL_LEASE_S)
        return {"agents": waited_for}

    def _rpc_standby(self, params: dict) -> dict:
        """A standby's long-poll (`p2pgen.join()` under P2PGEN_STANDBY): its incarnation once the agent promoted
        it, or `incarnation: None` after `timeout` seconds (it asks again). A token this agent does not know
        (a standby it dropped, or of another agent process) is refused: that process must exit."""
        token = str(params["token"])
        timeout = min(float(params.get("timeout", STANDBY_POLL_S)), STANDBY_POLL_S)
        spare = next((a for a in (self._standby, self.app) if a is not None and a.standby == token), None)
        if spare is None or spare.exited.is_set():
            raise P2PGenError(f"no standby of {self.config.peer_id} named {token!r} waits at agent {self.addr}: "
                              "this process must exit")
        spare.waiting = True
        deadline = time.monotonic() + timeout
        while not spare.promoted.wait(0.2) and not spare.exited.is_set() and time.monotonic() < deadline:
            pass                               # wakes at once on promotion; ends with a standby killed meanwhile
        return {"peer_id": self.config.peer_id, "incarnation": spare.incarnation}

    def _rpc_stopped(self, params: dict) -> dict:
        """The application stopped at a step boundary, as the drain asked: the driver records the leave now."""
        app = self.app
        if app is None or params.get("incarnation") != app.incarnation or not self._app_stop_asked():
            return {"leaving": False}
        self._events.put(("app_stopped_at_boundary", app))
        return {"leaving": True}

    def _rpc_leave(self, params: dict) -> dict:
        self.request_leave()
        return {"leaving": True}

"""RaftNode: one pysyncobj node of a job, ticked by its own thread, with a thread-safe API.

Owns: the SyncObj (a voter with a never-reused node id, or a non-voting member that reads the log and submits
through the leader), the thread that ticks it, command submission with retries, Raft membership changes, the
running hash of the applied log and the node's trace records, and publication of immutable views.
Invariants kept:
- only the node's own thread touches the SyncObj (getStatus and the state machine are not
  thread-safe, pitfall 13): other threads talk to it through a queue (and a pipe that wakes its poll, so
  the thread can sleep a whole append period between ticks when nothing happens) and read published views;
- the thread turns (ticks SyncObj, drives requests, publishes) when a timer is due or something happened that a
  turn acts on: a message that changed Raft's state or arrived while an entry is not yet applied, a link event, a
  submission. A wake-up for anything else (an idle heartbeat or its ack) is handled in the poll and the thread
  sleeps on (`_sleep`);
- a submitted command is retried with the *same* request id until a result arrives or the deadline
  passes (async callbacks can be lost on leader changes, pitfall 4), so it is applied at most once;
- traffic is encrypted with a password derived from the job secret, the server binds only the given
  address (pitfall 9), no journal and no dump file (pitfall 12);
- a voter's id is `host:port/nonce`, made for this node only (`identity`), and the transport proves it both
  ways (`transport`), so no later process can be taken for this node;
- a published leader is one heard from within the election timeout: a node cut off from the job (removed,
  partitioned, stalled) reports no leader rather than a stale one.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

import pysyncobj.pickle as so_pickle
from pysyncobj import FAIL_REASON, SyncObjConf
from pysyncobj.monotonic import monotonic as so_monotonic
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.syncobj import _COMMAND_TYPE, _RAFT_STATE

from p2pgen.auth import derive_key
from p2pgen.core import Activated, Command, GenerationMachine, Outcome, Register
from p2pgen.errors import P2PGenError
from p2pgen.raft.consumer import JobState
from p2pgen.raft.identity import NodeId, raft_addr_of
from p2pgen.raft.syncobj import JobSyncObj
from p2pgen.raft.trace import CHECKPOINT_EVERY, Trace
from p2pgen.raft.transport import NodeTransport

log = logging.getLogger(__name__)


def raft_purpose(epoch: int) -> str:
    """The key purpose of a Raft epoch: nodes of different epochs cannot decrypt each other (a fenced re-form
    starts a new epoch, `p2pgen recover`)."""
    return "raft" if epoch == 0 else f"raft/epoch/{epoch}"


class RaftUnavailable(P2PGenError):
    """No Raft quorum answered in time: a majority of agents is unreachable."""


@dataclass(frozen=True)
class RaftTiming:
    """Timeouts of the Raft node. Tight by default: the agent process does nothing else (see notes)."""

    append_period: float = 0.15       # idle heartbeats only (entries and commits are sent at once); < election_min / 3
    election_min: float = 0.5
    election_max: float = 1.0
    tick: float = 0.1                 # longest sleep between ticks while a request is pending or a voter is unreachable
    idle_tick: float = 0.5            # longest sleep otherwise: the thread wakes for a message, a submission, or the
                                      # next thing Raft does on a clock (the leader's append, a follower's election)
    attempt_timeout: float = 1.0      # resend a command with the same request id after this long
    retry_pause: float = 0.02
    leaderless_pause: float = 0.05    # retry of a command refused because no leader is known (see `conf`)
    hasten_spread: float = 0.15       # told its leader is dead, the k-th voter in id order campaigns after k × this

    def conf(self, bind: str | None, password: str, on_state_changed=None) -> SyncObjConf:
        """pysyncobj's settings. `commandsWaitLeader=False`: with True, a command submitted while no leader is
        known waits in pysyncobj's own queue with no deadline and is sent once a leader appears, even after
        `submit` raised RaftUnavailable; a minority node cut off for seconds then had its timed-out commands
        committed by the majority after the heal. With False it fails at once and RaftNode retries it
        itself, within the caller's deadline only."""
        return SyncObjConf(
            autoTick=False, appendEntriesPeriod=self.append_period,
            raftMinTimeout=self.election_min, raftMaxTimeout=self.election_max,
            connectionTimeout=max(1.0, self.election_max), connectionRetryTime=0.1,
            leaderFallbackTimeout=max(0.5, 3 * self.append_period), dynamicMembershipChange=True,
            bindAddress=bind, password=password, journalFile=None, fullDumpFile=None,
            commandsWaitLeader=False, onStateChanged=on_state_changed,
        )


@dataclass(frozen=True)
class RaftView:
    """A consistent copy of the replicated state and the node's Raft status, safe to read anywhere."""

    version: int                      # Raft index of the last applied entry
    machine: GenerationMachine
    term: int
    leader: str | None                # node id of the leader, when heard from recently
    is_leader: bool
    nodes: tuple[str, ...]            # the voters' node ids (this node included when it is one), sorted
    ready: bool                       # this node has caught up with the log at least once
    node_id: str | None = None        # this node's id; None for a non-voting member
    removed: bool = False             # this voter applied its own removal: it no longer speaks for the job
    log_hash: tuple[int, int, str] = (0, 0, "")            # (index, term, hex) after the last applied entry
    checkpoints: tuple[tuple[int, int, str], ...] = ()     # recent (index, term, hex), every CHECKPOINT_EVERY
    refusals: tuple[tuple[float, str, str], ...] = ()      # refusals received: (monotonic time, by node, reason)
    refused: tuple[tuple[str, int], ...] = ()              # connections this node refused: (kind, count)
    epoch: int = 0                                         # the Raft epoch (a fenced re-form starts a new one)

    @property
    def voter(self) -> bool:
        return self.node_id is not None


@dataclass
class _Request:
    kind: str                         # "command" | "add" | "remove" | "transfer"
    payload: object
    future: Future
    deadline: float
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    attempt: int = 0
    attempt_deadline: float = 0.0
    retry_at: float | None = 0.0      # when to (re)send; None while an attempt is in flight


class RaftNode:
    """A voter (`node_id` given: `host:port/nonce`, listening on host:port) or, with `node_id=None`, a non-voting
    member that dials the voters, receives the log and submits commands through the leader."""

    def __init__(self, job: str, node_id: str | None, voters: list[str], secret: bytes,
                 timing: RaftTiming = RaftTiming(), trace: Trace | None = None, epoch: int = 0,
                 on_view: Callable[[], None] = lambda: None,
                 on_link_lost: Callable[[str], None] = lambda node_id: None) -> None:
        self.job = job
        self.node_id = node_id
        self.timing = timing
        self._voters = sorted(v for v in voters if v != node_id)
        self.epoch = epoch
        self._on_view = on_view                   # called (on the node's thread) after each new view
        self._on_link_lost = on_link_lost         # called (on the node's thread) when a working link closed
        self._password = derive_key(secret, job, raft_purpose(epoch)).hex()
        self._state = JobState(job)
        self._trace = trace or Trace(None, "", "", "")
        self._inbox: queue.Queue[_Request] = queue.Queue()
        self._requests: dict[str, _Request] = {}
        self._answered: list[tuple[_Request, object]] = []   # succeeded this turn: answered once published
        self._handed_over = False                 # a request went to SyncObj this turn: tick again at once
        self._tick_left_work = False              # the tick's last poll handled messages: tick again at once
        self._leader_committed_term = -1         # the last term in which this node, leading, applied an entry
        self._hasten: str | None = None           # a leader id proven dead (set by another thread; hasten_election)
        self._view: RaftView | None = None
        self._view_changed = threading.Condition()
        self._stop = threading.Event()
        name = node_id or "nonvoter"
        self._thread = threading.Thread(target=self._run, name=f"raft-{name}", daemon=True)
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._removed = False
        self._wake: _Waker | None = None          # wakes the node's poll when another thread submits
        self._last_applied: tuple[int, int, str] = (0, 0, "")
        self._checkpoints: deque[tuple[int, int, str]] = deque(maxlen=32)

    def __repr__(self) -> str:
        return f"RaftNode({self.node_id or 'non-voting member'})"

    # --- lifecycle ---------------------------------------------------------------------------------

    def start(self, timeout: float = 5.0) -> None:
        self._thread.start()
        if not self._started.wait(timeout) or self._error:
            raise RaftUnavailable(f"raft node {self!r} failed to start: {self._error!r}")

    def stop(self) -> None:
        self._stop.set()
        wake = self._wake
        if wake is not None:
            wake.notify()                 # end the node thread's poll now, not at its next timer
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    # --- API for other threads ---------------------------------------------------------------------

    def submit(self, command: Command, timeout: float = 5.0) -> Outcome:
        return self._call("command", command, timeout)

    def add_node(self, addr: str, timeout: float = 5.0) -> None:
        self._call("add", addr, timeout)

    def remove_node(self, addr: str, timeout: float = 5.0) -> None:
        self._call("remove", addr, timeout)

    def transfer_leadership(self, timeout: float = 2.0) -> None:
        self._call("transfer", None, timeout)

    def hasten_election(self, leader: str) -> None:
        """The node `leader` is judged gone (its agent's host refused our heartbeats, or the detector judged its
        agent's silence): if it is still the leader this follower follows, campaign soon instead of after a full
        election timeout: the first surviving voter in id order at once, the k-th after k × `hasten_spread` s
        (every follower told at once knows the same order, so they do not split the vote; a first one that cannot
        win, its log behind, is followed by the next). An election is always safe in Raft; this only ends the
        wait for one that must come (a live leader judged gone by mistake is deposed, as Raft allows at any time).

        Args:
            leader: the node id of the leader judged gone.
        """
        self._hasten = leader
        wake = self._wake
        if wake is not None:
            wake.notify()

    def view(self) -> RaftView | None:
        return self._view

    def wake_waiters(self) -> None:
        """Make every `wait_view` re-check its predicate now (its predicate also reads something other than the
        view, which just changed)."""
        with self._view_changed:
            self._view_changed.notify_all()

    def wait_view(self, predicate: Callable[[RaftView], bool], timeout: float) -> RaftView | None:
        """Block until a published view satisfies `predicate`; return it (or None on timeout)."""
        deadline = time.monotonic() + timeout
        with self._view_changed:
            while True:
                view = self._view
                if view is not None and predicate(view):
                    return view
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return None
                self._view_changed.wait(min(left, 0.1))

    def _call(self, kind: str, payload: object, timeout: float):
        request = _Request(kind, payload, Future(), time.monotonic() + timeout)
        self._inbox.put(request)
        wake = self._wake
        if wake is not None:
            wake.notify()                 # the node's thread handles it now, not at its next tick
        if self._stop.is_set():           # its thread may have ended: it takes nothing more (see _run's end)
            self._refuse_inbox()
        try:
            return request.future.result(timeout + 1.0)
        except FutureTimeout:
            raise RaftUnavailable(f"no Raft quorum answered {kind} within {timeout:.1f} s") from None

    # --- the node's thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            bind = raft_addr_of(self.node_id) if self.node_id else None
            conf = self.timing.conf(bind, self._password, on_state_changed=self._on_state_changed)
            self._so = JobSyncObj(self.node_id, self._voters, conf=conf, consumers=[self._state],
                                  nodeClass=NodeId, transportClass=NodeTransport, on_applied=self._on_applied,
                                  on_vote=self._on_vote)
        except BaseException as e:
            self._error = e
            self._started.set()
            return
        self._so._SyncObj__transport.on_link_lost = self._link_lost
        self._wake = _Waker(self._so._poller)
        self._record("node", self.node_id, voter=self.node_id is not None)
        self._started.set()
        try:
            while not self._stop.is_set():
                self._sleep(self._turn())                # until a message, a submission or the next timer
        except Exception:
            log.exception("raft node %r crashed", self)
        finally:
            self._so.destroy()
            wake, self._wake = self._wake, None
            if wake is not None:
                wake.close(self._so._poller)
            index, term, digest = self._last_applied
            if index:
                self._record("applied", self.node_id, index=index, term=term, hash=digest)
            self._trace.flush()
            self._answer_published()
            for request in list(self._requests.values()):
                request.future.set_exception(RaftUnavailable("raft node stopped"))
            self._refuse_inbox()

    def _refuse_inbox(self) -> None:
        """Fail every request still waiting in the inbox of a stopped node at once. A caller that reached this
        node just before it stopped (an agent switching to its promoted voter) would otherwise wait out its whole
        deadline: a stress run saw an application's vote hang 6 s, and every generation after it wait for that
        vote. Run by the node's thread at its end and by a caller that finds the node stopped after enqueueing:
        whichever comes last takes what the other left."""
        while True:
            try:
                request = self._inbox.get_nowait()
            except queue.Empty:
                return
            request.future.set_exception(RaftUnavailable("raft node stopped"))
            self._requests.clear()
            with self._view_changed:
                self._view_changed.notify_all()

    def _turn(self) -> float:
        """One turn of the node's thread: Raft's timers, then the events already waiting, then our requests and
        view; returns how long the thread may sleep before the next turn."""
        handled = self._so.messages_handled
        self._so.doTick(0.0)
        self._tick_left_work = self._so.messages_handled != handled     # see syncobj.py, 6
        hasten, self._hasten = self._hasten, None
        if hasten is not None:
            self._campaign_soon(hasten)
        self._drain_inbox()
        self._drive_requests()
        self._publish()
        self._answer_published()
        self._trace.maybe_flush()
        return self._wait_s()

    def _sleep(self, wait: float) -> None:
        """Poll for `wait` seconds, or until something a turn acts on happened: a message that calls for a tick
        (`JobSyncObj.messages_handled`), a link or refusal event (`NodeTransport.events`), a wake-up by another
        thread, or a change of the leader this node would publish.

        Args:
            wait: seconds until the next thing on a clock (`_wait_s`).
        """
        so, transport, waker = self._so, self._so._SyncObj__transport, self._wake
        until = so_monotonic() + wait
        while not self._stop.is_set():
            marks = (so.messages_handled, transport.events, waker.woken if waker is not None else 0)
            now = so_monotonic()
            so._poller.poll(max(0.0, until - now))
            if so_monotonic() >= until or \
                    marks != (so.messages_handled, transport.events, waker.woken if waker is not None else 0) or \
                    self._view is None or self._fresh_leader() != self._view.leader:
                return

    def _campaign_soon(self, dead_leader: str) -> None:
        so = self._so
        leader = so._getLeader()
        if self.node_id is None or so._isLeader() or leader is None or leader.id != dead_leader:
            return                                # not a voter, or the job has moved on already
        survivors = sorted({str(n.id) for n in so.otherNodes} - {dead_leader} | {self.node_id})
        deadline = so_monotonic() + survivors.index(self.node_id) * self.timing.hasten_spread
        if deadline < so._SyncObj__raftElectionDeadline:
            so._SyncObj__raftElectionDeadline = deadline
            self._record("hasten", self.node_id, term=so.raftCurrentTerm, dead_leader=dead_leader,
                         after=round(deadline - so_monotonic(), 4))
            log.info("raft node %s: leader %s is judged gone; campaigning within %.2f s", self.node_id, dead_leader,
                     deadline - so_monotonic())

    def _link_lost(self, node_id: str) -> None:
        try:
            self._on_link_lost(node_id)
        except Exception:                         # a hint's consumer must not end the node's thread
            log.exception("raft node %s: the lost-link callback for %s failed", self.node_id, node_id)

    def _record(self, kind: str, node: str | None, **fields: object) -> None:
        self._trace.record(kind, node, epoch=self.epoch, **fields)

    # --- hooks called by SyncObj on this thread ------------------------------------------------------

    def _on_state_changed(self, old: int, new: int) -> None:
        if new == _RAFT_STATE.LEADER:
            self._record("leader", self.node_id, term=self._so.raftCurrentTerm, nodes=self._configuration(),
                         last=self._last_entry())

    def _on_vote(self, term: int, candidate: str, request: dict) -> None:
        self._record("vote", self.node_id, term=term, candidate=str(candidate), last=self._last_entry(),
                     candidate_last=[request.get("last_log_index"), request.get("last_log_term")])

    def _configuration(self) -> list[str]:
        return sorted({str(n.id) for n in self._so.otherNodes} | ({self.node_id} if self.node_id else set()))

    def _last_entry(self) -> list[int]:
        entries = self._so._SyncObj__getEntries(self._so._SyncObj__getCurrentLogIndex(), 1)
        return [entries[0][1], entries[0][2]] if entries else [0, 0]

    def _on_applied(self, index: int, term: int, command: bytes, result: object) -> None:
        digest = self._state.fold_entry(index, term, command)
        self._last_applied = (index, term, digest)
        if term != self._leader_committed_term and self._so._isLeader() and term == self._so.raftCurrentTerm:
            self._leader_committed_term = term          # the first entry of this leader's term it applied
            self._record("leader_commit", self.node_id, term=term, index=index)
        if index % CHECKPOINT_EVERY == 0:
            self._checkpoints.append(self._last_applied)
            self._record("applied", self.node_id, index=index, term=term, hash=digest)
        kind = command[0] if command else None
        if kind == _COMMAND_TYPE.MEMBERSHIP and self.node_id is not None:
            change = so_pickle.loads(command[1:])
            self._record("config", self.node_id, index=index, term=term, change=[change[0], str(change[1])],
                         nodes=self._configuration())
            if change[0] == "rem" and change[1] == self.node_id:
                self._removed = True
                log.warning("raft node %s applied its own removal: it no longer speaks for the job", self.node_id)
        elif kind == _COMMAND_TYPE.REGULAR and isinstance(result, Outcome) and result.ok and not result.replayed \
                and not self._state.last_was_duplicate:     # a duplicate or a replay changed nothing: nothing to trace
            self._trace_outcome(index, command, result)

    def _trace_outcome(self, index: int, command: bytes, outcome: Outcome) -> None:
        call = so_pickle.loads(command[1:])
        args = call[1] if isinstance(call, tuple) and len(call) > 1 else ()
        submitted = args[1] if len(args) > 1 else None
        if isinstance(submitted, Register):
            self._record("register", self.node_id, index=index, peer_id=submitted.peer_id,
                               incarnation=submitted.incarnation)
        for effect in outcome.effects:
            if isinstance(effect, Activated):
                cert = effect.certificate
                self._record("activated", self.node_id, index=index, generation=cert.generation,
                                   members=[[m.peer_id, m.incarnation] for m in cert.members],
                                   revision=cert.frontier.revision, regressed_from=cert.regressed_from)

    def _wait_s(self) -> float:
        """How long the node's thread may sleep in its next poll. Not at all after it handed SyncObj a request (the
        leader appends it, a follower forwards it, on the next tick) or after its tick handled messages (what they
        call for happens on the next tick). Otherwise until the next thing on a clock:
        the leader's next append or a follower's election deadline (pysyncobj's clock), a request's retry or
        deadline (ours); at most `idle_tick`, or `tick` while a node is not connected (reconnects run on the
        tick). Messages and submissions end the wait earlier."""
        if self._handed_over or self._tick_left_work:
            self._handed_over = False
            return 0.0
        so = self._so
        cap = self.timing.idle_tick if self._all_connected() else self.timing.tick
        raft_now = so_monotonic()
        if so._isLeader():
            due = so._SyncObj__newAppendEntriesTime
        elif self.node_id is not None:
            due = so._SyncObj__raftElectionDeadline
        else:
            due = raft_now + cap
        fresh_until = so.leader_heard_at + self.timing.election_max      # the leader goes stale: publish it then
        if self._view is not None and self._view.leader is not None and not so._isLeader() and fresh_until > raft_now:
            due = min(due, fresh_until)
        wait = min(cap, due - raft_now) if due > raft_now else self.timing.tick
        now = time.monotonic()
        for request in self._requests.values():
            next_step = request.retry_at if request.retry_at is not None else request.attempt_deadline
            wait = min(wait, max(0.0, min(next_step, request.deadline) - now))
        return wait

    def _all_connected(self) -> bool:
        so = self._so
        return all(so.isNodeConnected(node) for node in so.otherNodes)

    def _drain_inbox(self) -> None:
        while not self._inbox.empty():            # most loops find it empty: no exception raised for that
            try:
                request = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._requests[request.request_id] = request

    def _drive_requests(self) -> None:
        now = time.monotonic()
        for request in list(self._requests.values()):
            if now > request.deadline:
                self._finish(request, error=RaftUnavailable(
                    f"{request.kind} not committed after {request.attempt} attempt(s): no quorum reachable"))
            elif request.retry_at is not None and now >= request.retry_at:
                self._send(request, now)
            elif request.retry_at is None and now > request.attempt_deadline:
                request.retry_at = now        # the callback was lost: resend with the same request id

    def _send(self, request: _Request, now: float) -> None:
        self._handed_over = True
        request.attempt += 1
        request.retry_at = None
        request.attempt_deadline = now + self.timing.attempt_timeout
        attempt = request.attempt
        callback = lambda res, err: self._on_result(request, attempt, res, err)  # noqa: E731
        if request.kind == "command":
            self._state.submit(request.request_id, request.payload, callback=callback)
        elif request.kind == "add":
            self._so.addNodeToCluster(request.payload, callback=callback)
        elif request.kind == "remove":
            self._so.removeNodeFromCluster(request.payload, callback=callback)
        elif request.kind == "transfer":
            self._so.transferLeadership(callback=callback)

    def _on_result(self, request: _Request, attempt: int, result, error) -> None:
        if request.request_id not in self._requests or attempt != request.attempt:
            return
        if error == FAIL_REASON.SUCCESS:
            self._finish(request, result=result)
        elif error == FAIL_REASON.REQUEST_DENIED and self._membership_already_done(request):
            self._finish(request, result=None)
        elif error == FAIL_REASON.NOT_LEADER and request.kind == "transfer":
            self._finish(request, result=None)      # leadership already moved: nothing left to transfer
        else:
            log.debug("%s attempt %d failed (reason %s); retrying", request.kind, attempt, error)
            pause = self.timing.leaderless_pause if error == FAIL_REASON.MISSING_LEADER else self.timing.retry_pause
            request.retry_at = time.monotonic() + pause

    def _membership_already_done(self, request: _Request) -> bool:
        """A denied membership change whose effect is already in the configuration succeeded earlier
        (an earlier attempt committed, its answer was lost). A denied transfer is final."""
        nodes = {n.id for n in self._so.otherNodes} | {self.node_id}
        if request.kind == "add":
            return request.payload in nodes
        if request.kind == "remove":
            return request.payload not in nodes
        return False

    def _finish(self, request: _Request, result=None, error: BaseException | None = None) -> None:
        """Answer a request; a success only once the view that holds it is published (`_answer_published`), so
        that a caller whose submit returned reads a view with its command applied (it may act on that view at
        once, as a leaving agent deciding on a hand-over does). pysyncobj calls back before it counts the entry
        as applied, so the answer waits for this turn's publication."""
        self._requests.pop(request.request_id, None)
        if error is not None:
            request.future.set_exception(error)
        else:
            self._answered.append((request, result))

    def _answer_published(self) -> None:
        answered, self._answered = self._answered, []
        for request, result in answered:
            request.future.set_result(result)

    def _publish(self) -> None:
        so = self._so
        leader = self._fresh_leader()
        nodes = tuple(sorted({n.id for n in so.otherNodes} | ({self.node_id} if self.node_id else set())))
        transport = so._SyncObj__transport
        refusals = tuple(transport.refusals_received)
        refused = tuple(sorted(transport.refused.items()))
        status = (so.raftLastApplied, so.raftCurrentTerm, leader, nodes, so.isReady(), self._removed,
                  refusals[-1:], refused)
        old = self._view
        if old is not None and (old.version, old.term, old.leader, old.nodes, old.ready, old.removed,
                                old.refusals[-1:], old.refused) == status:
            return
        machine = self._state.machine.snapshot() if old is None or old.version != so.raftLastApplied \
            else old.machine
        view = RaftView(so.raftLastApplied, machine, so.raftCurrentTerm, leader, so._isLeader(), nodes,
                        so.isReady(), self.node_id, self._removed, self._last_applied, tuple(self._checkpoints),
                        refusals, refused, self.epoch)
        with self._view_changed:
            self._view = view
            self._view_changed.notify_all()
        self._on_view()

    def _fresh_leader(self) -> str | None:
        """The leader's node id, if this node heard an append from it within the longest election timeout (or
        is it). The fence reads this: a member whose agent hears no leader stops committing."""
        so = self._so
        if so._isLeader():
            return self.node_id
        leader = so._getLeader()
        if leader is None or so_monotonic() > so.leader_heard_at + self.timing.election_max:
            return None
        return leader.id


class _Waker:
    """A pipe in the node's poller: a byte written by another thread ends the node thread's wait at once."""

    def __init__(self, poller) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._lock = threading.Lock()            # a notify never writes into a closed (possibly reused) fd
        self._closed = False
        self.woken = 0                            # wake-ups taken (read by the node's thread)
        poller.subscribe(self._read, self._drain, POLL_EVENT_TYPE.READ)

    def notify(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                os.write(self._write, b"w")
            except BlockingIOError:               # full: a wake-up is pending anyway
                pass

    def _drain(self, descr: int, event_mask: int) -> None:
        self.woken += 1
        try:
            while os.read(self._read, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self, poller) -> None:
        with self._lock:
            self._closed = True
            poller.unsubscribe(self._read)
            os.close(self._read)
            os.close(self._write)

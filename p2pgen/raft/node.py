"""RaftNode: one pysyncobj node of a job, ticked by its own thread, with a thread-safe API.

Owns: the SyncObj, the thread that ticks it, command submission with retries, Raft membership
changes, and publication of immutable views of the replicated state.
Invariants kept:
- only the node's own thread touches the SyncObj (getStatus and the state machine are not
  thread-safe, pitfall 13): other threads talk to it through a queue and read published views;
- a submitted command is retried with the *same* request id until a result arrives or the deadline
  passes (async callbacks can be lost on leader changes, pitfall 4), so it is applied at most once;
- traffic is encrypted with a password derived from the job secret, the server binds only the given
  address (pitfall 9), no journal and no dump file (pitfall 12).
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
import time
import uuid
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Callable

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf

from p2pgen.auth import derive_key
from p2pgen.core import Command, GenerationMachine, Outcome
from p2pgen.errors import P2PGenError
from p2pgen.raft.consumer import JobState
from p2pgen.raft.transport import KeepAliveTransport

log = logging.getLogger(__name__)


class RaftUnavailable(P2PGenError):
    """No Raft quorum answered in time: a majority of agents is unreachable."""


@dataclass(frozen=True)
class RaftTiming:
    """Timeouts of the Raft node. Tight by default: the agent process does nothing else (see notes)."""

    append_period: float = 0.02
    election_min: float = 0.15
    election_max: float = 0.30
    tick: float = 0.005
    attempt_timeout: float = 1.0      # resend a command with the same request id after this long
    retry_pause: float = 0.02

    def conf(self, bind: str, password: str) -> SyncObjConf:
        return SyncObjConf(
            autoTick=False, appendEntriesPeriod=self.append_period,
            raftMinTimeout=self.election_min, raftMaxTimeout=self.election_max,
            connectionTimeout=max(1.0, self.election_max), connectionRetryTime=0.1,
            leaderFallbackTimeout=max(0.5, 3 * self.append_period), dynamicMembershipChange=True,
            bindAddress=bind, password=password, journalFile=None, fullDumpFile=None,
            commandsWaitLeader=True,
        )


@dataclass(frozen=True)
class RaftView:
    """A consistent copy of the replicated state and the node's Raft status, safe to read anywhere."""

    version: int                      # Raft index of the last applied entry
    machine: GenerationMachine
    term: int
    leader: str | None
    is_leader: bool
    nodes: tuple[str, ...]            # every voter, this node included, sorted
    ready: bool                       # this node has caught up with the log at least once


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
    def __init__(self, job: str, self_addr: str, others: list[str], secret: bytes,
                 timing: RaftTiming = RaftTiming()) -> None:
        self.job = job
        self.self_addr = self_addr
        self.timing = timing
        self._others = [o for o in others if o != self_addr]
        self._password = derive_key(secret, job, "raft").hex()
        self._state = JobState(job)
        self._inbox: queue.Queue[_Request] = queue.Queue()
        self._requests: dict[str, _Request] = {}
        self._view: RaftView | None = None
        self._view_changed = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"raft-{self_addr}", daemon=True)
        self._started = threading.Event()
        self._error: BaseException | None = None

    # --- lifecycle ---------------------------------------------------------------------------------

    def start(self, timeout: float = 5.0) -> None:
        self._thread.start()
        if not self._started.wait(timeout) or self._error:
            raise RaftUnavailable(f"raft node {self.self_addr} failed to start: {self._error!r}")

    def stop(self) -> None:
        self._stop.set()
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

    def view(self) -> RaftView | None:
        return self._view

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
        try:
            return request.future.result(timeout + 1.0)
        except FutureTimeout:
            raise RaftUnavailable(f"no Raft quorum answered {kind} within {timeout:.1f} s") from None

    # --- the node's thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._so = SyncObj(self.self_addr, self._others, conf=self.timing.conf(self.self_addr, self._password),
                               consumers=[self._state], transportClass=KeepAliveTransport)
        except BaseException as e:
            self._error = e
            self._started.set()
            return
        self._started.set()
        try:
            while not self._stop.is_set():
                self._so.doTick(self.timing.tick)
                self._drain_inbox()
                self._drive_requests()
                self._publish()
        except Exception:
            log.exception("raft node %s crashed", self.self_addr)
        finally:
            self._so.destroy()
            for request in list(self._requests.values()):
                request.future.set_exception(RaftUnavailable("raft node stopped"))
            self._requests.clear()
            with self._view_changed:
                self._view_changed.notify_all()

    def _drain_inbox(self) -> None:
        while True:
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
            request.retry_at = time.monotonic() + self.timing.retry_pause

    def _membership_already_done(self, request: _Request) -> bool:
        """A denied membership change whose effect is already in the configuration succeeded earlier
        (an earlier attempt committed, its answer was lost). A denied transfer is final."""
        nodes = {n.address for n in self._so.otherNodes} | {self.self_addr}
        if request.kind == "add":
            return request.payload in nodes
        if request.kind == "remove":
            return request.payload not in nodes
        return False

    def _finish(self, request: _Request, result=None, error: BaseException | None = None) -> None:
        self._requests.pop(request.request_id, None)
        if error is not None:
            request.future.set_exception(error)
        else:
            request.future.set_result(result)

    def _publish(self) -> None:
        so = self._so
        leader = so._getLeader()
        nodes = tuple(sorted({n.address for n in so.otherNodes} | {self.self_addr}))
        leader_addr = leader.address if leader else None
        status = (so.raftLastApplied, so.raftCurrentTerm, leader_addr, nodes, so.isReady())
        old = self._view
        if old is not None and (old.version, old.term, old.leader, old.nodes, old.ready) == status:
            return
        machine = copy.deepcopy(self._state.machine) if old is None or old.version != so.raftLastApplied \
            else old.machine
        view = RaftView(so.raftLastApplied, machine, so.raftCurrentTerm, leader_addr, so._isLeader(), nodes,
                        so.isReady())
        with self._view_changed:
            self._view = view
            self._view_changed.notify_all()

"""Heartbeats between agents and the runner of the failure detector.

Owns: a UDP socket on the agent's control address, signed heartbeats sent to every other agent of the job,
the arrival history of the agents it watches, what each of them last announced (`Announcement`: its process
instance, the Raft node it runs, whether it may be promoted to voter), and the calls to the pure
`p2pgen.detect.suspects` decision.
Invariants kept:
- every agent sends to every other, but judges only those it watches (`p2pgen.core.heartbeats.watched`: all of
  them up to WATCH_FANOUT others; beyond, its ring neighbours and the voters' agents; the Raft leader's agent
  watches every agent), plus every agent it knows only from heartbeats or from before (a joiner, an agent
  between two incarnations of its member) and, while the local application reports its collective stalled, the
  agents it waits for. A packet from an agent it does not watch is dropped before its signature is checked.
  Since the senders do not depend on who watches them, agents that disagree for a moment on the job's agents
  can judge a few more or fewer peers, never a peer that does not send to them;
- a heartbeat that is not signed with the job's key is ignored (I8): an outsider can neither keep a dead
  peer alive nor get one evicted. A signed heartbeat from an agent that is not a target yet (a joiner whose
  member is not registered) makes it one, so both sides hear each other from the joiner's first beat;
- an agent that hears no other agent blames no one: it cannot tell their silence from its own deafness (it
  just joined, or it is cut off). One that hears some suspects a target silent for the detector's timeout,
  heard before or not: an agent that died before its first heartbeat arrived (SIGKILLed right after its
  member registered) must still be evicted. "Hears none" also holds when at least two other agents were
  all silent at once for half the detector's floor: one agent's deafness is likelier than their failing
  together, so it blames none of them;
- our own stall (a SIGSTOP, a long GC) is never blamed on others: after a gap longer than the
  detector's floor, the gap is taken out of every peer's silence (its last arrival moves that much later);
  one already suspected stays suspected until it is heard again;
- each suspicion is reported once until the peer is heard from again;
- every heartbeat also says which agents its sender cannot hear (those it suspects). A peer that keeps saying it
  cannot hear this agent for the detector's floor (our own stalls excluded; it took the timeout to say so) is
  reported too, though we hear it:
  an agent that can speak but not listen gets no Raft log and can vote for nothing, so left in the job it would
  hold every generation change until the link heals (a one-way partition);
- every heartbeat also echoes, for each agent it judges and heard, the newest sequence number heard from it. The
  job is proven to hear this agent (`heard_by_job`) while a majority of its lease quorum (the voters' agents,
  itself counted when it runs a voter: `p2pgen.core.heartbeats.lease_quorum`) echoed one of its heartbeats sent
  within the detector's stalled floor (`lease_runs_out`; the thread wakes when it does): only a round trip renews
  that lease, so an agent whose sends are dropped while it still hears everyone (a one-way cut) loses it within
  the stalled floor, before any agent may suspect it, and its member stops committing
  (`p2pgen.core.view.cut_off`). A newly judged agent counts as heard for one lease; our own stall is taken out
  of the lease as out of the silences;
- a heartbeat from a new process at a known address (another instance) is reported at once as the end of
  the old one (`on_replaced`): a host replaced at the same address must not look alive to the detector;
- a target silent for PROBE_AFTER heartbeat intervals gets our heartbeats on a UDP socket connected to it
  instead of the shared one (one copy per round: a second copy of the same heartbeat would be counted as a
  replay by a peer that was only late). When no process holds its port (its agent died and its host lives: an
  OOM kill, a crash, a host that
  reboots the agent), the host answers ICMP port unreachable, which a connected socket reports as a refusal:
  that is proof, not silence, and the agent is reported at once instead of after the detector's timeout. A
  host that is gone, partitioned or an agent that is stopped answers nothing, and the detector decides as
  before;
- a target named by a hint (`hint`: its agent's Raft link to us closed, which its kernel does at once when
  the process dies) is probed at once rather than after PROBE_AFTER intervals, and its refusal looked for
  every HINT_RECHECK_S for HINT_WINDOW intervals: a refusal with nothing heard from it since the probe left
  is the same proof. A hint is never a suspicion by itself: a live target is heard again and nothing happens;
- while the local application reports its collective stalled (`stalled`: the members of those agents are
  what it waits for), their silences are judged from the detector's stalled floor instead of its floor, for
  the report's lease, at the instant a silence reaches the detector's verdict (`p2pgen.detect.judged_at`: the
  thread wakes then, not at its next round, since the whole job waits meanwhile); the same holds, with no report,
  for the agents whose members the job's pending generation waits for (`awaited`: their vote, or their pull),
  since no collective runs then to stall; like a hint, a stall report is never a suspicion by itself;
- a replayed heartbeat (one not newer than the last heard from its process, or from a process already
  replaced at that address) changes nothing: it can neither keep a dead process alive nor report a live
  one as replaced. Every packet dropped is counted under a reason (`refusals()`, shown by `p2pgen show`).
"""

from __future__ import annotations

import functools
import logging
import math
import socket
import struct
import threading
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import msgpack

from p2pgen import faults
from p2pgen.auth import Prover
from p2pgen.core.heartbeats import hears_no_one, lease_quorum, lease_runs_out, watched
from p2pgen.detect import DetectorConfig, HeartbeatHistory, judged_at, suspects
from p2pgen.transport.stats import RejectCounters

log = logging.getLogger(__name__)

TAG_BYTES = 32
MAX_PACKET = 4096
RETIRED_KEPT = 16                 # replaced instances remembered per address
REASONS = ("forged", "malformed", "oversized", "wrong_job", "replayed")
MAX_UNHEARD = 256                 # agents one heartbeat may name as unheard
MAX_ECHO = 64                     # agents one heartbeat may echo (the most recently heard first)
LEASE_WAKE_S = 0.001              # past the lease's end when the thread wakes to judge it
SENT_KEPT = 64                    # own heartbeats whose sending time is kept, to date their echoes
PROBE_AFTER = 2                   # heartbeat intervals of silence after which a target's port is probed
HINT_WINDOW = 2                   # heartbeat intervals a hinted target's refusal is looked for
HINT_RECHECK_S = 0.005            # how often, meanwhile (an ICMP answer takes one round trip)
SO_TIMESTAMPNS = 35               # Linux: stamp each datagram with its arrival time (struct timespec)
ANCILLARY_BYTES = socket.CMSG_SPACE(16)
TIMESPEC = struct.Struct("qq")
WatchPlan = tuple[frozenset[str], frozenset[str]]   # (the job's agents from the committed log, the voters' agents)
RoundPlan = tuple[AbstractSet[str], WatchPlan | None, AbstractSet[str], AbstractSet[str]]   # see HeartbeatRunner._plan


def _ask_kernel_stamps(sock: socket.socket) -> None:
    """Ask the kernel to stamp every datagram with its arrival time, so that a peer's heartbeat is dated when it
    arrived, not when this thread next woke; where the option is missing, arrivals are dated when read."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError as e:
        log.debug("no kernel arrival stamps on heartbeats (%s): arrivals are dated when read", e)


def _kernel_stamp(ancillary: list[tuple[int, int, bytes]]) -> float | None:
    """The wall-clock arrival time the kernel attached to a datagram, if any."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            seconds, nanoseconds = TIMESPEC.unpack_from(data)
            return seconds + nanoseconds * 1e-9
    return None


@functools.lru_cache(maxsize=4096)
def _address(agent: str) -> tuple[str, int]:
    """(host, port) of an agent's control address HOST:PORT, parsed once."""
    host, _, port = agent.rpartition(":")
    return host, int(port)


@functools.lru_cache(maxsize=4096)
def _valid_sender(sender: str) -> bool:
    """Whether a heartbeat's sender field is an address HOST:PORT (checked once per address)."""
    if type(sender) is not str:
        return False
    _, colon, port = sender.rpartition(":")
    return bool(colon) and port.isdigit()


def _own_echo(echo: object, self_addr: str) -> int | None:
    """The sequence number of ours that a heartbeat's echo names (None if it names none of ours).

    Raises:
        ValueError: `echo` is not a list of at most MAX_ECHO [address, seq] pairs.
    """
    if type(echo) is not list or len(echo) > MAX_ECHO:
        raise ValueError(f"echo {echo!r} is not a list of at most {MAX_ECHO} [address, seq] pairs")
    own = None
    for entry in echo:
        if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not str or type(entry[1]) is not int:
            raise ValueError(f"echo {echo!r} is not a list of at most {MAX_ECHO} [address, seq] pairs")
        if entry[0] == self_addr:
            own = entry[1]
    return own


class _Bell:
    """Ends the heartbeat thread's sleep early: `ring` from any thread, `sleep` on the heartbeat thread. A lock held
    while nobody rang: a sleep takes it (a ring before the sleep included), so no ring is lost, not even one that
    comes between a wake-up and the next sleep (an Event's wait then clear would lose it), and a sleep is one
    acquire with a timeout (an Event's wait builds a Condition's waiter lock on every call, ten times a second)."""

    def __init__(self) -> None:
        self._rung = threading.Lock()
        self._rung.acquire()

    def ring(self) -> None:
        """End the current sleep, or the next one at once."""
        try:
            self._rung.release()
        except RuntimeError:
            pass                                  # rung already, and not yet heard: one wake-up serves both

    def sleep(self, seconds: float) -> bool:
        """Until rung (a ring before the call counts) or for `seconds`; whether it was rung."""
        return self._rung.acquire(timeout=max(0.0, seconds))


@dataclass(frozen=True)
class Announcement:
    """What an agent says of itself in every heartbeat."""

    instance: str               # nonce of the agent process
    node: str                   # id of the Raft node it runs as a voter, or "" (a non-voting member)
    eligible: bool              # a non-voting member that is caught up and may be promoted to voter
    unheard: tuple[str, ...] = ()   # agents it suspects: it cannot hear them (filled in by the runner)


class HeartbeatRunner:
    def __init__(self, host: str, port: int, key: bytes, job: str, self_addr: str, config: DetectorConfig,
                 targets: Callable[[], AbstractSet[str]], on_suspect: Callable[[str, str, str], None],
                 announce: Callable[[], Announcement],
                 on_replaced: Callable[[str, str, str], None] = lambda addr, old, new: None,
                 on_refused: Callable[[str, str, str], None] | None = None,
                 watch: Callable[[], WatchPlan | None] = lambda: None,
                 on_heard: Callable[[bool], None] = lambda heard: None,
                 lease_plan: Callable[[], WatchPlan | None] = lambda: None) -> None:
        """Args (beyond the obvious):
            targets: every agent of the job (heartbeats go to each).
            watch: (the job's agents read from the committed log, the voters' agents), from which the agents this
                one judges are chosen (`p2pgen.core.heartbeats.watched`); None: judge every target.
            on_heard: called from the runner's thread when `heard_by_job` changes, with its new value.
            lease_plan: (the job's agents, the voters' agents) from the committed log, whoever leads, from which
                the agents whose echoes renew the lease are chosen (`p2pgen.core.heartbeats.lease_quorum`); None:
                not known (the agents judged renew it).
        """
        self.key, self.job, self.self_addr, self.config = key, job, self_addr, config
        self._targets, self._on_suspect, self._announce, self._on_replaced = targets, on_suspect, announce, on_replaced
        self._watch = watch
        self._watch_plan: WatchPlan | None = None          # the last plan given, and the agents it watches
        self._watched: frozenset[str] = frozenset()
        self._planned: RoundPlan | None = None            # the last round's, while reusable (own thread; see _plan)
        self._unwatched: AbstractSet[str] = frozenset()    # targets not judged now: their packets are dropped
        self._prover = Prover(key)
        self._on_refused = on_refused or on_suspect      # a suspicion proven by a refusal (default: like any other)
        # Written by this runner's thread alone; those guarded by _lock, which other threads read, are written under
        # it, and this thread reads them without it:
        self._heard: dict[str, Announcement] = {}   # last announcement of each agent (guarded by _lock)
        self._announced: dict[str, tuple[tuple[object, ...], Announcement]] = {}   # sender -> (its last fields,
        #                                                  their Announcement) (receive thread; see _announcement)
        self._joined: set[str] = set()               # signed senders that were not targets (guarded by _lock)
        self._last_seq: dict[str, tuple[str, int]] = {}  # address -> (instance, highest seq) (receive thread)
        self._retired: dict[str, list[str]] = {}         # address -> instances replaced there (receive thread)
        self._unheard_since: dict[str, float] = {}       # peer -> since when it says it cannot hear us (receive thread)
        self._deaf: set[str] = set()                     # peers reported for not hearing us (guarded by _lock)
        self._reported: set[str] = set()                 # peers reported as suspects (guarded by _lock)
        self._last_arrival = -math.inf                   # newest heartbeat taken from any agent (own thread)
        self._silent: set[str] = set()                   # peers the detector would suspect, not blamed (own thread)
        self._probes: dict[str, socket.socket] = {}      # silent target -> UDP socket connected to it (own thread)
        self._refused_on_send: set[str] = set()          # probed targets whose refusal a send reported (own thread)
        self._hints_in: dict[str, str] = {}               # hinted target -> why, not yet probed (guarded by _lock)
        self._hinted: dict[str, tuple[float, str]] = {}   # hinted target -> (when its probe left, why) (own thread)
        self._stalled_until: dict[str, float] = {}        # target -> end of its stall report (guarded by _lock)
        self._awaited: frozenset[str] = frozenset()        # agents the pending generation waits for (see awaited)
        self._wake = _Bell()                              # a hint (or stop) ends the thread's sleep
        self._on_heard, self._lease_plan = on_heard, lease_plan
        self._quorum_of: tuple[WatchPlan | None, frozenset[str], tuple[frozenset[str], bool]] | None = None
        self._sent: dict[int, float] = {}                 # own seq -> when it was sent (own thread)
        self._echoed: dict[str, float] = {}               # agent -> when we sent the newest it echoed (own thread)
        self._heard_by_job = True                         # the lease (read by other threads)
        self._lease_until = math.inf                      # when it runs out unless an echo comes (own thread)
        self._stall_due: float | None = None              # when a stalled target's silence is judged (own thread)
        self._judged_at = -math.inf                       # the time the last judgement looked at (own thread)
        self.counters = RejectCounters(REASONS)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((host, port))
        self._sock.setblocking(False)
        _ask_kernel_stamps(self._sock)
        self._history = HeartbeatHistory(config.window)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._seq = 0
        self._reset_requested = False
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{self_addr}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.ring()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self._sock.close()
        for probe in self._probes.values():
            probe.close()
        self._probes.clear()

    def suspected(self) -> set[str]:
        """Agents currently suspected (reported and not heard from since)."""
        with self._lock:
            return set(self._reported)

    def heard_by_job(self) -> bool:
        """Whether the job is proven to hear this agent: a majority of its lease quorum echoed one of its heartbeats
        sent within the detector's stalled floor (see the module docstring)."""
        return self._heard_by_job

    def _callers(self) -> set[str]:
        """Agents that sent us a signed heartbeat without being a target; dropped once suspected."""
        if not self._joined:
            return set()
        with self._lock:
            self._joined -= self._reported
            return set(self._joined)

    def refusals(self) -> dict[str, int]:
        """Heartbeat packets dropped, by reason."""
        return self.counters.snapshot()

    def heard(self) -> dict[str, Announcement]:
        """The last announcement of every agent heard from and not suspected since (neither silent nor deaf
        to this agent)."""
        with self._lock:
            return {a: ann for a, ann in self._heard.items() if a not in self._reported and a not in self._deaf}

    def hint(self, target: str, why: str) -> None:
        """Something other than the heartbeats suggests `target`'s agent is gone (`why`: its Raft link to us
        closed): probe its port now (see the module docstring). Thread-safe; never a suspicion by itself.

        Args:
            target: the agent's control address HOST:PORT.
            why: what suggested it, for the report a refusal makes.
        """
        with self._lock:
            self._hints_in.setdefault(target, why)
        self._wake.ring()

    def stalled(self, targets: list[str], lease: float) -> None:
        """The local application's collective waits for the members of `targets`' agents and receives
        nothing: judge their silences from the detector's stalled floor for the next `lease` seconds.
        Thread-safe; never a suspicion by itself.

        Args:
            targets: agents' control addresses HOST:PORT.
            lease: seconds the report holds (a new report extends it).
        """
        until = time.monotonic() + lease
        with self._lock:
            fresh = any(target not in self._stalled_until for target in targets)
            for target in targets:
                self._stalled_until[target] = max(until, self._stalled_until.get(target, 0.0))
        if fresh:                           # the thread plans its wake-up for the new target's verdict now
            self._wake.ring()

    def awaited(self, targets: AbstractSet[str]) -> None:
        """The job's pending generation waits for the members of `targets`' agents (their vote, or their pull):
        judge their silences from the detector's stalled floor for as long as it does. Replaces the previous
        set; thread-safe; never a suspicion by itself.

        Args:
            targets: agents' control addresses HOST:PORT (this agent's own is ignored).
        """
        targets = frozenset(targets) - {self.self_addr}
        fresh = bool(targets - self._awaited)
        self._awaited = targets
        if fresh:                           # the thread plans its wake-up for the new target's verdict now
            self._wake.ring()

    def _plan(self) -> tuple[AbstractSet[str], AbstractSet[str]]:
        """(the agents heartbeats go to, the agents judged); see the module docstring. The last round's answer
        (kept as (targets, watch plan, send_to, judged)) when it was made from the very same immutable targets and
        watch plan, with no joiner and no stall report then or now: what an idle agent's rounds find."""
        targets, plan = self._targets(), self._watch()
        last = self._planned
        if last is not None and last[0] is targets and last[1] is plan and not self._joined and \
                not self._stalled_until and not self._awaited:
            return last[2], last[3]
        send_to = (targets | self._callers()) - {self.self_addr}
        stalled: set[str] = set()
        if plan is None:
            judged = send_to
        else:
            if plan != self._watch_plan:
                self._watch_plan, self._watched = plan, watched(self.self_addr, *plan)
            with self._lock:
                self._joined -= plan[0]                   # a joiner that registered: the ring decides from now on
                stalled = set(self._stalled_until) | self._awaited
            judged = send_to & (self._watched | (send_to - plan[0]) | stalled)
        self._unwatched = send_to - judged
        reusable = isinstance(targets, frozenset) and not self._joined and not stalled
        self._planned = (targets, plan, send_to, judged) if reusable else None
        return send_to, judged

    def _stalled_judgement_due(self) -> float | None:
        """When the earliest silence among the stalled targets not yet reported reaches the detector's verdict
        (`p2pgen.detect.judged_at` with the stalled floor), if no judgement looked at that time yet (a verdict
        that reported nothing, the agent deaf, is not looked at again before the next round); None without one."""
        if not self._stalled_until and not self._awaited:
            return None
        with self._lock:
            stalled = [t for t in self._stalled_until.keys() | self._awaited if t not in self._reported]
        history, config = self._history, self.config
        return min((due for due in (judged_at(history.stats(t), config, stalled=True) for t in stalled if t in history)
                    if due > self._judged_at), default=None)

    def _stalled_now(self, now: float) -> frozenset[str]:
        """The agents judged from the stalled floor now: those a stall report names, and those the pending
        generation waits for."""
        awaited = self._awaited
        if not self._stalled_until:         # one read, as under the lock: a report given meanwhile counts next round
            return awaited
        with self._lock:
            for target in [t for t, until in self._stalled_until.items() if until <= now]:
                del self._stalled_until[target]
            return frozenset(self._stalled_until) | awaited

    def _run(self) -> None:
        """One round per heartbeat interval: take what arrived since the last round (each packet with the
        kernel's arrival time), judge, send, sleep until the next round. The thread wakes once per interval
        whatever the number of peers (an idle agent costs little CPU: a wakeup per packet cost more than the
        packet), and stop() ends its sleep at once; a hint wakes it for a probe, and while a hinted probe is
        open it wakes every HINT_RECHECK_S for its answer; the lease's end and a stalled target's verdict wake it
        when they are due."""
        next_send = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                if now >= next_send:
                    self._round(now, now - next_send)
                    next_send = now + self.config.heartbeat_interval
                else:
                    self._hint_turn(now)
            except Exception:       # a fault in one turn must not leave the agent deaf and mute for good
                log.exception("heartbeat turn failed; the next one runs as planned")
                next_send = max(next_send, now + self.config.heartbeat_interval)
            wait = next_send - time.monotonic()
            if self._hinted:
                wait = min(wait, HINT_RECHECK_S)
            if self._heard_by_job:             # judge the lease when it runs out, not at the next round
                wait = min(wait, self._lease_until + LEASE_WAKE_S - time.monotonic())
            self._stall_due = self._stalled_judgement_due()
            if self._stall_due is not None:    # judge a stalled target's silence when its floor runs out
                wait = min(wait, self._stall_due + LEASE_WAKE_S - time.monotonic())
            self._wake.sleep(wait)

    def _round(self, now: float, late: float) -> None:
        """One heartbeat round; `late`: how far past its planned start it runs (our own stall)."""
        if late > self.config.heartbeat_interval:     # no echo could come while we stalled: not the job's doing
            self._echoed = {peer: min(now, sent + late) for peer, sent in self._echoed.items()}
        if late > self.config.floor:
            self._forgive_all(now, late)
        elif self._reset_requested:
            self._reset_requested = False
            self._forgive(now)
        send_to, targets = self._plan()
        self._track(targets, now)
        self._receive(targets)
        self._judge_heard(targets, now)           # the round's start: a stall inside it is the next round's lateness
        self._probe_hinted(targets)
        self._judge_refusals(targets, time.monotonic())
        self._judge(targets, time.monotonic())
        self._send(send_to, targets)

    def _hint_turn(self, now: float) -> None:
        """Between rounds: probe newly hinted targets, take what arrived, judge the lease (the thread wakes when it
        runs out), look for their refusals, and judge the silences once a stalled target's is due. The targets are
        tracked as in a round (one that joined since the last round gets its history first)."""
        _, targets = self._plan()
        self._track(targets, now)
        self._receive(targets)              # an arrival after a probe left says the target lives
        self._judge_heard(targets, now)
        self._probe_hinted(targets)
        self._judge_refusals(targets, time.monotonic())
        if self._stall_due is not None and now >= self._stall_due:
            self._judge(targets, time.monotonic())

    def _probe_hinted(self, targets: AbstractSet[str]) -> None:
        """Send a heartbeat on a connected socket to each hinted target not yet probed for its hint."""
        if not self._hints_in:              # a hint given meanwhile rings the bell: the next turn takes it
            return
        with self._lock:
            fresh, self._hints_in = self._hints_in, {}
            reported = set(self._reported)
        packet = None
        for target, why in fresh.items():
            if target not in targets or target in reported or target in self._hinted or \
                    faults.blocked(self.self_addr, target):
                continue
            packet = packet or self._packet()
            self._hinted[target] = (time.monotonic(), why)
            if not self._probe(target, _address(target), packet):
                del self._hinted[target]

    def reset(self) -> None:
        """Start every peer's history afresh and forget every suspicion (after this agent joined or rejoined
        the job): what we heard while we were cut off says nothing about the others. Taken at the next
        round; until then no one is reported."""
        self._reset_requested = True

    def _forgive_all(self, now: float, gap: float) -> None:
        log.warning("this agent stalled for %.2f s; its peers' silences exclude that time", gap)
        self._forgive(now, gap)

    def _forgive(self, now: float, gap: float | None = None) -> None:
        """Take this agent's own stall of `gap` seconds out of every peer's silence (its last arrival moves
        `gap` later, never past now); a peer already suspected stays suspected until it is heard again, the
        evidence an agent that keeps stalling still needs (a starved leader must still convict, and remove,
        a dead voter). With no gap (after a join or rejoin) every peer starts afresh from now, suspected
        ones included: a peer that is really gone is judged again within the timeout."""
        with self._lock:
            if gap is None:
                self._reported.clear()
            reported = set(self._reported)
        self._unheard_since.clear()
        if gap is None:
            self._echoed = dict.fromkeys(self._echoed, now)
        for peer in self._history.peers():
            if peer in reported:
                continue
            last = self._history.last(peer)
            self._history.forget(peer)
            self._history.record(peer, now if gap is None else min(now, last + gap))

    def _track(self, targets: AbstractSet[str], now: float) -> None:
        history = self._history
        for peer in targets:
            if peer not in history:
                history.record(peer, now)         # a new node gets a full timeout before judgement
                self._echoed[peer] = now          # and a full lease before it counts against us
        if len(history) == len(targets):
            return                                # it holds every target: no other peer
        for peer in set(history.peers()) - targets:
            history.forget(peer)
            self._echoed.pop(peer, None)
            self._unheard_since.pop(peer, None)
            self._announced.pop(peer, None)
            with self._lock:
                self._reported.discard(peer)
                self._deaf.discard(peer)
                self._heard.pop(peer, None)

    def _packet(self) -> bytes:
        """A new signed heartbeat (the next sequence number)."""
        self._seq += 1
        self._sent[self._seq] = time.monotonic()
        self._sent.pop(self._seq - SENT_KEPT, None)
        me = self._announce()
        unheard = sorted(self._reported | self._silent)[:MAX_UNHEARD] if self._reported or self._silent else []
        body = msgpack.packb([self.job, self.self_addr, self._seq, me.instance, me.node, me.eligible, unheard,
                              self._echo()])
        return body + self._prover.prove(body)

    def _echo(self) -> list[list[str | int]]:
        """[agent, the newest seq heard from it] for the agents judged now: every one of them, or the MAX_ECHO most
        recently heard when there are more (a receiver looks for its own address; the order says nothing)."""
        last_seq, history = self._last_seq, self._history
        tracked = [peer for peer in last_seq if peer in history]
        if len(tracked) > MAX_ECHO:
            tracked.sort(key=history.last, reverse=True)
            del tracked[MAX_ECHO:]
        return [[peer, last_seq[peer][1]] for peer in tracked]

    def _take_echo(self, sender: str, seq: int) -> None:
        """Date `sender`'s echo of our heartbeat `seq` (by when we sent it): a round trip."""
        sent = self._sent.get(seq)
        if sent is not None:
            self._echoed[sender] = max(sent, self._echoed.get(sender, sent))

    def _lease_quorum(self, judged: AbstractSet[str]) -> tuple[frozenset[str], bool]:
        """`lease_quorum` for the current lease plan, computed again only when the plan or the judged agents
        change."""
        plan, frozen = self._lease_plan(), frozenset(judged)
        if self._quorum_of is None or self._quorum_of[:2] != (plan, frozen):
            ring, voters = plan if plan is not None else (None, None)
            self._quorum_of = (plan, frozen, lease_quorum(self.self_addr, frozen, ring, voters))
        return self._quorum_of[2]

    def _judge_heard(self, targets: AbstractSet[str], now: float) -> None:
        """Renew or lose the lease (`heard_by_job`); tell `on_heard` when it changes."""
        quorum, counts_itself = self._lease_quorum(targets)
        self._lease_until = lease_runs_out(self._echoed, quorum, counts_itself,
                                           min(self.config.stalled_floor, self.config.floor))
        heard = now <= self._lease_until
        if heard != self._heard_by_job:
            self._heard_by_job = heard
            self._on_heard(heard)

    def _send(self, send_to: AbstractSet[str], judged: AbstractSet[str]) -> None:
        """Send this round's heartbeat to every agent of `send_to`; a silent one of `judged` gets it on its probe."""
        packet = self._packet()
        silent_since = time.monotonic() - PROBE_AFTER * self.config.heartbeat_interval
        for target in send_to:
            if faults.blocked(self.self_addr, target):     # an injected partition (p2pgen.faults)
                continue
            address = _address(target)
            if target in judged and (target in self._probes or self._history.last(target) < silent_since) and \
                    self._probe(target, address, packet):
                continue
            try:
                self._sock.sendto(packet, address)
            except OSError as e:
                log.debug("heartbeat to %s failed: %s", target, e)

    def _probe(self, target: str, address: tuple[str, int], packet: bytes) -> bool:
        """Send the heartbeat on a UDP socket connected to the silent `target` (see the module docstring); False
        when no such socket could be made (the shared socket sends it then)."""
        probe = self._probes.get(target)
        if probe is None:
            probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                probe.setblocking(False)
                probe.connect(address)
            except OSError as e:
                probe.close()
                log.debug("no probe socket for %s: %s", target, e)
                return False
            self._probes[target] = probe
        try:
            probe.send(packet)
        except ConnectionRefusedError:
            self._refused_on_send.add(target)     # the refusal of an earlier probe: judged next round
        except OSError as e:
            log.debug("probe of %s failed: %s", target, e)
        return True

    def _judge_refusals(self, targets: AbstractSet[str], now: float) -> None:
        """Report a probed target whose host refused our heartbeat (no process holds its port); drop the probes
        of targets heard again or no longer targets."""
        silent_since = now - PROBE_AFTER * self.config.heartbeat_interval
        for target, probe in list(self._probes.items()):
            refused = target in self._refused_on_send
            self._refused_on_send.discard(target)
            try:
                probe.recv(1)
            except ConnectionRefusedError:
                refused = True
            except OSError:
                pass                              # nothing came back (BlockingIOError), or nothing to say
            hint = self._open_hint(target, targets, now)
            since = silent_since if hint is None else hint[0]
            heard = target in self._history and self._history.last(target) >= since
            if refused or heard or target not in targets:
                probe.close()
                del self._probes[target]
                self._hinted.pop(target, None)
            if not refused or heard or target not in targets:
                continue                          # heard since: the refusal was for a process replaced there
            with self._lock:
                last = self._heard.get(target)
                hears_others = any(a != target and a not in self._reported for a in self._heard)
                if target in self._reported or (last is None and not hears_others):
                    continue                      # never heard, by an agent that hears no one: as in _judge
                self._reported.add(target)
            silence = now - self._history.last(target)
            probed = f" (probed at once: {hint[1]})" if hint is not None else ""
            self._on_refused(target, last.instance if last else "",
                             f"{'never heard from; ' if last is None else ''}its host refused our heartbeat after "
                             f"{silence:.2f} s of silence{probed} (no process holds the agent's port)")

    def _open_hint(self, target: str, targets: AbstractSet[str], now: float) -> tuple[float, str] | None:
        """(when its probe left, why) of `target`'s hint while it is open; a hint past HINT_WINDOW intervals,
        or for a target no longer a target, is closed (the silence rule alone judges it from then on)."""
        hint = self._hinted.get(target)
        if hint is not None and (now - hint[0] > HINT_WINDOW * self.config.heartbeat_interval or
                                 target not in targets):
            del self._hinted[target]
            return None
        return hint

    def _receive(self, targets: AbstractSet[str]) -> None:
        """Take every heartbeat waiting in the socket (at most 1024 in one round), each at its arrival time; drop
        those whose source is an agent not judged now, unread (its address as the agents name it: HOST:PORT)."""
        clock_offset = time.monotonic() - time.time()      # kernel stamps are wall-clock; histories are monotonic
        unwatched = self._unwatched
        for _ in range(1024):
            try:
                packet, ancillary, _, source = self._sock.recvmsg(MAX_PACKET + 1, ANCILLARY_BYTES)
                if unwatched and f"{source[0]}:{source[1]}" in unwatched:
                    continue
            except BlockingIOError:
                return
            except OSError as e:                 # closed by stop(), or an ICMP error for an earlier send
                if self._stop.is_set():
                    return
                log.debug("heartbeat receive failed: %s", e)
                continue
            stamp = _kernel_stamp(ancillary)
            self._take(packet, targets, time.monotonic() if stamp is None else stamp + clock_offset)

    def _drop(self, reason: str, detail: str) -> None:
        self.counters.add(reason)
        log.debug("dropped a heartbeat (%s): %s", reason, detail)

    def _take(self, packet: bytes, targets: AbstractSet[str], arrived: float | None = None) -> None:
        if len(packet) > MAX_PACKET:
            return self._drop("oversized", f"a packet of more than {MAX_PACKET} bytes")
        body, tag = packet[:-TAG_BYTES], packet[-TAG_BYTES:]
        if len(packet) <= TAG_BYTES or not self._prover.verify(tag, body):
            return self._drop("forged", "not signed with this job's heartbeat key")
        try:
            job, sender, seq, instance, node, eligible, unheard, echo = msgpack.unpackb(body)
            if type(seq) is not int or not _valid_sender(sender):
                raise ValueError(f"sender {sender!r} is not HOST:PORT or seq {seq!r} is not an integer")
            echoed_seq = _own_echo(echo, self.self_addr)
            heard = self._announcement(sender, instance, node, eligible, unheard)
        except (ValueError, TypeError, AttributeError, msgpack.UnpackException) as e:
            return self._drop("malformed", str(e))
        if job != self.job:
            return self._drop("wrong_job", f"a heartbeat of job {job!r}")
        if faults.blocked(sender, self.self_addr) or sender in self._unwatched:
            return                                   # an injected partition (not a refusal), or not judged here
        if sender == self.self_addr or self._replayed(sender, heard.instance, seq):
            return self._drop("replayed", f"heartbeat {seq} of {sender} ({heard.instance}) was heard before")
        with self._lock:
            if sender not in targets:
                self._joined.add(sender)             # a target from the next round on
            before = self._heard.get(sender)
            self._heard[sender] = heard
            self._reported.discard(sender)
        if before is not None and before is not heard and before.instance != heard.instance:
            self._history.forget(sender)          # the new process is judged afresh
            self._on_replaced(sender, before.instance, heard.instance)
        now = time.monotonic() if arrived is None else arrived
        self._history.record(sender, now)
        if now > self._last_arrival:
            self._last_arrival = now
        self._judge_deafness(sender, heard, now)
        if echoed_seq is not None:
            self._take_echo(sender, echoed_seq)

    def _announcement(self, sender: str, instance: object, node: object, eligible: object,
                      unheard: object) -> Announcement:
        """The `Announcement` of these heartbeat fields: the very object made for `sender`'s last heartbeat while
        they are the same (an idle job's heartbeats repeat them), else a new one, its unheard list checked.

        Raises:
            ValueError: `unheard` is not a list of at most MAX_UNHEARD addresses.
        """
        last = self._announced.get(sender)
        fields = (instance, node, eligible, unheard)
        if last is not None and last[0] == fields:
            return last[1]
        if type(unheard) is not list or len(unheard) > MAX_UNHEARD or \
                not all(type(agent) is str for agent in unheard):
            raise ValueError(f"unheard {unheard!r} is not a list of at most {MAX_UNHEARD} addresses")
        heard = Announcement(str(instance), str(node), bool(eligible), tuple(unheard))
        self._announced[sender] = (fields, heard)
        return heard

    def _judge_deafness(self, sender: str, heard: Announcement, now: float) -> None:
        """Report `sender` once it has said for the detector's timeout that it cannot hear this agent; forget
        that as soon as it hears us again."""
        if self.self_addr not in heard.unheard:
            self._unheard_since.pop(sender, None)
            if sender in self._deaf:
                with self._lock:
                    self._deaf.discard(sender)
            return
        since = self._unheard_since.setdefault(sender, now)
        with self._lock:
            if now - since < self.config.floor or sender in self._deaf:
                return
            self._deaf.add(sender)
        self._on_suspect(sender, heard.instance, f"it has not heard this agent for {now - since:.2f} s "
                                                 "(it speaks but cannot listen: a one-way loss)")

    def _hears_no_one(self, targets: AbstractSet[str], now: float) -> bool:
        """Every other agent silent at once (`p2pgen.core.heartbeats.hears_no_one`): none heard for half the
        detector's floor, though at least two are there to hear. Then this agent's own deafness (its receive
        path starved or stopped, a partition around it) is likelier than their simultaneous failures, and it
        blames no one: an agent of a job that hears none of its peers could not commit a suspicion anyway;
        those that hear each other judge.
        A stress run showed the cost of blaming: an agent back from a stop and a rejoin heard no one for
        0.9 s and had four live agents' members evicted one after the other. It still tells the silent ones
        that it cannot hear them (its heartbeats' unheard list): if it stays deaf, they report it."""
        with self._lock:
            others = targets - self._reported
        return hears_no_one(len(others), now - self._last_arrival, self.config.floor)

    def _replayed(self, sender: str, instance: str, seq: int) -> bool:
        """Whether this heartbeat is not newer than the last one of its process, or comes from a process
        already replaced at `sender`; otherwise remember it as the newest. The newest process at an address is
        never among those replaced there (a replaced one is refused before it could become the newest again), so
        a heartbeat of the newest is judged by its sequence number alone."""
        last = self._last_seq.get(sender)
        if last is not None and last[0] == instance:
            if seq <= last[1]:
                return True
            self._last_seq[sender] = (instance, seq)
            return False
        retired = self._retired.setdefault(sender, [])
        if instance in retired:
            return True
        if last is not None:
            retired[:] = (retired + [last[0]])[-RETIRED_KEPT:]
        self._last_seq[sender] = (instance, seq)
        return False

    def _judge(self, targets: AbstractSet[str], now: float) -> None:
        self._judged_at = now
        found = suspects(now, self._history, self.config, self._stalled_now(now))
        self._silent = set(found) if found and self._hears_no_one(targets, now) else set()
        if not found or self._silent or self._reset_requested:     # a reset voids what was heard before it
            return
        for peer, reason in found.items():
            with self._lock:
                last = self._heard.get(peer)
                hears_others = any(a != peer and a not in self._reported for a in self._heard)
                if peer not in targets or peer in self._reported or (last is None and not hears_others):
                    continue
                self._reported.add(peer)
            if last is None:
                reason = f"never heard from in {reason}"
            self._on_suspect(peer, last.instance if last else "", reason)

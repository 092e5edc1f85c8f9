"""Discrete-event simulation of a synchronous cluster under churn, judged by the runtime's detector.

Owns: `simulate(scenario, seed) -> Run`. Invariants: the run is a deterministic function of
(scenario, seed) (numpy PCG64 streams spawned from the seed, one per source of randomness, so a sweep
over the detector sees the very same failures and silences: common random numbers); every detection is
decided by `p2pgen.detect.suspects` itself, called on the tick grid over a heartbeat history rebuilt for
the silent member (its decision depends only on that member's own history); the group makes progress
exactly when no stall interval covers the instant and it has at least one member.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from p2pgen.detect import HeartbeatHistory, suspects
from p2pgen_lab.simulator.model import Scenario

STREAMS = ("failure", "pause", "victim", "heartbeat", "loss")
# hang: a death until its detection; evict/rejoin: the generation changes a death causes; false-*: those a
# false suspicion causes.
STALL_KINDS = ("hang", "evict", "rejoin", "false-evict", "false-rejoin")


@dataclass(frozen=True)
class Stall:
    start: float
    end: float
    kind: str  # one of STALL_KINDS


@dataclass
class Run:
    """What happened in one simulated job."""

    scenario: Scenario
    seed: int
    stalls: list[Stall] = field(default_factory=list)
    sizes: list[tuple[float, int]] = field(default_factory=list)      # (time, members after the change)
    losses: list[tuple[float, float]] = field(default_factory=list)   # (time, progress lost), after the fact
    detect_latencies: list[float] = field(default_factory=list)       # heartbeat-detected deaths only
    failures: int = 0
    process_deaths: int = 0
    pauses: int = 0
    false_positives: int = 0
    detections_by_rule: dict[str, int] = field(default_factory=dict)  # "silent" (timeout) or "phi"

    @property
    def duration(self) -> float:
        return self.scenario.duration

    def stalled_time(self) -> float:
        """Measure of the union of stall intervals (and of memberless time) within the run."""
        return _union_length(self._stall_intervals(), self.duration)

    def additive_stall_time(self) -> float:
        """Sum of every stall's length, overlaps counted twice: the published churn study's (linear) accounting."""
        return sum(min(s.end, self.duration) - s.start for s in self.stalls if s.start < self.duration)

    def stall_by_kind(self) -> dict[str, float]:
        """Additive stall seconds per kind (before overlaps are merged)."""
        totals = dict.fromkeys(STALL_KINDS, 0.0)
        for s in self.stalls:
            if s.start < self.duration:
                totals[s.kind] += min(s.end, self.duration) - s.start
        return totals

    def lost_work(self) -> float:
        return sum(lost for _, lost in self.losses)

    def goodput(self) -> float:
        """Fraction of wall-clock time that became kept training progress."""
        return (self.duration - self.stalled_time() - self.lost_work()) / self.duration

    def additive_overhead(self) -> float:
        return (self.additive_stall_time() + self.lost_work()) / self.duration

    def progress(self, times: np.ndarray) -> np.ndarray:
        """Cumulative kept progress (s of training) at each of `times` (sorted)."""
        merged = np.array(_merge(self._stall_intervals()) or [(0.0, 0.0)])
        starts, ends = merged[:, 0], merged[:, 1]
        stalled = np.clip(np.minimum.outer(times, ends) - starts, 0.0, None).sum(axis=1)
        at = np.array([t for t, _ in self.losses])
        lost = np.array([x for _, x in self.losses])
        cut = np.searchsorted(at, times, side="right")
        kept_losses = np.concatenate(([0.0], np.cumsum(lost)))[cut]
        return times - stalled - kept_losses

    def _stall_intervals(self) -> list[tuple[float, float]]:
        spans = [(s.start, s.end) for s in self.stalls]
        empty_since = None
        for at, size in self.sizes:
            if size == 0 and empty_since is None:
                empty_since = at
            elif size > 0 and empty_since is not None:
                spans.append((empty_since, at))
                empty_since = None
        if empty_since is not None:
            spans.append((empty_since, self.duration))
        return spans


def _merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _union_length(spans: list[tuple[float, float]], horizon: float) -> float:
    return sum(max(0.0, min(e, horizon) - s) for s, e in _merge(spans) if s < horizon)


class _Member:
    """The observer's view of one member incarnation: its last heartbeat and recent intervals."""

    __slots__ = ("name", "last", "intervals")

    def __init__(self, name: str, since: float, window: int) -> None:
        self.name = name
        self.last = since
        self.intervals: deque[float] = deque(maxlen=window)


class _Sim:
    def __init__(self, scenario: Scenario, seed: int) -> None:
        self.s = scenario
        self.rng = dict(zip(STREAMS, (np.random.Generator(np.random.PCG64(c))
                                      for c in np.random.SeedSequence(seed).spawn(len(STREAMS)))))
        self.run = Run(scenario, seed)
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = 0
        self.incarnations = 0
        self.members: dict[str, _Member] = {}
        self.busy: set[str] = set()
        self.pending_losses: list[float] = []

    def go(self) -> Run:
        s = self.s
        for _ in range(s.size):
            self._admit(0.0)
        self.run.sizes.append((0.0, len(self.members)))
        self._push(self.rng["failure"].exponential(s.mtbf), "failure", None)
        self._push(self.rng["pause"].exponential(1.0 / s.pause_rate), "pause", None)
        while self.events:
            at, _, kind, data = heapq.heappop(self.events)
            if at >= s.duration:
                break
            getattr(self, "_on_" + kind.replace("-", "_"))(at, data)
        self._settle_losses()
        return self.run

    # -- events ---------------------------------------------------------------------------------------

    def _on_failure(self, at: float, _: object) -> None:
        self._push(at + self.rng["failure"].exponential(self.s.mtbf), "failure", None)
        victim = self._pick_idle()
        if victim is None:
            return
        self.run.failures += 1
        process_only = self.rng["victim"].random() < self.s.process_death_share
        self.run.process_deaths += process_only
        self._catch_up(victim, at)
        if process_only and self.s.instant_process_detection:
            detected = at
        else:
            detected = self._detection(victim, math.inf)
            self.run.detect_latencies.append(detected - at)
        self.run.stalls.append(Stall(at, detected, "hang"))
        self._evict(victim, detected, "evict")
        self._push(detected + self.s.respawn_delay, "join", "rejoin")

    def _on_pause(self, at: float, _: object) -> None:
        self._push(at + self.rng["pause"].exponential(1.0 / self.s.pause_rate), "pause", None)
        victim = self._pick_idle()
        if victim is None:
            return
        self.run.pauses += 1
        silence = self.rng["pause"].lognormal(math.log(self.s.pause_median), self.s.pause_sigma)
        self._catch_up(victim, at)
        heard_again = victim.last + silence
        detected = self._detection(victim, heard_again)
        if detected is None:
            victim.intervals.append(silence)
            victim.last = heard_again
            self.busy.add(victim.name)
            self._push(heard_again, "resume", victim.name)
            return
        self.run.false_positives += 1
        self._evict(victim, detected, "false-evict")
        self._push(heard_again + self.s.rejoin_delay, "join", "false-rejoin")

    def _on_resume(self, _: float, name: object) -> None:
        self.busy.discard(str(name))

    def _on_join(self, at: float, kind: object) -> None:
        self._admit(at)
        self.run.stalls.append(Stall(at, at + self.s.join_cost, str(kind)))
        self.run.sizes.append((at, len(self.members)))

    # -- helpers --------------------------------------------------------------------------------------

    def _push(self, at: float, kind: str, data: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, data))

    def _admit(self, at: float) -> None:
        self.incarnations += 1
        name = f"peer-{self.incarnations}"
        self.members[name] = _Member(name, at, self.s.detector.window)

    def _evict(self, member: _Member, at: float, kind: str) -> None:
        del self.members[member.name]
        self.busy.discard(member.name)
        self.run.stalls.append(Stall(at, at + self.s.evict_cost, kind))
        self.run.sizes.append((at, len(self.members)))
        self.pending_losses.append(at)

    def _pick_idle(self) -> _Member | None:
        idle = sorted(n for n in self.members if n not in self.busy)
        if not idle:
            return None
        return self.members[idle[int(self.rng["victim"].integers(len(idle)))]]

    def _catch_up(self, member: _Member, until: float) -> None:
        """Advance `member` by the regular heartbeats it sent up to `until`: its last one lands within one
        interval before `until`; only the last `window` intervals are generated (the rest do not count)."""
        h = self.s.detector.heartbeat_interval
        beats = math.floor((until - member.last) / h)
        if beats <= 0:
            return
        gaps = h + self.rng["heartbeat"].normal(0.0, self.s.jitter, min(beats, member.intervals.maxlen or 0))
        member.intervals.extend(np.clip(gaps, 0.1 * h, None).tolist())
        member.last += beats * h

    def _detection(self, member: _Member, heard_again: float) -> float | None:
        """First tick at which `suspects` names `member`, silent since its last heartbeat; None if that
        does not happen before its next heartbeat at `heard_again` (inf for a dead member)."""
        silent_from = member.last
        config = self.s.detector
        if heard_again - silent_from <= config.floor:
            return None  # never suspected within the floor (a tested invariant of `suspects`)
        history = self._history(member)
        tick = self.s.tick
        lo = math.floor(silent_from / tick) + 1
        hi = math.ceil((silent_from + config.timeout) / tick) + 1
        if not self._suspected(hi * tick, history, member.name):
            raise AssertionError(f"detector did not suspect {member.name} after its timeout")
        while lo < hi:
            mid = (lo + hi) // 2
            if self._suspected(mid * tick, history, member.name):
                hi = mid
            else:
                lo = mid + 1
        detected = lo * tick
        if detected >= heard_again:
            return None
        rule = suspects(detected, history, config)[member.name].split()[0]
        self.run.detections_by_rule[rule] = self.run.detections_by_rule.get(rule, 0) + 1
        return detected

    def _history(self, member: _Member) -> HeartbeatHistory:
        history = HeartbeatHistory(self.s.detector.window)
        arrivals = member.last - np.concatenate(([0.0], np.cumsum(list(reversed(member.intervals)))))
        for at in arrivals[::-1].tolist():
            history.record(member.name, at)
        return history

    def _suspected(self, now: float, history: HeartbeatHistory, name: str) -> bool:
        return name in suspects(now, history, self.s.detector)

    def _settle_losses(self) -> None:
        """Work lost at each eviction, drawn now that the run's progress is known (capped by the work
        kept since the previous loss: nothing is lost twice)."""
        s = self.s
        if s.rollback == "none":
            return
        span = s.step_time if s.rollback == "step" else s.checkpoint_interval
        times = np.array(sorted(t for t in self.pending_losses if t < s.duration))
        if times.size == 0:
            return
        cumulative, kept_after_last = 0.0, 0.0
        for at, gross in zip(times.tolist(), self.run.progress(times).tolist()):
            kept = gross - cumulative
            lost = min(self.rng["loss"].uniform(0.0, span), max(0.0, kept - kept_after_last))
            self.run.losses.append((at, lost))
            cumulative += lost
            kept_after_last = kept - lost


def simulate(scenario: Scenario, seed: int = 0) -> Run:
    """Run `scenario` for `scenario.duration` seconds; same (scenario, seed) -> same Run."""
    return _Sim(scenario, seed).go()

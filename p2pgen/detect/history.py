"""Per-peer heartbeat arrival history, bounded, with no clock inside.

Owns: for each peer, the time of its latest heartbeat and its last `window` inter-arrival intervals.
Invariants: times are passed in by the caller (never read here); an arrival earlier than the latest one
moves nothing backwards (it is not a new sample); the mean and standard deviation returned by `stats`
always describe exactly the intervals currently kept.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class PeerStats:
    """What the decision function needs about one peer: when it was last heard, and its rhythm."""

    last: float
    samples: int
    mean: float
    std: float


class _Peer:
    __slots__ = ("last", "intervals", "total", "squares", "_stats")

    def __init__(self, at: float, window: int) -> None:
        self.last = at
        self.intervals: deque[float] = deque(maxlen=window)
        self.total = 0.0
        self.squares = 0.0
        self._stats: PeerStats | None = None

    def add(self, at: float) -> None:
        if at <= self.last:
            return
        interval = at - self.last
        self.last = at
        if len(self.intervals) == self.intervals.maxlen:
            old = self.intervals[0]
            self.total -= old
            self.squares -= old * old
        self.intervals.append(interval)
        self.total += interval
        self.squares += interval * interval
        self._stats = None

    def stats(self) -> PeerStats:
        if self._stats is None:
            self._stats = self._compute()
        return self._stats

    def _compute(self) -> PeerStats:
        n = len(self.intervals)
        if n == 0:
            return PeerStats(self.last, 0, 0.0, 0.0)
        mean = self.total / n
        variance = max(self.squares / n - mean * mean, 0.0)
        return PeerStats(self.last, n, mean, math.sqrt(variance))


class HeartbeatHistory:
    """Arrival history of the peers one observer hears from. Not thread-safe: one owner records and asks."""

    def __init__(self, window: int = 100) -> None:
        if window < 2:
            raise ValueError(f"window must be at least 2 samples, got {window}")
        self.window = window
        self._peers: dict[str, _Peer] = {}

    def record(self, peer: str, at: float) -> None:
        """A heartbeat from `peer` arrived at time `at` (the caller's clock, seconds)."""
        state = self._peers.get(peer)
        if state is None:
            self._peers[peer] = _Peer(at, self.window)
        else:
            state.add(at)

    def forget(self, peer: str) -> None:
        """Stop judging `peer` (it left or was evicted). Unknown peers are ignored."""
        self._peers.pop(peer, None)

    def peers(self) -> list[str]:
        return sorted(self._peers)

    def __contains__(self, peer: object) -> bool:
        return peer in self._peers

    def __len__(self) -> int:
        return len(self._peers)

    def last(self, peer: str) -> float:
        """Latest arrival of `peer` (without computing its statistics); KeyError if never recorded."""
        return self._peers[peer].last

    def oldest_last(self) -> float:
        """The earliest of the peers' latest arrivals: every peer was heard at or after it (inf with no peer)."""
        return min((state.last for state in self._peers.values()), default=math.inf)

    def stats(self, peer: str) -> PeerStats:
        """Latest arrival and inter-arrival mean/std of `peer`; KeyError if never recorded."""
        return self._peers[peer].stats()

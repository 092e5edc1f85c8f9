"""Counters of rejected frames, connections and packets, by reason; readable by tests, the step loop and
`p2pgen show`.

`bad_seal` and `replayed` count frames of sealed links (`--encrypt`, p2pgen.transport.seal) that failed
authentication or came out of order; `encryption_mismatch` handshakes refused because the two ends' `--encrypt`
settings differ.

Invariant: every frame or connection the transport refuses is counted exactly once under one reason
(I2, I3, I8 ask for rejections to be counted, never silently dropped).
"""

from __future__ import annotations

import threading

REASONS = ("stale_generation", "wrong_incarnation", "bad_checksum", "oversized", "truncated",
           "auth_failed", "malformed", "not_member", "bad_seal", "replayed", "encryption_mismatch")


class RejectCounters:
    """Counts by reason; `reasons` is the closed set a listener may count under (the data plane's by default;
    the agent's RPC server and heartbeats pass their own)."""

    def __init__(self, reasons: tuple[str, ...] = REASONS) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(reasons, 0)

    def add(self, reason: str) -> None:
        if reason not in self._counts:
            raise ValueError(f"unknown reject reason {reason!r}; known: {tuple(self._counts)}")
        with self._lock:
            self._counts[reason] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

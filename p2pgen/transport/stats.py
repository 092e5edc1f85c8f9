"""Counters of rejected frames, connections and packets, by reason; readable by tests, the step loop and
`p2pgen show`; and counters of the payload bytes and frames the data plane moved (`WireCounters`).

`bad_seal` and `replayed` count frames of sealed links (`--encrypt`, p2pgen.transport.seal) that failed
authentication or came out of order; `encryption_mismatch` handshakes refused because the two ends' `--encrypt`
settings differ.

Invariants: every frame or connection the transport refuses is counted exactly once under one reason
(I2, I3, I8 ask for rejections to be counted, never silently dropped). Every data-plane frame is counted once
as sent when it is posted and once as received when it is delivered (verified, with its expected stamp),
with its payload length: per frame, never per element.
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


WIRE_KEYS = ("bytes_sent", "bytes_received", "frames_sent", "frames_received")


class WireCounters:
    """Payload bytes and frames sent and received, by one generation's session or a whole transport; a child
    (`WireCounters(parent)`) adds every count to its parent too. Headers (`frame.HEADER_BYTES` each) and seal
    tags are not in the bytes: they are frames times a constant."""

    def __init__(self, parent: WireCounters | None = None) -> None:
        self._lock = threading.Lock()
        self._parent = parent
        self._counts = dict.fromkeys(WIRE_KEYS, 0)

    def sent(self, nbytes: int) -> None:
        self._add("bytes_sent", "frames_sent", nbytes)

    def received(self, nbytes: int) -> None:
        self._add("bytes_received", "frames_received", nbytes)

    def _add(self, bytes_key: str, frames_key: str, nbytes: int) -> None:
        with self._lock:
            self._counts[bytes_key] += nbytes
            self._counts[frames_key] += 1
        if self._parent is not None:
            self._parent._add(bytes_key, frames_key, nbytes)

    def snapshot(self) -> dict[str, int]:
        """{bytes_sent, bytes_received, frames_sent, frames_received} so far."""
        with self._lock:
            return dict(self._counts)

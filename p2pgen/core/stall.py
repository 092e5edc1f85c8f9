"""When the data plane counts as stalled: an operation in flight and nothing received for a while. Pure.

Owns `StallWatch`: fed samples (the time, when the operation in flight began or None, the bytes received so
far), it answers how long this member has waited with nothing arriving. Invariant: 0 whenever no operation is in
flight, and never more than the time since the operation began or since the last byte arrived, whichever is
later. A slow link still moves bytes, so a long transfer is not a stall; a peer that stopped sending (stopped,
cut off, gone) stalls every member of a ring within one chunk.
"""

from __future__ import annotations


class StallWatch:
    """How long the member has waited in its current operation with nothing received."""

    def __init__(self) -> None:
        self._op: float | None = None          # start of the operation last sampled
        self._received = -1
        self._progress = 0.0                   # the op's start, or the last sample that saw new bytes

    def sample(self, now: float, op_since: float | None, received: int) -> float:
        """Seconds stalled at `now`.

        Args:
            now: the time of the sample (the clock of `op_since`).
            op_since: when the operation in flight began, or None when none is.
            received: bytes this member has received so far (any monotone counter of arrivals).
        """
        if op_since is None:
            self._op = None
            return 0.0
        if op_since != self._op:
            self._op, self._received, self._progress = op_since, received, op_since
        elif received != self._received:
            self._received, self._progress = received, now
        return max(0.0, now - self._progress)

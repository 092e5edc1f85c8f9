"""Detector configuration: the one place its parameters and their rules live.

Owns: `DetectorConfig` and its validation. Invariant: a `DetectorConfig` that exists is valid
(0 < floor <= timeout, every other number positive, kind known), so the decision function never has to
second-guess it. Every error message names the parameter and says how to fix it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

KINDS = ("fixed", "phi")


@dataclass(frozen=True)
class DetectorConfig:
    """How a peer's silence is turned into a suspicion.

    Defaults (floor 0.8 s, timeout 1.5 s): a floor well above the heartbeat interval keeps a briefly starved
    agent from being evicted. The detector sweep in sims/README.md (under the transient silences of the
    published churn study it reproduces) puts the optimum at 1.5 s with assumed recovery costs and 2 s with
    measured ones; there the 0.8 s floor suspects 13.7 % of silences (goodput 0.843 at MTBF 12 against 0.880
    for a fixed 2 s timeout).

    kind: "fixed" suspects a peer silent longer than `timeout`; "phi" suspects it once the phi-accrual
    level of its silence exceeds `phi_threshold`, but never within `floor` and always after `timeout`.
    heartbeat_interval: how often peers send heartbeats (the sender's period; the decision itself only
    uses it as the expected interval before any sample exists).
    window: inter-arrival samples kept per peer.
    stalled_floor: the floor while this agent's application reports its collective stalled (nothing received
    for a while in an operation the silent peer's member is part of): the whole job waits for that peer
    then, so a silence is judged from this shorter floor; the timeout and the phi rule stay. Never above
    `floor` (a larger value acts as `floor`). 0.3 s: three missed heartbeats, with the stall as the second
    witness.
    """

    kind: str = "phi"
    timeout: float = 1.5
    floor: float = 0.8
    phi_threshold: float = 8.0
    heartbeat_interval: float = 0.1
    window: int = 100
    stalled_floor: float = 0.3

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem:
            raise ValueError(f"invalid detector configuration: {problem}")


def _problem(c: DetectorConfig) -> str | None:
    if c.kind not in KINDS:
        return f"unknown detector kind {c.kind!r}; use one of {', '.join(KINDS)}"
    for name in ("timeout", "floor", "phi_threshold", "heartbeat_interval", "stalled_floor"):
        value = getattr(c, name)
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            return f"{name} must be a positive finite number, got {value!r}"
    if not isinstance(c.window, int) or c.window < 2:
        return f"window must be an integer >= 2 samples, got {c.window!r}"
    if c.floor > c.timeout:
        return (f"floor {c.floor:g} s exceeds timeout {c.timeout:g} s; the floor (never suspect) must be "
                f"at most the timeout (always suspect): lower the floor or raise the timeout")
    return None

"""Failure detection: which peers to suspect, decided by a pure function over heartbeat histories.

Layers: `config` (validated parameters) <- `history` (per-peer arrivals, no clock) <- `decision`
(`suspects(now, history, config)`, pure); the CLI flags are `p2pgen.agent.detectflags`. The agent records heartbeats and
calls `suspects` every tick; `p2pgen_lab.simulator` calls the very same function inside its churn simulation.
Detection of an application that exits or stops is immediate and lives in the agent, not here.
Invariant kept by every kind: never suspect a peer heard from within `floor`; always suspect one silent
for longer than `timeout`.
"""

from p2pgen.detect.config import KINDS, DetectorConfig
from p2pgen.detect.decision import MIN_STD_FRACTION, judge, judged_at, phi, suspects
from p2pgen.detect.history import HeartbeatHistory, PeerStats

__all__ = [
    "KINDS",
    "MIN_STD_FRACTION",
    "DetectorConfig",
    "HeartbeatHistory",
    "PeerStats",
    "judge",
    "judged_at",
    "phi",
    "suspects",
]

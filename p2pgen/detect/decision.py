"""The failure-detector decision: which peers to suspect now, and why.

Owns: `suspects(now, history, config, stalled)`, a pure function (no clock, no I/O, no randomness): the same
inputs always give the same answer, so the agent, the tests and the churn simulator (`p2pgen_lab.simulator`) all
run this very code. Invariants, for every kind:
  - a peer heard from within `config.floor` seconds is never suspected (within `config.stalled_floor` for the
    peers in `stalled`: those the job waits for, in the local application's stalled collective or in its pending
    generation);
  - a peer silent for more than `config.timeout` seconds is always suspected;
  - between the two, "fixed" waits for the timeout and "phi" suspects once phi > `phi_threshold`;
  - for a given history, suspicion is monotone in `now`: once suspected, still suspected later, and `judged_at`
    names the instant it starts (a silent peer is suspected right after it, never at or before it).
Phi-accrual (Hayashibara et al., 2004): phi(t) = -log10 P(next interval > t), the intervals taken as
normal with the observed mean and standard deviation (the latter at least MIN_STD_FRACTION of the mean,
so a perfectly regular peer does not make phi jump to infinity at the first late heartbeat).
"""

from __future__ import annotations

import math
from statistics import NormalDist

from p2pgen.detect.config import DetectorConfig
from p2pgen.detect.history import HeartbeatHistory, PeerStats

MIN_STD_FRACTION = 0.1


def phi(elapsed: float, mean: float, std: float) -> float:
    """Suspicion level of a silence of `elapsed` seconds given intervals ~ Normal(mean, std); may be inf."""
    z = (elapsed - mean) / (std * math.sqrt(2.0))
    p_later = 0.5 * math.erfc(z)
    return math.inf if p_later <= 0.0 else -math.log10(p_later)


def judge(now: float, stats: PeerStats, config: DetectorConfig, stalled: bool = False) -> str | None:
    """Reason to suspect one peer at `now`, or None. `suspects` applies this to every peer.

    Args:
        stalled: the job waits for this peer's member (the local application's collective, which it is part of,
            is stalled, or the pending generation waits for its vote or pull): the floor is `config.stalled_floor`
            (at most `config.floor`).
    """
    elapsed = now - stats.last
    if elapsed <= (min(config.stalled_floor, config.floor) if stalled else config.floor):
        return None
    if elapsed > config.timeout:
        return f"silent for {elapsed:.2f} s > timeout {config.timeout:.2f} s"
    if config.kind == "fixed" or stats.samples == 0:
        return None
    std = max(stats.std, MIN_STD_FRACTION * stats.mean)
    level = phi(elapsed, stats.mean, std)
    if level > config.phi_threshold:
        why = " (the job waits for it)" if stalled else ""
        return f"phi {level:.1f} > {config.phi_threshold:.1f} after {elapsed:.2f} s{why}"
    return None


def judged_at(stats: PeerStats, config: DetectorConfig, stalled: bool = False) -> float:
    """The instant from which `judge` suspects this peer if nothing more is heard from it: `judge` answers None
    at it and a reason at any later time (suspicion is monotone). The agent wakes just past it rather than at its
    next round, so that a stalled collective waits for the floor, not for the floor and part of a round.

    Args:
        stalled: as for `judge`.
    """
    floor = min(config.stalled_floor, config.floor) if stalled else config.floor
    if config.kind == "fixed" or stats.samples == 0:
        return stats.last + config.timeout
    std = max(stats.std, MIN_STD_FRACTION * stats.mean)
    crossing = stats.mean - std * NormalDist().inv_cdf(10.0 ** -config.phi_threshold)   # phi(crossing) == threshold
    return stats.last + min(config.timeout, max(floor, crossing))


def suspects(now: float, history: HeartbeatHistory, config: DetectorConfig,
             stalled: frozenset[str] | set[str] = frozenset()) -> dict[str, str]:
    """peer -> human-readable reason, for every peer in `history` that should be suspected at `now`.

    A peer recorded only once (no interval yet) is judged by the fixed rule with `config.timeout`. While every
    peer was heard within the lower of the two floors, no rule can fire and no peer is looked at (the agent asks
    every heartbeat interval, and most of the time this is the answer).

    Args:
        stalled: the peers whose members the local application's stalled collective waits for.
    """
    if now - history.oldest_last() <= min(config.stalled_floor, config.floor):
        return {}
    found: dict[str, str] = {}
    for peer in history.peers():
        reason = judge(now, history.stats(peer), config, peer in stalled)
        if reason is not None:
            found[peer] = reason
    return found

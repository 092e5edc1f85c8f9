"""What a churn simulation assumes: one `Scenario` holds every parameter, with its unit and meaning.

Owns: the scenario parameters and the transient-silence distribution. Invariant: a `Scenario` is
immutable and fully determines a run together with the seed (`p2pgen_lab.simulator.engine.simulate`).
Times are in seconds. Rates are for the whole cluster (the published churn study counts failures per
100 s of the job).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from p2pgen.detect import DetectorConfig

ROLLBACKS = ("none", "step", "checkpoint")


@dataclass(frozen=True)
class Scenario:
    """A cluster under churn.

    Failures: a Poisson process of rate 1/`mtbf` over the whole cluster, each killing one random member.
    A share `process_death_share` of them kill only the application (its agent lives and, when
    `instant_process_detection`, reports the exit at once); the rest take the host (agent included) and
    are found by the heartbeat detector. A dead member's replacement joins `respawn_delay` s later.
    Transient silences: a Poisson process of rate `pause_rate` over the cluster; each silences one member's
    heartbeats for S ~ LogNormal(ln `pause_median`, `pause_sigma`) s, counted from its last heartbeat
    (GC stall, network blip). Silences do not stall the data plane: they cost only if the detector
    (wrongly) suspects the member, which is then evicted and rejoins `rejoin_delay` s after the silence.
    Detection: the observer records heartbeats every `detector.heartbeat_interval` s (arrival jitter
    `jitter` s, standard deviation) and calls `p2pgen.detect.suspects` every `tick` s.
    Costs: each eviction stalls the group `evict_cost` s after detection, each join `join_cost` s; from a
    death until detection the whole group hangs. `rollback` is the work lost at each eviction: none,
    the aborted step (uniform in [0, `step_time`]) or everything since the last checkpoint (uniform in
    [0, `checkpoint_interval`]).
    """

    name: str = "study model"
    size: int = 8
    mtbf: float = 50.0
    process_death_share: float = 0.0
    instant_process_detection: bool = False
    pause_rate: float = 0.5
    pause_median: float = math.exp(-1.2)
    pause_sigma: float = 0.9
    detector: DetectorConfig = field(default_factory=lambda: fixed_detector(2.0, heartbeat_interval=0.5))
    tick: float = 0.01
    jitter_fraction: float = 0.05
    evict_cost: float = 1.0
    join_cost: float = 1.0
    respawn_delay: float = 30.0
    rejoin_delay: float = 2.0
    rollback: str = "none"
    step_time: float = 0.25
    checkpoint_interval: float = 10.0
    duration: float = 20_000.0

    def __post_init__(self) -> None:
        if self.rollback not in ROLLBACKS:
            raise ValueError(f"rollback must be one of {ROLLBACKS}, got {self.rollback!r}")
        if not 0.0 <= self.process_death_share <= 1.0:
            raise ValueError(f"process_death_share is a fraction in [0, 1], got {self.process_death_share}")
        for name in ("mtbf", "pause_rate", "pause_median", "pause_sigma", "tick", "duration"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.size < 1:
            raise ValueError(f"size must be at least 1, got {self.size}")

    @property
    def jitter(self) -> float:
        return self.jitter_fraction * self.detector.heartbeat_interval

    def with_(self, **changes: object) -> Scenario:
        return replace(self, **changes)


def fixed_detector(timeout: float, heartbeat_interval: float = 0.1) -> DetectorConfig:
    """A plain timeout (the floor set to the timeout: nothing is suspected earlier)."""
    return DetectorConfig(kind="fixed", timeout=timeout, floor=timeout, heartbeat_interval=heartbeat_interval)


def pause_exceedance(timeout: float, median: float, sigma: float) -> float:
    """P(S > timeout) for the transient-silence distribution (the churn study's 'FP rate' column)."""
    z = (math.log(timeout) - math.log(median)) / sigma
    return 0.5 * math.erfc(z / math.sqrt(2.0))

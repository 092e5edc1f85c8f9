"""The two tables of the published churn study and p2pgen's answer to them, computed by running the simulator.

Owns: the scenarios each table runs (their assumptions, stated once here) and the per-row summaries.
Invariant: every number in a table comes out of `simulate`; the only constants are the study's published
figures (`SEED_*`), kept to be printed beside ours.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import asdict, dataclass

import numpy as np

from p2pgen.agent.detectflags import config_from_args
from p2pgen.detect import DetectorConfig
from p2pgen_lab.simulator.costs import RecoveryCosts
from p2pgen_lab.simulator.engine import simulate
from p2pgen_lab.simulator.model import Scenario, fixed_detector

# The churn study's published figures: timeout -> (detect lat, FP rate, overhead); MTBF -> (failures/100, goodput).
SEED_TIMEOUT_ROWS = {0.5: (0.25, 0.285, 0.3297), 2.0: (1.75, 0.018, 0.0926), 5.0: (4.75, 0.001, 0.1360)}
SEED_MTBF_ROWS = {200.0: (0.5, 0.964), 50.0: (2.0, 0.907), 12.0: (8.3, 0.670)}

TIMEOUTS = (0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0)
P2PGEN_TIMEOUTS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0)
PHI_FLOORS = (0.3, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
MTBFS = (200.0, 50.0, 12.0)
PROCESS_DEATH_SHARE = 0.8
RESTART_ALL_COST = 1.0

SEED_ASSUMPTIONS = (
    "8 ranks; failures Poisson over the cluster (MTBF 50 s for the timeout sweep), every death found by a fixed "
    "heartbeat timeout; heartbeats every 0.5 s (so a death is detected timeout - 0.25 s later on average); "
    "transient silences 0.5/s over the cluster, S ~ LogNormal(mu=-1.2, sigma=0.9) s (median 0.30 s), "
    "counted from the last heartbeat, costing nothing unless they trip the detector; every membership change "
    "(eviction, false eviction, rejoin) stalls the group 1.0 s, so a death costs detection + 2 x 1.0 s; "
    "no rollback; goodput = share of wall-clock not stalled")


@dataclass(frozen=True)
class Summary:
    """Mean over `runs` seeds of one scenario."""

    label: str
    detect_latency: float
    fp_rate: float
    overhead: float
    additive_overhead: float
    goodput: float
    goodput_min: float
    failures_per_100s: float
    hang_cost: float       # share of wall-clock hung between a death and its detection (additive)
    fp_cost: float         # share spent on false evictions and their rejoins (additive)
    reconfig_cost: float   # share spent on evicting the dead and admitting replacements (additive)
    lost_work: float       # share of wall-clock whose progress was rolled back
    runs: int

    def as_dict(self) -> dict[str, float | str | int]:
        return asdict(self)


def summarize(scenario: Scenario, runs: int, seed: int) -> Summary:
    results = [simulate(scenario, seed + i) for i in range(runs)]
    latencies = [x for r in results for x in r.detect_latencies]
    goodputs = [r.goodput() for r in results]
    wall = runs * scenario.duration
    kinds = [r.stall_by_kind() for r in results]

    def share(*names: str) -> float:
        return sum(k[n] for k in kinds for n in names) / wall

    return Summary(
        label=scenario.name,
        detect_latency=float(np.mean(latencies)) if latencies else 0.0,
        fp_rate=sum(r.false_positives for r in results) / max(1, sum(r.pauses for r in results)),
        overhead=1.0 - statistics.fmean(goodputs),
        additive_overhead=statistics.fmean(r.additive_overhead() for r in results),
        goodput=statistics.fmean(goodputs),
        goodput_min=min(goodputs),
        failures_per_100s=100.0 * sum(r.failures for r in results) / wall,
        hang_cost=share("hang"),
        fp_cost=share("false-evict", "false-rejoin"),
        reconfig_cost=share("evict", "rejoin"),
        lost_work=sum(r.lost_work() for r in results) / wall,
        runs=runs,
    )


def seed_scenario(duration: float) -> Scenario:
    return Scenario(name="study model", duration=duration)


def p2pgen_scenario(costs: RecoveryCosts, duration: float, quantile: str = "p50",
                    detector: DetectorConfig | None = None) -> Scenario:
    """p2pgen: the agent reports an application's death at once (80% of deaths, an assumption: most
    failures kill the process, not the host), heartbeats every 0.1 s, certified recovery (a death loses
    only the aborted step, 0.25 s at most), generation changes cost the measured or assumed figures."""
    evict, join = costs.quantile(quantile)
    return Scenario(name=f"p2pgen ({quantile} costs)", duration=duration,
                    process_death_share=PROCESS_DEATH_SHARE, instant_process_detection=True,
                    detector=detector or fixed_detector(1.5, heartbeat_interval=0.1),
                    evict_cost=evict, join_cost=join, rollback="step")


def timeout_sweep(base: Scenario, timeouts: tuple[float, ...], runs: int, seed: int) -> list[Summary]:
    h = base.detector.heartbeat_interval
    return [summarize(base.with_(name=f"fixed {t:g} s", detector=fixed_detector(t, h)), runs, seed)
            for t in timeouts]


def phi_sweep(base: Scenario, floors: tuple[float, ...], runs: int, seed: int,
              timeout: float = 3.0) -> list[Summary]:
    h = base.detector.heartbeat_interval
    return [summarize(base.with_(name=f"phi floor {f:g} s", detector=DetectorConfig(
        kind="phi", timeout=timeout, floor=f, phi_threshold=8.0, heartbeat_interval=h)), runs, seed)
            for f in floors]


def mtbf_sweep(base: Scenario, mtbfs: tuple[float, ...], runs: int, seed: int) -> list[Summary]:
    return [summarize(base.with_(name=f"MTBF {m:g} s", mtbf=m), runs, seed) for m in mtbfs]


def best(rows: list[Summary]) -> Summary:
    return max(rows, key=lambda r: r.goodput)


def agent_default_detector() -> DetectorConfig:
    """The detector `p2pgen join` runs when given no detector flag: its own parser's defaults, read through
    the same `config_from_args` the agent calls (so the sims follow whatever the agent's defaults become)."""
    from p2pgen.agent.cli import add_commands

    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    return config_from_args(parser.parse_args(["join"]))


def describe_detector(d: DetectorConfig) -> str:
    if d.kind == "fixed":
        return f"fixed timeout {d.timeout:g} s"
    return f"phi {d.phi_threshold:g}, floor {d.floor:g} s, timeout {d.timeout:g} s"


def ladder(costs: RecoveryCosts, timeout: float, duration: float) -> list[Scenario]:
    """From the churn study's model to p2pgen, one design change at a time, then alternatives for comparison.
    Row P2PGEN_ROW is p2pgen as `p2pgen join` runs by default (the agent's default detector, p50 costs);
    row FIXED_ROW the same with a fixed `timeout` (the detector sweep's optimum) instead."""
    seed = seed_scenario(duration)
    instant = seed.with_(name="+ agent sees the application die (80% of deaths)",
                         process_death_share=PROCESS_DEATH_SHARE, instant_process_detection=True)
    certified = p2pgen_scenario(costs, duration, "p50", seed.detector).with_(
        name="+ certified recovery at p2pgen's p50 cost")
    default = agent_default_detector()
    p2pgen = p2pgen_scenario(costs, duration, "p50", default).with_(
        name=f"+ heartbeats {default.heartbeat_interval:g} s, agent's default detector "
             f"({describe_detector(default)}) = p2pgen")
    tuned = fixed_detector(timeout, heartbeat_interval=default.heartbeat_interval)
    return [seed, instant, certified, p2pgen,
            p2pgen_scenario(costs, duration, "p99", default).with_(name="  p2pgen at p99 costs"),
            p2pgen.with_(name=f"  p2pgen with a fixed {timeout:g} s timeout (the sweep's optimum) instead",
                         detector=tuned),
            p2pgen.with_(name=f"  restart-all instead: {RESTART_ALL_COST:g} s restart, checkpoint every 10 s",
                         evict_cost=RESTART_ALL_COST, join_cost=RESTART_ALL_COST, rollback="checkpoint")]


P2PGEN_ROW = 3
FIXED_ROW = 5


def ladder_rows(costs: RecoveryCosts, timeout: float, mtbfs: tuple[float, ...], runs: int, duration: float,
                seed: int) -> list[tuple[str, list[Summary]]]:
    return [(s.name, mtbf_sweep(s, mtbfs, runs, seed)) for s in ladder(costs, timeout, duration)]


def share_rows(costs: RecoveryCosts, shares: tuple[float, ...], mtbf: float, runs: int,
               duration: float, seed: int) -> list[tuple[float, Summary]]:
    """p2pgen's goodput at `mtbf` (agent's default detector) as the share of deaths its agent sees at once
    varies."""
    base = p2pgen_scenario(costs, duration, "p50", agent_default_detector())
    return [(share, summarize(base.with_(mtbf=mtbf, process_death_share=share), runs, seed)) for share in shares]

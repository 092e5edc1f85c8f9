"""The `p2pgen sim` results as data: computed once, then printed as text tables or dumped as JSON.

Owns: which sweeps each command runs and how their rows are laid out. Invariant: text and JSON are two
renderings of the same result object; nothing is computed while rendering.
"""

from __future__ import annotations

from dataclasses import dataclass

from p2pgen_lab.simulator.costs import RecoveryCosts
from p2pgen_lab.simulator.engine import Run, simulate
from p2pgen_lab.simulator.model import Scenario
from p2pgen_lab.simulator.tables import (
    FIXED_ROW,
    MTBFS,
    P2PGEN_ROW,
    P2PGEN_TIMEOUTS,
    PHI_FLOORS,
    SEED_ASSUMPTIONS,
    SEED_MTBF_ROWS,
    SEED_TIMEOUT_ROWS,
    TIMEOUTS,
    Summary,
    agent_default_detector,
    best,
    describe_detector,
    ladder,
    ladder_rows,
    mtbf_sweep,
    p2pgen_scenario,
    phi_sweep,
    seed_scenario,
    share_rows,
    summarize,
    timeout_sweep,
)

SHARES = (0.0, 0.5, 0.8, 1.0)
P2PGEN_MTBF = 12.0


@dataclass(frozen=True)
class RunSpec:
    runs: int
    duration: float
    seed: int
    costs: RecoveryCosts


@dataclass(frozen=True)
class DetectorResult:
    spec: RunSpec
    seed_sweep: list[Summary]
    p2pgen_fixed: list[Summary]
    p2pgen_phi: list[Summary]
    agent_default: Summary          # p2pgen at MTBF 12 with the detector `p2pgen join` runs by default


@dataclass(frozen=True)
class ChurnResult:
    spec: RunSpec
    timeout: float
    seed_mtbf: list[Summary]
    ladder: list[tuple[str, list[Summary]]]
    shares: list[tuple[float, Summary]]


def p2pgen_base(spec: RunSpec) -> Scenario:
    return p2pgen_scenario(spec.costs, spec.duration).with_(mtbf=P2PGEN_MTBF)


def run_detector(spec: RunSpec) -> DetectorResult:
    base = p2pgen_base(spec)
    return DetectorResult(
        spec=spec,
        seed_sweep=timeout_sweep(seed_scenario(spec.duration), TIMEOUTS, spec.runs, spec.seed),
        p2pgen_fixed=timeout_sweep(base, P2PGEN_TIMEOUTS, spec.runs, spec.seed),
        p2pgen_phi=phi_sweep(base, PHI_FLOORS, spec.runs, spec.seed),
        agent_default=summarize(base.with_(name="agent's default", detector=agent_default_detector()), spec.runs,
                                spec.seed),
    )


def tuned_timeout(spec: RunSpec) -> float:
    """The fixed timeout that maximizes p2pgen's goodput at MTBF 12 (the detector sweep's optimum)."""
    rows = timeout_sweep(p2pgen_base(spec), P2PGEN_TIMEOUTS, spec.runs, spec.seed)
    return P2PGEN_TIMEOUTS[rows.index(best(rows))]


def run_churn(spec: RunSpec, timeout: float | None = None) -> ChurnResult:
    timeout = tuned_timeout(spec) if timeout is None else timeout
    return ChurnResult(
        spec=spec,
        timeout=timeout,
        seed_mtbf=mtbf_sweep(seed_scenario(spec.duration), MTBFS, spec.runs, spec.seed),
        ladder=ladder_rows(spec.costs, timeout, MTBFS, spec.runs, spec.duration, spec.seed),
        shares=share_rows(spec.costs, SHARES, P2PGEN_MTBF, spec.runs, spec.duration, spec.seed),
    )


# -- text -----------------------------------------------------------------------------------------------

def _header(spec: RunSpec) -> list[str]:
    return [f"# {spec.runs} run(s) x {spec.duration:g} s simulated, seeds {spec.seed}..{spec.seed + spec.runs - 1}"]


def detector_text(r: DetectorResult) -> str:
    lines = _header(r.spec) + ["", "## The published churn study's model: heartbeat-timeout sweep (MTBF 50 s)",
                               f"assumptions: {SEED_ASSUMPTIONS}", "",
                               "timeout  detect lat  FP rate  overhead  (additive)  "
                               "| seed: detect lat  FP rate  overhead"]
    for t, s in zip(TIMEOUTS, r.seed_sweep):
        seed = SEED_TIMEOUT_ROWS.get(t)
        ref = f"  {seed[0]:10.2f}  {seed[1]:7.3f}  {seed[2]:8.4f}" if seed else ""
        lines.append(f"{t:7.2f}  {s.detect_latency:10.2f}  {s.fp_rate:7.3f}  {s.overhead:8.4f}  "
                     f"({s.additive_overhead:8.4f})  |{ref}")
    opt = TIMEOUTS[r.seed_sweep.index(best(r.seed_sweep))]
    lines += [f"optimum: {opt:g} s (seed: 2.00 s; reconfigure time 1.0 s). 'overhead' merges overlapping stalls; "
              f"'additive' sums them, as the study does.", "",
              f"## p2pgen at MTBF {P2PGEN_MTBF:g} s: fixed timeout vs phi-accrual (threshold 8, bound 3 s), "
              f"heartbeats 0.1 s", f"costs: {r.spec.costs.source}", "",
              "detector               detect lat  FP rate  goodput  (min over runs)"]
    for s in r.p2pgen_fixed + r.p2pgen_phi + [r.agent_default]:
        lines.append(f"{s.label:22s} {s.detect_latency:10.2f}  {s.fp_rate:7.3f}  {s.goodput:7.4f}  "
                     f"({s.goodput_min:.4f})")
    lines.append(f"best fixed: {best(r.p2pgen_fixed).label}; best phi: {best(r.p2pgen_phi).label}; agent's default "
                 f"(what `p2pgen join` runs): {describe_detector(agent_default_detector())}")
    return "\n".join(lines)


def churn_text(r: ChurnResult) -> str:
    width = max(len(name) for name, _ in r.ladder)
    lines = _header(r.spec) + ["", "## The published churn study's model: goodput vs MTBF (timeout 2.0 s)",
                               f"assumptions: {SEED_ASSUMPTIONS}", "",
                               "MTBF  failures/100 s  goodput  (additive)  | seed: failures/100  goodput"]
    for s, m in zip(r.seed_mtbf, MTBFS):
        f100, gp = SEED_MTBF_ROWS[m]
        lines.append(f"{m:4.0f}  {s.failures_per_100s:14.1f}  {s.goodput:7.3f}  ({1 - s.additive_overhead:7.3f})  |"
                     f"  {f100:17.1f}  {gp:7.3f}")
    lines += ["", "## From the churn study's model to p2pgen, one change at a time (goodput, overlapping stalls "
                  f"merged; p2pgen = the agent's default detector, {describe_detector(agent_default_detector())}; "
                  f"{r.timeout:g} s is the optimum of the fixed-timeout sweep)", f"costs: {r.spec.costs.source}", "",
              f"{'scenario':{width}s}" + "".join(f"  MTBF {m:<4.0f}" for m in MTBFS)]
    for name, rows in r.ladder:
        lines.append(f"{name:{width}s}" + "".join(f"  {s.goodput:9.3f}" for s in rows))
    lines += ["", f"## p2pgen at MTBF {P2PGEN_MTBF:g} s (agent's default detector) vs the share of deaths that leave "
                  "the host (and agent) alive",
              "", "share  goodput  (min)   hang   false-pos  reconfig  rollback"]
    for share, s in r.shares:
        lines.append(f"{share:5.2f}  {s.goodput:7.3f}  ({s.goodput_min:.3f})  {s.hang_cost:5.3f}  {s.fp_cost:9.3f}  "
                     f"{s.reconfig_cost:8.3f}  {s.lost_work:8.3f}")
    return "\n".join(lines)


# -- JSON -----------------------------------------------------------------------------------------------

def _spec_json(spec: RunSpec) -> dict[str, object]:
    return {"runs": spec.runs, "duration_s": spec.duration, "seed": spec.seed, "costs": spec.costs.__dict__,
            "seed_assumptions": SEED_ASSUMPTIONS}


def detector_json(r: DetectorResult) -> dict[str, object]:
    return {"spec": _spec_json(r.spec),
            "seed_timeout_sweep": [dict(s.as_dict(), timeout=t, seed_reference=SEED_TIMEOUT_ROWS.get(t))
                                   for t, s in zip(TIMEOUTS, r.seed_sweep)],
            "p2pgen_fixed": [dict(s.as_dict(), timeout=t) for t, s in zip(P2PGEN_TIMEOUTS, r.p2pgen_fixed)],
            "p2pgen_phi": [dict(s.as_dict(), floor=f) for f, s in zip(PHI_FLOORS, r.p2pgen_phi)],
            "agent_default": dict(r.agent_default.as_dict(), detector=agent_default_detector().__dict__)}


def churn_json(r: ChurnResult) -> dict[str, object]:
    return {"spec": _spec_json(r.spec), "p2pgen_detector": agent_default_detector().__dict__,
            "fixed_timeout_row": r.timeout, "p2pgen_row": P2PGEN_ROW, "fixed_row": FIXED_ROW,
            "seed_mtbf": [dict(s.as_dict(), mtbf=m, seed_reference=SEED_MTBF_ROWS[m])
                          for m, s in zip(MTBFS, r.seed_mtbf)],
            "ladder": [{"scenario": name, "rows": [dict(s.as_dict(), mtbf=m) for m, s in zip(MTBFS, rows)]}
                       for name, rows in r.ladder],
            "process_death_share": [dict(s.as_dict(), share=share) for share, s in r.shares]}



MORPH_WINDOW_S = 150.0


def morph_runs(r: ChurnResult) -> list[Run]:
    """A short window of the churn study's model and of p2pgen at MTBF 12, same seed: the same failure times."""
    scenarios = [ladder(r.spec.costs, r.timeout, MORPH_WINDOW_S)[i] for i in (0, P2PGEN_ROW)]
    return [simulate(s.with_(mtbf=P2PGEN_MTBF), r.spec.seed) for s in scenarios]

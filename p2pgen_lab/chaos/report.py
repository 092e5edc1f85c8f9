"""The benchmark's table and JSON: per policy, semantic failures first, then recovery cost.

Columns: runs, injections fired, semantic failures (runs with at least one; the failure names with
counts beside), stalled runs (liveness: a run that did not finish in time is not a semantic failure
unless the checker also named one), Raft safety violations found in the agents' traces (summed over
runs, per check in the JSON) and how many runs' traces had something to compare, recovery latency
p50/p99 (s), rollback distance (committed steps lost per injection: mean and max), throughput under
faults (steps/s from the first applied step to the last member's end, mean over runs).
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from p2pgen.raft.checker import CHECKS, CheckResult
from p2pgen_lab.chaos.checker import Verdict, percentile


def summarize(policy: str, verdicts: list[Verdict], rafts: list[CheckResult] = ()) -> dict[str, Any]:
    names = Counter(n for v in verdicts for n in v.failures)
    latencies = [x for v in verdicts for x in v.latencies]
    rollbacks = [x for v in verdicts for x in v.rollbacks]
    rates = [v.steps_per_s for v in verdicts if v.steps_per_s is not None]
    return {
        "policy": policy, "runs": len(verdicts), "injections": sum(v.injections for v in verdicts),
        "semantic_failures": sum(1 for v in verdicts if v.failures), "failure_names": dict(names),
        "stalled": sum(1 for v in verdicts if v.stalled),
        "raft_violations": {c: sum(r.counts[c] for r in rafts) for c in CHECKS},
        "raft_traced_runs": sum(1 for r in rafts if r.evidence),
        "latency_p50_s": percentile(latencies, 50), "latency_p99_s": percentile(latencies, 99),
        "rollback_mean": statistics.fmean(rollbacks) if rollbacks else None,
        "rollback_max": max(rollbacks) if rollbacks else None,
        "steps_per_s": statistics.fmean(rates) if rates else None,
    }


def table(rows: list[dict[str, Any]]) -> str:
    header = ["policy", "semantic failures", "runs", "injections", "stalled", "raft violations", "traced runs",
              "latency p50 s", "latency p99 s", "rollback mean/max", "steps/s", "failure names"]
    lines = [header]
    for r in rows:
        names = ", ".join(f"{n} x{c}" for n, c in sorted(r["failure_names"].items(), key=lambda x: -x[1])) or "-"
        lines.append([r["policy"], str(r["semantic_failures"]), str(r["runs"]), str(r["injections"]),
                      str(r["stalled"]), str(sum(r["raft_violations"].values())), str(r["raft_traced_runs"]),
                      _num(r["latency_p50_s"]), _num(r["latency_p99_s"]),
                      f"{_num(r['rollback_mean'])}/{r['rollback_max'] if r['rollback_max'] is not None else '-'}",
                      _num(r["steps_per_s"]), names])
    widths = [max(len(line[c]) for line in lines) for c in range(len(header))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def raft_words(result: CheckResult) -> str:
    """One run's Raft check in a few words, for the progress line."""
    if not result.passed:
        return "UNSAFE: " + ", ".join(f"{c} x{n}" for c, n in result.counts.items() if n)
    return "ok" if result.evidence else "ok (no traces to compare)"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"

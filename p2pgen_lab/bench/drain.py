"""`p2pgen bench recovery --only drain`: a drained host against a SIGKILLed one, same host, same run.

Three `p2pgen join` agents train the step-loop workload (`p2pgen_lab.bench.apps.steploop`). The same peer's host is
taken again and again, alternating (drain, kill, kill, drain, ...): a drain is SIGTERM to its agent (what a spot
notice starts too: `--notice-file`/`--notice-url` call the same drain), a kill is SIGKILL of the agent and its
application together. After each, the survivors regain the pre-fault revision, the host comes back, and the job
trains with three members again before the next one.

Per fault, from the applications' traces: the survivors' longest time without a committed step (each survivor's
longest gap between two consecutive commits, from its last one before the fault to its first one past the
pre-fault revision), beside the step time before the fault, and their difference, the time lost (a gap of one
step is no loss: the goal of a drain is to lose less than one step); the steps lost (rolled back); fault -> first commit
of every survivor; and fault -> the taken host's agent gone.
Invariant: every process is stopped by pid before the section returns (`P2PGenDeployment.stop`).
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from pathlib import Path
from typing import Any

from p2pgen_lab.bench.recovery import (
    PEERS,
    Events,
    Fault,
    P2PGenDeployment,
    Plan,
    TraceTail,
    _commits,
    _past,
    _training,
    analyze_fault,
    summarize,
)
from p2pgen_lab.bench.table import aligned

KINDS = ("drain", "sigkill_host")
VICTIM = "p2"
WARM_COMMITS = 90                # commits (30 steps of 3 members) before the first fault: a steady step time


def survivor_stall(events: Events, survivors: list[str], t0: float, revision: int) -> float:
    """The longest time a survivor went without committing a step, around the fault at `t0`: over each survivor's
    commits from its last one at or before `t0` to its first one after `t0` above `revision`, the longest gap
    between two consecutive ones; the largest over the survivors."""
    worst = 0.0
    for peer in survivors:
        times = sorted((e["t"], e["revision"]) for e in _commits(events) if e["peer"] == peer)
        before = [t for t, _ in times if t <= t0]
        after = [t for t, r in times if t > t0 and r > revision]
        if not before or not after:
            continue
        inside = [t for t, _ in times if before[-1] <= t <= after[0]]
        worst = max([worst, *(b - a for a, b in zip(inside, inside[1:]))])
    return worst


def step_time(events: Events, before: float, n: int = 20) -> float:
    """The median time between the last `n` increases of the highest committed revision before `before`."""
    rising, high = [], -1
    for e in sorted((e for e in _commits(events) if e["t"] < before), key=lambda e: e["t"]):
        if e["revision"] > high:
            high = e["revision"]
            rising.append(e["t"])
    last = rising[-n - 1:]
    gaps = [b - a for a, b in zip(last, last[1:])]
    return statistics.median(gaps) if gaps else float("nan")


def _take(deployment: P2PGenDeployment, kind: str) -> tuple[float, Any]:
    agent = deployment.cluster.agents[VICTIM]
    t0 = time.time()
    if kind == "drain":
        os.kill(agent.pid, signal.SIGTERM)
    else:
        os.killpg(agent.pid, signal.SIGKILL)
    return t0, agent


def _one(deployment: P2PGenDeployment, tail: TraceTail, kind: str) -> dict[str, Any]:
    events = tail.refresh()
    revision = max(e["revision"] for e in _commits(events))
    t0, agent = _take(deployment, kind)
    agent.proc.wait(60)
    gone = time.time() - t0
    survivors = [p for p in PEERS if p != VICTIM]
    tail.wait(_past(t0, revision + 2, survivors), 120, f"survivors of {kind} past revision {revision + 2}",
              deployment.logs)
    events = tail.refresh()
    record = analyze_fault(events, Fault("p2pgen", kind, VICTIM, t0))
    stall, step = survivor_stall(events, survivors, t0, record["revision_at_fault"]), step_time(events, t0)
    record.update({"stall_s": stall, "step_s": step, "lost_s": max(0.0, stall - step), "gone_s": gone})
    deployment.start_host(VICTIM)
    tail.wait(_training(time.time(), len(PEERS)), 120, f"training with 3 members again after {kind}",
              deployment.logs)
    return record


def run_drain(plan: Plan, detect_timeout: float, workdir: Path) -> list[dict[str, Any]]:
    """`plan.trials` drains and as many kills of the same host, alternating (ABBA)."""
    trace_dir = workdir / "traces"
    trace_dir.mkdir(parents=True)
    deployment = P2PGenDeployment("p2pgen", plan, detect_timeout, workdir, trace_dir)
    tail = TraceTail(trace_dir)
    order = [KINDS[(i // 2 + i) % 2] for i in range(2 * plan.trials)]          # drain, kill, kill, drain, ...
    records = []
    try:
        deployment.start()
        tail.wait(_training(0.0, len(PEERS)), 180, "training with 3 members", deployment.logs)
        tail.wait(lambda events: len(_commits(events)) >= WARM_COMMITS, 120, "warm-up steps", deployment.logs)
        records = [_one(deployment, tail, kind) for kind in order]
    finally:
        deployment.stop()
    return records


def summarize_drain(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for kind in KINDS:
        mine = [r for r in records if r["kind"] == kind]
        if mine:
            out[kind] = {key: summarize([r[key] for r in mine])
                         for key in ("stall_s", "step_s", "lost_s", "to_first_commit_s", "rollback_steps", "gone_s")}
    return out


def format_drain(summary: dict[str, dict[str, Any]], detect_timeout: float) -> str:
    rows = [["drain vs SIGKILL of the same host", "n", *(f"{k} p50/max" for k in summary)]]
    labels = (("stall_s", "survivors' longest time without a commit (ms)", 1000.0),
              ("step_s", "step time before the fault (ms)", 1000.0),
              ("lost_s", "time lost: that gap minus one step (ms)", 1000.0),
              ("to_first_commit_s", "to first commit, every survivor (ms)", 1000.0),
              ("rollback_steps", "steps lost", 1.0),
              ("gone_s", "to the host's agent gone (ms)", 1000.0))
    for key, label, scale in labels:
        cells = [summary[k][key] for k in summary]
        digits = 0 if scale > 1 else 1
        rows.append([label, "/".join(sorted({str(c["n"]) for c in cells})),
                     *(f"{c['p50'] * scale:.{digits}f}/{c['max'] * scale:.{digits}f}" for c in cells)])
    return "\n".join(aligned(rows) + [
        f"3 members train the step-loop workload; peer {VICTIM}'s host is drained (SIGTERM to its agent, what a "
        f"spot notice also starts) or SIGKILLed (agent and application), alternating; p2pgen detector: fixed "
        f"{detect_timeout} s"])

"""`p2pgen bench recovery`: what faults and joins cost, on real agent processes, beside baselines.

Owns four sections, each reported as a table and under its own JSON key:
1. membership (top-level keys, read by `p2pgen sim --recovery-json`): SIGKILL and SIGSTOP of a
   supervised `sleep` application, SIGKILL of the agent that is the Raft leader, a joiner becoming a
   member. Read from certificates (`activated_at` minus the wall time of the fault).
2. `steploop`: three members train a small numpy model in the step loop (`p2pgen.bench.apps.steploop`);
   SIGKILL of an application, SIGSTOP of one, SIGKILL of the leader's agent; under the p2pgen policy and
   under restart-all (every application restarts and reloads a checkpoint, as torchrun does). Read from
   the applications' traces: fault -> next generation active, -> first commit of every survivor,
   -> every survivor past the pre-fault revision (time lost), and the steps rolled back.
3. `catchup`: `p2pgen.bench.catchup.catchup_throughput` (pull vs raw loopback TCP, same run).
4. `step_overhead`: `p2pgen.bench.apps.noop`: a step through `peer.steps()` vs a bare all-reduce, in
   one process and one generation.
Invariant: every process a section starts is stopped by pid before the section returns (`Cluster`);
figures are wall-clock differences of timestamps taken on this machine, never of polling times.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from p2pgen.testing.agents import RESTART_ALL_AGENT_ARGS, Cluster, active, active_members, free_control_ports
from p2pgen.termprogress import TermProgress

APP = [sys.executable, "-c", "import time; time.sleep(3600)"]
SECTIONS = ("membership", "steploop", "catchup", "overhead")
POLICIES = ("p2pgen", "restart-all")
FAULTS = ("sigkill_app", "sigstop_app", "kill_agent")
PEERS = ("p0", "p1", "p2")
CATCHUP_RUNS = ((64 << 20, 1), (64 << 20, 2), (256 << 20, 1), (256 << 20, 2))


@dataclass(frozen=True)
class Plan:
    """How much of each section to run (`--quick` shrinks every one)."""
    trials: int = 4                  # membership trials
    steploop_rounds: int = 2         # rounds; each runs both policies (order alternates) ...
    steploop_trials: int = 1         # ... with this many trials of the three faults each
    step_delay: float = 0.02
    checkpoint_every: int = 20
    catchup: tuple[tuple[int, int], ...] = CATCHUP_RUNS
    overhead_steps: int = 200        # steps per block
    overhead_blocks: int = 6

    @classmethod
    def quick(cls) -> "Plan":
        return cls(trials=1, steploop_rounds=1, steploop_trials=1, catchup=((64 << 20, 1),),
                   overhead_steps=50, overhead_blocks=4)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def summarize(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": statistics.median(values), "p90": _percentile(values, 90),
            "p99": _percentile(values, 99), "max": max(values)}


def _detect_flags(detect_timeout: float) -> tuple[str, ...]:
    return ("--attach-grace=0", "--detector=fixed", f"--detect-timeout={detect_timeout}",
            f"--detect-floor={min(0.3, detect_timeout / 2)}", "--heartbeat-interval=0.1")


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]


# --- 1. membership ----------------------------------------------------------------------------------

def _leader_agent(cluster: Cluster, show: dict[str, Any]):
    return next(a for a in cluster.agents.values() if a.alive() and a.addr == show["raft"]["leader_agent"])


def _without(peer: str, inc: int):
    return lambda s: active(s) is not None and (peer, inc) not in active_members(s)


def _with_newer(peer: str, inc: int):
    return lambda s: dict(active_members(s)).get(peer, -1) > inc


def run_membership(trials: int, detect_timeout: float, workdir: Path) -> dict[str, list[float]]:
    """Section 1: the foundation's membership figures, with stateless `sleep` applications."""
    cluster = Cluster(workdir, job="bench-recovery", detect=_detect_flags(detect_timeout))
    results: dict[str, list[float]] = {k: [] for k in (
        "sigkill_app_to_active_s", "app_back_as_new_incarnation_s", "sigstop_app_to_active_s",
        "leader_agent_kill_to_active_s", "agent_restart_to_member_s", "join_to_member_s")}
    try:
        addrs = [f"127.0.0.1:{p}" for p in free_control_ports(4)]
        members, spare = addrs[:3], addrs[3]
        for i, addr in enumerate(members):
            cluster.start(f"p{i}", addr, [a for a in members if a != addr], command=APP,
                          extra=("--min-members=3", "--max-restarts=1000"))
        cluster.wait(members[0], lambda s: len(active_members(s)) == 3, timeout=60)
        for trial in range(trials):
            victim = cluster.agents[f"p{trial % 3}"]
            observer = next(a.addr for a in cluster.agents.values() if a is not victim and a.alive())
            for sig, key in ((signal.SIGKILL, "sigkill_app_to_active_s"), (signal.SIGSTOP, "sigstop_app_to_active_s")):
                with cluster.client(victim.addr) as c:
                    shown = c.show()
                pid, inc = shown["agent"]["app_pid"], shown["agent"]["incarnation"]
                t0 = time.time()
                os.kill(pid, sig)
                gone = cluster.wait(observer, _without(victim.peer_id, inc))
                results[key].append(active(gone)["activated_at"] - t0)
                back = cluster.wait(observer, _with_newer(victim.peer_id, inc))
                if sig == signal.SIGKILL:
                    results["app_back_as_new_incarnation_s"].append(active(back)["activated_at"] - t0)
            shown = cluster.wait(observer, lambda s: len(active_members(s)) == 3 and s["state"]["pending"] is None)
            leader = _leader_agent(cluster, shown)
            inc = dict(active_members(shown))[leader.peer_id]
            observer = next(a.addr for a in cluster.agents.values() if a is not leader and a.alive())
            t0 = time.time()
            os.killpg(leader.pid, signal.SIGKILL)
            leader.proc.wait()
            gone = cluster.wait(observer, _without(leader.peer_id, inc))
            results["leader_agent_kill_to_active_s"].append(active(gone)["activated_at"] - t0)
            t0 = time.time()
            cluster.start(leader.peer_id, leader.addr, [a for a in members if a != leader.addr], command=APP,
                          extra=("--max-restarts=1000",))
            back = cluster.wait(observer, _with_newer(leader.peer_id, inc), timeout=60)
            results["agent_restart_to_member_s"].append(active(back)["activated_at"] - t0)
            t0 = time.time()
            joiner = cluster.start("joiner", spare, [members[trial % 3]])
            joined = cluster.wait(members[(trial + 1) % 3], lambda s: "joiner" in dict(active_members(s)), timeout=60)
            results["join_to_member_s"].append(active(joined)["activated_at"] - t0)
            joiner.signal(signal.SIGTERM)
            joiner.proc.wait(20)
            cluster.wait(observer, lambda s: "joiner" not in dict(active_members(s)) and len(s["raft"]["nodes"]) == 3)
    finally:
        cluster.stop_all()
    return results


def format_membership(results: dict[str, list[float]], detect_timeout: float) -> str:
    rows = [["membership (3 agents, sleep apps, 127.0.0.1)", "n", "p50 ms", "p90 ms", "p99 ms", "max ms"]]
    for key, values in results.items():
        if values:
            s = summarize(values)
            rows.append([key, str(s["n"])] + [f"{s[q] * 1000:.0f}" for q in ("p50", "p90", "p99", "max")])
    return "\n".join(_table(rows) + [
        f"detector: fixed timeout {detect_timeout} s (SIGSTOP and agent kills are detected by timeout; "
        "an application's exit is reported by its agent at once)"])


# --- 2. step-loop recovery, p2pgen vs restart-all ------------------------------------------------------

SETTLE_COMMITS = 5
Events = list[dict[str, Any]]


@dataclass(frozen=True)
class Fault:
    policy: str
    kind: str
    victim: str
    t: float


class TraceTail:
    """The start/certificate/commit events of every trace file in a directory, read incrementally."""

    KEPT = (b'"event": "commit"', b'"event": "certificate"', b'"event": "start"')

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.events: Events = []
        self._offsets: dict[Path, int] = {}

    def refresh(self) -> Events:
        for path in sorted(self.directory.glob("*.jsonl")):
            offset = self._offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            whole = data[:data.rfind(b"\n") + 1]          # a line being written is read next time
            self._offsets[path] = offset + len(whole)
            self.events.extend(json.loads(line) for line in whole.splitlines() if any(k in line for k in self.KEPT))
        return self.events

    def wait(self, predicate: Callable[[Events], bool], timeout: float, what: str, cluster: Cluster) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self.refresh()):
                return
            time.sleep(0.05)
        raise AssertionError(f"step loop: {what} did not happen within {timeout} s\n{cluster.logs()}")


def _commits(events: Events) -> Events:
    return [e for e in events if e["event"] == "commit"]


def _past(t0: float, revision: int, peers: list[str]) -> Callable[[Events], bool]:
    """Every one of `peers` committed a revision above `revision` after t0."""
    return lambda events: set(peers) <= {e["peer"] for e in _commits(events)
                                         if e["t"] > t0 and e["revision"] > revision}


def _training(after: float, world: int) -> Callable[[Events], bool]:
    """A generation of `world` members, first trained in after `after`, where each committed SETTLE_COMMITS steps."""
    def holds(events: Events) -> bool:
        full = {e["generation"] for e in events
                if e["event"] == "certificate" and e["world"] == world and e["t"] > after}
        counts = Counter((e["generation"], e["peer"]) for e in _commits(events) if e["generation"] in full)
        return any(sum(counts[(g, p)] >= SETTLE_COMMITS for p in PEERS) == world for g in full)
    return holds


def _inject(cluster: Cluster, kind: str, trial: int) -> tuple[str, float]:
    """Inject one fault; returns (victim peer id, wall time of the fault)."""
    if kind == "kill_agent":
        shown = cluster.wait(cluster.agents[PEERS[0]].addr, lambda s: s["raft"]["leader"] is not None)
        agent = _leader_agent(cluster, shown)
        t0 = time.time()
        os.killpg(agent.pid, signal.SIGKILL)
        agent.proc.wait()
        return agent.peer_id, t0
    victim = cluster.agents[PEERS[(trial + (kind == "sigstop_app")) % len(PEERS)]]
    with cluster.client(victim.addr) as c:
        pid = c.show()["agent"]["app_pid"]
    t0 = time.time()
    os.kill(pid, signal.SIGKILL if kind == "sigkill_app" else signal.SIGSTOP)
    return victim.peer_id, t0


def _one_fault(cluster: Cluster, tail: TraceTail, command: list[str], addrs: list[str], policy: str, kind: str,
               trial: int, checkpoint_every: int) -> Fault:
    """Wait for mid-interval between two checkpoints (the mean rollback of a fault at a random time), inject, wait
    until the survivors are past the pre-fault revision, restore 3 members, wait until they train."""
    now = max(e["revision"] for e in _commits(tail.refresh()))
    half = checkpoint_every // 2
    target = now + (half - now) % checkpoint_every
    tail.wait(lambda events: max(e["revision"] for e in _commits(events)) >= target, 90,
              f"{policy}: revision {target} before {kind}", cluster)
    victim, t0 = _inject(cluster, kind, trial)
    revision = max(e["revision"] for e in _commits(tail.refresh()) if e["t"] <= t0)
    survivors = [p for p in PEERS if p != victim]
    tail.wait(_past(t0, revision, survivors), 90, f"{policy}: survivors of {kind} past revision {revision}", cluster)
    if kind == "kill_agent":
        addr = cluster.agents[victim].addr
        cluster.start(victim, addr, [a for a in addrs if a != addr], command=command, extra=("--max-restarts=1000",))
    tail.wait(_training(t0, len(PEERS)), 90, f"{policy}: training with 3 members again after {kind}", cluster)
    return Fault(policy, kind, victim, t0)


def analyze_fault(events: Events, fault: Fault) -> dict[str, Any]:
    """The figures of one fault, from the traces of every process of the run (see the module docstring)."""
    commits = _commits(events)
    g_before = max(e["generation"] for e in commits if e["t"] <= fault.t)
    r_fault = max(e["revision"] for e in commits if e["generation"] <= g_before)
    survivors = [p for p in PEERS if p != fault.victim]
    after = sorted((e for e in commits if e["generation"] > g_before and e["t"] > fault.t), key=lambda e: e["t"])
    first = [next(e for e in after if e["peer"] == p) for p in survivors]
    regained = [next(e for e in after if e["peer"] == p and e["revision"] > r_fault) for p in survivors]
    cert = min((e for e in events if e["event"] == "certificate" and e["generation"] > g_before),
               key=lambda e: e["generation"])
    until = max(e["t"] for e in regained)
    started = {(e["peer"], e["incarnation"]) for e in events if e["event"] == "start" and fault.t < e["t"] <= until}
    return {**asdict(fault), "revision_at_fault": r_fault, "to_active_s": cert["activated_at"] - fault.t,
            "to_first_commit_s": max(e["t"] for e in first) - fault.t, "to_regain_s": until - fault.t,
            "rollback_steps": r_fault - (min(e["revision"] for e in first) - 1), "processes_started": len(started)}


def run_steploop_block(policy: str, trials: int, first_trial: int, plan: Plan, detect_timeout: float,
                       workdir: Path) -> list[dict[str, Any]]:
    """One cluster of three agents running the step-loop app under `policy`; `trials` x the three faults."""
    trace_dir = workdir / "traces"
    trace_dir.mkdir(parents=True)
    cluster = Cluster(workdir, job="bench-steploop", detect=_detect_flags(detect_timeout))
    command = [sys.executable, "-m", "p2pgen.bench.apps.steploop", f"--policy={policy}", f"--trace-dir={trace_dir}",
               f"--checkpoint={workdir / 'checkpoint.npz'}", f"--checkpoint-every={plan.checkpoint_every}",
               f"--step-delay={plan.step_delay}"]
    tail = TraceTail(trace_dir)
    faults: list[Fault] = []
    try:
        addrs = [f"127.0.0.1:{p}" for p in free_control_ports(len(PEERS))]
        for peer, addr in zip(PEERS, addrs):
            cluster.start(peer, addr, [a for a in addrs if a != addr], command=command,
                          extra=("--min-members=3", "--max-restarts=1000",
                                 *(RESTART_ALL_AGENT_ARGS if policy == "restart-all" else ())))
        tail.wait(_training(0.0, len(PEERS)), 120, f"{policy}: training with 3 members", cluster)
        for trial in range(first_trial, first_trial + trials):
            faults.extend(_one_fault(cluster, tail, command, addrs, policy, kind, trial, plan.checkpoint_every)
                          for kind in FAULTS)
    finally:
        cluster.stop_all()
    events = tail.refresh()
    return [analyze_fault(events, f) for f in faults]


def run_steploop(plan: Plan, detect_timeout: float, workdir: Path) -> list[dict[str, Any]]:
    """Rounds of both policies, the order alternating (ABBA), so that both see the same load drift."""
    records: list[dict[str, Any]] = []
    for r in range(plan.steploop_rounds):
        for policy in (POLICIES if r % 2 == 0 else POLICIES[::-1]):
            records += run_steploop_block(policy, plan.steploop_trials, r * plan.steploop_trials, plan,
                                          detect_timeout, workdir / f"{policy}-{r}")
    return records


STEPLOOP_METRICS = (("to_active_s", "to next active generation (ms)", 1000.0),
                    ("to_first_commit_s", "to first commit, every survivor (ms)", 1000.0),
                    ("to_regain_s", "to regain pre-fault revision (ms)", 1000.0),
                    ("rollback_steps", "steps rolled back", 1.0),
                    ("processes_started", "processes started", 1.0))


def summarize_steploop(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """policy -> fault kind -> metric -> summary."""
    return {policy: {kind: {m: summarize([r[m] for r in records if r["policy"] == policy and r["kind"] == kind])
                            for m, _, _ in STEPLOOP_METRICS}
                     for kind in FAULTS if any(r["policy"] == policy and r["kind"] == kind for r in records)}
            for policy in POLICIES}


def format_steploop(summary: dict[str, Any], plan: Plan, detect_timeout: float) -> str:
    rows = [["fault", "measurement", "n", "p2pgen p50", "p2pgen p99", "restart-all p50", "restart-all p99",
             "ratio p50"]]
    for kind in FAULTS:
        for metric, label, scale in STEPLOOP_METRICS:
            ours, base = summary["p2pgen"].get(kind, {}).get(metric), summary["restart-all"].get(kind, {}).get(metric)
            if ours is None or base is None:
                continue
            digits = 0 if scale > 1 else 1
            ratio = f"{base['p50'] / ours['p50']:.1f}x" if ours["p50"] > 0 else "-"
            rows.append([kind if metric == "to_active_s" else "", label, str(ours["n"]),
                         *(f"{s[q] * scale:.{digits}f}" for s in (ours, base) for q in ("p50", "p99")), ratio])
    return "\n".join([
        f"step-loop recovery: 3 members train a numpy model (4 MiB of state, {plan.step_delay * 1000:.0f} ms step "
        f"delay); restart-all = every application restarts and reloads the checkpoint rank 0 writes every "
        f"{plan.checkpoint_every} steps; both policies are faulted mid-interval "
        f"({plan.checkpoint_every // 2} steps after a checkpoint); ratio = restart-all / p2pgen",
        *_table(rows),
        f"kill_agent kills the Raft leader's agent (its application dies with it); detector: fixed {detect_timeout} s; "
        "p99 of n samples is the max when n < 100"])


# --- 3. catch-up throughput ----------------------------------------------------------------------------

def run_catchup(plan: Plan) -> list[dict[str, Any]]:
    from p2pgen.bench.catchup import catchup_throughput

    return [catchup_throughput(size, sources) for size, sources in plan.catchup]


def format_catchup(rows: list[dict[str, Any]]) -> str:
    table = [["catch-up (joiner pulls from source processes)", "sources", "pull GB/s", "raw TCP GB/s", "pull/raw"]]
    for r in rows:
        table.append([f"{r['size_bytes'] >> 20} MiB of state", str(r["sources"]), f"{r['pull_GBps']:.2f}",
                      f"{r['raw_GBps']:.2f}", f"{r['pull_over_raw']:.2f}"])
    return "\n".join(_table(table) + ["raw TCP: the same bytes over as many plain loopback connections, in the same "
                                      "run; pull includes handshake, manifest, checksums and the final digest"])


# --- 4. per-step overhead, no faults --------------------------------------------------------------------

def run_overhead(plan: Plan, detect_timeout: float, workdir: Path) -> dict[str, Any]:
    """Two members run the no-op app to completion; rank 0's per-block seconds become microseconds per step."""
    out = workdir / "noop.json"
    cluster = Cluster(workdir, job="bench-overhead", detect=_detect_flags(detect_timeout))
    command = [sys.executable, "-m", "p2pgen.bench.apps.noop", f"--out={out}",
               f"--steps-per-block={plan.overhead_steps}", f"--blocks={plan.overhead_blocks}"]
    try:
        addrs = [f"127.0.0.1:{p}" for p in free_control_ports(2)]
        for i, addr in enumerate(addrs):
            cluster.start(f"n{i}", addr, [a for a in addrs if a != addr], command=command, extra=("--min-members=2",))
        for agent in list(cluster.agents.values()):
            if agent.proc.wait(timeout=120) != 0:
                raise RuntimeError(f"no-op app under {agent.peer_id} failed\n{cluster.logs()}")
        raw = json.loads(out.read_text())
    finally:
        cluster.stop_all()
    return summarize_overhead(raw)


def summarize_overhead(raw: dict[str, Any]) -> dict[str, Any]:
    n = raw["steps_per_block"]
    step_us = [s / n * 1e6 for s in raw["step_s"]]
    bare_us = [s / n * 1e6 for s in raw["bare_s"]]
    overhead = [a - b for a, b in zip(step_us, bare_us)]
    return {"world": raw["world"], "steps_per_block": n, "blocks": len(step_us), "step_us_blocks": step_us,
            "bare_us_blocks": bare_us, "step_us": statistics.median(step_us),
            "bare_all_reduce_us": statistics.median(bare_us), "overhead_us": statistics.median(overhead),
            "overhead_us_min": min(overhead), "overhead_us_max": max(overhead),
            "ratio": statistics.median(step_us) / statistics.median(bare_us)}


def format_overhead(s: dict[str, Any]) -> str:
    rows = [["per-step overhead, no-op model", "step via peer.steps()", "bare all_reduce", "overhead/step",
             "ratio", "overhead min..max"],
            [f"{s['world']} members, {s['blocks']} x {s['steps_per_block']} steps", f"{s['step_us']:.0f} us",
             f"{s['bare_all_reduce_us']:.0f} us", f"{s['overhead_us']:.0f} us", f"{s['ratio']:.2f}",
             f"{s['overhead_us_min']:.0f}..{s['overhead_us_max']:.0f} us"]]
    return "\n".join(_table(rows) + ["a step = the boundary-agreement all-reduce (int64 MAX) + a 4-byte all-reduce + "
                                     "commit(); baseline = one bare 4-byte all-reduce; blocks alternate ABBA in one "
                                     "generation; medians over blocks; traces off"])


# --- the whole benchmark ------------------------------------------------------------------------------

def run(plan: Plan, detect_timeout: float, sections: tuple[str, ...], workdir: Path,
        progress: TermProgress | None = None) -> dict[str, Any]:
    """Run the sections in order; `progress` (if given) counts finished sections and names the current one."""
    results: dict[str, Any] = {}
    for section in sections:
        (workdir / section).mkdir()
    steps = {"membership": lambda: run_membership(plan.trials, detect_timeout, workdir / "membership"),
             "steploop": lambda: run_steploop(plan, detect_timeout, workdir / "steploop"),
             "catchup": lambda: run_catchup(plan),
             "overhead": lambda: run_overhead(plan, detect_timeout, workdir / "overhead")}
    for done, section in enumerate(s for s in SECTIONS if s in sections):
        if progress is not None:
            progress.update(done, f"running {section}")
        results[section] = steps[section]()
    if progress is not None:
        progress.update(len(sections), "done")
    return results


def to_json(results: dict[str, Any], detect_timeout: float, plan: Plan) -> str:
    membership = results.get("membership", {})
    out: dict[str, Any] = {k: summarize(v) for k, v in membership.items() if v}
    out["detect_timeout_s"] = detect_timeout
    if membership:
        out["agent_kill_to_active_s"] = out.get("leader_agent_kill_to_active_s")   # the key `p2pgen sim` reads
    if "steploop" in results:
        out["steploop"] = {"step_delay_s": plan.step_delay, "checkpoint_every": plan.checkpoint_every,
                           "summary": summarize_steploop(results["steploop"]), "faults": results["steploop"]}
    if "catchup" in results:
        out["catchup"] = results["catchup"]
    if "overhead" in results:
        out["step_overhead"] = results["overhead"]
    return json.dumps(out, indent=2, sort_keys=True)


def format_text(results: dict[str, Any], detect_timeout: float, plan: Plan) -> str:
    parts = []
    if "membership" in results:
        parts.append(format_membership(results["membership"], detect_timeout))
    if "steploop" in results:
        parts.append(format_steploop(summarize_steploop(results["steploop"]), plan, detect_timeout))
    if "catchup" in results:
        parts.append(format_catchup(results["catchup"]))
    if "overhead" in results:
        parts.append(format_overhead(results["overhead"]))
    return "\n\n".join(parts)


def main(plan: Plan, detect_timeout: float, sections: tuple[str, ...], as_json: bool, out: str | None,
         plot: str | None = None) -> int:
    progress = TermProgress(len(sections), "p2pgen bench recovery", enabled=not as_json, unit=" sections")
    try:
        with tempfile.TemporaryDirectory(prefix="p2pgen-bench-recovery-") as tmp:
            results = run(plan, detect_timeout, sections, Path(tmp), progress)
    finally:
        progress.close()
    text = to_json(results, detect_timeout, plan)
    if out:
        Path(out).write_text(text)
    print(text if as_json else format_text(results, detect_timeout, plan))
    if plot:
        from p2pgen.bench.plots import plot_recovery
        summaries = {"membership": {k: summarize(v) for k, v in results.get("membership", {}).items() if v}}
        if "steploop" in results:
            summaries["steploop"] = summarize_steploop(results["steploop"])
        plot_recovery(results, summaries, STEPLOOP_METRICS, FAULTS, plot)
        print(f"wrote {plot}", file=sys.stderr)
    return 0

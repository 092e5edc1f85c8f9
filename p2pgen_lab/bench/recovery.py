"""`p2pgen bench recovery`: what faults and joins cost, on real agent processes, beside baselines.

Owns six sections, each reported as a table and under its own JSON key:
1. membership (top-level keys, read by `p2pgen sim --recovery-json`): SIGKILL and SIGSTOP of a
   supervised `sleep` application, SIGKILL of the agent that is the Raft leader, a joiner becoming a
   member. Read from certificates (`activated_at` minus the wall time of the fault).
2. `steploop`: three members train a small numpy model in a step loop, the same workload under every peer:
   p2pgen (`p2pgen_lab.bench.apps.steploop`), torchft and torchrun (`p2pgen_lab.bench.peers`, real processes of
   theirs) and restart-all (p2pgen's agents restarting every application from a checkpoint). Faults:
   SIGKILL of an application, SIGSTOP of one, SIGKILL of a whole host (p2pgen: the leader's agent).
   Read from the applications' traces, one analysis for every peer (`analyze_fault`): fault -> next
   generation active, -> first commit of every survivor, -> every survivor past the pre-fault revision
   (time lost), the steps rolled back, and -> the replacement process's first commit (heal); for p2pgen,
   where the time to the survivors' first commit goes (`p2pgen_lab.bench.breakdown`). Every process of every
   peer runs with OMP_NUM_THREADS=1 unless the caller set it (three applications share the machine).
3. `heal`: `p2pgen_lab.bench.heal.run_heal`: a torch application's heal (kill -> the replacement's first commit)
   with and without a warm standby (`p2pgen join --standby 1`), beside torchft's heal from section 2.
4. `catchup`: `p2pgen_lab.bench.catchup.catchup_throughput` (pull vs raw loopback TCP, same run).
5. `step_overhead`: `p2pgen_lab.bench.apps.noop`: a step through `peer.steps()` vs a bare all-reduce, in
   one process and one generation.
6. `drain`: `p2pgen_lab.bench.drain.run_drain`: a drained host (SIGTERM, what a spot notice starts) against a
   SIGKILLed one, same host, same run: the survivors' longest time without a commit, steps lost, host gone.
Invariant: every process a section starts is stopped by pid before the section returns (`Cluster`,
`p2pgen_lab.bench.peers.Deployment`); figures are wall-clock differences of timestamps taken on this machine,
never of polling times.
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
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from p2pgen.termprogress import TermProgress
from p2pgen_lab.bench.breakdown import fault_phases, format_phases, summarize_phases
from p2pgen_lab.bench.peers import DEPLOYMENTS, MISSING, StepLoopDeployment, settings_text
from p2pgen_lab.bench.table import aligned
from p2pgen_lab.rigs.agents import RESTART_ALL_AGENT_ARGS, Cluster, active, active_members, free_control_ports
from p2pgen_lab.rigs.netns import EmulatedCluster
from p2pgen_lab.rigs.traces import read_records

APP = [sys.executable, "-c", "import time; time.sleep(3600)"]
SECTIONS = ("membership", "steploop", "heal", "catchup", "overhead", "drain")
HOST_SECTIONS = ("membership", "steploop", "drain")           # the sections that run in emulated hosts (--hosts)
HOST_PEERS = ("p2pgen", "restart-all")                # the step-loop peers that do
STEPLOOP_PEERS = ("p2pgen", "torchft", "torchrun", "restart-all")
FAULTS = ("sigkill_app", "sigstop_app", "kill_agent")
PEERS = ("p0", "p1", "p2")
CATCHUP_RUNS = ((64 << 20, 1), (64 << 20, 2), (256 << 20, 1), (256 << 20, 2))


@dataclass(frozen=True)
class Plan:
    """How much of each section to run (`--quick` shrinks every one)."""
    trials: int = 4                  # membership trials
    steploop_rounds: int = 2         # rounds; each runs both policies (order alternates) ...
    steploop_trials: int = 1         # ... with this many trials of the three faults each
    peers: tuple[str, ...] = STEPLOOP_PEERS   # step-loop peers, in the order of the first round
    step_delay: float = 0.02
    checkpoint_every: int = 20
    catchup: tuple[tuple[int, int], ...] = CATCHUP_RUNS
    overhead_steps: int = 200        # steps per block
    overhead_blocks: int = 6
    heal_rounds: int = 2             # rounds of one block per mode (standby, plain; ABBA) ...
    heal_kills: int = 3              # ... with this many application kills each
    hosts: EmulatedCluster | None = None     # membership and step loop in emulated hosts (created by the caller)

    @classmethod
    def quick(cls) -> Plan:
        return cls(trials=1, steploop_rounds=1, steploop_trials=1, catchup=((64 << 20, 1),),
                   overhead_steps=50, overhead_blocks=4, heal_rounds=1, heal_kills=2)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def summarize(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": statistics.median(values), "p90": _percentile(values, 90),
            "p99": _percentile(values, 99), "max": max(values)}


def _detect_flags(detect_timeout: float) -> tuple[str, ...]:
    return ("--attach-grace=0", "--detector=fixed", f"--detect-timeout={detect_timeout}",
            f"--detect-floor={min(0.3, detect_timeout / 2)}", "--heartbeat-interval=0.1")


# --- 1. membership ----------------------------------------------------------------------------------

def _leader_agent(cluster: Cluster, show: dict[str, Any]):
    return next(a for a in cluster.agents.values() if a.alive() and a.addr == show["raft"]["leader_agent"])


def _without(peer: str, inc: int):
    return lambda s: active(s) is not None and (peer, inc) not in active_members(s)


def _with_newer(peer: str, inc: int):
    return lambda s: dict(active_members(s)).get(peer, -1) > inc


def run_membership(trials: int, detect_timeout: float, workdir: Path,
                   hosts: EmulatedCluster | None = None) -> dict[str, list[float]]:
    """Section 1: the foundation's membership figures, with stateless `sleep` applications (in the first four
    emulated hosts when `hosts` is given)."""
    cluster = Cluster(workdir, job="bench-recovery", detect=_detect_flags(detect_timeout), hosts=hosts)
    results: dict[str, list[float]] = {k: [] for k in (
        "sigkill_app_to_active_s", "app_back_as_new_incarnation_s", "sigstop_app_to_active_s",
        "leader_agent_kill_to_active_s", "agent_restart_to_member_s", "join_to_member_s")}
    try:
        addrs = cluster.addresses(4)
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


def format_membership(results: dict[str, list[float]], detect_timeout: float, where: str = "127.0.0.1") -> str:
    rows = [[f"membership (3 agents, sleep apps, {where})", "n", "p50 ms", "p90 ms", "p99 ms", "max ms"]]
    for key, values in results.items():
        if values:
            s = summarize(values)
            rows.append([key, str(s["n"])] + [f"{s[q] * 1000:.0f}" for q in ("p50", "p90", "p99", "max")])
    return "\n".join(aligned(rows) + [
        f"detector: fixed timeout {detect_timeout} s (SIGSTOP and agent kills are detected by timeout; "
        "an application's exit is reported by its agent at once)"])


# --- 2. step-loop recovery: p2pgen beside torchft, torchrun and restart-all --------------------------

SETTLE_COMMITS = 5
Events = list[dict[str, Any]]


@dataclass(frozen=True)
class Fault:
    policy: str          # the peer under test: p2pgen, torchft, torchrun, restart-all
    kind: str
    victim: str
    t: float


class TraceTail:
    """The events of every trace file in a directory that the analysis reads, read incrementally."""

    KEPT = (b'"event": "commit"', b'"event": "certificate"', b'"event": "start"', b'"event": "retire"',
            b'"event": "ready"', b'"event": "active"', b'"event": "connected"')

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

    def wait(self, predicate: Callable[[Events], bool], timeout: float, what: str, logs: Callable[[], str]) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self.refresh()):
                return
            time.sleep(0.05)
        raise AssertionError(f"step loop: {what} did not happen within {timeout} s\n{logs()}")


def _commits(events: Events) -> Events:
    return [e for e in events if e["event"] == "commit"]


def _past(t0: float, revision: int, peers: list[str]) -> Callable[[Events], bool]:
    """Every one of `peers` committed a revision above `revision` after t0."""
    return lambda events: set(peers) <= {e["peer"] for e in _commits(events)
                                         if e["t"] > t0 and e["revision"] > revision}


def _training(after: float, world: int) -> Callable[[Events], bool]:
    """Every peer committed SETTLE_COMMITS steps, after `after`, in generations of `world` members first trained in
    after `after` (torchft's quorums can change every few steps; p2pgen's stay)."""
    def holds(events: Events) -> bool:
        full = {e["generation"] for e in events
                if e["event"] == "certificate" and e["world"] == world and e["t"] > after}
        counts = Counter(e["peer"] for e in _commits(events) if e["generation"] in full and e["t"] > after)
        return all(counts[p] >= SETTLE_COMMITS for p in PEERS)
    return holds


class P2PGenDeployment:
    """Three `p2pgen join` agents running the step-loop app under the p2pgen or restart-all policy."""

    def __init__(self, policy: str, plan: Plan, detect_timeout: float, workdir: Path, trace_dir: Path,
                 agent_args: tuple[str, ...] = ()) -> None:
        self.policy, self.agent_args = policy, (f"--trace-dir={raft_trace_dir(workdir)}", *agent_args)
        self.cluster = Cluster(workdir, job="bench-steploop", detect=_detect_flags(detect_timeout), hosts=plan.hosts)
        self.command = [sys.executable, "-m", "p2pgen_lab.bench.apps.steploop", f"--policy={policy}",
                        f"--trace-dir={trace_dir}", f"--checkpoint={workdir / 'checkpoint.npz'}",
                        f"--checkpoint-every={plan.checkpoint_every}", f"--step-delay={plan.step_delay}"]
        self.addrs: list[str] = []

    def start(self) -> None:
        self.addrs = self.cluster.addresses(len(PEERS))
        start_steploop_cluster(self.cluster, self.policy, self.command, self.addrs, self.agent_args)

    def start_host(self, peer: str) -> None:
        addr = self.cluster.agents[peer].addr
        self.cluster.start(peer, addr, [a for a in self.addrs if a != addr], command=self.command,
                           extra=("--max-restarts=1000", *self.agent_args))

    def inject(self, kind: str, trial: int, events: Events) -> tuple[str, float]:
        """Inject one fault; returns (victim peer id, wall time of the fault)."""
        cluster = self.cluster
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

    def logs(self) -> str:
        return self.cluster.logs()

    def stop(self) -> None:
        self.cluster.stop_all()


def start_steploop_cluster(cluster: Cluster, policy: str, command: list[str], addrs: list[str],
                           agent_args: tuple[str, ...] = ()) -> None:
    """The one place the step loop's agents start: one per address in PEERS' order; `agent_args` are added to
    every agent's command line (and to a restarted agent's)."""
    for peer, addr in zip(PEERS, addrs):
        cluster.start(peer, addr, [a for a in addrs if a != addr], command=command,
                      extra=("--min-members=3", "--max-restarts=1000",
                             *(RESTART_ALL_AGENT_ARGS if policy == "restart-all" else ()), *agent_args))


def _one_fault(deployment: StepLoopDeployment, tail: TraceTail, policy: str, kind: str, trial: int,
               checkpoint_every: int) -> Fault:
    """Wait for mid-interval between two checkpoints (the mean rollback of a fault at a random time), inject, wait
    until the survivors are past the pre-fault revision, bring a killed host back, wait until 3 members train.
    A stopped application is never continued: its supervisor (p2pgen's agent, torchft's host) kills it after
    the detection timeout and starts a new one; torchrun's agent kills it when it restarts its workers."""
    now = max(e["revision"] for e in _commits(tail.refresh()))
    half = checkpoint_every // 2
    target = now + (half - now) % checkpoint_every
    tail.wait(lambda events: max(e["revision"] for e in _commits(events)) >= target, 90,
              f"{policy}: revision {target} before {kind}", deployment.logs)
    victim, t0 = deployment.inject(kind, trial, tail.refresh())
    revision = max(e["revision"] for e in _commits(tail.refresh()) if e["t"] <= t0)
    survivors = [p for p in PEERS if p != victim]
    tail.wait(_past(t0, revision, survivors), 120, f"{policy}: survivors of {kind} past revision {revision}",
              deployment.logs)
    if kind == "kill_agent":
        deployment.start_host(victim)
    tail.wait(_training(t0, len(PEERS)), 120, f"{policy}: training with 3 members again after {kind}",
              deployment.logs)
    return Fault(policy, kind, victim, t0)


def analyze_fault(events: Events, fault: Fault, raft: Events = ()) -> dict[str, Any]:
    """The figures of one fault, from the traces of every process of the run (see the module docstring);
    `raft`: the agents' Raft trace records, for the breakdown's election marks.
    heal_s: fault -> first commit of a process of the victim started after the fault (None if none did).
    A survivor's first commit is its first in a later generation than the one running at the fault; when a
    survivor has none, the fault did not reach the survivors' generation (torchft: its quorum had already left
    the victim out), and its commits after the fault in any generation count (`note` says so)."""
    commits = _commits(events)
    g_before = max(e["generation"] for e in commits if e["t"] <= fault.t)
    r_fault = max(e["revision"] for e in commits if e["generation"] <= g_before)
    survivors = [p for p in PEERS if p != fault.victim]
    after = sorted((e for e in commits if e["generation"] > g_before and e["t"] > fault.t), key=lambda e: e["t"])
    note = None
    if not set(survivors) <= {e["peer"] for e in after if e["revision"] > r_fault}:
        note = f"the survivors went on in generation {g_before}: the fault did not change it"
        r_fault = max(e["revision"] for e in commits if e["t"] <= fault.t)
        after = sorted((e for e in commits if e["t"] > fault.t and e["peer"] in survivors), key=lambda e: e["t"])
    first = [next(e for e in after if e["peer"] == p) for p in survivors]
    regained = [next(e for e in after if e["peer"] == p and e["revision"] > r_fault) for p in survivors]
    cert = min((e for e in events if e["event"] == "certificate" and e["generation"] > g_before),
               key=lambda e: e["generation"], default=None)
    until = max(e["t"] for e in regained)
    started = {(e["peer"], e["incarnation"]) for e in events if e["event"] == "start" and fault.t < e["t"] <= until}
    new = {e["incarnation"] for e in events if e["event"] == "start" and e["peer"] == fault.victim and e["t"] > fault.t}
    healed = [e["t"] for e in commits if e["peer"] == fault.victim and e["incarnation"] in new and e["t"] > fault.t]
    return {**asdict(fault), "revision_at_fault": r_fault, "note": note,
            "to_active_s": cert["activated_at"] - fault.t if cert is not None and note is None else None,
            "to_first_commit_s": max(e["t"] for e in first) - fault.t, "to_regain_s": until - fault.t,
            "rollback_steps": r_fault - (min(e["revision"] for e in first) - 1), "processes_started": len(started),
            "heal_s": min(healed) - fault.t if healed else None,
            "raft_leaders": _leaders_elected(raft, fault.t, until) if raft else None,
            "phases": fault_phases(events, survivors, fault.t, raft) if fault.policy == "p2pgen" else None}


def _leaders_elected(raft: Events, after: float, until: float) -> int:
    """How many Raft terms got a leader in (after, until]: 1 after the leader's loss, more in an election storm."""
    return len({(r.get("epoch", 0), r["term"]) for r in raft if r.get("kind") == "leader" and after < r["t"] <= until})


def make_deployment(policy: str, plan: Plan, detect_timeout: float, workdir: Path,
                    trace_dir: Path) -> StepLoopDeployment:
    """The processes of one step-loop block of `policy` (not started yet)."""
    if policy in ("p2pgen", "restart-all"):
        return P2PGenDeployment(policy, plan, detect_timeout, workdir, trace_dir)
    return DEPLOYMENTS[policy](workdir, trace_dir, plan.step_delay, plan.checkpoint_every, detect_timeout)


def run_steploop_block(policy: str, trials: int, first_trial: int, plan: Plan, detect_timeout: float,
                       workdir: Path) -> list[dict[str, Any]]:
    """Three hosts running the step loop under `policy` (a peer of STEPLOOP_PEERS); `trials` x the three faults."""
    trace_dir = workdir / "traces"
    trace_dir.mkdir(parents=True)
    deployment = make_deployment(policy, plan, detect_timeout, workdir, trace_dir)
    tail = TraceTail(trace_dir)
    faults: list[Fault] = []
    try:
        deployment.start()
        tail.wait(_training(0.0, len(PEERS)), 180, f"{policy}: training with 3 members", deployment.logs)
        for trial in range(first_trial, first_trial + trials):
            faults.extend(_one_fault(deployment, tail, policy, kind, trial, plan.checkpoint_every) for kind in FAULTS)
    finally:
        deployment.stop()
    events = tail.refresh()
    raft = read_records(raft_trace_dir(workdir))
    return [analyze_fault(events, f, raft) for f in faults]


def raft_trace_dir(workdir: Path) -> Path:
    """Where a p2pgen block's agents write their Raft traces (the breakdown's election marks)."""
    return workdir / "raft"


def available_peers(peers: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, str]]:
    """The peers of `peers` that can run here, and why each other one cannot."""
    skipped = {p: why for p in peers if p in MISSING and (why := MISSING[p]()) is not None}
    return tuple(p for p in peers if p not in skipped), skipped


def run_steploop(plan: Plan, detect_timeout: float, workdir: Path) -> list[dict[str, Any]]:
    """Rounds of every peer of the plan, the order reversed every other round (ABBA), so that all see the same
    load drift."""
    records: list[dict[str, Any]] = []
    for r in range(plan.steploop_rounds):
        for policy in (plan.peers if r % 2 == 0 else plan.peers[::-1]):
            records += run_steploop_block(policy, plan.steploop_trials, r * plan.steploop_trials, plan,
                                          detect_timeout, workdir / f"{policy}-{r}")
    return records


STEPLOOP_METRICS = (("to_active_s", "to next active generation (ms)", 1000.0),
                    ("to_first_commit_s", "to first commit, every survivor (ms)", 1000.0),
                    ("to_regain_s", "to regain pre-fault revision (ms)", 1000.0),
                    ("rollback_steps", "steps rolled back", 1.0),
                    ("heal_s", "heal: to the replacement's first commit (ms)", 1000.0),
                    ("processes_started", "processes started", 1.0),
                    ("raft_leaders", "Raft leaders elected until then", 1.0))


def summarize_steploop(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """peer -> fault kind -> metric -> summary (a metric with no value, e.g. no heal seen, is left out)."""
    out: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for policy in STEPLOOP_PEERS:
        for kind in FAULTS:
            rows = [r for r in records if r["policy"] == policy and r["kind"] == kind]
            if rows:
                out.setdefault(policy, {})[kind] = {
                    m: summarize(values) for m, _, _ in STEPLOOP_METRICS
                    if (values := [r[m] for r in rows if r.get(m) is not None])}
    return out


def summarize_breakdown(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """fault kind -> p2pgen's phases (p50, max, share) of the time to the survivors' first commit."""
    return {kind: summary for kind in FAULTS
            if (summary := summarize_phases([r["phases"] for r in records
                                             if r["policy"] == "p2pgen" and r["kind"] == kind and r.get("phases")]))}


def format_breakdown(breakdown: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = ["where p2pgen's time goes, fault -> first commit of every survivor (the survivor that committed last; "
             "each phase from the end of the previous one, see p2pgen_lab.bench.breakdown)"]
    for kind, summary in breakdown.items():
        lines += format_phases(kind, summary)
    return "\n".join(lines)


def format_steploop(summary: dict[str, Any], plan: Plan, detect_timeout: float,
                    skipped: dict[str, str] | None = None) -> str:
    peers = [p for p in STEPLOOP_PEERS if p in summary]
    rows = [["fault", "measurement", "n", *(f"{p} p50/p99/max" for p in peers)]]
    for kind in FAULTS:
        for metric, label, scale in STEPLOOP_METRICS:
            cells = [summary[p].get(kind, {}).get(metric) for p in peers]
            if not any(cells):
                continue
            digits = 0 if scale > 1 else 1
            n = "/".join(sorted({str(c["n"]) for c in cells if c}))
            rows.append([kind if metric == "to_active_s" else "", label, n,
                         *("/".join(f"{c[q] * scale:.{digits}f}" for q in ("p50", "p99", "max")) if c else "-"
                           for c in cells)])
    return "\n".join([
        f"step-loop recovery: 3 members train a linear model (float32 W and momentum, 4 MiB, gradients all-reduced "
        f"(SUM) every step, {plan.step_delay * 1000:.0f} ms step delay); every peer is faulted mid-interval "
        f"({plan.checkpoint_every // 2} steps after a checkpoint of rank 0, written every {plan.checkpoint_every} "
        "steps by torchrun and restart-all, which restart every process and reload it; torchft heals a replica from "
        "a peer, p2pgen a process from the frontier)",
        *aligned(rows),
        f"kill_agent: p2pgen and restart-all kill the Raft leader's agent, torchft the host (restarter and replica) "
        f"and torchrun the agent and worker of rank 0; the host comes back once the survivors are past the "
        f"pre-fault step. p2pgen detector: fixed {detect_timeout} s. p99 of n samples is the max when n < 100",
        *settings_text(detect_timeout),
        f"every process of every peer: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')} (three "
        "applications share this machine; torchrun and `p2pgen join --local` set the same default)",
        *(f"{p}: skipped: {why}" for p, why in (skipped or {}).items())])


# --- 3. heal, with and without a warm standby -----------------------------------------------------------

def run_heal_section(plan: Plan, workdir: Path) -> dict[str, Any]:
    from p2pgen_lab.bench.heal import run_heal

    return run_heal(plan.heal_rounds, plan.heal_kills, plan.step_delay, workdir)


def format_heal_section(heal: dict[str, Any], steploop: list[dict[str, Any]] | None) -> str:
    from p2pgen_lab.bench.heal import format_heal

    lines = [format_heal(heal)]
    torchft = [r["heal_s"] for r in steploop or [] if r["policy"] == "torchft" and r["kind"] == "sigkill_app"
               and r.get("heal_s") is not None]
    if torchft:
        s = summarize(torchft)
        lines.append(f"torchft, same run (step loop: a torch process healed from a peer): heal p50 {s['p50']:.3f} s, "
                     f"max {s['max']:.3f} s, n={s['n']}")
    return "\n".join(lines)


# --- 4. catch-up throughput ----------------------------------------------------------------------------

def run_catchup(plan: Plan) -> list[dict[str, Any]]:
    from p2pgen_lab.bench.catchup import catchup_throughput

    return [catchup_throughput(size, sources) for size, sources in plan.catchup]


def format_catchup(rows: list[dict[str, Any]]) -> str:
    table = [["catch-up (joiner pulls from source processes)", "sources", "pull GB/s", "raw TCP GB/s", "pull/raw",
              "per round"]]
    for r in rows:
        table.append([f"{r['size_bytes'] >> 20} MiB of state", str(r["sources"]), f"{r['pull_GBps']:.2f}",
                      f"{r['raw_GBps']:.2f}", f"{r['pull_over_raw']:.2f}",
                      f"{r['ratio_min']:.2f}..{r['ratio_max']:.2f}"])
    return "\n".join(aligned(table) + ["raw TCP: the same bytes over as many plain loopback connections, in the same "
                                      "run; pull includes handshake, manifest, checksums and the final digest; "
                                      f"medians of {rows[0]['rounds'] if rows else 0} interleaved rounds (the order "
                                      "alternating), per round: min..max of the rounds' pull/raw"])


# --- 5. per-step overhead, no faults --------------------------------------------------------------------

def run_overhead(plan: Plan, detect_timeout: float, workdir: Path) -> dict[str, Any]:
    """Two members run the no-op app to completion; rank 0's per-block seconds become microseconds per step."""
    out = workdir / "noop.json"
    cluster = Cluster(workdir, job="bench-overhead", detect=_detect_flags(detect_timeout))
    command = [sys.executable, "-m", "p2pgen_lab.bench.apps.noop", f"--out={out}",
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
    return "\n".join(aligned(rows) + ["a step = the boundary-agreement all-reduce (int64 MAX) + a 4-byte all-reduce + "
                                     "commit(); baseline = one bare 4-byte all-reduce; blocks alternate ABBA in one "
                                     "generation; medians over blocks; traces off"])


# --- the whole benchmark ------------------------------------------------------------------------------

def run(plan: Plan, detect_timeout: float, sections: tuple[str, ...], workdir: Path,
        progress: TermProgress | None = None) -> dict[str, Any]:
    """Run the sections in order; `progress` (if given) counts finished sections and names the current one."""
    results: dict[str, Any] = {}
    for section in sections:
        (workdir / section).mkdir()
    if {"steploop", "heal"} & set(sections) and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = "1"     # every peer's processes inherit it: 3 applications on this machine
    if "steploop" in sections:        # said before anything is measured
        peers, results["steploop_skipped"] = available_peers(plan.peers)
        if plan.hosts is not None:
            results["steploop_skipped"].update({p: "runs on 127.0.0.1 only, not in emulated hosts"
                                                for p in peers if p not in HOST_PEERS})
            peers = tuple(p for p in peers if p in HOST_PEERS)
        for peer, why in results["steploop_skipped"].items():
            print(f"p2pgen bench recovery: step loop without {peer}: {why}", file=sys.stderr)
        plan = replace(plan, peers=peers)
    steps = {"membership": lambda: run_membership(plan.trials, detect_timeout, workdir / "membership", plan.hosts),
             "steploop": lambda: run_steploop(plan, detect_timeout, workdir / "steploop"),
             "heal": lambda: run_heal_section(plan, workdir / "heal"),
             "catchup": lambda: run_catchup(plan),
             "overhead": lambda: run_overhead(plan, detect_timeout, workdir / "overhead"),
             "drain": lambda: _drain_section().run_drain(plan, detect_timeout, workdir / "drain")}
    for done, section in enumerate(s for s in SECTIONS if s in sections):
        if progress is not None:
            progress.update(done, f"running {section}")
        results[section] = steps[section]()
    if progress is not None:
        progress.update(len(sections), "done")
    return results


def _drain_section():
    from p2pgen_lab.bench import drain  # it builds on this module's step loop
    return drain


def to_json(results: dict[str, Any], detect_timeout: float, plan: Plan) -> str:
    membership = results.get("membership", {})
    out: dict[str, Any] = {k: summarize(v) for k, v in membership.items() if v}
    out["detect_timeout_s"] = detect_timeout
    if membership:
        out["agent_kill_to_active_s"] = out.get("leader_agent_kill_to_active_s")   # the key `p2pgen sim` reads
    if "steploop" in results:
        out["steploop"] = {"step_delay_s": plan.step_delay, "checkpoint_every": plan.checkpoint_every,
                           "summary": summarize_steploop(results["steploop"]), "faults": results["steploop"],
                           "breakdown": summarize_breakdown(results["steploop"]),
                           "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                           "skipped": results.get("steploop_skipped", {}), "settings": settings_text(detect_timeout)}
    if "heal" in results:
        out["heal"] = results["heal"]
    if "catchup" in results:
        out["catchup"] = results["catchup"]
    if "overhead" in results:
        out["step_overhead"] = results["overhead"]
    if "drain" in results:
        out["drain"] = {"summary": _drain_section().summarize_drain(results["drain"]), "faults": results["drain"]}
    return json.dumps(out, indent=2, sort_keys=True)


def format_text(results: dict[str, Any], detect_timeout: float, plan: Plan) -> str:
    parts = []
    if plan.hosts is not None:
        parts.append(plan.hosts.describe())
    if "membership" in results:
        where = f"{len(plan.hosts.names)} emulated hosts" if plan.hosts is not None else "127.0.0.1"
        parts.append(format_membership(results["membership"], detect_timeout, where))
    if "steploop" in results:
        parts.append(format_steploop(summarize_steploop(results["steploop"]), plan, detect_timeout,
                                     results.get("steploop_skipped")))
        breakdown = summarize_breakdown(results["steploop"])
        if breakdown:
            parts.append(format_breakdown(breakdown))
    if "heal" in results:
        parts.append(format_heal_section(results["heal"], results.get("steploop")))
    if "catchup" in results:
        parts.append(format_catchup(results["catchup"]))
    if "overhead" in results:
        parts.append(format_overhead(results["overhead"]))
    if "drain" in results:
        drain = _drain_section()
        parts.append(drain.format_drain(drain.summarize_drain(results["drain"]), detect_timeout))
    return "\n\n".join(parts)


def main(plan: Plan, detect_timeout: float, sections: tuple[str, ...], as_json: bool, out: str | None,
         plot: str | None = None) -> int:
    progress = TermProgress(len(sections), "p2pgen bench recovery", enabled=not as_json, unit=" sections")
    try:
        if plan.hosts is not None:
            plan.hosts.create()
        with tempfile.TemporaryDirectory(prefix="p2pgen-bench-recovery-") as tmp:
            results = run(plan, detect_timeout, sections, Path(tmp), progress)
    finally:
        progress.close()
        if plan.hosts is not None:
            plan.hosts.remove()
    text = to_json(results, detect_timeout, plan)
    if out:
        Path(out).write_text(text)
    print(text if as_json else format_text(results, detect_timeout, plan))
    if plot:
        from p2pgen_lab.bench.plots import plot_recovery
        summaries = {"membership": {k: summarize(v) for k, v in results.get("membership", {}).items() if v}}
        if "steploop" in results:
            summaries["steploop"] = summarize_steploop(results["steploop"])
        plot_recovery(results, summaries, STEPLOOP_METRICS, FAULTS, plot)
        print(f"wrote {plot}", file=sys.stderr)
    return 0

"""One `p2pgen stress` run on 127.0.0.1: N agents supervising a training application, seeded churn.

Owns: the run directory (agent logs, traces, progress reports), every agent process of the run (through
`p2pgen_lab.rigs.agents.Cluster`), the fault loop (`plan.choose` every DELAY_S, executed at once; agent
replacements and SIGCONTs on timers), what the harness observes of the job (each live agent's `show`:
its Raft node id, its application's pid and incarnation, the voters; the certificate history), the end
of the run (faults stop, the job settles with every live agent's application in the active generation,
the harness asks every application to stop at one revision ahead of all of them) and the verdict.
Partitions go through `p2pgen.faults`: every agent (and its application) watches RUN_DIR/faults.json; the
minority's slots are `cut` until the heal, and the verdict adds `faults.minority_violations` (a minority that
committed a step or elected a leader while cut off fails the run).
With an emulated cluster (`StressConfig.hosts`: `p2pgen stress --hosts N`) every agent runs in its own host, at
the same port on every host; a joiner takes a host nobody ran on yet, else the host of a peer that left and whose
agent has exited (a new machine given a departed one's address); host cuts and zone partitions go through the hosts' own
tools (`p2pgen_lab.rigs.netns`), and their cut side is judged like a partition's minority. The cluster is made when
the run starts and removed, with every namespace and link, when it ends.
With `StressConfig.calm` the job first trains that long without faults, and the report adds the goodput of the
fault window against it (`p2pgen_lab.stress.goodput`); `fault_every` rescales the delays between faults.
Invariant kept: every process it starts is stopped by pid (the process group of each agent) before
`run` returns, whatever happened; a pid reported by an agent is signalled only while it is that
agent's child.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2pgen import faults
from p2pgen.agent import launch
from p2pgen.agent.client import AgentClient
from p2pgen.errors import P2PGenError
from p2pgen.progress import ENV as PROGRESS_ENV
from p2pgen.progress import Commit, CommitLog, write_stop
from p2pgen.raft import checker
from p2pgen_lab.rigs.agents import AgentProc, Cluster, free_control_ports
from p2pgen_lab.rigs.netns import EmulatedCluster
from p2pgen_lab.rigs.traces import read_records
from p2pgen_lab.stress import goodput, plan, verdict

FAULTS_BEGIN = "training started: faults begin"      # said when the fault phase starts (the CLI times it)
FAULTS_END = "faults end; waiting for the job to settle"

LOOP_S = 0.05
OBSERVE_EVERY_S = 1.0
HISTORY_EVERY_S = 2.0
SETTLE_OBSERVE_S = 0.5
CALM_WARMUP_S = 2.0              # of training after the first commit before the calm window is measured
STOP_MARGIN = 30                 # steps past the highest committed revision when the stop is written
EXIT_WAIT_S = 20.0
SPARE_ADDRESSES = 64             # fresh control addresses for joining peers
AGENT_ARGS = ("--max-restarts=1000000",)


@dataclass
class StressConfig:
    agents: int = 5
    duration: float = 60.0               # seconds of faults
    seed: int = 0
    command: list[str] = field(default_factory=list)   # the application (default: examples/train_spot.py)
    step_delay: float = 0.01
    start_timeout: float = 120.0         # until the first committed step
    settle_timeout: float = 60.0         # after the faults, until every live member stopped at one revision
    max_agents: int | None = None        # default agents + 2
    min_agents: int = 3
    kinds: tuple[str, ...] = ()          # only these fault kinds (empty: all of plan.KINDS)
    hosts: EmulatedCluster | None = None  # one emulated host per agent (not yet created: the run makes it)
    calm: float = 0.0                    # seconds of fault-free training measured before the faults (goodput)
    fault_every: float | None = None     # mean seconds between faults (None: DELAY_S, 1.75 s on average)
    detect: tuple[str, ...] = ()         # the agents' detector flags (empty: `p2pgen join`'s defaults)


@dataclass
class Slot:
    """A peer id at a control address and its current agent process."""

    peer: str
    addr: str
    proc: AgentProc
    state: str = "up"                    # up | stopped | down (killed, replacement due) | cut | left
    node: str | None = None              # the Raft node id of the current process (from its `show`)
    app_pid: int | None = None
    incarnation: int | None = None
    replace_at: float | None = None
    cont_at: float | None = None
    scope: str = ""                      # of the current pause


@dataclass
class Report:
    actions: list[dict[str, Any]]
    verdict: verdict.Verdict
    checker: checker.CheckResult
    failures: list[str]
    final_revisions: dict[str, int | None]
    notes: list[str]
    run_dir: Path
    goodput: goodput.Goodput | None = None

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        v = self.verdict
        return {"passed": self.passed, "failures": self.failures, "actions": self.actions,
                "violations": self.checker.counts, "checker": self.checker.to_json(),
                "max_stall_s": round(v.max_stall_s, 3), "regressions": v.regressions,
                "digest_mismatches": v.mismatches, "final_digests": v.final_digests,
                "final_revisions": self.final_revisions, "settled": v.settled, "notes": self.notes,
                "run_dir": str(self.run_dir), "goodput": self.goodput.to_json() if self.goodput else None}


class Harness:
    def __init__(self, config: StressConfig, run_dir: Path, say: Callable[[str], None]) -> None:
        self.config, self.run_dir, self._say = config, run_dir, say
        self.rng = random.Random(f"p2pgen-stress/{config.seed}")
        for sub in ("traces", "progress"):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        self.cluster = Cluster(run_dir, job=f"stress-{config.seed}", detect=config.detect, hosts=config.hosts)
        self.rules = run_dir / "faults.json"
        faults.heal(self.rules)
        self.partition: tuple[faults.Window, float] | None = None   # the open network fault, and when to heal it
        self._undo: Callable[[], None] = lambda: None                 # how to heal it
        self.hosts = config.hosts
        self._released: set[str] = set()                              # left peers whose host was freed
        self.windows: list[faults.Window] = []
        self.env = {"P2PGEN_TRACE_DIR": str(run_dir / "traces"), PROGRESS_ENV: str(run_dir / "progress"),
                    faults.ENV: str(self.rules),
                    "P2PGEN_STEPS": str(10 ** 9), "P2PGEN_STEP_DELAY": str(config.step_delay)}
        self.commits = CommitLog(run_dir / "progress")
        self.slots: dict[str, Slot] = {}
        self.free = [] if self.hosts else [f"127.0.0.1:{p}"
                                           for p in free_control_ports(config.agents + SPARE_ADDRESSES)]
        self.voters: list[tuple[str, str]] | None = None     # (node, agent addr); None: nothing observed yet
        self.history: dict[tuple, dict[str, Any]] = {}       # (generation, raft index, time) -> history entry
        self._history_turn = 0
        self.timeline = plan.Timeline()
        self.actions: list[dict[str, Any]] = []
        self.faults: list[verdict.Fault] = []
        self.notes: list[str] = []                            # what happened to the run, for the report
        self.problems: list[str] = []                         # those that fail it beyond the verdict
        self.t0 = time.time()
        self._observed_at = self._history_at = 0.0
        self._latest: dict[str, Any] | None = None           # the leader's (else the newest) `show` seen last
        self._last: dict[str, tuple[int, int, str]] = {}    # peer -> (incarnation, revision, digest) newest
        self._stop_written_at: float | None = None
        self.calm_window: tuple[float, float] | None = None  # wall times of the fault-free measurement
        self.fault_window: tuple[float, float] | None = None

    # --- the run ------------------------------------------------------------------------------------

    def run(self) -> Report:
        settled, window = False, (self.t0, self.t0)
        try:
            if self.hosts is not None:
                self.hosts.create()
                self.free = self.cluster.addresses(len(self.hosts.names))
                self.say(self.hosts.describe())
            self._start_job()
            first = self._wait_first_commit()
            if first is not None:
                self._calm()
                began = time.time()
                self._fault_loop(time.monotonic() + self.config.duration)
                self.fault_window = (began, time.time())
                settled = self._finish()
                window = (first, self._stop_written_at or time.time())
        finally:
            self._heal()
            self._record_majority()
            self.cluster.stop_all()
            if self.hosts is not None:
                self.hosts.remove()
        return self._report(settled, window)

    def _start_job(self) -> None:
        addrs = [self.free.pop(0) for _ in range(self.config.agents)]
        for i, addr in enumerate(addrs):
            self._start_agent(f"p{i}", addr, [a for a in addrs if a != addr], ("--min-members", str(len(addrs))))
        self.say(f"started {len(addrs)} agents at {', '.join(addrs)}; run directory {self.run_dir}")

    def _start_agent(self, peer: str, addr: str, peers: list[str], extra: tuple[str, ...] = ()) -> None:
        proc = self.cluster.start(peer, addr, peers, command=self.config.command, extra=(*AGENT_ARGS, *extra),
                                  env=self.env)
        self.slots[peer] = Slot(peer, addr, proc)

    def _wait_first_commit(self) -> float | None:
        deadline = time.monotonic() + self.config.start_timeout
        while time.monotonic() < deadline:
            if self._poll_commits():
                first = min(c.t for c in self.commits.commits)
                self.say(FAULTS_BEGIN)
                return first
            self._tick()
            time.sleep(LOOP_S)
        self._problem(f"no step committed within {self.config.start_timeout:.0f} s of the start")
        return None

    def _calm(self) -> None:
        """With `config.calm`: CALM_WARMUP_S of training, then `calm` seconds measured without faults."""
        if self.config.calm <= 0:
            return
        self.say(f"{self.config.calm:.0f} s without faults (the goodput's reference rate)")
        for seconds in (CALM_WARMUP_S, self.config.calm):
            began, end = time.time(), time.monotonic() + seconds
            while time.monotonic() < end:
                self._tick()
                time.sleep(LOOP_S)
        self.calm_window = (began, time.time())

    def _fault_loop(self, end: float) -> None:
        next_action = time.monotonic() + plan.next_delay(self.rng, self.config.fault_every)
        while time.monotonic() < end:
            self._tick()
            if time.monotonic() >= next_action:
                self._observe()
                action = plan.choose(self.rng, self._world(), new_peer=f"p{len(self.slots)}", kinds=self.config.kinds)
                self._execute(action)
                next_action = time.monotonic() + plan.next_delay(self.rng, self.config.fault_every)
            time.sleep(LOOP_S)

    def _tick(self) -> None:
        """Timers, agents that exited by themselves, observation and the majority timeline."""
        now = time.monotonic()
        if self.partition is not None and now >= self.partition[1]:
            self._heal()
        for slot in list(self.slots.values()):
            if slot.state == "stopped" and slot.cont_at is not None and now >= slot.cont_at:
                self._signal(slot, signal.SIGCONT)
                slot.state, slot.cont_at = "up", None
            elif slot.state == "down" and slot.replace_at is not None and now >= slot.replace_at:
                self._replace(slot)
            elif slot.state == "left" and self.hosts and not slot.proc.alive() and slot.peer not in self._released:
                self._released.add(slot.peer)
                self.free.append(slot.addr)                 # its host may take a joiner now
            elif slot.state == "up" and not slot.proc.alive() and self._stop_written_at is None:
                self._problem(f"agent {slot.peer} exited by itself (code {slot.proc.proc.returncode}); "
                              "replaced 1 s later")
                slot.state, slot.node, slot.replace_at = "down", None, now + plan.REPLACE_AFTER_S
        if now - self._observed_at >= OBSERVE_EVERY_S:
            self._observe()
        if now - self._history_at >= HISTORY_EVERY_S:
            self._poll_history()
        self._poll_commits()
        self._record_majority()

    def _poll_commits(self) -> int:
        new = self.commits.poll()
        for c in new:
            if (c.incarnation, c.revision) > self._last.get(c.peer, (-1, -1, ""))[:2]:
                self._last[c.peer] = (c.incarnation, c.revision, c.digest)
        return len(new)

    # --- observing the job ----------------------------------------------------------------------------

    def _show(self, slot: Slot) -> dict[str, Any] | None:
        try:
            with AgentClient(slot.addr, self.cluster.secret, job=self.cluster.job, timeout=1.0) as c:
                return c.show()
        except (OSError, P2PGenError):
            return None

    def _observe(self) -> None:
        """Each running agent's node id, application pid and incarnation; the voters as the leader sees them."""
        self._observed_at = time.monotonic()
        views = []
        for slot in self.slots.values():
            if slot.state != "up":
                continue
            view = self._show(slot)
            if view is None:
                continue
            slot.node, slot.app_pid = view["raft"].get("self"), view["agent"].get("app_pid")
            slot.incarnation = view["agent"].get("incarnation")
            views.append(view)
        if views:
            best = max(views, key=lambda v: (v["raft"].get("self") == v["raft"].get("leader"), v["raft"]["index"]))
            voters = best["raft"].get("voters")
            if voters is not None:
                self.voters = [(v["node"], v["agent"]) for v in voters]
            else:                        # agents that do not list voters: every Raft node votes
                self.voters = [(node, "") for node in best["raft"].get("nodes", [])]
            self._latest = best

    def _voter_counts(self) -> tuple[int, int, set[str]]:
        """(voters, voters down, peers whose current node is a voter): see `plan.voter_status`."""
        return plan.voter_status([(s.peer, s.state, s.node) for s in self.slots.values()], self.voters)

    def _record_majority(self) -> None:
        total, down, _ = self._voter_counts()
        self.timeline.sample(time.time(), plan.majority_up(total, down))

    def _world(self) -> plan.World:
        total, down, voting = self._voter_counts()
        agents = tuple(plan.Agent(s.peer, s.state == "up", s.peer in voting, s.app_pid is not None)
                       for s in self.slots.values() if s.state != "left")
        max_agents = self.config.max_agents or self.config.agents + 2
        return plan.World(agents, total, down, max_agents, self.config.min_agents, can_join=bool(self.free),
                          can_partition=self.partition is None, hosts=self.hosts is not None)

    def _poll_history(self) -> None:
        """The certificate history of one running agent, a different one each time (lineages that split
        apart each keep their own)."""
        self._history_at = time.monotonic()
        up = [s for s in self.slots.values() if s.state == "up"]
        if not up:
            return
        self._history_turn += 1
        slot = up[self._history_turn % len(up)]
        try:
            with AgentClient(slot.addr, self.cluster.secret, job=self.cluster.job, timeout=1.0) as c:
                entries = c.history()
        except (OSError, P2PGenError):
            return
        for e in entries:
            cert = e.get("certificate")
            if e["outcome"] == "activated" and cert:
                self.history.setdefault((e["generation"], cert["raft_index"], cert["activated_at"]), e)

    # --- faults ---------------------------------------------------------------------------------------

    def _execute(self, action: plan.Action) -> None:
        now = time.time()
        self.actions.append({"t": round(now - self.t0, 3), "kind": action.kind, "targets": list(action.targets),
                             "text": action.describe()})
        self.say(action.describe())
        if action.kind == "none":
            return
        self.faults.append(verdict.Fault(now, action.kind, f"[{now - self.t0:.1f} s] {action.describe()}"))
        if action.kind == "kill_app":
            self._kill_app(self.slots[action.targets[0]])
        elif action.kind == "kill_agent":
            self._kill_agent(self.slots[action.targets[0]], action.replace_after[0])
        elif action.kind == "kill_two":
            self._kill_agent(self.slots[action.targets[0]], action.replace_after[0])
            time.sleep(action.seconds)
            self._kill_agent(self.slots[action.targets[1]], action.replace_after[1])
        elif action.kind == "pause":
            slot = self.slots[action.targets[0]]
            slot.scope = action.scope
            self._signal(slot, signal.SIGSTOP)
            slot.state, slot.cont_at = "stopped", time.monotonic() + action.seconds
        elif action.kind == "join":
            live = [s.addr for s in self.slots.values() if s.state == "up"]
            self._start_agent(action.targets[0], self.free.pop(0), live)
        elif action.kind == "partition":
            self._partition(action)
        elif action.kind in plan.HOST_KINDS:
            self._host_fault(action)
        elif action.kind == "leave":
            slot = self.slots[action.targets[0]]
            slot.proc.signal(signal.SIGTERM)
            slot.state = "left"
        self._record_majority()

    def _partition(self, action: plan.Action) -> None:
        minority = [self.slots[p] for p in action.targets]
        cut = {s.addr for s in minority}
        others = sorted({s.addr for s in self.slots.values()} | set(self.free)) # joiners land on the majority side
        faults.write_partition(self.rules, [sorted(cut), [a for a in others if a not in cut]],
                               one_way=action.scope == "one_way")
        self._cut_off(minority, action, lambda: faults.heal(self.rules))

    def _host_fault(self, action: plan.Action) -> None:
        """A host cut (its link down) or a zone partition (routes between two groups of hosts black-holed)."""
        assert self.hosts is not None
        cut = [self.slots[p] for p in action.targets]
        hosts = [self.hosts.host_of(s.addr) for s in cut]
        if action.kind == "host_cut":
            self.hosts.cut(hosts[0])
            self._cut_off(cut, action, lambda: self.hosts.heal(hosts[0]))
        else:
            self.hosts.partition(hosts)           # from every other host, joiners' spare hosts included
            self._cut_off(cut, action, self.hosts.heal_partition)

    def _cut_off(self, minority: list[Slot], action: plan.Action, undo: Callable[[], None]) -> None:
        for slot in minority:
            slot.state = "cut"
        window = faults.Window(time.time(), float("inf"), frozenset(s.addr for s in minority),
                               frozenset(action.targets), action.scope == "one_way")
        self.partition, self._undo = (window, time.monotonic() + action.seconds), undo

    def _heal(self) -> None:
        if self.partition is None:
            return
        self._undo()
        window, _ = self.partition
        self.partition = None
        self.windows.append(faults.Window(window.cut, time.time(), window.agents, window.peers, window.one_way))
        for slot in self.slots.values():
            if slot.state == "cut":
                slot.state = "up"
        self.say(f"healed the network of {', '.join(sorted(window.peers))} after "
                 f"{self.windows[-1].healed - window.cut:.1f} s")

    def _kill_app(self, slot: Slot) -> None:
        pid = slot.app_pid
        if pid is None or _parent_of(pid) != slot.proc.pid:
            self.say(f"  (the application of {slot.peer} was already gone)")
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        slot.app_pid = None

    def _kill_agent(self, slot: Slot, replace_after: float) -> None:
        if slot.state == "stopped":
            self._signal(slot, signal.SIGCONT)
        launch.kill_group(slot.proc.proc)
        slot.state, slot.node, slot.app_pid, slot.cont_at = "down", None, None, None
        slot.replace_at = time.monotonic() + replace_after

    def _replace(self, slot: Slot) -> None:
        live = [s.addr for s in self.slots.values() if s.state == "up" and s.addr != slot.addr]
        if not live:
            self.notes.append(f"no live agent to replace {slot.peer} through")
            slot.state, slot.replace_at = "left", None
            return
        self.say(f"replacement agent for {slot.peer} starts at {slot.addr}")
        self._start_agent(slot.peer, slot.addr, live)

    def _signal(self, slot: Slot, sig: int) -> None:
        try:
            if slot.scope == "host":
                os.killpg(slot.proc.pid, sig)
            else:
                os.kill(slot.proc.pid, sig)
        except ProcessLookupError:
            pass

    # --- the end --------------------------------------------------------------------------------------

    def _finish(self) -> bool:
        """Let the timers run out, wait for every live agent's application to be in the active generation,
        then stop every application at one revision. True when they all got there in time."""
        self.say(FAULTS_END)
        deadline = time.monotonic() + self.config.settle_timeout
        settled_views = 0
        while time.monotonic() < deadline:
            self._tick()
            if time.monotonic() - self._observed_at >= SETTLE_OBSERVE_S:
                self._observe()
                settled_views = settled_views + 1 if self._settled() else 0
                if settled_views >= 2:       # two fresh views in a row: no fault of the last seconds still unseen
                    break
            time.sleep(LOOP_S)
        else:
            self.notes.append(f"the job did not settle within {self.config.settle_timeout:.0f} s after the faults")
            self.say(self.notes[-1])
            return False
        stop = max(c.revision for c in self.commits.commits) + STOP_MARGIN
        write_stop(self.run_dir / "progress", stop)
        self._stop_written_at = time.time()
        self.say(f"settled: every application stops at revision {stop}")
        live = [s for s in self.slots.values() if s.state == "up"]
        deadline = time.monotonic() + self.config.settle_timeout
        while time.monotonic() < deadline and not all(self._final(s.peer)[0] == stop for s in live):
            self._poll_commits()
            time.sleep(LOOP_S)
        exit_by = time.monotonic() + EXIT_WAIT_S
        while any(s.proc.alive() for s in live) and time.monotonic() < exit_by:
            time.sleep(LOOP_S)
        reached = all(self._final(s.peer)[0] == stop for s in live)
        if not reached:
            self.notes.append(f"not every live member reached revision {stop}")
        return reached

    def _settled(self) -> bool:
        """No agent down or stopped, no pending proposal, every live agent's member in the active generation."""
        if any(s.state in ("down", "stopped", "cut") for s in self.slots.values()):
            return False
        view = self._latest
        if view is None or view["state"]["pending"] is not None or view["state"]["active"] is None:
            return False
        active = {(m["peer_id"], m["incarnation"]) for m in view["state"]["active"]["members"]}
        live = [s for s in self.slots.values() if s.state == "up"]
        return bool(live) and all(s.incarnation is not None and (s.peer, s.incarnation) in active for s in live)

    def _final(self, peer: str) -> tuple[int | None, str | None]:
        """The last (revision, digest) the newest incarnation of `peer` committed."""
        if peer not in self._last:
            return None, None
        _, revision, digest = self._last[peer]
        return revision, digest

    # --- the verdict ----------------------------------------------------------------------------------

    def _report(self, settled: bool, window: tuple[float, float]) -> Report:
        self._poll_commits()
        commits = sorted(self.commits.commits, key=lambda c: c.t)
        traces = checker.load(self.run_dir / "traces")
        result = checker.check(traces)
        activated = [verdict.Activated(a.generation, a.revision, a.t, a.regressed_from)
                     for a in checker.activations(traces)] or [
            verdict.Activated(g, e["certificate"]["frontier"]["revision"], at, e["certificate"].get("regressed_from"))
            for (g, _, at), e in sorted(self.history.items())]
        stall, stall_at = verdict.max_stall([c.t for c in commits], self.timeline.close(time.time()), *window)
        live = [s.peer for s in self.slots.values() if s.state == "up"]
        finals = {p: self._final(p) for p in live}
        regressions = verdict.regressions(activated, commits)
        v = verdict.Verdict(result.counts, result.evidence, verdict.recoveries(self.faults, commits), stall,
                            stall_at, regressions, verdict.digest_mismatches(commits, regressions),
                            {p: d for p, (_, d) in finals.items()}, settled)
        for action, latency in zip([a for a in self.actions if a["kind"] != "none"], v.recovery):
            action["recovery_s"] = None if latency is None else round(latency, 3)
        leaders = [(r["t"], r["agent"]) for r in traces.of("leader")]
        failures = v.failures(self.faults) + self.problems + faults.minority_violations(
            self.windows, [(c.t, c.peer) for c in commits], leaders)
        return Report(self.actions, v, result, failures, {p: r for p, (r, _) in finals.items()}, self.notes,
                      self.run_dir, self._goodput(commits, traces.records))

    def _goodput(self, commits: list[Commit], raft: list[dict[str, Any]]) -> goodput.Goodput | None:
        """With a calm window: the goodput of the fault window against it, and its lost time by fault kind."""
        if self.calm_window is None or self.fault_window is None:
            return None
        at = [goodput.FaultAt(a["t"] + self.t0, a["kind"], tuple(a["targets"]))
              for a in self.actions if a["kind"] != "none"]
        try:
            return goodput.measure(commits, at, self.calm_window, self.fault_window,
                                   read_records(self.run_dir / "traces"), raft)
        except ValueError as e:
            self._problem(f"no goodput: {e}")
            return None

    def _problem(self, text: str) -> None:
        self.problems.append(text)
        self.notes.append(text)
        self.say(text)

    def say(self, text: str) -> None:
        self._say(f"[{time.time() - self.t0:7.1f} s] {text}")


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def default_command() -> list[str]:
    example = Path(__file__).resolve().parents[2] / "examples" / "train_spot.py"
    return [sys.executable, str(example)]


def run(config: StressConfig, run_dir: Path, say: Callable[[str], None] = print) -> Report:
    if not config.command:
        config.command = default_command()
        if not Path(config.command[1]).exists():
            raise P2PGenError(f"{config.command[1]} not found: pass the application with --app")
    return Harness(config, run_dir, say).run()

"""One schedule under one policy on real processes: 4 agents (`p2pgen join`) supervising `p2pgen_lab.chaos.app`.

Owns: the run directory (config, logs, markers, requests, the agents' Raft traces), the agent processes
of the run and everything the applications ask of the harness: replacing an agent that was SIGKILLed (a
lost host coming back under the same peer id, at the same address: REPLACE_AFTER_S later, or
REPLACE_FAST_S later when the application marked it in RUN_DIR/fast/ before killing it), starting a new
peer for a `join` request (scale-up), and the map from agent address to pid that `kill_leader` and
`kill_two_agents` read. It also polls the job's certificate history (`p2pgen history --json`) while the
job runs, since the last agent leaves with it. Every agent runs with `P2PGEN_TRACE_DIR=RUN_DIR/traces`
(the input of `p2pgen.raft.checker`) and `P2PGEN_FAULTS=RUN_DIR/faults.json`: a partition an application asks
for (RUN_DIR/requests/partition-*) is written there at once and healed when its `heal_s` is over (or when the
run ends); `windows` records each one for `partition_findings`.
An agent still up END_GRACE_S after a member finished at the fixed end is stopped (and noted): its application
lost its membership while the others were finishing, and with every other agent gone no quorum is left to
register with, so it could only wait until the timeout (a stall of the harness, not of the job).
A run that stalls leaves what each live agent's `show` said at the timeout in RUN_DIR/stalled-<peer>.json.
Invariant kept: every process it starts is stopped by pid (process group of each agent) before `run`
returns, whatever happened.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2pgen import faults
from p2pgen.agent import launch
from p2pgen.agent.client import AgentClient
from p2pgen.errors import P2PGenError
from p2pgen.raft import checker as raft_checker
from p2pgen_lab.chaos.schedule import Schedule
from p2pgen_lab.rigs.agents import RESTART_ALL_AGENT_ARGS, AgentProc, Cluster, free_control_ports

REPLACE_AFTER_S = 1.0
REPLACE_FAST_S = 0.2             # inside the detection timeout: the dead agent is not even suspected yet
POLL_S = 0.05
HISTORY_EVERY_S = 0.5
FINISH_MARGIN = 25
END_GRACE_S = 20.0
DETECT = ("--attach-grace=0", "--detector=fixed", "--detect-timeout=1.0", "--detect-floor=0.3",
          "--heartbeat-interval=0.1")
AGENT_ARGS = ("--attach-grace=30", "--max-restarts=200")


@dataclass(frozen=True)
class RunConfig:
    step_delay: float = 0.02
    pause_short: float = 0.3       # below the detector's 1.0 s timeout
    pause_long: float = 2.0        # above it
    timeout: float = 120.0         # a run not finished by then is reported as stalled
    sharded: bool = False          # the mini-training also keeps a sharded object (certified only)


@dataclass
class RunResult:
    policy: str
    schedule: Schedule
    run_dir: Path
    events: list[dict[str, Any]]
    history: list[dict[str, Any]]
    stalled: bool
    started: float
    ended: float
    harness: list[str] = field(default_factory=list)
    windows: list[faults.Window] = field(default_factory=list)     # the partitions, as they happened


def run(schedule: Schedule, policy: str, run_dir: Path, config: RunConfig = RunConfig()) -> RunResult:
    for sub in ("logs", "fired", "requests", "pids", "snapshots", "traces", "fast", "stale", "reuse", "ranks"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps({
        "policy": policy, "steps": schedule.steps, "step_delay": config.step_delay, "sharded": config.sharded,
        "pause_short": config.pause_short, "pause_long": config.pause_long,
        "injections": schedule.to_json()["injections"]}))
    harness = _Harness(schedule, policy, run_dir)
    started = time.time()
    try:
        stalled = not harness.drive(config.timeout)
    finally:
        harness.heal()
        harness.cluster.stop_all()
    return RunResult(policy, schedule, run_dir, read_events(run_dir / "logs"), harness.history, stalled, started,
                     time.time(), harness.notes, harness.windows)


def partition_findings(result: RunResult) -> list[str]:
    """Evidence that a partitioned minority made progress alone (`faults.minority_violations`): a step it applied,
    or a Raft leader on one of its agents, while it was cut off."""
    if not result.windows:
        return []
    commits = [(e["t"], e["peer"]) for e in result.events if e["event"] == "apply"]
    leaders = [(r["t"], r["agent"]) for r in raft_checker.load(result.run_dir / "traces").of("leader")]
    return faults.minority_violations(result.windows, commits, leaders)


def read_events(log_dir: Path) -> list[dict[str, Any]]:
    events = []
    for path in sorted(log_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.endswith("}"):               # a line cut by SIGKILL mid-write is not an event
                events.append(json.loads(line))
    return sorted(events, key=lambda e: e["t"])


class _Harness:
    def __init__(self, schedule: Schedule, policy: str, run_dir: Path) -> None:
        self.run_dir, self.steps = run_dir, schedule.steps
        joins = sum(1 for i in schedule.injections if i.kind == "join")
        self.free = [f"127.0.0.1:{p}" for p in free_control_ports(schedule.members + joins)]
        self.cluster = Cluster(run_dir, job=f"chaos-{policy}-{schedule.index}", detect=DETECT)
        self.agent_args = AGENT_ARGS + (RESTART_ALL_AGENT_ARGS if policy == "restart-all" else ())
        self.command = [sys.executable, "-m", "p2pgen_lab.chaos.app", str(run_dir)]
        self.history: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.replacing: dict[str, float] = {}
        self.rules = run_dir / "faults.json"
        faults.heal(self.rules)
        self.partition: tuple[faults.Window, float] | None = None    # the open partition and when to heal it
        self.windows: list[faults.Window] = []
        self.joined = 0
        self._history_at = 0.0
        self.finished_at: float | None = None        # when a member was first seen to have finished
        self.stopped: set[str] = set()               # stragglers stopped after the end (never replaced)
        members = [self.free.pop(0) for _ in range(schedule.members)]
        for i, addr in enumerate(members):
            self._start(f"p{i}", addr, [a for a in members if a != addr], ("--min-members", str(len(members))))

    def _start(self, peer_id: str, addr: str, peers: list[str], extra: tuple[str, ...] = ()) -> AgentProc:
        agent = self.cluster.start(peer_id, addr, peers, command=self.command, extra=(*self.agent_args, *extra),
                                   env={"P2PGEN_TRACE_DIR": str(self.run_dir / "traces"),
                                        faults.ENV: str(self.rules)})
        pids = {a.addr: a.pid for a in self.cluster.agents.values() if a.alive()}
        tmp = self.run_dir / "agents.json.tmp"
        tmp.write_text(json.dumps(pids))
        os.replace(tmp, self.run_dir / "agents.json")
        return agent

    def drive(self, timeout: float) -> bool:
        """Serve the run until every agent has left; False if that did not happen within `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._poll_history()
            self._serve_joins()
            self._serve_partitions()
            self._replace_killed_agents()
            self._allow_finish_when_settled()
            self._stop_stragglers()
            if not self.replacing and not any(a.alive() for a in self.cluster.agents.values()):
                return True
            time.sleep(POLL_S)
        self.notes.append(f"stalled: not finished within {timeout:.0f} s")
        self._keep_views()
        return False

    def _keep_views(self) -> None:
        """A stalled run: write what every live agent's `show` says now to RUN_DIR/stalled-<peer>.json (the pending
        generation, its votes and hold, the Raft view), since nothing else records what the job waits for."""
        for peer_id, agent in self.cluster.agents.items():
            if not agent.alive():
                continue
            try:
                with AgentClient(agent.addr, self.cluster.secret, job=self.cluster.job, timeout=2.0) as c:
                    shown = c.show()
            except (OSError, P2PGenError) as e:
                shown = {"error": str(e)}
            (self.run_dir / f"stalled-{peer_id}.json").write_text(json.dumps(shown, indent=1))

    def _allow_finish_when_settled(self) -> None:
        """Once some member reached the schedule's last step and every live agent's newest application
        is in the newest generation, write the revision the run ends at into RUN_DIR/finish (atomically):
        FINISH_MARGIN steps past the highest revision logged, so that no member has passed it yet."""
        finish = self.run_dir / "finish"
        if finish.exists() or self.replacing or self.partition or any((self.run_dir / "requests").iterdir()):
            return
        live = {a.peer_id for a in self.cluster.agents.values() if a.alive()}
        newest: dict[str, int] = {}
        generation, members, revision = 0, set(), 0
        for path in (self.run_dir / "logs").glob("*.jsonl"):
            peer, inc = path.stem.rsplit("-", 1)
            newest[peer] = max(newest.get(peer, 0), int(inc))
            for line in path.read_text().splitlines():
                if '"apply"' in line and line.endswith("}"):
                    revision = max(revision, json.loads(line)["revision"] + 1)
                elif '"activate"' in line and line.endswith("}"):
                    e = json.loads(line)
                    if e["generation"] > generation:
                        generation, members = e["generation"], {tuple(m) for m in e["members"]}
        if revision >= self.steps and live and live <= set(newest) and {(p, newest[p]) for p in live} <= members:
            tmp = self.run_dir / "finish.tmp"
            tmp.write_text(str(revision + FINISH_MARGIN))
            os.replace(tmp, finish)

    def _stop_stragglers(self) -> None:
        """END_GRACE_S after a member finished at the fixed end, stop the agents still up (see the module doc)."""
        if not (self.run_dir / "finish").exists():
            return
        now = time.monotonic()
        if self.finished_at is None:
            if any('"final"' in p.read_text() for p in (self.run_dir / "logs").glob("*.jsonl")):
                self.finished_at = now
            return
        if now - self.finished_at < END_GRACE_S:
            return
        for peer_id, agent in self.cluster.agents.items():
            if agent.alive():
                self.stopped.add(peer_id)
                self.notes.append(f"stopped {peer_id}: still up {END_GRACE_S:.0f} s after a member finished")
                launch.kill_group(agent.proc, wait_s=10)

    def _live_addrs(self) -> list[str]:
        return [a.addr for a in self.cluster.agents.values() if a.alive()]

    def _serve_joins(self) -> None:
        for request in sorted((self.run_dir / "requests").glob("join-*")):
            request.unlink()
            live = self._live_addrs()
            if (self.run_dir / "finish").exists():     # the end is fixed: a joiner would find no job left
                self.notes.append(f"scale-up after the end was fixed: not started ({request.name})")
                continue
            if not live or not self.free:
                continue
            peer_id = f"p{len(self.cluster.agents)}"
            self.notes.append(f"scale-up: {peer_id} ({request.name})")
            self._start(peer_id, self.free.pop(0), live)

    def _serve_partitions(self) -> None:
        """Cut what an application asked for (one partition at a time: a request while one is open is dropped,
        and noted), and heal the open one when it is due."""
        if self.partition is not None and time.monotonic() >= self.partition[1]:
            self.heal()
        for request in sorted(p for p in (self.run_dir / "requests").glob("partition-*") if p.suffix != ".tmp"):
            asked = json.loads(request.read_text())
            request.unlink()
            if self.partition is not None or (self.run_dir / "finish").exists():
                self.notes.append(f"partition not made (one is open, or the end is fixed): {request.name}")
                continue
            minority = set(asked["minority"])
            everyone = {a.addr for a in self.cluster.agents.values()} | set(self.free)
            faults.write_partition(self.rules, [sorted(minority), sorted(everyone - minority)], asked["one_way"])
            peers = frozenset(a.peer_id for a in self.cluster.agents.values() if a.addr in minority)
            self.partition = (faults.Window(time.time(), float("inf"), frozenset(minority), peers, asked["one_way"]),
                              time.monotonic() + asked["heal_s"])
            self.notes.append(f"partition: {', '.join(sorted(peers))} cut off "
                              f"{'one way' if asked['one_way'] else 'both ways'} for {asked['heal_s']:.1f} s")

    def heal(self) -> None:
        if self.partition is None:
            return
        faults.heal(self.rules)
        w, _ = self.partition
        self.partition = None
        self.windows.append(faults.Window(w.cut, time.time(), w.agents, w.peers, w.one_way))

    def _replace_killed_agents(self) -> None:
        now = time.monotonic()
        for peer_id, agent in list(self.cluster.agents.items()):
            if agent.alive() or peer_id in self.replacing or peer_id in self.stopped:
                continue
            if agent.proc.returncode == -signal.SIGKILL:
                fast = self.run_dir / "fast" / peer_id
                self.replacing[peer_id] = now + (REPLACE_FAST_S if fast.exists() else REPLACE_AFTER_S)
                fast.unlink(missing_ok=True)
        for peer_id, due in list(self.replacing.items()):
            live = [a for a in self._live_addrs() if a != self.cluster.agents[peer_id].addr]
            if now >= due and live:
                del self.replacing[peer_id]
                self.notes.append(f"replaced agent {peer_id}")
                self._start(peer_id, self.cluster.agents[peer_id].addr, live)
            elif now >= due:
                del self.replacing[peer_id]       # nobody left to join through: the job is over

    def _poll_history(self) -> None:
        if time.monotonic() - self._history_at < HISTORY_EVERY_S:
            return
        self._history_at = time.monotonic()
        for addr in self._live_addrs():
            try:
                with AgentClient(addr, self.cluster.secret, job=self.cluster.job, timeout=1.0) as c:
                    history = c.history()
            except (OSError, P2PGenError):
                continue
            if len(history) >= len(self.history):
                self.history = history
            return

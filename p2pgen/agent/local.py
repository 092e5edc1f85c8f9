"""`p2pgen join --local N [--chaos N]`: a whole job on 127.0.0.1, for the demo and for trying faults.

Owns: N agent processes with symmetric configuration (each given the others as peers), the relay of
their output (and their applications') line by line, prefixed with the peer, so that no two lines are
ever glued; the printing of each generation as it is decided and of each recovery; the carrying out of an
optional seeded fault schedule (SIGKILL of an application, which its agent restarts, or of a whole agent, which
is replaced by a fresh agent under the same peer id, as a spot instance would be), which
`p2pgen.agent.faultplan.LocalPlan` decides from what this module observes of the agents; the final summary of
the applications' own reports; and an exit code that tells the truth (non-zero, naming the members, when
an agent failed or the final digests differ). Agents are started and killed through `p2pgen.agent.launch`, the
launcher the lab's harnesses use too.
Invariants kept: every process it starts it stops, by pid, before returning (Ctrl-C and SIGTERM
included, within STOP_DEADLINE_S), and it removes its work folder; an agent dies with the runner even
when the runner is SIGKILLed (PR_SET_PDEATHSIG); a whole host is killed only while every Raft voter is a
live agent, so no fault can cost the job its Raft quorum, and at most MAX_FAULTS_IN_FLIGHT faults are
unrecovered at a time.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import IO

from p2pgen.agent import launch
from p2pgen.agent.agent import PORTS_PER_AGENT
from p2pgen.agent.faultplan import APPLICATION, HOST, MAX_FAULTS_IN_FLIGHT, LocalPlan, all_voters_live
from p2pgen.agent.supervisor import stop_on_sigterm
from p2pgen.auth import read_secret_file
from p2pgen.errors import P2PGenError
from p2pgen.progress import ENV as PROGRESS_ENV
from p2pgen.progress import CommitLog

AGENT_REPLACEMENT_DELAY_S = 1.0
STOP_DEADLINE_S = 4.0          # SIGTERM to every agent, then SIGKILL of what is left (within 5 s in all)
LINGER_AFTER_DONE_S = 10.0     # how long agents with no job left may wait once another agent ended
STDERR_TAIL = 12               # lines of each agent's stderr kept for the failure report
# N applications on one host, each with an OpenMP / BLAS pool of every core, oversubscribe it: on 2 cores, 3
# numpy step-loop members with a 20 ms step took a median 115-137 ms per step, 22 ms with one thread each.
# torchrun sets the same default when it starts several processes per node.
THREADS_PER_APP = "1"
def _now() -> str:
    return datetime.now().strftime("%H:%M:%S.%f")[:-3]


class _Relay:
    """Copies one agent process's stdout and stderr (its application's included) to ours, whole lines only,
    each prefixed with the peer, and keeps the last lines of its stderr for a failure report."""

    lock = threading.Lock()

    def __init__(self, proc: subprocess.Popen, prefix: str) -> None:
        self.tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
        self._threads = [threading.Thread(target=self._pump, args=(proc.stdout, sys.stdout, None), daemon=True),
                         threading.Thread(target=self._pump, args=(proc.stderr, sys.stderr, self.tail), daemon=True)]
        self._prefix = prefix
        for t in self._threads:
            t.start()

    def _pump(self, source: IO[bytes], sink: IO[str], tail: collections.deque[str] | None) -> None:
        for raw in iter(source.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            if tail is not None:
                tail.append(line)
            with _Relay.lock:
                try:
                    sink.write(f"{self._prefix}{line}\n")
                    sink.flush()
                except (OSError, ValueError):       # our own output is gone (closed pipe): keep draining
                    pass
        source.close()

    def join(self, timeout: float) -> None:
        for t in self._threads:
            t.join(timeout)


@dataclass
class _Fault:
    kind: str                   # "application" or "host"
    peer: int
    incarnation: int | None     # the member's incarnation when it was killed
    revision: int               # the job's revision when it was killed
    at: float                   # time.time()
    recovered_after: float | None = None


class LocalJob:
    def __init__(self, n: int, job: str, base_port: int, agent_args: list[str], command: list[str] | None,
                 secret_file: str | None, chaos: float | None = None, seed: int = 0, steps: int | None = None,
                 step_delay: float | None = None, http: tuple[int, str] | None = None) -> None:
        self.n, self.job, self.command, self.chaos, self.steps = n, job, command, chaos, steps
        self.step_delay = step_delay
        self.http = http                                # (first port, bind address) of the status pages
        self.addrs = [f"127.0.0.1:{base_port + PORTS_PER_AGENT * i}" for i in range(n)]
        self.workdir = tempfile.mkdtemp(prefix="p2pgen-local-")
        self.summary_dir = os.path.join(self.workdir, "summaries")
        self.progress_dir = os.path.join(self.workdir, "progress")
        os.makedirs(self.summary_dir)
        os.makedirs(self.progress_dir)
        self.secret_file = secret_file or self._new_secret()
        self.secret = read_secret_file(self.secret_file)
        self.agent_args = agent_args + [f"--secret-file={self.secret_file}"]
        self.plan = LocalPlan(chaos, seed, n, bool(command), steps)
        self.agents: dict[int, subprocess.Popen] = {}
        self.relays: dict[int, _Relay] = {}
        self.started: list[tuple[int, subprocess.Popen, _Relay]] = []
        self.chaos_killed: set[int] = set()           # pids of agents the chaos schedule killed
        self.failures: list[tuple[int, int, list[str]]] = []    # (peer index, exit code, stderr tail)
        self.reaped: set[int] = set()
        self.finished_at: float | None = None          # when an agent last ended on its own
        self.stalled_since: float | None = None        # since when every agent left has had no job
        self.lingering: set[int] = set()               # pids of agents stopped for outliving the job
        self.replacements: list[tuple[float, int]] = []      # (due time, agent index)
        self.faults: list[_Fault] = []
        self.seen_generation = 0
        self.commits = CommitLog(self.progress_dir)
        self.revision = 0
        self._voter_count = 0                          # voters when the job was first whole
        self._next_fault: float | None = None          # a revision (counted in steps) or a monotonic time

    @property
    def counts_steps(self) -> bool:
        """With --steps and a COMMAND, --chaos is a mean number of committed steps between faults."""
        return self.plan.counts_steps

    def _new_secret(self) -> str:
        path = os.path.join(self.workdir, "secret")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(secrets.token_hex(32))
        return path

    def run(self) -> int:
        stop_on_sigterm()                              # SIGTERM stops the agents like Ctrl-C does
        try:
            for i in range(self.n):
                self._start_agent(i, initial=True)
            print(f"started {self.n} agents of job {self.job!r} at {', '.join(self.addrs)}; Ctrl-C stops them\n"
                  f"inspect with: p2pgen show --peer {self.addrs[0]} --secret-file {self.secret_file}", flush=True)
            if "OMP_NUM_THREADS" not in os.environ:
                print(f"OMP_NUM_THREADS={THREADS_PER_APP} for every application ({self.n} on one host, as torchrun "
                      "sets it); set OMP_NUM_THREADS to choose another value", flush=True)
            if self.http is not None:
                print(f"status pages: http://{self.http[1]}:{self.http[0]}/ (one per agent, ports "
                      f"{self.http[0]}..{self.http[0] + self.n - 1})", flush=True)
            self._describe_chaos()
            self._next_fault = self.plan.due_after(0, time.monotonic())
            while self._running():
                self._print_new_generations()
                self._reap()
                self._maybe_inject()
                self._replace_due_agents(time.monotonic())
                self._stop_lingering()
                time.sleep(0.2)
            self._reap()
            self._print_new_generations()
            for _, _, relay in self.started:
                relay.join(1.0)
            return self._print_summary()
        except KeyboardInterrupt:
            print("\nstopping the agents", flush=True)
            return 130
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)   # a second SIGTERM must not cut the stopping short
            self._stop_all()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            shutil.rmtree(self.workdir, ignore_errors=True)     # secret, summaries, progress reports

    # --- agents --------------------------------------------------------------------------------------

    def _start_agent(self, i: int, initial: bool) -> None:
        addr = self.addrs[i]
        options = [*self.agent_args, *(["--min-members", str(self.n)] if initial else [])]
        if self.http is not None:
            options += [f"--http={self.http[0] + i}", f"--http-bind={self.http[1]}"]
        cmd = launch.join_command(self.job, f"peer{i}", addr, [a for a in self.addrs if a != addr], options,
                                  self.command)
        env = {**os.environ, "P2PGEN_SUMMARY_DIR": self.summary_dir, PROGRESS_ENV: self.progress_dir}
        env.setdefault("OMP_NUM_THREADS", THREADS_PER_APP)
        if self.steps is not None:
            env["P2PGEN_STEPS"] = str(self.steps)
        if self.step_delay is not None:
            env["P2PGEN_STEP_DELAY"] = str(self.step_delay)
        proc = launch.spawn(cmd, subprocess.PIPE, subprocess.PIPE, env=env,   # Ctrl-C reaches only this process
                            death_signal=signal.SIGTERM)                       # a graceful leave
        relay = _Relay(proc, f"[peer{i}] ")
        self.agents[i] = proc
        self.relays[i] = relay
        self.started.append((i, proc, relay))

    def _running(self) -> bool:
        return any(p.poll() is None for p in self.agents.values()) or bool(self.replacements)

    def _reap(self) -> None:
        """Note every agent that ended on its own with a non-zero code (the chaos schedule's kills aside)."""
        for i, proc, relay in self.started:
            if proc.pid in self.reaped or proc.poll() is None:
                continue
            self.reaped.add(proc.pid)
            if proc.pid not in self.chaos_killed and proc.pid not in self.lingering:
                self.finished_at = time.monotonic()      # it ended on its own: the job may be over
            if proc.returncode != 0 and proc.pid not in self.chaos_killed:
                relay.join(1.0)
                self.failures.append((i, proc.returncode, list(relay.tail)))

    def _stop_lingering(self) -> None:
        """Once an agent ended on its own (its application finished, or failed for good), the agents still
        running that have no job left (each one waiting for members that have all gone: `show` says so, or
        cannot answer) for LINGER_AFTER_DONE_S are stopped, gracefully. Agents still training are left alone."""
        if self.finished_at is None:
            return
        now = time.monotonic()
        live = {i: p for i, p in self.agents.items() if p.poll() is None and p.pid not in self.lingering}
        if not live or any(not self._stalled(i) for i in live):
            self.stalled_since = None
            return
        self.stalled_since = self.stalled_since or now
        if now - max(self.stalled_since, self.finished_at) < LINGER_AFTER_DONE_S:
            return
        for i, proc in live.items():
            self.lingering.add(proc.pid)
            self._print(f"peer{i}'s agent has had no job to rejoin for {LINGER_AFTER_DONE_S:.0f} s since the others "
                        f"ended: stopping it")
            proc.send_signal(signal.SIGTERM)

    def _stalled(self, i: int) -> bool:
        try:
            with self._client(self.addrs[i]) as c:
                return bool(c.show()["agent"]["waiting"])
        except (OSError, P2PGenError):
            return True

    def _stop_all(self) -> None:
        """SIGTERM every agent still running (each leaves gracefully), then SIGKILL the process group (agent
        and application) of any agent still there after STOP_DEADLINE_S."""
        live = [(i, p) for i, p, _ in self.started if p.poll() is None]
        for _, proc in live:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_DEADLINE_S
        for i, proc in live:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"peer{i}'s agent (pid {proc.pid}) did not leave within {STOP_DEADLINE_S:.0f} s: killed",
                      file=sys.stderr, flush=True)
                launch.kill_group(proc)
        for _, _, relay in self.started:
            relay.join(1.0)

    # --- chaos ---------------------------------------------------------------------------------------

    def _describe_chaos(self) -> None:
        if not self.chaos:
            return
        unit = "committed steps" if self.counts_steps else "seconds"
        print(f"chaos: a fault every {self.chaos:g} {unit} on average (seed-determined), at most "
              f"{MAX_FAULTS_IN_FLIGHT} unrecovered at a time"
              + (f", none after step {self.plan.last_fault_revision()}" if self.counts_steps else ""), flush=True)

    def _poll_revision(self) -> None:
        for commit in self.commits.poll():
            self.revision = max(self.revision, commit.revision)

    def _maybe_inject(self) -> None:
        if self._next_fault is None:
            return
        self._poll_revision()
        if self.counts_steps:
            if self.revision < self._next_fault:
                return
            if self.revision > self.plan.last_fault_revision():
                self._next_fault = None
                return
        elif time.monotonic() < self._next_fault or self._training_done():
            return
        kind = self.plan.kind()
        target = self._target(kind)
        if target is None:
            return
        self.plan.injected()
        self._inject(kind, *target)
        self._next_fault = self.plan.due_after(self.revision, time.monotonic())

    def _training_done(self) -> bool:
        return bool(glob.glob(os.path.join(self.summary_dir, "*.json")))

    def _target(self, kind: str) -> tuple[int, dict] | None:
        """A peer to fault now, with its agent's `show`, or None while the plan finds the fault unsafe (see
        `LocalPlan.target`): the facts it decides on are the agents' `show` views, which agents run, and the
        voters when the job first formed."""
        recovering = {f.peer for f in self.faults if f.recovered_after is None}
        if not self.plan.may_fault(recovering):
            return None
        views: dict[int, dict] = {}
        for i, proc in self.agents.items():
            if proc.poll() is not None:
                continue
            try:
                with self._client(self.addrs[i]) as c:
                    views[i] = c.show()
            except (OSError, P2PGenError):
                continue
        if not views:
            return None
        self._note_voters(views)
        active = next(iter(views.values()))["state"]["active"]
        in_active = {m["peer_id"] for m in active["members"]} if active else set()
        candidates = {i: bool(v["agent"]["app_pid"]) for i, v in views.items() if f"peer{i}" in in_active}
        i = self.plan.target(kind, candidates, recovering, kind == HOST and self._raft_whole(views))
        return None if i is None else (i, views[i])

    def _note_voters(self, views: dict[int, dict]) -> None:
        if len(views) == self.n and not self.replacements:
            self._voter_count = max(self._voter_count, len(next(iter(views.values()))["raft"]["voters"]))

    def _raft_whole(self, views: dict[int, dict]) -> bool:
        if self.replacements or len(views) < len(self.agents) or \
                any(p.poll() is not None for p in self.agents.values()):
            return False
        live_nodes = {v["raft"]["self"] for v in views.values()}
        voters = [v["node"] for v in next(iter(views.values()))["raft"]["voters"]]
        return all_voters_live(voters, live_nodes, self._voter_count)

    def _inject(self, kind: str, i: int, view: dict) -> None:
        agent = view["agent"]
        fault = _Fault(kind, i, agent["incarnation"], self.revision, time.time())
        if kind == APPLICATION:
            pid = agent["app_pid"]
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:      # it exited (or was restarted) since we asked its agent
                return
            self._print(f"chaos: SIGKILL application of peer{i} (pid {pid}) at revision {self.revision}; "
                        f"its agent restarts it")
        else:
            proc = self.agents[i]
            self.chaos_killed.add(proc.pid)
            launch.kill_group(proc)
            self.replacements.append((time.monotonic() + AGENT_REPLACEMENT_DELAY_S, i))
            self._print(f"chaos: SIGKILL agent peer{i} and its application at revision {self.revision} "
                        f"(a lost spot instance); a new agent replaces it in {AGENT_REPLACEMENT_DELAY_S:.0f} s")
        self.faults.append(fault)

    def _replace_due_agents(self, now: float) -> None:
        if self.finished_at is not None:        # the job is ending: a replacement would find nobody to join
            self.replacements.clear()
            return
        for due, i in list(self.replacements):
            if now >= due:
                self.replacements.remove((due, i))
                self._start_agent(i, initial=False)

    def _print(self, text: str, at: float | None = None) -> None:
        when = datetime.fromtimestamp(at).strftime("%H:%M:%S.%f")[:-3] if at else _now()
        with _Relay.lock:
            print(f"[{when}] {text}", flush=True)

    # --- observation ---------------------------------------------------------------------------------

    def _client(self, addr: str):
        from p2pgen.agent.client import AgentClient
        return AgentClient(addr, self.secret, timeout=2.0)

    def _print_new_generations(self) -> None:
        for i, proc in self.agents.items():
            if proc.poll() is not None:
                continue
            try:
                with self._client(self.addrs[i]) as client:
                    history = client.history()
            except (OSError, P2PGenError):
                continue
            for entry in history:
                if entry["generation"] > self.seen_generation:
                    self.seen_generation = entry["generation"]
                    self._print_generation(entry)
            return

    def _print_generation(self, entry: dict) -> None:
        members = " ".join(f"{m['peer_id']}#{m['incarnation']}" for m in entry["members"])
        self._print(f"generation {entry['generation']} {entry['outcome']}: [{members}] — {entry['reason']}",
                    entry["at"])
        if entry["certificate"] and entry["certificate"].get("recovery"):
            self._print(f"  {entry['certificate']['recovery']}", entry["at"])
        if entry["outcome"] != "activated":
            return
        back = {m["peer_id"]: m["incarnation"] for m in entry["members"]}
        for fault in self.faults:
            incarnation = back.get(f"peer{fault.peer}")
            if fault.recovered_after is None and incarnation is not None and \
                    (fault.incarnation is None or incarnation > fault.incarnation):
                fault.recovered_after = entry["at"] - fault.at
                self._print(f"recovered: peer{fault.peer} is back as peer{fault.peer}#{incarnation} in generation "
                            f"{entry['generation']}, {fault.recovered_after:.1f} s after its {fault.kind} was "
                            f"killed", entry["at"])

    # --- the end -------------------------------------------------------------------------------------

    def _print_summary(self) -> int:
        """The applications' reports, the faults and their recoveries; returns the exit code."""
        reports = []
        for path in sorted(glob.glob(os.path.join(self.summary_dir, "*.json"))):
            with open(path) as f:
                reports.append(json.load(f))
        identical = True
        if reports:
            identical = self._print_reports(reports)
        if self.faults:
            self._print_faults()
        for i, code, tail in self.failures:
            print(f"FAILED: peer{i}'s agent exited with code {code}; the last lines of its stderr:", file=sys.stderr)
            for line in tail:
                print(f"  [peer{i}] {line}", file=sys.stderr)
        sys.stderr.flush()
        if self.failures:
            print(f"p2pgen join --local: {len(self.failures)} agent(s) failed: "
                  f"{', '.join(f'peer{i}' for i, _, _ in self.failures)}", file=sys.stderr, flush=True)
        return 1 if self.failures or not identical else 0

    def _print_reports(self, reports: list[dict]) -> bool:
        print(f"\nsummary: {len(self.faults)} fault(s) injected, {self.seen_generation} generation number(s) used")
        rows = [["peer", "incarnation", "revision", "generations", "committed", "discarded", "s between gens",
                 "final digest"]]
        for r in reports:
            rows.append([r["peer"], str(r["incarnation"]), str(r["revision"]), str(r["generations"]),
                         str(r["steps_committed"]), str(r["steps_discarded"]), f"{r['seconds_between']:.2f}",
                         r["digest"]])
        _print_table(rows)
        last = max(r["revision"] for r in reports)
        digests = {r["digest"] for r in reports if r["revision"] == last}
        identical = len(digests) == 1
        verdict = "identical on every member" if identical else "DIFFERENT across members"
        print(f"final state: {verdict}", flush=True)
        return identical

    def _print_faults(self) -> None:
        rows = [["fault", "peer", "at revision", "recovered after"]]
        for f in self.faults:
            rows.append([f"{f.kind} killed", f"peer{f.peer}", str(f.revision),
                         f"{f.recovered_after:.1f} s" if f.recovered_after is not None else "not before the end"])
        print()
        _print_table(rows)
        times = [f.recovered_after for f in self.faults if f.recovered_after is not None]
        kinds = collections.Counter(f.kind for f in self.faults)
        text = ", ".join(f"{count} {kind} kill(s)" for kind, count in sorted(kinds.items()))
        median = f"; median recovery {statistics.median(times):.1f} s, max {max(times):.1f} s" if times else ""
        print(f"faults: {text}; {len(times)} of {len(self.faults)} recovered before the end{median}", flush=True)


def _print_table(rows: list[list[str]]) -> None:
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())

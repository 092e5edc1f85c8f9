"""`p2pgen join --local N [--chaos S]`: a whole job on 127.0.0.1, for the demo and for trying faults.

Owns: N agent processes with symmetric configuration (each given the others as peers), the printing
of each generation as it is decided, an optional seeded fault schedule (SIGKILL of an application,
which its agent restarts, or of a whole agent, which is replaced by a fresh agent under the same peer
id, as a spot instance would be), and the final summary of the applications' own reports.
Invariant kept: every process it starts it stops, by pid, before returning (Ctrl-C included).
"""

from __future__ import annotations

import glob
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime

from p2pgen.agent.agent import PORTS_PER_AGENT
from p2pgen.auth import read_secret_file
from p2pgen.errors import P2PGenError

AGENT_REPLACEMENT_DELAY_S = 1.0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class LocalJob:
    def __init__(self, n: int, job: str, base_port: int, agent_args: list[str], command: list[str] | None,
                 secret_file: str | None, chaos: float | None = None, seed: int = 0, steps: int | None = None):
        self.n, self.job, self.command, self.chaos, self.steps = n, job, command, chaos, steps
        self.addrs = [f"127.0.0.1:{base_port + PORTS_PER_AGENT * i}" for i in range(n)]
        self.workdir = tempfile.mkdtemp(prefix="p2pgen-local-")
        self.summary_dir = os.path.join(self.workdir, "summaries")
        os.makedirs(self.summary_dir)
        self.secret_file = secret_file or self._new_secret()
        self.secret = read_secret_file(self.secret_file)
        self.agent_args = agent_args + [f"--secret-file={self.secret_file}"]
        self.rng = random.Random(seed)
        self.agents: dict[int, subprocess.Popen] = {}
        self.started: list[subprocess.Popen] = []
        self.replacements: list[tuple[float, int]] = []      # (due time, agent index)
        self.faults: list[str] = []
        self.seen_generation = 0

    def _new_secret(self) -> str:
        path = os.path.join(self.workdir, "secret")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(secrets.token_hex(32))
        return path

    def run(self) -> int:
        signal.signal(signal.SIGTERM, _interrupt)      # SIGTERM stops the agents like Ctrl-C does
        try:
            for i in range(self.n):
                self._start_agent(i, initial=True)
            print(f"started {self.n} agents of job {self.job!r} at {', '.join(self.addrs)}; Ctrl-C stops them\n"
                  f"inspect with: p2pgen show --peer {self.addrs[0]} --secret-file {self.secret_file}", flush=True)
            next_fault = self._next_fault_time()
            while self._running():
                self._print_new_generations()
                now = time.monotonic()
                if next_fault is not None and now >= next_fault and not self._training_done():
                    self._inject()
                    next_fault = self._next_fault_time()
                self._replace_due_agents(now)
                time.sleep(0.2)
            self._print_new_generations()
            self._print_summary()
        except KeyboardInterrupt:
            print("\nstopping the agents")
        finally:
            self._stop_all()
        return 0

    # --- agents --------------------------------------------------------------------------------------

    def _start_agent(self, i: int, initial: bool) -> None:
        addr = self.addrs[i]
        cmd = [sys.executable, "-m", "p2pgen", "join", "--job", self.job, "--id", f"peer{i}", "--listen", addr,
               *self.agent_args, *[f"--peer={a}" for a in self.addrs if a != addr]]
        if initial:
            cmd += ["--min-members", str(self.n)]
        if self.command:
            cmd += ["--", *self.command]
        env = {**os.environ, "P2PGEN_SUMMARY_DIR": self.summary_dir}
        if self.steps is not None:
            env["P2PGEN_STEPS"] = str(self.steps)
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)   # Ctrl-C reaches only this process
        self.agents[i] = proc
        self.started.append(proc)

    def _running(self) -> bool:
        return any(p.poll() is None for p in self.agents.values()) or bool(self.replacements)

    def _stop_all(self) -> None:
        """SIGTERM each agent in turn (each leaves gracefully while a quorum remains), SIGKILL laggards."""
        for proc in reversed(self.started):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()

    # --- chaos ---------------------------------------------------------------------------------------

    def _next_fault_time(self) -> float | None:
        return time.monotonic() + self.rng.expovariate(1.0 / self.chaos) if self.chaos else None

    def _training_done(self) -> bool:
        return bool(glob.glob(os.path.join(self.summary_dir, "*.json")))

    def _inject(self) -> None:
        alive = [i for i, p in self.agents.items() if p.poll() is None]
        if len(alive) < 2:
            return
        i = self.rng.choice(alive)
        if self.command and self.rng.random() < 0.7:
            pid = self._app_pid(self.addrs[i])
            try:
                os.kill(pid, signal.SIGKILL) if pid else None
            except ProcessLookupError:      # it exited (or was restarted) since we asked its agent
                return
            if pid:
                self._fault(f"SIGKILL application of peer{i} (pid {pid}); its agent restarts it")
            return
        os.killpg(self.agents[i].pid, signal.SIGKILL)
        self.agents[i].wait()
        self.replacements.append((time.monotonic() + AGENT_REPLACEMENT_DELAY_S, i))
        self._fault(f"SIGKILL agent peer{i} and its application (a lost spot instance); replaced in "
                    f"{AGENT_REPLACEMENT_DELAY_S:.0f} s")

    def _replace_due_agents(self, now: float) -> None:
        for due, i in list(self.replacements):
            if now >= due:
                self.replacements.remove((due, i))
                self._start_agent(i, initial=False)

    def _fault(self, text: str) -> None:
        self.faults.append(text)
        print(f"[{datetime.now().strftime('%H:%M:%S.%f')[:-3]}] chaos: {text}", flush=True)

    # --- observation ---------------------------------------------------------------------------------

    def _client(self, addr: str):
        from p2pgen.agent.client import AgentClient
        return AgentClient(addr, self.secret, timeout=2.0)

    def _app_pid(self, addr: str) -> int | None:
        try:
            with self._client(addr) as c:
                return c.show()["agent"]["app_pid"]
        except (OSError, P2PGenError):
            return None

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
                    members = " ".join(f"{m['peer_id']}#{m['incarnation']}" for m in entry["members"])
                    when = datetime.fromtimestamp(entry["at"]).strftime("%H:%M:%S.%f")[:-3]
                    print(f"[{when}] generation {entry['generation']} {entry['outcome']}: [{members}] — "
                          f"{entry['reason']}", flush=True)
                    if entry["certificate"] and entry["certificate"].get("recovery"):
                        print(f"[{when}]   {entry['certificate']['recovery']}", flush=True)
            return

    def _print_summary(self) -> None:
        reports = []
        for path in sorted(glob.glob(os.path.join(self.summary_dir, "*.json"))):
            with open(path) as f:
                reports.append(json.load(f))
        if not reports:
            return
        print(f"\nsummary: {len(self.faults)} fault(s) injected, {self.seen_generation} generation number(s) used")
        rows = [["peer", "incarnation", "revision", "generations", "committed", "discarded", "s between gens",
                 "final digest"]]
        for r in reports:
            rows.append([r["peer"], str(r["incarnation"]), str(r["revision"]), str(r["generations"]),
                         str(r["steps_committed"]), str(r["steps_discarded"]), f"{r['seconds_between']:.2f}",
                         r["digest"]])
        widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
        for row in rows:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
        digests = {r["digest"] for r in reports if r["revision"] == max(x["revision"] for x in reports)}
        verdict = "identical on every member" if len(digests) == 1 else "DIFFERENT across members"
        print(f"final state: {verdict}")

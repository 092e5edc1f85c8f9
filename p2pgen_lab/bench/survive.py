"""`p2pgen bench survive`: what an application crash costs in state, with a local copy, a checkpoint, or neither.

Four sections, each printed beside its baseline measured in the same run:

0. `overhead` (real agents), per state size (`--state-mb`): 2 members train `p2pgen_lab.bench.apps.overhead`
   (one float32 tensor updated in full every step) with the local copy on (the default) and off
   (`--no-local-state`), in alternating rounds; the step rates, their ratio, how far the copy lagged
   the commits, and, in this process, the cost of the frontier digest a vote needs after a commit:
   hashed again from the tensors (copies off) or taken from the background writer's hashes (on).
1. `copies` (one process, no agents), per state size: the cost a commit pays to save the local copy
   (hash + copy into tmpfs), the time to verify and load that copy into a new process's state, to write
   and to load a checkpoint, and, as the baseline a restarted member without a copy pays, a pull of the
   same bytes from a source process over loopback (`p2pgen_lab.bench.catchup.catchup_throughput`).
2. `killall` (real agents): 3 members train `p2pgen_lab.bench.apps.survive` (S MB of state); every
   application is SIGKILLed at once (their agents live), `trials` times per configuration:
   - `local copy` (the default): the new incarnations resume from their host's copy;
   - `checkpoint`: no local copy, a checkpoint every C revisions, `--regress-wait W`: the job waits W s
     (no holder comes back), then falls back to the newest checkpoint (loudly);
   - `none`: no local copy, no checkpoint, `--regress-wait 0 --allow-fresh-start`: the behaviour before
     state could outlive its processes (the job restarts from revision 0).
   Per kill: the revision committed before it, the revision the job resumed at, steps lost, seconds from
   the kill to the first commit after it, and how the new incarnations got their state.
3. `churn` (real agents): 5 members (`--churn-members`) train under a seeded fault schedule (every 0.5-3 s:
   SIGKILL of one
   application; of 2-3 applications within 0.3 s; of a whole agent, replaced 1 s later at the same
   address; SIGSTOP of an application for 0.3-2 s), once with local copies and once as before
   (`none`). For every generation activated: the revision it resumed at against the highest revision
   any member had committed before, and against the certified one.

Invariant: every process it starts is stopped by pid (`Cluster.stop_all`) before a section returns.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from p2pgen.state import LocalCopy, SharedState, list_checkpoints, load_checkpoint, write_checkpoint
from p2pgen_lab.bench.catchup import catchup_throughput
from p2pgen_lab.rigs.agents import Cluster, free_control_ports

PEERS = ("s0", "s1", "s2")
DETECT = ("--attach-grace=60", "--detector=fixed", "--detect-timeout=1.0", "--detect-floor=0.3",
          "--heartbeat-interval=0.1", "--max-restarts=1000")
SECTIONS = ("overhead", "copies", "killall", "churn")


@dataclass(frozen=True)
class Plan:
    sizes_mb: tuple[float, ...] = (16.0, 128.0)
    repeats: int = 3
    killall_mb: float = 64.0
    trials: int = 3
    checkpoint_every: int = 20
    regress_wait: float = 2.0
    step_delay: float = 0.02
    configs: tuple[str, ...] = ("local copy", "checkpoint", "none")
    churn_s: float = 240.0
    churn_members: int = 5
    churn_mb: float = 16.0
    seed: int = 1
    state_mb: tuple[float, ...] = (16.0, 256.0, 1024.0)
    overhead_s: float = 12.0
    overhead_rounds: int = 2
    overhead_budget: float = 0.05        # --local-state-budget of the members with the copy on

    @classmethod
    def quick(cls) -> Plan:
        return cls(sizes_mb=(16.0,), repeats=2, killall_mb=16.0, trials=1, churn_s=40.0, state_mb=(16.0,),
                   overhead_s=6.0, overhead_rounds=1)


# --- 0. overhead ---------------------------------------------------------------------------------------

def digest_cost(mbytes: float, repeats: int) -> dict[str, float]:
    """Seconds (median of `repeats`) of the frontier digest after a commit of `mbytes` MiB of torch state:
    hashed from the tensors (no local copy) and with the local copy's writer (its hashes reused), and
    the writer's background seconds per save."""
    import types

    import torch

    from p2pgen.state import StateKeeper, StateKeeperConfig
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    gen = types.SimpleNamespace(generation=1, state_epoch=1, frontier=types.SimpleNamespace(revision=0, digest=""))
    rehash, reused, writer = [], [], []
    with tempfile.TemporaryDirectory(prefix="p2pgen-digest-", dir=shm) as local:
        state = SharedState({"w": torch.zeros(int(mbytes * (1 << 20)) // 4)})
        keeper = StateKeeper(StateKeeperConfig(local_dir=local, local_budget=1e9), state, "bench", ("p0", 1))
        keeper.instance = "bench"
        try:
            for _ in range(2):              # both slots allocated before anything is timed
                state._commit()
                keeper.committed(gen, 1)
                keeper.settle()
            for _ in range(repeats):
                state.tensors["w"].add_(1.0)
                state._commit()
                t = time.perf_counter()
                state.digest()
                rehash.append(time.perf_counter() - t)
                state.tensors["w"].add_(1.0)
                state._commit()
                t = time.perf_counter()
                keeper.committed(gen, 1)
                keeper.settle()
                writer.append(time.perf_counter() - t)
                t = time.perf_counter()
                state.digest()
                reused.append(time.perf_counter() - t)
        finally:
            keeper.close()
        del state
    return {"digest_rehash_s": statistics.median(rehash), "digest_with_copy_s": statistics.median(reused),
            "save_s": statistics.median(writer)}


def _rate(events: list[dict[str, Any]], peer: str, start: float, end: float) -> tuple[float, float, float]:
    """(steps/s, share of commits that took a snapshot, mean revisions the copy lagged) of `peer` in [start, end]."""
    mine = sorted((e for e in events if e["event"] == "commit" and e["peer"] == peer and start <= e["t"] <= end),
                  key=lambda e: e["t"])
    if len(mine) < 2:
        return 0.0, 0.0, 0.0
    rate = (len(mine) - 1) / (mine[-1]["t"] - mine[0]["t"])
    if "snapshot" not in mine[0]:
        return rate, 0.0, 0.0
    taken = sum(1 for e in mine if e["snapshot"] == e["revision"]) / len(mine)
    return rate, taken, statistics.mean(e["revision"] - e["snapshot"] for e in mine)


def overhead_run(mbytes: float, copies_on: bool, plan: Plan, workdir: Path) -> dict[str, float]:
    """One run of 2 members for `plan.overhead_s` seconds of steady steps; rates as `_rate` gives them."""
    traces = workdir / "traces"
    traces.mkdir(parents=True)
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    cluster = Cluster(workdir, job="bench-overhead", detect=DETECT)
    command = [sys.executable, "-m", "p2pgen_lab.bench.apps.overhead", f"--mbytes={mbytes}"]
    env_before = os.environ.get("P2PGEN_TRACE_DIR")
    os.environ["P2PGEN_TRACE_DIR"] = str(traces)
    with tempfile.TemporaryDirectory(prefix="p2pgen-overhead-", dir=shm) as local:
        flags = ((f"--local-state-dir={local}", f"--local-state-budget={plan.overhead_budget}") if copies_on
                 else ("--no-local-state",))
        try:
            addrs = [f"127.0.0.1:{p}" for p in free_control_ports(2)]
            run = _Run(cluster, traces, addrs)
            for peer, addr in zip(PEERS[:2], addrs):
                cluster.start(peer, addr, [a for a in addrs if a != addr], command=command,
                              extra=("--min-members=2", *flags))
            run.wait(lambda: len({e["peer"] for e in run.commits()}) == 2 and len(run.commits()) >= 8, 180,
                     f"overhead {mbytes:g} MiB: both training")
            start = time.time() + 1.0
            time.sleep(1.0 + plan.overhead_s)
            rate, taken, lag = _rate(run.refresh(), PEERS[0], start, start + plan.overhead_s)
        finally:
            cluster.stop_all()
            if env_before is None:
                os.environ.pop("P2PGEN_TRACE_DIR", None)
            else:
                os.environ["P2PGEN_TRACE_DIR"] = env_before
    return {"steps_per_s": rate, "snapshot_share": taken, "lag": lag}


def overhead(mbytes: float, plan: Plan, workdir: Path) -> dict[str, Any]:
    """Alternating rounds (on, off) at one size; the median rate of each, their ratio and the digest cost."""
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for i in range(plan.overhead_rounds):
        for on in (True, False):
            runs[on].append(overhead_run(mbytes, on, plan, workdir / f"{mbytes:g}-{i}-{'on' if on else 'off'}"))
    on = statistics.median(r["steps_per_s"] for r in runs[True])
    off = statistics.median(r["steps_per_s"] for r in runs[False])
    return {"mbytes": mbytes, "on_steps_per_s": on, "off_steps_per_s": off, "ratio": on / off if off else 0.0,
            "snapshot_share": statistics.mean(r["snapshot_share"] for r in runs[True]),
            "lag": statistics.mean(r["lag"] for r in runs[True]), "rates_on": [r["steps_per_s"] for r in runs[True]],
            "rates_off": [r["steps_per_s"] for r in runs[False]], **digest_cost(mbytes, 3)}


def format_overhead(rows: list[dict[str, Any]], plan: Plan) -> str:
    table = [["state", "steps/s, local copy on", "steps/s, --no-local-state", "ratio", "commits snapshotted",
              "copy lag (revisions, mean)", "vote digest: rehash", "vote digest: with copy", "writer per save"]]
    for r in rows:
        table.append([f"{r['mbytes']:g} MiB", f"{r['on_steps_per_s']:.1f}", f"{r['off_steps_per_s']:.1f}",
                      f"{r['ratio']:.2f}x", f"{r['snapshot_share'] * 100:.0f} %", f"{r['lag']:.1f}",
                      _ms(r["digest_rehash_s"]), _ms(r["digest_with_copy_s"]), _ms(r["save_s"])])
    return (_table(table) + "\n2 members, one float32 torch tensor updated in full every step (all_reduce of 8 "
            f"floats, add_, commit); {plan.overhead_rounds} alternating rounds of {plan.overhead_s:g} s per "
            f"configuration (median); local copy in /dev/shm, --local-state-budget {plan.overhead_budget:g}; "
            "digests measured in this "
            "process "
            "(median of 3)")


# --- 1. copies ---------------------------------------------------------------------------------------

def _state(mbytes: float, value: float) -> SharedState:
    n = int(mbytes * 1e6) // 4 // 4
    return SharedState({f"w{i}": np.full(n, value + i, np.float32) for i in range(4)}, {"step": int(value)})


def copies(mbytes: float, repeats: int) -> dict[str, Any]:
    """Seconds (median of `repeats`) of each way to keep and to recover `mbytes` MB of state."""
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="p2pgen-survive-", dir=shm) as local, \
            tempfile.TemporaryDirectory(prefix="p2pgen-survive-ckpt-") as ckpt:
        source, copy = _state(mbytes, 1.0), LocalCopy(local, "bench", "p0")
        save, restore, write, load = [], [], [], []
        for _ in range(repeats):
            source._commit()                               # as in the step loop: a commit drops cached digests
            t = time.perf_counter()
            copy.save(source, instance="bench", incarnation=1, generation=1, epoch=1)
            save.append(time.perf_counter() - t)
            target = _state(mbytes, 0.0)
            t = time.perf_counter()
            copy.load_into(target, instance="bench")
            restore.append(time.perf_counter() - t)
            t = time.perf_counter()
            write_checkpoint(source, ckpt, job="bench", instance="bench", epoch=1, generation=1, writer=("p0", 1),
                             keep=1)
            write.append(time.perf_counter() - t)
            target = _state(mbytes, 0.0)
            t = time.perf_counter()
            load_checkpoint(target, list_checkpoints(ckpt)[0])
            load.append(time.perf_counter() - t)
        del source, target
    pull = statistics.median(catchup_throughput(int(mbytes * 1e6), sources=1)["pull_seconds"]
                             for _ in range(repeats))
    return {"mbytes": mbytes, "local_dir": shm or tempfile.gettempdir(), "save_copy_s": statistics.median(save),
            "restore_copy_s": statistics.median(restore), "write_checkpoint_s": statistics.median(write),
            "load_checkpoint_s": statistics.median(load), "pull_s": pull}


def format_copies(rows: list[dict[str, Any]]) -> str:
    table = [["state", "save local copy (per commit)", "restore local copy", "write checkpoint", "load checkpoint",
              "pull from 1 peer (baseline)"]]
    for r in rows:
        table.append([f"{r['mbytes']:g} MB"] + [_ms(r[k]) for k in ("save_copy_s", "restore_copy_s",
                                                                    "write_checkpoint_s", "load_checkpoint_s",
                                                                    "pull_s")])
    where = rows[0]["local_dir"] if rows else "-"
    return (_table(table) + f"\nlocal copy in {where}; checkpoint in {tempfile.gettempdir()} (fsynced); pull over "
            "loopback from a source process; every figure verifies digests; median of the repeats")


# --- 2. kill every application at once -----------------------------------------------------------------

@dataclass
class _Run:
    cluster: Cluster
    traces: Path
    addrs: list[str]
    events: list[dict[str, Any]] = field(default_factory=list)

    def refresh(self) -> list[dict[str, Any]]:
        events = []
        for path in sorted(self.traces.glob("*.jsonl")):
            for line in path.read_text().splitlines():
                if line.endswith("}"):
                    events.append(json.loads(line))
        self.events = events
        return events

    def commits(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == "commit"]

    def wait(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.refresh()
            if predicate():
                return
            time.sleep(0.1)
        raise AssertionError(f"bench survive: {what} did not happen within {timeout} s\n{self.cluster.logs()}")


def _agent_flags(config: str, plan: Plan, workdir: Path) -> tuple[str, ...]:
    if config == "local copy":
        return ()
    if config == "checkpoint":
        return ("--no-local-state", f"--checkpoint-dir={workdir / 'checkpoints'}",
                f"--checkpoint-every={plan.checkpoint_every}", f"--regress-wait={plan.regress_wait}")
    return ("--no-local-state", "--regress-wait=0", "--allow-fresh-start")


def killall(config: str, plan: Plan, workdir: Path) -> list[dict[str, Any]]:
    """`plan.trials` kills of every application at once under one configuration; one row per kill."""
    traces = workdir / "traces"
    traces.mkdir(parents=True)
    cluster = Cluster(workdir, job="bench-survive", detect=DETECT)
    command = [sys.executable, "-m", "p2pgen_lab.bench.apps.survive", f"--mbytes={plan.killall_mb}",
               f"--step-delay={plan.step_delay}"]
    env_before = os.environ.get("P2PGEN_TRACE_DIR")
    os.environ["P2PGEN_TRACE_DIR"] = str(traces)
    rows = []
    try:
        addrs = [f"127.0.0.1:{p}" for p in free_control_ports(len(PEERS))]
        run = _Run(cluster, traces, addrs)
        for peer, addr in zip(PEERS, addrs):
            cluster.start(peer, addr, [a for a in addrs if a != addr], command=command,
                          extra=("--min-members=3", *_agent_flags(config, plan, workdir)))
        for trial in range(plan.trials):
            rows.append(_one_kill(run, config, trial, plan))
    finally:
        cluster.stop_all()
        if env_before is None:
            os.environ.pop("P2PGEN_TRACE_DIR", None)
        else:
            os.environ["P2PGEN_TRACE_DIR"] = env_before
    return rows


def _one_kill(run: _Run, config: str, trial: int, plan: Plan) -> dict[str, Any]:
    since = max((e["t"] for e in run.commits()), default=0.0)
    start = max((e["revision"] for e in run.commits()), default=0)
    # train a while, and land the kill mid-way between two checkpoints (the mean loss of a checkpoint)
    half = plan.checkpoint_every // 2
    target = start + 15 + (half - (start + 15)) % plan.checkpoint_every
    run.wait(lambda: len({e["peer"] for e in run.commits() if e["t"] > since}) == 3
             and max(e["revision"] for e in run.commits()) >= target, 120, f"{config}: revision {target}")
    pids = []
    for addr in run.addrs:
        with run.cluster.client(addr) as c:
            pids.append(c.show()["agent"]["app_pid"])
    t0 = time.time()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    old = {(e["peer"], e["incarnation"]) for e in run.refresh()}

    def new_commits() -> list[dict[str, Any]]:
        return [e for e in run.commits() if (e["peer"], e["incarnation"]) not in old]
    run.wait(lambda: len({e["peer"] for e in new_commits()}) == 3, 60 + plan.regress_wait,
             f"{config}: all three training again")
    committed = max(e["revision"] for e in run.commits() if (e["peer"], e["incarnation"]) in old)
    after = [e for e in run.events if (e["peer"], e["incarnation"]) not in old]
    firsts = [min((e for e in new_commits() if e["peer"] == p), key=lambda e: e["t"]) for p in PEERS]
    resumed = min(e["revision"] for e in firsts) - 1
    return {"config": config, "trial": trial, "committed": committed, "resumed": resumed,
            "lost": max(0, committed - resumed), "kill_to_commit_s": min(e["t"] for e in firsts) - t0,
            "restored_copies": sum(1 for e in after if e["event"] == "restore" and e["revision"] > 0),
            "pulled": sum(1 for e in after if e["event"] == "pull"),
            "loaded_checkpoint": sum(1 for e in after if e["event"] == "synced" and "checkpoint" in e["report"]),
            "held": any(e["event"] == "held" for e in after)}


def format_killall(rows: list[dict[str, Any]], plan: Plan) -> str:
    table = [["configuration", "kills", "steps committed before", "resumed at", "steps lost", "kill -> commit p50",
              "max", "state from"]]
    for config in plan.configs:
        mine = [r for r in rows if r["config"] == config]
        if not mine:
            continue
        times = [r["kill_to_commit_s"] for r in mine]
        sources = (f"{sum(r['restored_copies'] for r in mine)} copies restored, {sum(r['pulled'] for r in mine)} "
                   f"pulls, {sum(r['loaded_checkpoint'] for r in mine)} checkpoint loads"
                   + (", held first" if any(r["held"] for r in mine) else ""))
        table.append([config, str(len(mine)), " ".join(str(r["committed"]) for r in mine),
                      " ".join(str(r["resumed"]) for r in mine), " ".join(str(r["lost"]) for r in mine),
                      f"{statistics.median(times):.2f} s", f"{max(times):.2f} s", sources])
    return (_table(table) + f"\n3 members, {plan.killall_mb:g} MB of state, every application SIGKILLed at once "
            f"(agents live); checkpoint: every {plan.checkpoint_every} revisions, --regress-wait "
            f"{plan.regress_wait:g}; none: --regress-wait 0 --allow-fresh-start (as before state could outlive "
            "its processes)")


# --- 3. churn -----------------------------------------------------------------------------------------

class _Churn:
    """One churn run: 5 agents, the seeded fault schedule, every process stopped by pid at the end."""

    def __init__(self, config: str, plan: Plan, workdir: Path) -> None:
        import random
        self.plan, self.config = plan, config
        self.rng = random.Random(plan.seed)
        self.traces = workdir / "traces"
        self.traces.mkdir(parents=True)
        self.cluster = Cluster(workdir, job="bench-churn", detect=DETECT)
        self.command = [sys.executable, "-m", "p2pgen_lab.bench.apps.survive", f"--mbytes={plan.churn_mb}",
                        f"--step-delay={plan.step_delay}"]
        self.peers = tuple(f"c{i}" for i in range(plan.churn_members))
        self.addrs = dict(zip(self.peers, (f"127.0.0.1:{p}" for p in free_control_ports(len(self.peers)))))
        self.replace: list[tuple[float, str]] = []
        self.actions: list[str] = []

    def run(self) -> None:
        for peer in self.peers:
            self._start(peer, initial=True)
        run = _Run(self.cluster, self.traces, list(self.addrs.values()))
        run.wait(lambda: len({e["peer"] for e in run.commits()}) == len(self.peers), 120, "churn: all training")
        end = time.monotonic() + self.plan.churn_s
        next_fault = time.monotonic()
        while time.monotonic() < end:
            now = time.monotonic()
            for due, peer in list(self.replace):
                if now >= due:
                    self.replace.remove((due, peer))
                    self._start(peer, initial=False)
            if now >= next_fault:
                self._fault()
                next_fault = now + self.rng.uniform(0.5, 3.0)
            time.sleep(0.05)

    def _start(self, peer: str, initial: bool) -> None:
        addr = self.addrs[peer]
        extra = (*_agent_flags(self.config, self.plan, Path(self.traces).parent),
                 f"--min-members={len(self.peers)}") if initial \
            else _agent_flags(self.config, self.plan, Path(self.traces).parent)
        self.cluster.start(peer, addr, [a for a in self.addrs.values() if a != addr], command=self.command,
                           extra=extra)

    def _app_pid(self, peer: str) -> int | None:
        try:
            with self.cluster.client(self.addrs[peer]) as c:
                return c.show()["agent"]["app_pid"]
        except Exception:          # the agent is restarting: no fault this time
            return None

    def _fault(self) -> None:
        live = [p for p in self.peers if self.cluster.agents[p].alive() and p not in {x for _, x in self.replace}]
        kind = self.rng.choices(("kill_app", "kill_apps", "kill_agent", "pause_app"), (55, 15, 15, 15))[0]
        if kind == "kill_agent" and len(live) == len(self.peers):
            peer = self.rng.choice(live)
            os.killpg(self.cluster.agents[peer].pid, signal.SIGKILL)
            self.cluster.agents[peer].proc.wait(10)
            self.replace.append((time.monotonic() + 1.0, peer))
            self.actions.append(f"kill agent {peer}")
            return
        victims = self.rng.sample(live, min(len(live), self.rng.choice((2, 3)) if kind == "kill_apps" else 1))
        for peer in victims:
            pid = self._app_pid(peer)
            if pid is None:
                continue
            try:
                if kind == "pause_app":
                    os.kill(pid, signal.SIGSTOP)
                    subprocess.Popen(["/bin/sh", "-c", f"sleep {self.rng.uniform(0.3, 2.0):.2f}; kill -CONT {pid}"],
                                     start_new_session=True, stderr=subprocess.DEVNULL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.actions.append(f"{'pause' if kind == 'pause_app' else 'kill'} application of {peer}")


def churn(config: str, plan: Plan, workdir: Path) -> dict[str, Any]:
    """One churn run under `config`; the regressions found in its traces."""
    env_before = os.environ.get("P2PGEN_TRACE_DIR")
    job = _Churn(config, plan, workdir)
    os.environ["P2PGEN_TRACE_DIR"] = str(job.traces)
    try:
        job.run()
    finally:
        job.cluster.stop_all()
        if env_before is None:
            os.environ.pop("P2PGEN_TRACE_DIR", None)
        else:
            os.environ["P2PGEN_TRACE_DIR"] = env_before
    events = _Run(job.cluster, job.traces, []).refresh()
    return {"config": config, "actions": len(job.actions), **regressions(events)}


def regressions(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Every generation's resumption against the highest revision committed (by anyone) since the generation
    before it, and against the revision that one certified: each loss is counted once, on the branch where
    it happened."""
    events = sorted(events, key=lambda e: e["t"])
    top, certified, final, seen = 0, 0, 0, set()
    lost_vs_committed, lost_vs_certified = [], []
    for e in events:
        if e["event"] == "commit":
            top, final = max(top, e["revision"]), max(final, e["revision"])
        elif e["event"] == "active" and e["generation"] not in seen:
            seen.add(e["generation"])
            if e["revision"] < top:
                lost_vs_committed.append(top - e["revision"])
            if e["revision"] < certified:
                lost_vs_certified.append(certified - e["revision"])
            certified = top = e["revision"]
    return {"generations": len(seen), "final_revision": final,
            "resumed_below_committed": len(lost_vs_committed), "steps_lost_vs_committed": sum(lost_vs_committed),
            "resumed_below_certified": len(lost_vs_certified), "steps_lost_vs_certified": sum(lost_vs_certified),
            "held": sum(1 for e in events if e["event"] == "held")}


def format_churn(rows: list[dict[str, Any]], plan: Plan) -> str:
    table = [["configuration", "faults", "generations", "final revision", "resumed below certified (steps lost)",
              "resumed below committed (steps lost)", "held"]]
    for r in rows:
        table.append([r["config"], str(r["actions"]), str(r["generations"]), str(r["final_revision"]),
                      f"{r['resumed_below_certified']} ({r['steps_lost_vs_certified']})",
                      f"{r['resumed_below_committed']} ({r['steps_lost_vs_committed']})", str(r["held"])])
    return (_table(table) + f"\n{plan.churn_members} members, {plan.churn_mb:g} MB of state, {plan.churn_s:g} s "
            "of faults every "
            f"0.5-3 s (seed {plan.seed}): kill 1 application 55%, kill 2-3 applications within 0.3 s 15%, kill an "
            "agent (replaced after 1 s at its address) 15%, SIGSTOP an application 0.3-2 s 15%")


# --- the whole benchmark -----------------------------------------------------------------------------

def main(plan: Plan, sections: tuple[str, ...], as_json: bool, out: str | None) -> int:
    result: dict[str, Any] = {"plan": plan.__dict__}
    if "overhead" in sections:
        with tempfile.TemporaryDirectory(prefix="p2pgen-overhead-") as tmp:
            result["overhead"] = [overhead(mb, plan, Path(tmp)) for mb in plan.state_mb]
        if not as_json:
            print(format_overhead(result["overhead"], plan), flush=True)
    if "copies" in sections:
        result["copies"] = [copies(mb, plan.repeats) for mb in plan.sizes_mb]
        if not as_json:
            print(format_copies(result["copies"]), flush=True)
    if "killall" in sections:
        rows = []
        with tempfile.TemporaryDirectory(prefix="p2pgen-survive-") as tmp:
            for i, config in enumerate(plan.configs):
                rows += killall(config, plan, Path(tmp) / f"run{i}")
        result["killall"] = rows
        if not as_json:
            print("\n" + format_killall(rows, plan), flush=True)
    if "churn" in sections:
        with tempfile.TemporaryDirectory(prefix="p2pgen-churn-") as tmp:
            result["churn"] = [churn(config, plan, Path(tmp) / f"run{i}")
                               for i, config in enumerate(("local copy", "none"))]
        if not as_json:
            print("\n" + format_churn(result["churn"], plan), flush=True)
    text = json.dumps(result, indent=1, default=list)
    if as_json:
        print(text)
    if out:
        Path(out).write_text(text)
    return 0


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths)] + lines[1:])

"""`p2pgen bench diloco`: time to a target loss, synchronous against DiLoCo, on emulated hosts.

Each configuration trains the shipped task (`p2pgen_lab.bench.apps.diloco_task`) on the same N hosts (network
namespaces, links shaped by the kernel: `p2pgen_lab.rigs.netns`), one after the other in one run, and is
measured the same way: seconds from the first member's start to the first evaluation at or below the target
loss (host 0's log), the bytes each host's link sent meanwhile (`/proc/net/dev` of its namespace: every
byte, Raft and heartbeats included), the final loss and the outer steps. Rows: torch DDP on gloo
(synchronous), synchronous p2pgen (one all-reduce per step), p2pgen DiLoCo at each H, optionally compressed,
and torchft 0.2.0's DiLoCo at each H (`p2pgen_lab.bench.apps.torchft_diloco`: its lighthouse in host 0, one
replica group of one process per host) when torchft is installed.

The fault section trains DiLoCo for a fixed time twice, fault-free and with a host (its agent and
application) killed every `faults_every` seconds and started again one second later, and reports the
committed outer steps of both: steps kept = faulty / fault-free. The same for torchft's DiLoCo (a host's
replica killed and started again one second later), with the outer steps torchft threw away counted (`reset`
records of every replica: a sync whose commit failed, a replica healed from a peer).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from p2pgen.agent import launch
from p2pgen_lab.bench.peers import kill_tree, torchft_missing
from p2pgen_lab.bench.table import aligned
from p2pgen_lab.rigs.agents import Cluster
from p2pgen_lab.rigs.netns import EmulatedCluster

APP = (sys.executable, "-m", "p2pgen_lab.bench.apps.diloco_task")
DDP_PORT = 23500
TORCHFT_APP = (sys.executable, "-m", "p2pgen_lab.bench.apps.torchft_diloco")
LIGHTHOUSE_PORT = 23600
# the lighthouse in host 0: `p2pgen bench recovery`'s settings (a quorum of at least 2, a replica dead after 1 s
# without heartbeats) but for the wait on a heartbeating replica that has not asked to join: at 100 ms, on a
# loaded 2-core machine, a replica reaching the sync a little after the others was left out of the outer step
# every few steps and healed from a peer; 5 s also lets a restarted replica into the first outer step it reaches
TORCHFT_LIGHTHOUSE = {"min_replicas": 2, "join_timeout_ms": 5000, "quorum_tick_ms": 10, "heartbeat_timeout_ms": 1000}
TORCHFT_TIMEOUT_S = 10.0           # the Manager's collectives and connections, and ProcessGroupGloo
START_GRACE_S = 90.0       # agents forming the job and the applications importing torch, before a run's clock


@dataclass(frozen=True)
class Config:
    """One row: `mode` ddp | sync | diloco | torchft, with DiLoCo's H and compression."""

    label: str
    mode: str
    sync_every: int = 1
    compress: str | None = None

    def args(self) -> list[str]:
        out = ["--mode", self.mode, "--sync-every", str(self.sync_every)]
        return out + (["--compress", self.compress] if self.compress else [])


@dataclass
class Result:
    label: str
    reached: bool
    seconds: float            # to the target (or the whole run when not reached)
    sent_mb_per_host: float
    final_loss: float
    outer_steps: int
    inner_steps: int
    curve: list[tuple[float, float]]       # (seconds since the start, loss) at every evaluation
    resets: int = 0                        # torchft: outer steps thrown away, summed over the replicas


def configs(sync_every: list[int], compress: list[str], torchft: bool = False) -> list[Config]:
    """The rows: gloo DDP, synchronous p2pgen, DiLoCo at each H, each H again per compression, and with
    `torchft` torchft's DiLoCo at each H."""
    rows = [Config("DDP, gloo", "ddp"), Config("p2pgen, synchronous", "sync")]
    rows += [Config(f"p2pgen DiLoCo H={h}", "diloco", h) for h in sync_every]
    rows += [Config(f"p2pgen DiLoCo H={h}, {c}", "diloco", h, c) for c in compress for h in sync_every]
    return rows + (torchft_configs(sync_every) if torchft else [])


def torchft_configs(sync_every: list[int]) -> list[Config]:
    """torchft's DiLoCo at each H."""
    return [Config(f"torchft DiLoCo H={h}", "torchft", h) for h in sync_every]


def torchft_skipped() -> str | None:
    """Why the torchft rows are left out here (torchft or its lighthouse missing), or None."""
    missing = torchft_missing()
    return None if missing is None else f"torchft DiLoCo rows skipped: {missing}"


def fault_configs(sync_every: int, torchft: bool) -> list[Config]:
    """What the fault section trains: p2pgen's DiLoCo at H, and with `torchft` torchft's."""
    rows = [Config(f"p2pgen DiLoCo H={sync_every}", "diloco", sync_every)]
    return rows + (torchft_configs([sync_every]) if torchft else [])


def tx_bytes(hosts: EmulatedCluster) -> list[int]:
    """Bytes each host's eth0 has sent so far."""
    out = []
    for i in range(len(hosts.names)):
        text = subprocess.run([*hosts.prefix(i), "cat", "/proc/net/dev"], capture_output=True, text=True,
                              check=True).stdout
        line = next(row for row in text.splitlines() if row.strip().startswith("eth0:"))
        out.append(int(line.split(":", 1)[1].split()[8]))
    return out


def read_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_config(hosts: EmulatedCluster, config: Config, workdir: Path, target: float, max_seconds: float,
               faults_every: float = 0.0, seed: int = 0) -> Result:
    """Train `config` on every host until the target loss (or `max_seconds`); faults for every mode but ddp."""
    workdir.mkdir(parents=True, exist_ok=True)
    n = len(hosts.names)
    logs = [workdir / f"m{i}.jsonl" for i in range(n)]
    common = ["--target-loss", str(target)]
    before = tx_bytes(hosts)
    if config.mode == "ddp":
        _run_ddp(hosts, config, logs, common, max_seconds)
    elif config.mode == "torchft":
        _run_torchft(hosts, config, workdir, logs, common, max_seconds, faults_every, seed)
    else:
        _run_p2pgen(hosts, config, workdir, logs, common, max_seconds, faults_every, seed)
    sent = [b - a for a, b in zip(before, tx_bytes(hosts))]
    result = _result(config.label, read_log(logs[0]), target, sent)
    return replace(result, resets=count_resets(logs)) if config.mode == "torchft" else result


def _run_ddp(hosts: EmulatedCluster, config: Config, logs: list[Path], common: list[str],
             max_seconds: float) -> None:
    master = hosts.addr(0, DDP_PORT)
    procs = []
    try:
        for i, log in enumerate(logs):
            cmd = [*hosts.prefix(i), *APP, *config.args(), "--log", str(log), *common, "--rank", str(i),
                   "--world", str(len(logs)), "--master", master]
            with open(f"{log}.err", "w") as err:
                procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err,
                                              env={**os.environ, "GLOO_SOCKET_IFNAME": "eth0"}))
        _wait_run(logs[0], lambda: any(p.poll() is None for p in procs), max_seconds)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


def _run_p2pgen(hosts: EmulatedCluster, config: Config, workdir: Path, logs: list[Path], common: list[str],
                max_seconds: float, faults_every: float, seed: int) -> None:
    cluster = Cluster(workdir, job=f"bench-diloco-{workdir.name}", hosts=hosts)
    addrs = cluster.addresses(len(logs))
    peers = [f"m{i}" for i in range(len(logs))]

    def start(i: int, first: bool) -> None:
        cluster.start(peers[i], addrs[i], [a for a in addrs if a != addrs[i]],
                      command=[*APP, *config.args(), "--log", str(logs[i]), *common],
                      extra=((f"--min-members={len(logs)}",) if first else ()) + ("--attach-grace=60",))

    try:
        for i in range(len(logs)):
            start(i, True)
        _wait_run(logs[0], lambda: any(a.alive() for a in cluster.agents.values()), max_seconds,
                  _fault_schedule(len(logs), faults_every, seed, lambda i: _kill_host(cluster, peers[i]),
                                  lambda i: start(i, False)) if faults_every else None)
    finally:
        cluster.stop_all()


def _run_torchft(hosts: EmulatedCluster, config: Config, workdir: Path, logs: list[Path], common: list[str],
                 max_seconds: float, faults_every: float, seed: int) -> None:
    """torchft's lighthouse in host 0 and one replica per host; with `faults_every`, a random host's replica
    (never host 0's) killed that often and started again one second later."""
    n = len(logs)
    started: list[subprocess.Popen] = []
    replicas: dict[int, subprocess.Popen] = {}

    def start(i: int, first: bool) -> None:
        cmd = [*hosts.prefix(i), *TORCHFT_APP, "--log", str(logs[i]), *common, "--sync-every",
               str(config.sync_every), "--rank", str(i), "--world", str(n), "--address", hosts.addrs[i],
               "--lighthouse", f"http://{hosts.addr(0, LIGHTHOUSE_PORT)}", "--timeout", str(TORCHFT_TIMEOUT_S)]
        replicas[i] = _spawn(cmd + (["--wait-all"] if first else []), Path(f"{logs[i]}.err"), started)

    try:
        _spawn([*hosts.prefix(0), _lighthouse_binary(), "--bind", hosts.addr(0, LIGHTHOUSE_PORT),
                *(f"--{k}={v}" for k, v in TORCHFT_LIGHTHOUSE.items())], workdir / "lighthouse.log", started)
        for i in range(n):
            start(i, True)
        _wait_run(logs[0], lambda: any(p.poll() is None for p in replicas.values()), max_seconds,
                  _fault_schedule(n, faults_every, seed, lambda i: kill_tree(replicas[i]),
                                  lambda i: start(i, False)) if faults_every else None)
    finally:
        for proc in reversed(started):
            kill_tree(proc)


def _spawn(cmd: list[str], log: Path, started: list[subprocess.Popen]) -> subprocess.Popen:
    """Start `cmd` as the leader of its own process group (so `kill_tree` takes it whole), dying with us."""
    with open(log, "ab") as out:
        proc = launch.spawn(cmd, out, subprocess.STDOUT, env={**os.environ, "GLOO_SOCKET_IFNAME": "eth0"})
    started.append(proc)
    return proc


def _lighthouse_binary() -> str:
    return shutil.which("torchft_lighthouse") or str(Path(sys.executable).parent / "torchft_lighthouse")


def _fault_schedule(n: int, faults_every: float, seed: int, kill: Callable[[int], None],
                    start: Callable[[int], None]) -> Callable[[], None]:
    """A `during` for `_wait_run`: every `faults_every` s, `kill(i)` a random host i >= 1 (host 0 keeps the log
    the row is read from), then one second later `start(i)`."""
    rng, next_fault = random.Random(seed), None

    def fault() -> None:
        nonlocal next_fault
        next_fault = next_fault or time.monotonic() + faults_every
        if time.monotonic() >= next_fault:
            victim = rng.randrange(1, n)
            kill(victim)
            time.sleep(1.0)
            start(victim)
            next_fault += faults_every
    return fault


def count_resets(logs: list[Path]) -> int:
    """The `reset` records of every host's log (every incarnation of its replica)."""
    return sum(e["event"] == "reset" for log in logs for e in read_log(log))


def _wait_run(log: Path, running, max_seconds: float, during=None) -> None:
    """Until the run is over (`running()` false) or `max_seconds` after host 0's start; `during()` is
    called every 0.2 s once it started."""
    deadline = time.monotonic() + START_GRACE_S
    started = None
    while running() and time.monotonic() < deadline:
        if started is None and any(e["event"] == "start" for e in read_log(log)):
            started = time.monotonic()
            deadline = started + max_seconds
        if started is not None and during is not None:
            during()
        time.sleep(0.2)


def _kill_host(cluster: Cluster, peer: str) -> None:
    agent = cluster.agents[peer]
    if agent.alive():
        try:
            os.killpg(agent.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        agent.proc.wait(10)


def _result(label: str, events: list[dict], target: float, sent: list[int]) -> Result:
    start = next((e["t"] for e in events if e["event"] == "start"), None)
    evals = [e for e in events if e["event"] == "eval"]
    if start is None or not evals:
        return Result(label, False, float("nan"), sum(sent) / len(sent) / 2**20, float("nan"), 0, 0, [])
    hit = next((e for e in evals if e["loss"] <= target), None)
    last = evals[-1]
    return Result(label, hit is not None, (hit or last)["t"] - start, sum(sent) / len(sent) / 2**20,
                  last["loss"], last["outer"], last["steps"], [(e["t"] - start, e["loss"]) for e in evals])


def format_results(results: list[Result], target: float, where: str) -> str:
    """The table, with each row's time to the target as a speed-up over the first row's (synchronous DDP on
    gloo, unless the rows were chosen otherwise)."""
    base = results[0]
    rows = []
    for r in results:
        speedup = base.seconds / r.seconds if r.reached and base.seconds == base.seconds else float("nan")
        rows.append([r.label, f"{r.seconds:.1f}" + ("" if r.reached else " (not reached)"),
                     f"{speedup:.2f}x" if speedup == speedup else "-", f"{r.sent_mb_per_host:.1f}",
                     f"{r.final_loss:.5f}", str(r.outer_steps), str(r.inner_steps)])
    head = ["configuration", "s to target", f"speed-up vs {base.label}", "MiB sent/host", "final loss", "outer steps",
            "inner steps/member"]
    return f"DiLoCo against synchronous training, {where}; target loss {target}\n" + "\n".join(aligned([head, *rows]))


def format_faults(clean: Result, faulty: Result, faults_every: float, seconds: float) -> str:
    kept = faulty.outer_steps / clean.outer_steps if clean.outer_steps else float("nan")
    rows = [["fault-free", str(clean.outer_steps), f"{clean.final_loss:.5f}"],
            [f"host killed every {faults_every:g} s", str(faulty.outer_steps), f"{faulty.final_loss:.5f}"]]
    return (f"{clean.label}, {seconds:g} s each; steps kept {kept:.3f}\n"
            + "\n".join(aligned([["run", "outer steps committed", "final loss"], *rows])))


def format_torchft_faults(clean: Result, faulty: Result, faults_every: float, seconds: float) -> str:
    """The fault table of torchft's DiLoCo: `format_faults`'s, with the outer steps torchft threw away."""
    kept = faulty.outer_steps / clean.outer_steps if clean.outer_steps else float("nan")
    rows = [["fault-free", str(clean.outer_steps), f"{clean.final_loss:.5f}", str(clean.resets)],
            [f"replica killed every {faults_every:g} s", str(faulty.outer_steps), f"{faulty.final_loss:.5f}",
             str(faulty.resets)]]
    head = ["run", "outer steps committed", "final loss", "resets (all replicas)"]
    return f"{clean.label}, {seconds:g} s each; steps kept {kept:.3f}\n" + "\n".join(aligned([head, *rows]))


def to_json(results: list[Result], faults: tuple[Result, Result] | None,
            torchft_faults: tuple[Result, Result] | None = None) -> str:
    out = {"rows": [asdict(r) for r in results], "faults": [asdict(r) for r in faults] if faults else None}
    if torchft_faults:
        out["torchft_faults"] = [asdict(r) for r in torchft_faults]
    return json.dumps(out, indent=2)

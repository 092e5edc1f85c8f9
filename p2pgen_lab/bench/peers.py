"""Real peers for `p2pgen bench recovery`'s step loop: torchft and torchrun, run and faulted like p2pgen.

Owns the processes of one step-loop block of a peer other than p2pgen: starting them, the three faults
(`sigkill_app`, `sigstop_app`, `kill_agent`), bringing a killed host back, and stopping everything.
- torchft 0.2.0: a lighthouse (`torchft_lighthouse`) and three pretend hosts
  (`p2pgen_lab.bench.apps.host`), each restarting one replica process (`p2pgen_lab.bench.apps.torchft_loop`,
  a replica group of one). Host kill: the host and its replica, SIGKILLed together.
- torchrun (`python -m torch.distributed.run`): three agents, one worker each
  (`p2pgen_lab.bench.apps.torchrun_loop worker`), c10d rendezvous on a TCPStore of its own
  (`p2pgen_lab.bench.apps.torchrun_loop store`). Host kill: the agent and its worker, SIGKILLed together.
The applications write `start`, `certificate` and `commit` events of the same shape as p2pgen's step loop,
so `p2pgen_lab.bench.recovery.analyze_fault` computes every peer's figures.
Invariant: every process is signalled by pid (or by the process group of a process this module started),
never by name; `stop()` kills every process of the block, with the descendants it can still see.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from p2pgen.agent import launch
from p2pgen_lab.rigs.agents import free_control_ports

PEERS = ("p0", "p1", "p2")
Events = list[dict[str, Any]]

# torchft: the lowest timeouts its options allow that still train on a loaded 2-core machine
TORCHFT_LIGHTHOUSE = {"min_replicas": 2, "join_timeout_ms": 100, "quorum_tick_ms": 10, "heartbeat_timeout_ms": 1000}
TORCHFT_TIMEOUT_S = 10.0           # Manager (collectives, quorum, connect) and ProcessGroupGloo
# torchrun: a node may be missing (2:3), a restart budget the benchmark never spends, a fast monitor; the
# rendezvous closes 1 s after the minimum is there (default 30 s). Keep-alives stay at their defaults (every 5 s,
# dead after 3 missed): at 1 s x 2 a loaded 2-core machine dropped a live agent from the rendezvous, the
# others formed a round without it, and it never replaced its stopped worker.
TORCHRUN_MAX_RESTARTS = 100
TORCHRUN_MONITOR_S = 0.1
TORCHRUN_RDZV_CONF = {"is_host": "false", "last_call_timeout": 1}
TORCHRUN_GLOO_TIMEOUT_S = 10.0
# torch 2.13: with the agent's rendezvous store shared with the workers, the first restart hung
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def torchft_missing() -> str | None:
    """Why the torchft peer cannot run here, or None."""
    try:
        import torchft  # noqa: F401
    except ImportError as e:
        return f"torchft is not installed ({e}); `pip install -e .[bench]` adds torchft 0.2.0"
    if shutil.which("torchft_lighthouse") is None and not (Path(sys.executable).parent / "torchft_lighthouse").exists():
        return "torchft is installed but its torchft_lighthouse command is not on PATH"
    return None


def torchrun_missing() -> str | None:
    """Why the torchrun peer cannot run here, or None."""
    try:
        import torch.distributed.run  # noqa: F401
    except ImportError as e:
        return f"torch is not installed ({e}); `pip install -e .[torch]`"
    return None


def descendants(pid: int) -> list[int]:
    """Every live descendant of pid, from /proc (children before grandchildren)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(0), [])
        found += kids
        todo += kids
    return found


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a process this module started (the leader of its own group), its group and every descendant."""
    pids = descendants(proc.pid) if proc.poll() is None else []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(10)


class StepLoopDeployment(Protocol):
    """What `p2pgen_lab.bench.recovery` needs of one step-loop block's processes, whichever the peer."""

    def start(self) -> None: ...

    def start_host(self, peer: str) -> None: ...

    def inject(self, kind: str, trial: int, events: Events) -> tuple[str, float]: ...

    def logs(self) -> str: ...

    def stop(self) -> None: ...


def latest(events: Events, peer: str, event: str) -> dict[str, Any]:
    """The last `event` of `peer` in the traces."""
    return max((e for e in events if e["peer"] == peer and e["event"] == event), key=lambda e: e["t"])


class Deployment:
    """One block's processes of a peer whose applications trace their pid as incarnation."""

    name = ""

    def __init__(self, workdir: Path, trace_dir: Path, step_delay: float, checkpoint_every: int,
                 detect_timeout: float) -> None:
        self.workdir, self.trace_dir = workdir, trace_dir
        self.step_delay, self.checkpoint_every, self.detect_timeout = step_delay, checkpoint_every, detect_timeout
        self.hosts: dict[str, subprocess.Popen] = {}
        self.started: list[tuple[subprocess.Popen, Path]] = []

    def _spawn(self, cmd: list[str], log_name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        log = self.workdir / f"{log_name}-{len(self.started)}.log"
        with open(log, "ab") as out:
            proc = launch.spawn(cmd, out, subprocess.STDOUT, env={**os.environ, **(env or {})})
        self.started.append((proc, log))
        return proc

    def start(self) -> None:
        raise NotImplementedError

    def start_host(self, peer: str) -> None:
        raise NotImplementedError

    def inject(self, kind: str, trial: int, events: Events) -> tuple[str, float]:
        """Inject one fault; returns (victim host, wall time of the fault). kill_agent's victim is the host of
        rank 0 (the replica or worker the others recover or rendezvous through), as p2pgen's is the Raft leader."""
        if kind == "kill_agent":
            ranks = {p: latest(events, p, "commit")["rank"] for p in PEERS}
            victim = min(PEERS, key=lambda p: len(PEERS) if ranks[p] is None else ranks[p])
            host = self.hosts[victim]
            t0 = time.time()
            kill_tree(host)
            return victim, t0
        victim = PEERS[(trial + (kind == "sigstop_app")) % len(PEERS)]
        pid = latest(events, victim, "start")["incarnation"]
        if pid not in descendants(self.hosts[victim].pid):
            raise AssertionError(f"{self.name}: {victim}'s application {pid} is not running\n{self.logs()}")
        t0 = time.time()
        os.kill(pid, signal.SIGKILL if kind == "sigkill_app" else signal.SIGSTOP)
        return victim, t0

    def logs(self) -> str:
        return "\n".join(f"--- {log.name} ---\n{log.read_text(errors='replace')[-3000:]}"
                         for _, log in self.started[-6:] if log.exists())

    def stop(self) -> None:
        for proc, _ in reversed(self.started):
            kill_tree(proc)


class TorchftDeployment(Deployment):
    """A torchft lighthouse and three hosts, each restarting its replica (see the module docstring)."""

    name = "torchft"

    def start(self) -> None:
        ports = free_control_ports(len(PEERS) + 1)
        self.lighthouse_port, self.ports = ports[-1], dict(zip(PEERS, ports))
        binary = shutil.which("torchft_lighthouse") or str(Path(sys.executable).parent / "torchft_lighthouse")
        self._spawn(
            [binary, "--bind", f"127.0.0.1:{self.lighthouse_port}",
             *(f"--{k}={v}" for k, v in TORCHFT_LIGHTHOUSE.items())], "lighthouse")
        for peer in PEERS:
            self.start_host(peer)

    def start_host(self, peer: str) -> None:
        port = self.ports[peer]
        replica = [sys.executable, "-m", "p2pgen_lab.bench.apps.torchft_loop", f"--peer={peer}",
                   f"--lighthouse=http://127.0.0.1:{self.lighthouse_port}", f"--store-port={port}",
                   f"--manager-port={port + 1}", f"--trace-dir={self.trace_dir}", f"--step-delay={self.step_delay}",
                   f"--timeout={TORCHFT_TIMEOUT_S}"]
        self.hosts[peer] = self._spawn([sys.executable, "-m", "p2pgen_lab.bench.apps.host",
                                        f"--stopped-timeout={self.detect_timeout}", "--", *replica], f"host-{peer}")


class TorchrunDeployment(Deployment):
    """Three torchrun agents of one worker each, on a rendezvous store of their own (see the module docstring)."""

    name = "torchrun"

    def start(self) -> None:
        self.store_port = free_control_ports(1)[0]
        self._spawn([sys.executable, "-m", "p2pgen_lab.bench.apps.torchrun_loop", "store", f"--port={self.store_port}"],
                    "rdzv-store")
        for peer in PEERS:
            self.start_host(peer)

    def start_host(self, peer: str) -> None:
        self.hosts[peer] = self._spawn(
            [sys.executable, "-m", "torch.distributed.run", f"--nnodes=2:{len(PEERS)}", "--nproc-per-node=1",
             f"--max-restarts={TORCHRUN_MAX_RESTARTS}", "--rdzv-backend=c10d",
             f"--rdzv-endpoint=127.0.0.1:{self.store_port}", "--rdzv-id=bench-recovery",
             "--rdzv-conf=" + ",".join(f"{k}={v}" for k, v in TORCHRUN_RDZV_CONF.items()),
             f"--monitor-interval={TORCHRUN_MONITOR_S}", "-m", "p2pgen_lab.bench.apps.torchrun_loop", "worker",
             f"--peer={peer}", f"--trace-dir={self.trace_dir}", f"--checkpoint={self.workdir / 'checkpoint.npz'}",
             f"--checkpoint-every={self.checkpoint_every}", f"--step-delay={self.step_delay}",
             f"--timeout={TORCHRUN_GLOO_TIMEOUT_S}"], f"torchrun-{peer}", env=TORCHRUN_ENV)


DEPLOYMENTS: dict[str, type[Deployment]] = {"torchft": TorchftDeployment, "torchrun": TorchrunDeployment}
MISSING = {"torchft": torchft_missing, "torchrun": torchrun_missing}


def settings_text(detect_timeout: float) -> list[str]:
    """The settings of every real peer, printed under the step-loop table."""
    lighthouse = " ".join(f"--{k} {v}" for k, v in TORCHFT_LIGHTHOUSE.items())
    return [
        f"torchft 0.2.0: torchft_lighthouse {lighthouse}; Manager(min_replica_size=2, use_async_quorum=False, "
        f"timeout=quorum_timeout=connect_timeout={TORCHFT_TIMEOUT_S:.0f} s), ProcessGroupGloo(timeout="
        f"{TORCHFT_TIMEOUT_S:.0f} s), HTTP checkpoint transport; a host restarts its replica at once and kills it "
        f"after {detect_timeout} s stopped (as a p2pgen agent does)",
        f"torchrun: --nnodes=2:3 --nproc-per-node=1 --max-restarts={TORCHRUN_MAX_RESTARTS} --rdzv-backend=c10d "
        "(its own TCPStore) --rdzv-conf=" + ",".join(f"{k}={v}" for k, v in TORCHRUN_RDZV_CONF.items()) + " "
        f"--monitor-interval={TORCHRUN_MONITOR_S}, gloo timeout {TORCHRUN_GLOO_TIMEOUT_S:.0f} s, "
        + " ".join(f"{k}={v}" for k, v in TORCHRUN_ENV.items())
        + "; a stopped worker is left to torchrun (its agent kills it when it restarts its workers)"]

"""Real agent processes on 127.0.0.1 or in the hosts of an emulated cluster, for integration tests and benchmarks.

Owns: port allocation below 32768, starting `p2pgen join` processes (inside their host when the `Cluster` has
emulated hosts: `p2pgen_lab.rigs.netns`), and stopping every process a test started, by pid (never by name),
including the applications the agents supervise. Agents are started and killed through the runtime's launcher,
`p2pgen.agent.launch`, the one `p2pgen join --local` uses.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from p2pgen.agent import launch
from p2pgen.agent.agent import PORTS_PER_AGENT
from p2pgen.agent.client import AgentClient

if TYPE_CHECKING:
    from p2pgen_lab.rigs.netns import EmulatedCluster

PORT_LOW, PORT_HIGH = 20000, 32000
HOST_PORT = 23400                # every agent's control port on an emulated host
# restart-all (torchrun's policy) rolls back to its checkpoint, or to revision 0 before the first one, by
# design: its agents let a generation resume below the certified revision at once
RESTART_ALL_AGENT_ARGS = ("--regress-wait=0", "--allow-fresh-start")


def _free(port: int) -> bool:
    """Every port of one agent is free: control (TCP and UDP), Raft, data, state, channel."""
    kinds = [(socket.SOCK_DGRAM, port)] + [(socket.SOCK_STREAM, port + k) for k in range(PORTS_PER_AGENT)]
    for kind, p in kinds:
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                return False
    return True


SERVICE_PORTS = (32100, 32768)


def port_range() -> tuple[int, int]:
    """Where tests take ports: $P2PGEN_TEST_PORTS=LOW-HIGH (runs side by side on one machine keep apart), else
    20000-32000."""
    spec = os.environ.get("P2PGEN_TEST_PORTS", "")
    if not spec:
        return PORT_LOW, PORT_HIGH
    low, _, high = spec.partition("-")
    if not (low.isdigit() and high.isdigit()
            and 1024 <= int(low) and int(low) + 10 * PORTS_PER_AGENT <= int(high) < 32768):
        raise ValueError(f"P2PGEN_TEST_PORTS={spec!r}: expected LOW-HIGH, 1024 <= LOW, LOW + 50 <= HIGH < 32768")
    return int(low), int(high)


def worker_port_range(worker: int, workers: int) -> tuple[int, int]:
    """The slice of PORT_LOW-PORT_HIGH that test worker `worker` of `workers` (pytest-xdist) takes ports from:
    disjoint slices, so a port one worker found free cannot be taken by another before its agent binds it.

    Args:
        worker: this worker's index, 0 <= worker < workers.
        workers: how many workers run side by side.

    Raises:
        ValueError: worker out of range, or too many workers for a slice of ten agents each.
    """
    width = (PORT_HIGH - PORT_LOW) // max(1, workers)
    if not 0 <= worker < workers or width < 10 * PORTS_PER_AGENT:
        raise ValueError(f"test worker {worker} of {workers}: expected 0 <= worker < workers, "
                         f"at most {(PORT_HIGH - PORT_LOW) // (10 * PORTS_PER_AGENT)} workers")
    low = PORT_LOW + worker * width
    return low, low + width


def free_control_ports(n: int) -> list[int]:
    """n control ports (each with all of its agent's ports free), below 32768, spread by pid."""
    low, high = port_range()
    start = low + (os.getpid() * 37) % max(1, high - low - 10 * PORTS_PER_AGENT)
    ports: list[int] = []
    port = start - start % PORTS_PER_AGENT
    while len(ports) < n:
        if port + PORTS_PER_AGENT <= high and _free(port):
            ports.append(port)
        port += PORTS_PER_AGENT
        if port >= high:
            port = low - low % PORTS_PER_AGENT + PORTS_PER_AGENT
    return ports


def free_service_port() -> int:
    """A free TCP port for a test's own server (a status page), in SERVICE_PORTS: below 32768 and outside
    the agents' range, so no agent another test starts meanwhile can take it (spread by pid)."""
    low, high = SERVICE_PORTS
    start = low + (os.getpid() * 7) % (high - low)
    for i in range(high - low):
        port = low + (start - low + i) % (high - low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free TCP port in {low}-{high - 1} for a test's server")


def free_local_base(n: int) -> int:
    """A first control port for `p2pgen join --local n --base-port PORT`: n agents' consecutive blocks free."""
    low, high = port_range()
    for port in free_control_ports(8 * n):
        if port + n * PORTS_PER_AGENT <= high and all(_free(port + i * PORTS_PER_AGENT) for i in range(n)):
            return port
    raise RuntimeError(f"no {n} consecutive free agent port blocks in {low}-{high}: set P2PGEN_TEST_PORTS to a "
                       "wider or quieter range")


@dataclass
class AgentProc:
    peer_id: str
    addr: str
    proc: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)


@dataclass
class Cluster:
    tmp: Path
    job: str = "itest"
    secret_file: Path = field(init=False)
    agents: dict[str, AgentProc] = field(default_factory=dict)     # latest process of each peer_id
    started: list[AgentProc] = field(default_factory=list)         # every process ever started, for cleanup
    # 2 s: a 2-core CI machine running a dozen agents and their torch applications starves a process for more
    # than 1 s now and then; a false suspicion there evicts a live member and turns a test's plan into churn.
    detect: tuple[str, ...] = ("--attach-grace=0", "--detector=fixed", "--detect-timeout=2.0", "--detect-floor=0.5",
                               "--heartbeat-interval=0.1")
    hosts: EmulatedCluster | None = None     # created by the caller: agent i of `addresses()` runs in host i

    def __post_init__(self) -> None:
        self.secret_file = self.tmp / "secret"
        self.secret_file.write_text("integration-test-secret-0123456789")
        self.secret = self.secret_file.read_bytes().strip()

    def addresses(self, n: int) -> list[str]:
        """n control addresses for agents: free ports on 127.0.0.1, or HOST_PORT on each of the first n hosts.

        Raises:
            ValueError: more addresses than the emulated cluster has hosts.
        """
        if self.hosts is None:
            return [f"127.0.0.1:{p}" for p in free_control_ports(n)]
        if n > len(self.hosts.names):
            raise ValueError(f"{n} agents need {n} emulated hosts; the cluster has {len(self.hosts.names)}")
        return [self.hosts.addr(i, HOST_PORT) for i in range(n)]

    def start(self, peer_id: str, addr: str, peers: list[str], command: list[str] | None = None,
              extra: tuple[str, ...] = (), secret_file: Path | None = None,
              env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()) -> AgentProc:
        """Start `p2pgen join` for `peer_id` at `addr`; `env` is added to this process's environment (the
        agent hands it on to its application); `prefix` runs it through another command that execs it
        (`ip netns exec NS`), so the pid is still the agent's; with emulated hosts, by default the host that
        owns `addr`."""
        if self.hosts is not None and not prefix:
            prefix = self.hosts.prefix(self.hosts.host_of(addr))
        log = self.tmp / f"{peer_id.replace('/', '_')}-{len(self.agents)}.log"
        options = ("--secret-file", str(secret_file or self.secret_file), "--local-state-dir",
                   str(self.tmp / "local-state"), *self.detect, *extra)
        cmd = launch.join_command(self.job, peer_id, addr, peers, options, command, prefix, verbose=True)
        with open(log, "ab") as out:     # the agent dies with this process, even if it is SIGKILLed
            proc = launch.spawn(cmd, out, subprocess.STDOUT, env={**os.environ, **env} if env else None)
        agent = AgentProc(peer_id, addr, proc, log)
        self.agents[peer_id] = agent
        self.started.append(agent)
        return agent

    def client(self, addr: str) -> AgentClient:
        return AgentClient(addr, self.secret, job=self.job, timeout=5.0)

    def wait(self, addr: str, predicate: Callable[[dict[str, Any]], bool], timeout: float = 20.0) -> dict[str, Any]:
        """Poll any live agent at `addr` until predicate(show()) holds."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                with self.client(addr) as c:
                    last = c.show()
                    if predicate(last):
                        return last
            except Exception as e:  # agent starting or restarting: keep polling until the deadline
                last = e
            time.sleep(0.05)
        raise AssertionError(f"condition not met within {timeout} s at {addr}; last: {last}\n{self.logs()}")

    def wait_until(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll `predicate()` until it holds; fail with `what` and every agent's log after `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.1)
        raise AssertionError(f"{what} did not happen within {timeout} s\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"--- {a.peer_id} ---\n{a.log.read_text()[-3000:]}" for a in self.agents.values()
                         if a.log.exists())

    def stop_all(self) -> None:
        """SIGKILL every agent this test started, and their applications' process groups, by pid."""
        for agent in self.started:
            if agent.alive():
                launch.kill_group(agent.proc, wait_s=10)   # the agent leads its own session/group


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (Linux /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def active(show: dict[str, Any]) -> dict[str, Any] | None:
    return show["state"]["active"]


def active_members(show: dict[str, Any]) -> list[tuple[str, int]]:
    cert = active(show)
    return [(m["peer_id"], m["incarnation"]) for m in cert["members"]] if cert else []

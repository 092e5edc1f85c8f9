"""Network partitions as an injectable fault: which agent may not send to which, read from a file every process watches.

Owns: the partition rules (`Rules`: directed pairs of agents whose traffic is dropped), their file format, the
watcher that reloads them at run time, and the one question every hook asks: `blocked(src, dst)`.

How it is used. A process started with `$P2PGEN_FAULTS=PATH` (an agent, and through its environment the application
it supervises) watches PATH; while the file says `{"drop": [["A", "B"], ...]}`, traffic from agent A to agent B is
dropped by p2pgen itself:
- Raft (`raft/transport.py`): messages A->B are not sent by A and not delivered at B (the TCP link stays up;
  the messages are lost, as in a black-holed route), so one direction can be cut alone;
- UDP heartbeats (`agent/heartbeat.py`): A does not send to B, B ignores what arrives from A;
- data plane (`transport/`) and agent-to-agent RPC (`agent/rpc.py`): TCP needs both directions, so a connection
  between A and B is refused while either direction is cut, and an open data-plane link fails on its next frame.
Writing `{"drop": []}` (or removing the file) heals. `write_partition` / `heal` write the file atomically;
`p2pgen fault partition|heal` does the same from the shell.

An agent is named by its control address HOST:PORT; all of its ports (control, Raft, data, state, channel) are
PORT..PORT+AGENT_PORT_SPAN-1 on the same host (see `agent.agent.PORT_OFFSETS`), so any address a hook sees maps back
to its agent. A process that has no address of its own in a hook (a non-voting Raft node, an RPC client) uses
its local agent: `$P2PGEN_AGENT` (set for applications) or `set_local_agent` (called by the agent).
Invariants kept: with no `$P2PGEN_FAULTS` nothing is ever dropped and no file is read; traffic within one agent
(an application and its own agent) is never dropped; a rule change is seen within `RELOAD_S` by every process.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

ENV = "P2PGEN_FAULTS"
ENV_LOCAL_AGENT = "P2PGEN_AGENT"
AGENT_PORT_SPAN = 5          # == len(agent.agent.PORT_OFFSETS); checked by tests/test_faults.py
RELOAD_S = 0.05


def split(addr: str) -> tuple[str, int]:
    host, colon, port = addr.rpartition(":")
    if not (colon and host and port.isdigit()):
        raise ValueError(f"{addr!r} is not an agent address (expected HOST:PORT, the agent's --listen)")
    return host, int(port)


@dataclass(frozen=True)
class Rules:
    """Directed pairs (from agent, to agent) whose traffic is dropped; agents by control address."""

    drop: frozenset[tuple[str, str]] = frozenset()
    _agents: dict[str, list[int]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        by_host: dict[str, list[int]] = {}
        for pair in self.drop:
            for addr in pair:
                host, port = split(addr)
                by_host.setdefault(host, []).append(port)
        for host, ports in by_host.items():
            ports = sorted(set(ports))
            for a, b in zip(ports, ports[1:]):
                if b - a < AGENT_PORT_SPAN:
                    raise ValueError(f"agents {host}:{a} and {host}:{b} are closer than {AGENT_PORT_SPAN} ports: "
                                     "their port blocks overlap, so a partition rule cannot tell them apart")
            self._agents[host] = ports

    def agent_of(self, addr: str) -> str | None:
        """The agent (among those named in the rules) that owns the address `addr`, or None."""
        try:
            host, port = split(addr)
        except ValueError:
            return None
        for base in self._agents.get(host, ()):
            if 0 <= port - base < AGENT_PORT_SPAN:
                return f"{host}:{base}"
        return None

    def blocked(self, src: str | None, dst: str | None) -> bool:
        """Is traffic from the address `src` to the address `dst` dropped? (either None: no)"""
        if not self.drop or src is None or dst is None:
            return False
        a, b = self.agent_of(src), self.agent_of(dst)
        return a is not None and b is not None and a != b and (a, b) in self.drop

    def to_json(self) -> dict:
        return {"drop": sorted([list(p) for p in self.drop])}

    @classmethod
    def from_json(cls, data: object) -> Rules:
        if not isinstance(data, dict) or not isinstance(data.get("drop", []), list):
            raise ValueError(f"partition rules must be a JSON object {{\"drop\": [[FROM, TO], ...]}}, got {data!r}")
        pairs = []
        for pair in data.get("drop", []):
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(a, str) for a in pair)):
                raise ValueError(f"a drop rule is [FROM_AGENT, TO_AGENT] (two HOST:PORT strings), got {pair!r}")
            pairs.append((pair[0], pair[1]))
        return cls(frozenset(pairs))


def partition(sides: Iterable[Iterable[str]], one_way: bool = False) -> Rules:
    """Rules that cut the first side off the others: both directions, or (`one_way`) only what the first side
    sends to the others (the first side still hears them). With more than two sides and not one-way, every
    side is cut from every other."""
    groups = [list(s) for s in sides]
    if len(groups) < 2 or any(not g for g in groups):
        raise ValueError(f"a partition needs at least two non-empty sides, got {groups}")
    seen = [a for g in groups for a in g]
    if len(set(seen)) != len(seen):
        raise ValueError(f"an agent is on two sides of the partition: {groups}")
    drop = set()
    for i, gi in enumerate(groups):
        for j, gj in enumerate(groups):
            if i != j and (not one_way or i == 0):
                drop |= {(a, b) for a in gi for b in gj}
    return Rules(frozenset(drop))


def write_rules(path: str | os.PathLike, rules: Rules) -> None:
    """Replace the rules file atomically (a watcher never reads half a file)."""
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(rules.to_json(), f)
    os.replace(tmp, path)


def write_partition(path: str | os.PathLike, sides: Iterable[Iterable[str]], one_way: bool = False) -> Rules:
    rules = partition(sides, one_way)
    write_rules(path, rules)
    return rules


def heal(path: str | os.PathLike) -> None:
    write_rules(path, Rules())


def read_rules(path: str | os.PathLike) -> Rules:
    """The rules in `path`; no file means no rules. ValueError saying what is wrong for a bad file."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return Rules()
    try:
        return Rules.from_json(json.loads(text))
    except json.JSONDecodeError as e:
        raise ValueError(f"partition rules file {path} is not JSON ({e}); write it with "
                         "p2pgen.faults.write_rules") from None


class Watcher:
    """The rules of one file, re-read when its mtime or size changes, looked at most every `interval` s."""

    def __init__(self, path: str, interval: float = RELOAD_S) -> None:
        self.path, self.interval = path, interval
        self._lock = threading.Lock()
        self._rules = Rules()
        self._stamp: tuple[int, int] | None = None
        self._next = 0.0

    def rules(self) -> Rules:
        now = time.monotonic()
        if now < self._next:
            return self._rules
        with self._lock:
            self._next = now + self.interval
            try:
                st = os.stat(self.path)
                stamp = (st.st_mtime_ns, st.st_size)
            except FileNotFoundError:
                stamp = None
            if stamp != self._stamp:
                try:
                    self._rules = read_rules(self.path)
                    self._stamp = stamp
                except ValueError:     # half-written by a foreign tool: keep the old rules, read again next time
                    pass
            return self._rules


_watcher: Watcher | None = Watcher(os.environ[ENV]) if os.environ.get(ENV) else None
_local_agent: str | None = os.environ.get(ENV_LOCAL_AGENT) or None


def watch(path: str | None, interval: float = RELOAD_S) -> None:
    """Watch `path` for rules from now on (None: stop; nothing is dropped). `$P2PGEN_FAULTS` does this at import;
    `interval` 0 re-checks the file at every question (tests that change rules and look at once)."""
    global _watcher
    _watcher = Watcher(path, interval) if path else None


def set_local_agent(addr: str | None) -> None:
    """The agent this process belongs to (the agent itself calls this with its control address)."""
    global _local_agent
    _local_agent = addr


def local_agent() -> str | None:
    return _local_agent


def blocked(src: str | None, dst: str | None) -> bool:
    """Is traffic from `src` to `dst` (any HOST:PORT of an agent; None: this process's agent) dropped now?"""
    w = _watcher
    if w is None:
        return False
    return w.rules().blocked(src or _local_agent, dst or _local_agent)


def cut(a: str | None, b: str | None) -> bool:
    """Is either direction between `a` and `b` dropped? (a TCP connection needs both)"""
    return blocked(a, b) or blocked(b, a)


def refuse_connect(dst: str, src: str | None = None) -> None:
    """Raise ConnectionRefusedError when a TCP connection from `src` (default: this process's agent) to `dst`
    crosses a cut link."""
    if cut(src, dst):
        raise ConnectionRefusedError(f"partitioned from {dst} (fault injected through ${ENV})")


# --- `p2pgen fault partition | heal` ----------------------------------------------------------------------


def add_commands(sub) -> None:
    p = sub.add_parser("fault", help="inject a network partition into agents started with $P2PGEN_FAULTS")
    kinds = p.add_subparsers(dest="fault", required=True, metavar="KIND")
    part = kinds.add_parser("partition", help="cut the first --side off the others (both ways, or --one-way)")
    part.add_argument("file", help="the rules file the agents watch ($P2PGEN_FAULTS)")
    part.add_argument("--side", action="append", required=True, metavar="AGENT,AGENT,...",
                      help="agents (control HOST:PORT) of one side; give --side at least twice")
    part.add_argument("--one-way", action="store_true",
                      help="drop only what the first side sends to the others (it still hears them)")
    part.set_defaults(func=_cmd_partition)
    h = kinds.add_parser("heal", help="drop nothing any more")
    h.add_argument("file", help="the rules file the agents watch ($P2PGEN_FAULTS)")
    h.set_defaults(func=_cmd_heal)


def _cmd_partition(args) -> int:
    sides = [[a.strip() for a in side.split(",") if a.strip()] for side in args.side]
    try:
        rules = write_partition(args.file, sides, args.one_way)
    except ValueError as e:
        raise SystemExit(f"p2pgen fault partition: {e}") from None
    print(f"partitioned: {len(rules.drop)} directed agent pairs dropped (rules in {args.file})")
    return 0


def _cmd_heal(args) -> int:
    heal(args.file)
    print(f"healed: nothing is dropped (rules in {args.file})")
    return 0


# --- what a partition must not do: the check `p2pgen chaos` and `p2pgen stress` apply -----------------------

IN_FLIGHT_S = 0.5            # a step whose frames were all sent before the cut may still be logged this late


@dataclass(frozen=True)
class Window:
    """One partition as it happened: wall times of the cut and of the heal, and its minority side."""

    cut: float
    healed: float
    agents: frozenset[str]           # control addresses of the minority's agents
    peers: frozenset[str]            # their peer ids
    one_way: bool = False


def minority_violations(windows: Iterable[Window], commits: Iterable[tuple[float, str]],
                        leaders: Iterable[tuple[float, str]]) -> list[str]:
    """Evidence that a minority side made progress of its own while it was cut off, one line per finding:
    a step committed by a minority peer (`commits`: (wall time, peer id)) or a Raft leader elected on a minority
    agent (`leaders`: (wall time, agent address), the traces' `leader` records) between the cut (plus
    IN_FLIGHT_S) and the heal. Empty: the minority activated and committed nothing."""
    out = []
    commits, leaders = list(commits), list(leaders)
    for w in windows:
        side = "one-way" if w.one_way else "symmetric"
        for t, peer in commits:
            if peer in w.peers and w.cut + IN_FLIGHT_S < t < w.healed:
                out.append(f"minority peer {peer} committed a step {t - w.cut:.2f} s into a {side} partition")
        for t, agent in leaders:
            if agent in w.agents and w.cut + IN_FLIGHT_S < t < w.healed:
                out.append(f"minority agent {agent} became Raft leader {t - w.cut:.2f} s into a {side} partition")
    return out

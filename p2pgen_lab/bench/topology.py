"""Topology benchmark: all_reduce on a zoned emulated cluster, in join order beside the topology-aware paths.

One worker process per host of an emulated cluster (`p2pgen_lab.rigs.netns`; default: two zones alternating, h0 h2
... in zone a and h1 h3 ... in zone b, 10 Gbit/s inside a zone and 200 Mbit/s between, so that the join order
h0 h1 h2 ... crosses zones at every hop). First every worker measures the links from its host to the others with
the agents' own probe (`p2pgen.agent.probe.measure`, over the authenticated control RPC), and `core.topology.
ring_order` turns the measured matrix into a rank order and groups, as the agents' Raft state would. Then four
communicators of the same hosts take turns on every size, `rounds` rounds of each (who goes first rotates):
- `join ring`: the flat TCP ring in join order (the baseline);
- `topology ring`: the flat ring in the measured order;
- `hierarchical`: that order with the hierarchical all_reduce the certificate would ask for (equal zones:
  reduce-scatter in the zone, all_reduce of each slice across zones, all-gather);
- `leaders`: the same with one leader per zone (all_reduce in the zone, across leaders, broadcast).
A round's time is the slowest rank's mean; a size's time is the median over its rounds; the ratio is the join
ring's time over the variant's, with its min..max over the rounds (both from the same rounds). float32 SUM.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from p2pgen_lab.bench.allreduce import stop_workers

if TYPE_CHECKING:
    from p2pgen.core.model import Topology
    from p2pgen_lab.rigs.netns import EmulatedCluster
    from p2pgen_lab.rigs.netns import Topology as Shape

JOB = "bench-topology"
PROBE_PORT = 23500                 # every host is its own namespace: fixed ports do not collide
VARIANTS = ("join ring", "topology ring", "hierarchical", "leaders")
ROUNDS = 5
DEFAULT_SHAPE = ("10gbit", "200mbit")


@dataclass
class Row:
    size: int
    seconds: dict[str, float]                                    # variant -> median seconds per call
    ratios: dict[str, tuple[float, float, float]] = field(default_factory=dict)   # median, min, max vs join ring


@dataclass
class Result:
    hosts: list[str]                       # the hosts' addresses, in join order (h0, h1, ...)
    rates: dict[tuple[str, str], float]    # measured Mbit/s, (from, to)
    order: list[int]                       # host indexes in the topology order
    groups: list[list[int]]                # host indexes of each group, as ranked
    groups_from: str                       # "measured", or "topology file" when the matrix showed one group
    topology: Topology | None
    rows: list[Row]


def default_shape(hosts: int) -> Shape:
    """Two zones alternating (even hosts in `a`, odd in `b`), 10 Gbit/s inside, 200 Mbit/s between."""
    from p2pgen_lab.rigs.netns import parse_topology

    zones = "\n".join(f"zone {name} " + " ".join(f"h{i}" for i in range(first, hosts, 2))
                      for name, first in (("a", 0), ("b", 1)))
    return parse_topology(f"intra {DEFAULT_SHAPE[0]}\ninter {DEFAULT_SHAPE[1]}\n{zones}\n", hosts, "default")


def iterations(size: int) -> int:
    return max(2, min(20, (32 << 20) // max(size, 1)))


def run(cluster: EmulatedCluster, sizes: list[int], iters: int = 0, rounds: int = ROUNDS,
        chunk_bytes: int = 1 << 20) -> Result:
    """Probe, order, then time every variant on every size (see the module docstring).

    Args:
        cluster: an emulated cluster already created (at least 4 hosts for two zones of two).
    Raises:
        ValueError: the measured order or the cluster's zones give no two groups of two hosts.
    """
    workers = _Workers(cluster, chunk_bytes)
    try:
        rates = workers.probe()
        result = _plan(cluster, rates)
        workers.connect(result)
        result.rows = [_measure(workers, size, iters or iterations(size), rounds) for size in sizes]
        return result
    finally:
        workers.close()


def _plan(cluster: EmulatedCluster, rates: dict[tuple[str, str], float]) -> Result:
    from p2pgen.core.model import Member
    from p2pgen.core.topology import ring_order

    addrs = cluster.addrs
    members = tuple(Member(f"h{i}", 1, (("data", f"{a}:{PROBE_PORT}"),)) for i, a in enumerate(addrs))
    order, topology = ring_order(members, rates)
    index = [int(m.peer_id[1:]) for m in order]
    groups = [[int(p[1:]) for p in peers] for _, peers in topology.groups] if topology else []
    source = "measured"
    if len(groups) < 2 or min(len(g) for g in groups) < 2:
        shape = cluster.topology
        zones = list(shape.zones.values()) if shape is not None else []
        if len(zones) < 2 or min(len(z) for z in zones) < 2:
            raise ValueError("the topology benchmark needs two or more zones of two or more hosts")
        index, groups, source = [h for z in zones for h in z], [list(z) for z in zones], "topology file"
    return Result(list(addrs), rates, index, groups, source, topology, [])


def _measure(workers: _Workers, size: int, iters: int, rounds: int) -> Row:
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for k in range(rounds):
        turn = VARIANTS[k % len(VARIANTS):] + VARIANTS[:k % len(VARIANTS)]
        for variant in turn:
            times[variant].append(workers.time(variant, size, iters))
    row = Row(size, {v: statistics.median(t) for v, t in times.items()})
    for v in VARIANTS:
        each = [j / t for j, t in zip(times["join ring"], times[v])]
        row.ratios[v] = (row.seconds["join ring"] / row.seconds[v], min(each), max(each))
    return row


def format_report(result: Result, where: str) -> str:
    """The benchmark's text: the measured matrix, the orders and why, and the table of times and ratios."""
    hosts = result.hosts
    name = {a: f"h{i}" for i, a in enumerate(hosts)}
    lines = [f"# all_reduce float32 sum on {where}", "# measured links (Mbit/s, from row to column):",
             "#   " + " " * 4 + "".join(f"{name[h]:>9}" for h in hosts)]
    for a in hosts:
        cells = ("-" if a == b else f"{result.rates.get((a, b), 0):.0f}" for b in hosts)
        lines.append(f"#   {name[a]:<4}" + "".join(f"{c:>9}" for c in cells))
    lines.append(f"# join order:     {' '.join(f'h{i}' for i in range(len(hosts)))}")
    reason = result.topology.reason if result.topology else "nothing measured"
    lines.append(f"# topology order: {' '.join(f'h{i}' for i in result.order)} ({reason})")
    lines.append(f"# groups ({result.groups_from}): " + "; ".join(" ".join(f"h{i}" for i in g) for g in result.groups))
    head = f"# {'size(B)':>10} " + "".join(f"{v + ' (ms)':>20}" for v in VARIANTS) + "".join(
        f"{'join/' + v:>28}" for v in VARIANTS[1:])
    lines.append(head)
    for r in result.rows:
        cells = "".join(f"{r.seconds[v] * 1e3:>20.1f}" for v in VARIANTS)
        ratios = "".join(f"{f'{m:.2f} ({lo:.2f}..{hi:.2f})':>28}" for m, lo, hi in (r.ratios[v] for v in VARIANTS[1:]))
        lines.append(f"  {r.size:>10} {cells}{ratios}")
    lines.append("# join/x: the join-order ring's time over x's (median of the rounds, then min..max of each round's); "
                 "the topology-aware all_reduce must reach 1.8")
    return "\n".join(lines)


def to_json(result: Result) -> str:
    data = asdict(result)
    data["rates"] = [{"from": a, "to": b, "mbps": r} for (a, b), r in sorted(result.rates.items())]
    data["topology"] = result.topology.to_json() if result.topology else None
    return json.dumps(data, indent=2)


# ---- workers -------------------------------------------------------------------------------------
class _Workers:
    """One worker process per host, idle between the calls it is told to time."""

    def __init__(self, cluster: EmulatedCluster, chunk_bytes: int) -> None:
        ctx = mp.get_context("spawn")
        self.pipes, self.procs = [], []
        try:
            for i, (ns, addr) in enumerate(zip(cluster.names, cluster.addrs)):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_worker, args=(child, i, ns, addr, list(cluster.addrs), chunk_bytes),
                                daemon=True)
                p.start()
                self.pipes.append(parent)
                self.procs.append(p)
            for pipe in self.pipes:
                _expect(pipe.recv(), "listening")
        except BaseException:
            self.close()
            raise

    def probe(self) -> dict[tuple[str, str], float]:
        for pipe in self.pipes:
            pipe.send("probe")
        rates: dict[tuple[str, str], float] = {}
        for pipe in self.pipes:
            rates.update(_expect(pipe.recv(), "rates"))
        return rates

    def connect(self, result: Result) -> None:
        plans = {"join ring": (list(range(len(self.pipes))), None, False),
                 "topology ring": (result.order, None, False),
                 "hierarchical": (result.order, result.groups, False),
                 "leaders": (result.order, result.groups, True)}
        for pipe in self.pipes:
            pipe.send(plans)
        ports = [_expect(pipe.recv(), "ports") for pipe in self.pipes]
        for pipe in self.pipes:
            pipe.send(ports)
        for pipe in self.pipes:
            _expect(pipe.recv(), "connected")

    def time(self, variant: str, size: int, iters: int) -> float:
        for pipe in self.pipes:
            pipe.send((variant, size, iters))
        return max(_expect(pipe.recv(), "seconds") for pipe in self.pipes)

    def close(self) -> None:
        stop_workers(self.pipes, self.procs)


def _expect(message: Any, what: str) -> Any:
    kind, value = message
    if kind == "error":
        raise RuntimeError(f"a topology benchmark worker failed: {value}")
    if kind != what:
        raise RuntimeError(f"a topology benchmark worker sent {kind!r}, expected {what!r}")
    return value


def _worker(pipe, index: int, netns_name: str, addr: str, addrs: list[str], chunk_bytes: int) -> None:
    from p2pgen_lab.rigs.netns import enter

    enter(netns_name)
    try:
        _serve(pipe, index, addr, addrs, chunk_bytes)
    except Exception as e:          # reported to the parent, which raises it
        pipe.send(("error", f"host h{index}: {e!r}"))


def _serve(pipe, index: int, addr: str, addrs: list[str], chunk_bytes: int) -> None:
    import numpy as np

    from p2pgen.agent.probe import measure, serve_probe
    from p2pgen.agent.rpc import RpcServer
    from p2pgen.testing.cluster import SECRET

    server = RpcServer(addr, PROBE_PORT, JOB, SECRET, {"probe": serve_probe})
    server.start()
    backends: dict[str, Any] = {}
    transports: list[Any] = []
    try:
        pipe.send(("listening", None))
        if pipe.recv() != "probe":
            return
        pipe.send(("rates", {(addr, other): measure(f"{other}:{PROBE_PORT}", SECRET, JOB)
                             for other in addrs if other != addr}))
        plans = pipe.recv()
        backends, transports = _backends(pipe, index, addr, addrs, plans, chunk_bytes)
        while (job := pipe.recv()) is not None:
            variant, size, iters = job
            pipe.send(("seconds", _time(backends[variant], np.zeros(size // 4, np.float32), iters)))
    finally:
        for t in transports:
            t.close()
        server.stop()


def _backends(pipe, index: int, addr: str, addrs: list[str], plans: dict, chunk_bytes: int):
    from p2pgen.collectives import TcpBackend, hierarchical
    from p2pgen.testing.cluster import SECRET
    from p2pgen.testing.ports import open_transport
    from p2pgen.transport import Endpoint, Group, TransportConfig

    config = TransportConfig(chunk_bytes=chunk_bytes, max_frame_bytes=max(16 << 20, chunk_bytes))
    transports = {v: open_transport(JOB, SECRET, f"h{index}", k + 1, config, host=addr)
                  for k, v in enumerate(VARIANTS)}
    pipe.send(("ports", {v: t.port for v, t in transports.items()}))
    ports = pipe.recv()
    backends = {}
    for variant, (order, groups, leaders_only) in plans.items():
        members = [Endpoint(f"h{h}", VARIANTS.index(variant) + 1, addrs[h], ports[h][variant]) for h in order]
        backend = TcpBackend(transports[variant], Group(JOB, 1, members, order.index(index)))
        if groups is not None:
            rank = {h: r for r, h in enumerate(order)}
            hierarchical.attach(backend, [[rank[h] for h in g] for g in groups], leaders_only=leaders_only)
        backend.connect()
        backends[variant] = backend
    pipe.send(("connected", None))
    return backends, list(transports.values())


def _time(backend: Any, buf: Any, iters: int) -> float:
    import numpy as np

    backend.all_reduce(buf)                     # warm-up (and the hierarchy's subgroups)
    backend.all_reduce(np.zeros(1, np.float32))  # line the ranks up
    t0 = time.perf_counter()
    for _ in range(iters):
        backend.all_reduce(buf)
    return (time.perf_counter() - t0) / iters

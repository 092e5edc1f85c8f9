"""An emulated cluster: hosts as Linux network namespaces on one bridge, with shaped links, cuts and partitions.

Owns: the namespaces, veth pairs and bridge of one cluster, the address plan (one private /24 per cluster, host i at
.i+1, the root namespace at .254 so a harness reaches every host), the shaping of every link (one rate for all, or
zones from a topology file: an intra-zone and an inter-zone rate, through htb classes per destination address), and
the network faults a host can suffer from its own tools: its link down and up (`cut`/`heal`), and routes to another
group of hosts black-holed (`partition`/`heal_partition`).

Processes run inside a host through `prefix(i)` (`ip netns exec NAME`, which execs the command, so a pid is still
the command's) or, for a worker already started (a multiprocessing child), `enter(name)` (setns on the current
thread, before it opens any socket).

Invariants: everything `create` makes, `remove` removes (and a `create` that fails half-way removes what it made);
every name carries the creating process's pid and a per-process counter, so two clusters never collide and the
leftovers of a run that was killed are found (`remove_stale`) and removed; the only addresses involved are the
cluster's own /24 inside its own namespaces. This is lab equipment: the runtime never imports it.
"""

from __future__ import annotations

import ctypes
import ipaddress
import itertools
import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

NETNS_DIR = Path("/var/run/netns")
CLONE_NEWNET = 0x40000000
_counter = itertools.count()
_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|tbit)$", re.IGNORECASE)
_UNIT = {"bit": 1, "kbit": 10 ** 3, "mbit": 10 ** 6, "gbit": 10 ** 9, "tbit": 10 ** 12}
_NAME = re.compile(r"^p2p(\d+)[a-z]+h\d+$")       # a host namespace: p2p<pid><cluster letters>h<i>


class ClusterError(RuntimeError):
    """An emulated cluster could not be made or changed (the message says which command failed and why)."""


class TopologyError(ValueError):
    """A topology file is malformed or names hosts the cluster does not have (the message gives the line)."""


def parse_rate(text: str) -> int:
    """Bits per second of a tc-style rate.

    Args:
        text: like "1gbit", "200mbit", "2.5gbit".
    Raises:
        ValueError: not such a rate.
    """
    m = _RATE.match(text.strip())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"rate {text!r}: give a positive number with a unit, like 200mbit, 1gbit or 10gbit")
    return int(float(m.group(1)) * _UNIT[m.group(2).lower()])


def format_rate(bits: int) -> str:
    """A rate as tc writes it back, largest whole unit: 1000000000 -> "1gbit"."""
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bits % _UNIT[unit] == 0:
            return f"{bits // _UNIT[unit]}{unit}"
    return f"{bits}bit"


@dataclass(frozen=True)
class Topology:
    """Zones of hosts (by index) and the rate of a link between two hosts: `intra` inside a zone, `inter` between
    zones unless a `link` line set that pair of zones."""

    zones: dict[str, tuple[int, ...]]
    intra: int
    inter: int
    links: dict[frozenset[str], int] = field(default_factory=dict)

    @classmethod
    def uniform(cls, hosts: int, rate: int) -> Topology:
        """Every link at `rate`: one zone holding every host."""
        return cls({"all": tuple(range(hosts))}, rate, rate)

    @property
    def hosts(self) -> int:
        return sum(len(h) for h in self.zones.values())

    def zone_of(self, host: int) -> str:
        return next(z for z, members in self.zones.items() if host in members)

    def rate(self, a: int, b: int) -> int:
        """Bits per second from host a to host b."""
        za, zb = self.zone_of(a), self.zone_of(b)
        if za == zb:
            return self.intra
        return self.links.get(frozenset((za, zb)), self.inter)

    def is_uniform(self) -> bool:
        n = self.hosts
        return len({self.rate(a, b) for a in range(n) for b in range(n) if a != b} or {0}) == 1

    def describe(self) -> str:
        if self.is_uniform():
            return f"{self.hosts} hosts, every link {format_rate(self.intra)}"
        zones = "; ".join(f"zone {z}: hosts {', '.join(f'h{i}' for i in m)}" for z, m in self.zones.items())
        extra = "".join(f"; {' <-> '.join(sorted(p))} {format_rate(r)}" for p, r in self.links.items())
        return f"{zones}; intra-zone {format_rate(self.intra)}, inter-zone {format_rate(self.inter)}{extra}"


def parse_topology(text: str, hosts: int, source: str = "topology") -> Topology:
    """A topology from its file format, one statement per line (`#` starts a comment):

        intra 10gbit          # rate between two hosts of one zone
        inter 200mbit         # rate between hosts of two zones
        zone east h0 h1       # a zone and its hosts (h0..h<N-1>, or 0..N-1); every host in exactly one zone
        zone west h2 h3
        link east west 1gbit  # optional: the rate between two particular zones

    Args:
        text: the file's content.
        hosts: how many hosts the cluster has.
        source: the file's name, for messages.
    Raises:
        TopologyError: "<source>:<line>: <what is wrong>" (or without a line for what is missing).
    """
    rates: dict[str, int] = {}
    zones: dict[str, tuple[int, ...]] = {}
    links: dict[frozenset[str], int] = {}
    placed: dict[int, str] = {}
    link_lines: list[tuple[int, str, str]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{source}:{number}"
        keyword, args = words[0].lower(), words[1:]
        if keyword in ("intra", "inter"):
            if len(args) != 1:
                raise TopologyError(f"{where}: `{keyword} RATE` takes one rate, got {len(args)} words")
            rates[keyword] = _rate_at(args[0], where)
        elif keyword == "zone":
            if len(args) < 2:
                raise TopologyError(f"{where}: `zone NAME HOST...` needs a name and at least one host")
            name = args[0]
            if name in zones:
                raise TopologyError(f"{where}: zone {name!r} is defined twice")
            members = tuple(_host_at(h, hosts, where) for h in args[1:])
            for h in members:
                if h in placed:
                    raise TopologyError(f"{where}: host h{h} is already in zone {placed[h]!r}")
                placed[h] = name
            zones[name] = members
        elif keyword == "link":
            if len(args) != 3:
                raise TopologyError(f"{where}: `link ZONE ZONE RATE` takes two zones and a rate")
            links[frozenset(args[:2])] = _rate_at(args[2], where)
            link_lines.append((number, args[0], args[1]))
        else:
            raise TopologyError(f"{where}: unknown statement {words[0]!r} (expected intra, inter, zone or link)")
    missing = [h for h in range(hosts) if h not in placed]
    if missing:
        raise TopologyError(f"{source}: hosts {', '.join(f'h{h}' for h in missing)} are in no zone "
                            f"(the cluster has {hosts} hosts: h0..h{hosts - 1})")
    for key in ("intra", "inter"):
        if key not in rates and (key == "intra" or len(zones) > 1):
            raise TopologyError(f"{source}: no `{key} RATE` line")
    for number, a, b in link_lines:
        for z in (a, b):
            if z not in zones:
                raise TopologyError(f"{source}:{number}: `link` names zone {z!r}, which no `zone` line defines")
        if a == b:
            raise TopologyError(f"{source}:{number}: `link` needs two different zones (inside one: `intra`)")
    return Topology(zones, rates["intra"], rates.get("inter", rates["intra"]), links)


def _rate_at(text: str, where: str) -> int:
    try:
        return parse_rate(text)
    except ValueError as e:
        raise TopologyError(f"{where}: {e}") from None


def _host_at(text: str, hosts: int, where: str) -> int:
    digits = text[1:] if text[:1].lower() == "h" else text
    if not digits.isdigit():
        raise TopologyError(f"{where}: {text!r} is not a host (write h0..h{hosts - 1})")
    if int(digits) >= hosts:
        raise TopologyError(f"{where}: host {text!r} does not exist: the cluster has {hosts} hosts "
                            f"(h0..h{hosts - 1})")
    return int(digits)


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise ClusterError(f"`{' '.join(args)}` failed: {done.stderr.strip() or f'exit code {done.returncode}'}")
    return done


def unavailable() -> str | None:
    """Why an emulated cluster cannot be made on this machine (a sentence), or None when it can."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "the `ip` and `tc` tools (iproute2) are not installed"
    probe = f"p2p{os.getpid()}zh0"
    made = _run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` is not permitted here ({made.stderr.strip() or made.returncode}): run as root " \
               "or with CAP_NET_ADMIN"
    try:
        veth = _run("ip", "-n", probe, "link", "add", "a0", "type", "veth", "peer", "name", "b0", check=False)
        if veth.returncode != 0:
            return f"cannot create a veth pair: {veth.stderr.strip()}"
        qdisc = _run("ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "a0", "root", "tbf", "rate",
                     "1gbit", "burst", "128k", "latency", "50ms", check=False)
        if qdisc.returncode != 0:
            return f"the tbf qdisc is not available: {qdisc.stderr.strip()}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return None


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def remove_stale() -> list[str]:
    """Remove the namespaces and bridges of clusters whose creating process is gone; the names removed."""
    removed = []
    names = [p.name for p in NETNS_DIR.iterdir()] if NETNS_DIR.is_dir() else []
    for name in names:
        m = _NAME.match(name)
        if m and not _pid_alive(int(m.group(1))):
            _run("ip", "netns", "del", name, check=False)
            removed.append(name)
    links = _run("ip", "-o", "link", "show", "type", "bridge", check=False).stdout
    for bridge in re.findall(r"^\d+: (p2pb(\d+)[a-z]+)[:@]", links, re.MULTILINE):
        if not _pid_alive(int(bridge[1])):
            _run("ip", "link", "del", bridge[0], check=False)
            removed.append(bridge[0])
    return removed


def _letters(n: int) -> str:
    out = ""
    while True:
        out = chr(ord("a") + n % 26) + out
        n = n // 26 - 1
        if n < 0:
            return out


def _free_subnet() -> ipaddress.IPv4Network:
    used = _run("ip", "-o", "-4", "addr", "show", check=False).stdout + _run("ip", "-4", "route", check=False).stdout
    taken = {ipaddress.ip_network(f"{a}/24", strict=False) for a in re.findall(r"(10\.\d+\.\d+\.\d+)", used)}
    base = 214 + os.getpid() % 40
    for second, third in itertools.product(list(range(base, 254)) + list(range(214, base)), range(256)):
        net = ipaddress.ip_network(f"10.{second}.{third}.0/24")
        if net not in taken:
            return net
    raise ClusterError("no free 10.214-253.x.0/24 subnet for the cluster")


def enter(name: str) -> None:
    """Move the calling thread (in practice: a freshly started single-threaded worker process) into network
    namespace `name`; sockets opened afterwards live there.

    Raises:
        ClusterError: the namespace does not exist or setns is refused.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        fd = os.open(NETNS_DIR / name, os.O_RDONLY)
    except OSError as e:
        raise ClusterError(f"network namespace {name!r} not found: {e}") from None
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise ClusterError(f"setns into {name!r} failed: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def _burst(bits: int) -> int:
    """Bucket bytes for a shaper at `bits`/s: 1 ms of traffic, and never below two GSO packets (veth hands tc
    segments of up to 64 KiB: a bucket smaller than one drops it)."""
    return max(bits // 8 // 1000, 128 << 10)


class EmulatedCluster:
    """`hosts` emulated hosts: namespace `names[i]` with interface eth0 at `addrs[i]` on one bridge, links shaped
    by `topology` (None: unshaped). Use as a context manager, or call `create()` and, in `finally`, `remove()`."""

    def __init__(self, hosts: int, topology: Topology | None = None) -> None:
        if hosts < 1:
            raise ValueError("an emulated cluster needs at least one host")
        if topology is not None and topology.hosts != hosts:
            raise ValueError(f"the topology places {topology.hosts} hosts, the cluster has {hosts}")
        self.topology = topology
        tag = f"{os.getpid()}{_letters(next(_counter))}"
        self.names = [f"p2p{tag}h{i}" for i in range(hosts)]
        self.bridge = f"p2pb{tag}"
        self._veths = [f"p2pv{tag}h{i}" for i in range(hosts)]
        if len(self._veths[-1]) > 15:
            raise ClusterError(f"interface name {self._veths[-1]!r} is over 15 characters: fewer hosts")
        self.addrs: list[str] = []
        self.gateway = ""
        self._made = False
        self._blackholes: list[tuple[int, str]] = []
        self._down: set[int] = set()

    def __enter__(self) -> EmulatedCluster:
        self.create()
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"EmulatedCluster({len(self.names)} hosts, bridge {self.bridge}, {self.gateway}/24)"

    def create(self) -> None:
        """Make the bridge, the hosts and their shaping.

        Raises:
            ClusterError: a command failed (what was made is removed first).
        """
        remove_stale()
        net = _free_subnet()
        self.addrs = [str(net.network_address + i + 1) for i in range(len(self.names))]
        self.gateway = str(net.network_address + 254)
        self._made = True
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
            for i in range(len(self.names)):
                self._make_host(i)
            if self.topology is not None:
                for i in range(len(self.names)):
                    self._shape(i)
        except BaseException:
            self.remove()
            raise

    def _make_host(self, i: int) -> None:
        ns, veth = self.names[i], self._veths[i]
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _run("ip", "link", "set", veth, "master", self.bridge, "up")
        _run("ip", "-n", ns, "addr", "add", f"{self.addrs[i]}/24", "dev", "eth0")
        _run("ip", "-n", ns, "link", "set", "eth0", "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")

    def _tc(self, i: int | None, *args: str) -> None:
        prefix = ("ip", "netns", "exec", self.names[i]) if i is not None else ()
        _run(*prefix, "tc", *args)

    def _shape(self, i: int) -> None:
        """Host i's egress per destination (tbf when every link has one rate, else htb classes selected by u32
        filters on the destination address), and its ingress (the bridge side of its veth) at its fastest rate."""
        topo = self.topology
        assert topo is not None
        others = [j for j in range(len(self.names)) if j != i]
        fastest = max((topo.rate(j, i) for j in others), default=topo.intra)
        self._tbf(self._veths[i], None, fastest)
        if topo.is_uniform() or not others:
            self._tbf("eth0", i, topo.intra)
            return
        self._tc(i, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "1")
        self._htb_class(i, "1:1", topo.intra)          # anything not to a host of the cluster (ARP and the like)
        for k, j in enumerate(others, start=2):
            self._htb_class(i, f"1:{k}", topo.rate(i, j))
            self._tc(i, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                     "match", "ip", "dst", f"{self.addrs[j]}/32", "flowid", f"1:{k}")

    def _htb_class(self, i: int, classid: str, bits: int) -> None:
        burst = str(_burst(bits))
        quantum = str(min(200_000, max(3_000, bits // 8 // 1000)))
        self._tc(i, "class", "add", "dev", "eth0", "parent", "1:", "classid", classid, "htb", "rate", str(bits),
                 "ceil", str(bits), "burst", burst, "cburst", burst, "quantum", quantum)

    def _tbf(self, dev: str, i: int | None, bits: int) -> None:
        limit = str(max(_burst(bits) * 4, bits // 8 // 50))          # queue: 20 ms of traffic
        self._tc(i, "qdisc", "add", "dev", dev, "root", "tbf", "rate", str(bits), "burst", str(_burst(bits)),
                 "limit", limit)

    def remove(self) -> None:
        """Remove every namespace, link and the bridge this cluster made (idempotent, never raises for what is
        already gone)."""
        if not self._made:
            return
        for ns in self.names:
            _run("ip", "netns", "del", ns, check=False)          # takes its end of the veth pair, and the pair
        _run("ip", "link", "del", self.bridge, check=False)
        self._made = False
        self._blackholes.clear()
        self._down.clear()

    # ---- running things inside a host ------------------------------------------------------------------------
    def prefix(self, i: int) -> tuple[str, ...]:
        """The command prefix that runs a command inside host i (and execs it: the pid stays the command's)."""
        return ("ip", "netns", "exec", self.names[i])

    def addr(self, i: int, port: int) -> str:
        """HOST:PORT of `port` on host i."""
        return f"{self.addrs[i]}:{port}"

    def host_of(self, address: str) -> int:
        """The host index of an address (HOST or HOST:PORT) of this cluster.

        Raises:
            KeyError: not an address of this cluster.
        """
        host = address.rsplit(":", 1)[0]
        if host not in self.addrs:
            raise KeyError(f"{address!r} is not an address of this cluster ({', '.join(self.addrs)})")
        return self.addrs.index(host)

    # ---- network faults --------------------------------------------------------------------------------------
    def cut(self, i: int) -> None:
        """Host i loses its network both ways: `ip link set eth0 down`, run inside the host."""
        subprocess.run([*self.prefix(i), "ip", "link", "set", "eth0", "down"], check=True, timeout=30)
        self._down.add(i)

    def heal(self, i: int) -> None:
        """Host i's network comes back: `ip link set eth0 up`, run inside the host."""
        subprocess.run([*self.prefix(i), "ip", "link", "set", "eth0", "up"], check=True, timeout=30)
        self._down.discard(i)

    def partition(self, side: Iterable[int], other: Iterable[int] | None = None) -> None:
        """Hosts `side` and hosts `other` (default: every other host) stop reaching each other, both ways; inside
        each side traffic flows. Each host black-holes the other side's addresses in its own routing table.

        Raises:
            ClusterError: a partition is already in place (heal it first).
        """
        if self._blackholes:
            raise ClusterError("a partition is already in place: heal_partition() first")
        a = sorted(set(side))
        b = sorted(set(other) if other is not None else set(range(len(self.names))) - set(a))
        for src, dsts in [(i, b) for i in a] + [(j, a) for j in b]:
            for dst in dsts:
                _run("ip", "-n", self.names[src], "route", "add", "blackhole", f"{self.addrs[dst]}/32")
                self._blackholes.append((src, self.addrs[dst]))

    def heal_partition(self) -> None:
        """Remove the partition's routes (nothing happens when there is none)."""
        for src, dst in self._blackholes:
            _run("ip", "-n", self.names[src], "route", "del", "blackhole", f"{dst}/32", check=False)
        self._blackholes.clear()

    @property
    def partitioned(self) -> bool:
        return bool(self._blackholes)

    def describe(self) -> str:
        shaping = self.topology.describe() if self.topology else f"{len(self.names)} hosts, links unshaped"
        return f"emulated cluster: {shaping}; hosts {', '.join(self.addrs)} on bridge {self.bridge}"



def add_arguments(parser, what: str) -> None:
    """The emulated-cluster options every lab command shares: --hosts, --rate, --topology.

    Args:
        parser: an argparse parser.
        what: what runs in each host, for the help text.
    """
    parser.add_argument("--hosts", type=int, default=0, metavar="N",
                        help=f"run {what} in N emulated hosts (network namespaces on a bridge, as root) instead of "
                             "on 127.0.0.1")
    parser.add_argument("--rate", metavar="RATE", help="with --hosts: shape every link to RATE (e.g. 1gbit, 10gbit)")
    parser.add_argument("--topology", metavar="FILE",
                        help="with --hosts: zones and their intra- and inter-zone rates from FILE (lines "
                             "`intra RATE`, `inter RATE`, `zone NAME h0 h1 ...`, `link ZONE ZONE RATE`)")


def from_arguments(hosts: int, rate: str | None = None, topology: str | None = None) -> EmulatedCluster | None:
    """The cluster the shared options ask for (not yet created), or None without --hosts.

    Args:
        hosts: --hosts (0: none).
        rate: --rate.
        topology: --topology, a file path.
    Raises:
        ClusterError: the options contradict each other, or namespaces cannot be made here (the reason).
        TopologyError: the topology file is malformed or names unknown hosts (with the line).
    """
    if not hosts:
        if rate or topology:
            raise ClusterError("--rate and --topology shape the links of emulated hosts: add --hosts N")
        return None
    if hosts < 2:
        raise ClusterError("--hosts needs at least 2 hosts")
    if rate and topology:
        raise ClusterError("give either --rate (every link) or --topology (zones), not both")
    shape = None
    if rate:
        try:
            shape = Topology.uniform(hosts, parse_rate(rate))
        except ValueError as e:
            raise ClusterError(f"--rate: {e}") from None
    elif topology:
        try:
            text = Path(topology).read_text()
        except OSError as e:
            raise ClusterError(f"--topology {topology}: cannot read it ({e.strerror})") from None
        shape = parse_topology(text, hosts, source=topology)
    why = unavailable()
    if why:
        raise ClusterError(f"cannot emulate hosts on this machine: {why}")
    return EmulatedCluster(hosts, shape)

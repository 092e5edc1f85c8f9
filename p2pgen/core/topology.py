"""The rank map's order from what the job knows of its links: zones its operators declared, and the bandwidth
its agents measured between hosts. Pure: no I/O, no clock, no threads.

Owns: `ring_order(members, links)`, the order a proposal gives its members (the TCP ring runs in rank order),
with the `Topology` the certificate records: the groups behind slow links, how many times the ring crosses a
slow link, whether all_reduce goes hierarchical, and why. Also the small helpers that parse and render the
measured rates (`parse_rates`, `rates_text`) and that count crossings (`crossings`), which the tests use too.

The rules:
- Groups. Declared zones win: when any member declares one, the groups are the zones (members without a zone
  form the group `-`), and two members in different zones are across a slow link. Otherwise, when the matrix
  covers every pair of the members' hosts (at least two hosts), a link is slow when it is more than
  SLOW_FACTOR times slower than the fastest one, and the groups are the sets of hosts joined by fast links.
  Otherwise nothing is known to be slow: one group.
- Order. One group: the join order, unchanged (every job that declares nothing ranks as before). Several: the
  groups one after the other, sorted by name; inside a group, by host then peer id, each next member a
  neighbour over a fast link where one is left (so members of one host are adjacent). That order crosses slow
  links once per group boundary, the fewest any ring can when the groups are cliques of fast links; the join
  order is kept instead only if it crosses strictly fewer.
- Hierarchy (`Topology.hierarchical`): all_reduce reduces within each group, all-reduces across groups and
  gathers within the group (p2pgen.collectives.hierarchical) when there are at least two groups, every group
  has at least two members, the members span at least two hosts, and the links between groups are slow: the
  fastest measured link between groups is at least SLOW_FACTOR times slower than the slowest inside any group
  (declared zones without a complete matrix count as slow: the operator said so).
Invariant: the result depends only on the arguments (members in join order, their zones and addresses, the
rates), never on dict or set iteration order, so every agent applying the same Raft log proposes the same rank
map (I1); ties are broken by host and peer id.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence

from p2pgen.core.model import Member, Topology

SLOW_FACTOR = 4.0           # a link this many times slower than the fastest is slow
MAX_RATE = 1e7              # Mbit/s (10 Tbit/s): a larger measured rate is refused as nonsense
NO_ZONE = "-"               # the group of members that declared no zone, among members that did
ZONE_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")

Links = Mapping[tuple[str, str], float]      # (from host, to host) -> Mbit/s
Slow = Callable[[Member, Member], bool]


def check_zone(zone: str) -> str | None:
    """Why `zone` is not a valid zone name ("" is: no zone), or None."""
    if zone == "" or ZONE_PATTERN.fullmatch(zone):
        return None
    return f"zone {zone!r} must be 1-64 letters, digits, '.', '_' or '-'"


def parse_rates(text: str) -> dict[str, float]:
    """"HOST=MBITS HOST=MBITS ..." as {host: Mbit/s}.

    Raises:
        ValueError: an entry is not HOST=MBITS, a host repeats, or a rate is not a finite number in
            (0, MAX_RATE].
    """
    rates: dict[str, float] = {}
    for entry in text.split():
        host, sep, value = entry.rpartition("=")
        if not sep or not host:
            raise ValueError(f"rate {entry!r} is not HOST=MBITS")
        try:
            rate = float(value)
        except ValueError:
            raise ValueError(f"rate {entry!r}: {value!r} is not a number of Mbit/s") from None
        if not (math.isfinite(rate) and 0 < rate <= MAX_RATE):
            raise ValueError(f"rate {entry!r}: Mbit/s must be within (0, {MAX_RATE:g}]")
        if host in rates:
            raise ValueError(f"rate {entry!r}: host {host} appears twice")
        rates[host] = rate
    return rates


def rates_text(rates: Mapping[str, float]) -> str:
    """The inverse of `parse_rates`, hosts sorted."""
    return " ".join(f"{host}={rates[host]:.6g}" for host in sorted(rates))


def rate(links: Links, a: str, b: str) -> float | None:
    """The rate between hosts a and b: the faster direction measured (each direction is measured by another
    agent at another moment, and contention only ever slows a probe down: one contended probe must not make
    a link slow), None if neither was."""
    known = [r for r in (links.get((a, b)), links.get((b, a))) if r is not None]
    return max(known) if known else None


def crossings(order: Sequence[Member], slow: Slow) -> int:
    """How many ring neighbours (rank i, rank i+1 mod N) are across a slow link."""
    n = len(order)
    return 0 if n < 2 else sum(slow(order[i], order[(i + 1) % n]) for i in range(n))


def ring_order(members: Sequence[Member], links: Links) -> tuple[tuple[Member, ...], Topology | None]:
    """The rank map of a proposal of `members` (in join order) and what it was chosen from; the Topology is
    None when nothing is known (no zone declared, no rate measured between the members' hosts)."""
    members = tuple(members)
    rates = _rates_between(members, links)
    if not any(m.zone for m in members) and not rates:
        return members, None
    source, label, slow, why = _groups(members, links)
    names = sorted({label[m.peer_id] for m in members})
    join = crossings(members, slow)
    if len(names) < 2:
        order = members
    else:
        grouped = tuple(m for name in names for m in _path([m for m in members if label[m.peer_id] == name], slow))
        order = members if join < crossings(grouped, slow) else grouped
    groups = _listed_groups(order, label)
    hierarchical, how = _hierarchy(order, groups, source, links)
    chosen = crossings(order, slow)
    said = (f"{len(groups)} group(s) {' '.join(f'{n}({len(p)})' for n, p in groups)}: the ring crosses slow "
            f"links {chosen} time(s) (join order: {join})" if len(groups) > 1 else "one group: join order")
    return order, Topology(source, groups, chosen, join, hierarchical, f"{why}; {said}; {how}", rates)


def _rates_between(members: tuple[Member, ...], links: Links) -> tuple[tuple[str, str, float], ...]:
    hosts = sorted({m.host for m in members if m.host})
    return tuple((a, b, r) for i, a in enumerate(hosts) for b in hosts[i + 1:]
                 if (r := rate(links, a, b)) is not None)


def _groups(members: tuple[Member, ...], links: Links) -> tuple[str, dict[str, str], Slow, str]:
    """(source, group name per peer id, the slow-link relation, why)."""
    if any(m.zone for m in members):
        label = {m.peer_id: m.zone or NO_ZONE for m in members}
        return "zones", label, lambda a, b: label[a.peer_id] != label[b.peer_id], "declared zones"
    hosts = sorted({m.host for m in members})
    pairs = [(a, b, rate(links, a, b)) for i, a in enumerate(hosts) for b in hosts[i + 1:]]
    if "" in hosts or len(hosts) < 2 or any(r is None for _, _, r in pairs):
        label = {m.peer_id: NO_ZONE for m in members}
        return "join", label, lambda a, b: False, "no zones declared and no rate measured between every two hosts"
    measured = [(a, b, r) for a, b, r in pairs if r is not None]     # all of them (checked above)
    threshold = max(r for _, _, r in measured) / SLOW_FACTOR
    fast = {(a, b) for a, b, r in measured if r >= threshold}
    component = _components(hosts, fast)
    label = {m.peer_id: component[m.host] for m in members}

    def slow(a: Member, b: Member) -> bool:
        return a.host != b.host and tuple(sorted((a.host, b.host))) not in fast

    return "measured", label, slow, f"measured: links below {threshold:.6g} Mbit/s (fastest / {SLOW_FACTOR:g}) are slow"


def _components(hosts: list[str], fast: set[tuple[str, str]]) -> dict[str, str]:
    """Host -> the name of its group: its hosts joined by fast links, named by their sorted list."""
    parent = {h: h for h in hosts}

    def root(h: str) -> str:
        while parent[h] != h:
            h = parent[h]
        return h

    for a, b in sorted(fast):
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    members: dict[str, list[str]] = {}
    for h in hosts:
        members.setdefault(root(h), []).append(h)
    return {h: ",".join(members[root(h)]) for h in hosts}


def _path(group: list[Member], slow: Slow) -> list[Member]:
    """The group's members by (host, peer id), each next one on the same host, else over a fast link, where one
    is left."""
    left = sorted(group, key=lambda m: (m.host, m.peer_id))
    path = [left.pop(0)]
    while left:
        here = path[-1]
        nxt = next((m for m in left if m.host == here.host), None) \
            or next((m for m in left if not slow(here, m)), left[0])
        left.remove(nxt)
        path.append(nxt)
    return path


def _listed_groups(order: tuple[Member, ...], label: dict[str, str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Groups in the order their first member ranks, each with its peer ids in rank order."""
    groups: dict[str, list[str]] = {}
    for m in order:
        groups.setdefault(label[m.peer_id], []).append(m.peer_id)
    return tuple((name, tuple(peers)) for name, peers in groups.items())


def _hierarchy(order: tuple[Member, ...], groups: tuple[tuple[str, tuple[str, ...]], ...], source: str,
               links: Links) -> tuple[bool, str]:
    """Whether all_reduce goes hierarchical (see the module docstring), and why, in words."""
    if len(groups) < 2 or min(len(p) for _, p in groups) < 2:
        return False, "all_reduce: ring (hierarchical needs 2+ groups of 2+ members)"
    if len({m.host for m in order}) < 2:
        return False, "all_reduce: ring (every member on one host: shared memory)"
    host = {m.peer_id: m.host for m in order}
    group_of = {p: name for name, peers in groups for p in peers}
    inside: list[float | None] = []
    between: list[float | None] = []
    for i, a in enumerate(order):
        for b in order[i + 1:]:
            if a.host == b.host:
                continue
            r = rate(links, host[a.peer_id], host[b.peer_id])
            (inside if group_of[a.peer_id] == group_of[b.peer_id] else between).append(r)
    if any(r is None for r in inside + between):
        if source == "zones":
            return True, "all_reduce: hierarchical (declared zones; links not all measured)"
        return False, "all_reduce: ring (links not all measured)"
    slowest_inside = min((r for r in inside if r is not None), default=math.inf)     # every r is (checked above)
    fastest_between = max(r for r in between if r is not None)
    if fastest_between * SLOW_FACTOR <= slowest_inside:
        return True, (f"all_reduce: hierarchical (between groups at most {fastest_between:.6g} Mbit/s, inside at "
                      f"least {_mbps(slowest_inside)})")
    return False, (f"all_reduce: ring (between groups up to {fastest_between:.6g} Mbit/s is not "
                   f"{SLOW_FACTOR:g}x below {_mbps(slowest_inside)} inside)")


def _mbps(r: float) -> str:
    return "one host" if math.isinf(r) else f"{r:.6g} Mbit/s"


def unmeasured(members: Sequence[Member], links: Links, source: str) -> tuple[tuple[str, str], ...]:
    """The other hosts of `members` with no rate measured from `source` yet, each with the agent address to probe
    (its first member's, by peer id), sorted by host: what an agent on host `source` measures next."""
    targets: dict[str, str] = {}
    for m in sorted(members, key=lambda m: m.peer_id):
        agent = m.addr("agent")
        if m.host and m.host != source and agent and (source, m.host) not in links:
            targets.setdefault(m.host, agent)
    return tuple(sorted(targets.items()))

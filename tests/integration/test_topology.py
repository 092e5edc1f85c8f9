"""Integration: rank maps from real agents' link knowledge.

- On 127.0.0.1: four agents joining in alternating zones (`join --zone`) get a rank map with each zone contiguous,
  agreed by every agent, with the reason in the certificate; all on one host, all_reduce stays the ring (shared
  memory). No probe runs: there is no other host.
- In an emulated cluster (slow, root): four agents on four hosts, two zones shaped 10 Gbit/s inside and
  200 Mbit/s between, no zone declared, joined alternating the zones: the agents probe each other's hosts, every
  agent holds the same matrix, and the job proposes its members again in the measured order, hierarchical.
"""

from __future__ import annotations

import pytest

from p2pgen.testing import netns
from p2pgen.testing.agents import active, free_control_ports

ZONES = ("east", "west", "east", "west")


def _ranked(show) -> list[str]:
    cert = active(show)
    return [m["peer_id"] for m in cert["members"]] if cert else []


@pytest.mark.timeout(90)
def test_agents_in_declared_zones_are_ranked_zone_by_zone(cluster):
    addrs = [f"127.0.0.1:{p}" for p in free_control_ports(4)]
    for i, addr in enumerate(addrs):
        cluster.start(f"p{i}", addr, addrs[:i], extra=("--min-members=4", f"--zone={ZONES[i]}"))
    show = cluster.wait(addrs[0], lambda s: len(_ranked(s)) == 4, 60)
    cert = active(show)
    assert _ranked(show) == ["p0", "p2", "p1", "p3"]
    assert [m["zone"] for m in cert["members"]] == ["east", "east", "west", "west"]
    topology = cert["topology"]
    assert (topology["source"], topology["crossings"]) == ("zones", 2) and topology["join_crossings"] >= 2
    assert not topology["hierarchical"] and "one host" in topology["reason"]
    for addr in addrs[1:]:               # I1: every agent holds the same certificate
        assert active(cluster.wait(addr, lambda s: active(s) is not None)) == cert
    assert not show["state"]["links"], "agents on one host probe nothing"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_agents_on_shaped_hosts_probe_and_are_reordered_by_the_measured_links(cluster):
    why = netns.unavailable()
    if why:
        pytest.skip(f"network namespaces unavailable: {why}")
    shape = netns.parse_topology("intra 10gbit\ninter 200mbit\nzone a h0 h2\nzone b h1 h3\n", 4)
    hosts = netns.EmulatedCluster(4, shape)
    try:
        hosts.create()
        cluster.hosts = hosts
        addrs = cluster.addresses(4)
        for i, addr in enumerate(addrs):
            cluster.start(f"p{i}", addr, addrs[:i], extra=("--min-members=4",))
        show = cluster.wait(addrs[0], lambda s: (active(s) or {}).get("topology", {}).get("source") == "measured",
                            180)
        cert = active(show)
        assert _ranked(show) == ["p0", "p2", "p1", "p3"], cert
        assert cert["topology"]["hierarchical"] and cert["reason"].startswith("rank order:"), cert
        show = cluster.wait(addrs[0], lambda s: len(s["state"]["links"]) == 12, 60)    # every agent reported
        links = {(r["from"], r["to"]): r["mbps"] for r in show["state"]["links"]}
        inside = [v for (a, b), v in links.items() if hosts.host_of(a) % 2 == hosts.host_of(b) % 2]
        between = [v for (a, b), v in links.items() if hosts.host_of(a) % 2 != hosts.host_of(b) % 2]
        assert max(between) < 250 and min(inside) > 4 * max(between), links
        for addr in addrs[1:]:
            assert cluster.wait(addr, lambda s: active(s) == cert, 30)
    finally:
        cluster.stop_all()
        hosts.remove()

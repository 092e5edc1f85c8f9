"""Integration: rank maps from real agents' link knowledge.

- On 127.0.0.1: four agents joining in alternating zones (`join --zone`) get a rank map with each zone contiguous,
  agreed by every agent, with the reason in the certificate; all on one host, all_reduce stays the ring (shared
  memory). No probe runs: there is no other host.
- In an emulated cluster (slow, root): four agents on four hosts, two zones shaped 10 Gbit/s inside and
  200 Mbit/s between, no zone declared, joined alternating the zones, training the exact integer mini-training
  with a 512 KiB all_reduce per step: the agents probe each other's hosts, every agent holds the same matrix, the
  job proposes its members again in the measured order with all_reduce hierarchical, and every member ends with
  the serial reference's state (I5) after steps committed in that generation.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from p2pgen_lab.rigs import netns
from p2pgen_lab.rigs.agents import active, free_control_ports
from tests.integration.apps.exact_train import reference

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
@pytest.mark.timeout(300)
def test_agents_on_shaped_hosts_probe_reorder_and_train_hierarchically(cluster, tmp_path, monkeypatch):
    why = netns.unavailable()
    if why:
        pytest.skip(f"network namespaces unavailable: {why}")
    steps, size = 300, 1 << 16                                  # 512 KiB of int64: above hierarchical.MIN_BYTES
    for key, value in (("EXACT_STEPS", steps), ("EXACT_SIZE", size), ("EXACT_STEP_DELAY", 0.02),
                       ("P2PGEN_SUMMARY_DIR", tmp_path)):
        monkeypatch.setenv(key, str(value))
    app = [sys.executable, str(Path(__file__).parent / "apps" / "exact_train.py")]
    shape = netns.parse_topology("intra 10gbit\ninter 200mbit\nzone a h0 h2\nzone b h1 h3\n", 4)
    hosts = netns.EmulatedCluster(4, shape)
    try:
        hosts.create()
        cluster.hosts = hosts
        addrs = cluster.addresses(4)
        for i, addr in enumerate(addrs):
            cluster.start(f"p{i}", addr, addrs[:i], command=app, extra=("--min-members=4", "--attach-grace=60"))
        show = cluster.wait(addrs[0], lambda s: (active(s) or {}).get("topology", {}).get("source") == "measured",
                            120)
        cert = active(show)
        assert _ranked(show) == ["p0", "p2", "p1", "p3"], cert
        assert cert["topology"]["hierarchical"] and cert["reason"].startswith("rank order:"), cert["topology"]
        show = cluster.wait(addrs[0], lambda s: len(s["state"]["links"]) == 12, 60)    # every agent reported
        links = {(r["from"], r["to"]): r["mbps"] for r in show["state"]["links"]}
        inside = [v for (a, b), v in links.items() if hosts.host_of(a) % 2 == hosts.host_of(b) % 2]
        between = [v for (a, b), v in links.items() if hosts.host_of(a) % 2 != hosts.host_of(b) % 2]
        assert max(between) < 250 and min(inside) > 4 * max(between), links
        for addr in addrs[1:]:
            assert active(cluster.wait(addr, lambda s: active(s) == cert, 30)) == cert
        revision_then = min(r["revision"] for r in cert["revisions"])
        for agent in list(cluster.agents.values()):
            cluster.wait_until(lambda: not agent.alive(), 180, f"{agent.peer_id} finishing")
            assert agent.proc.returncode == 0, cluster.logs()
        finals = [json.loads(p.read_text()) for p in tmp_path.glob("p*.json")]
        assert sorted(f["peer"] for f in finals) == ["p0", "p1", "p2", "p3"]
        assert {f["revision"] for f in finals} == {steps} and revision_then < steps
        assert all(np.array_equal(f["w"], reference(steps, size)) for f in finals), "not the serial history (I5)"
    finally:
        cluster.stop_all()
        hosts.remove()

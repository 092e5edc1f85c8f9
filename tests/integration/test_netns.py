"""Integration: 4 agents on 4 hosts that are not 127.0.0.1 (network namespaces), partitioned with the hosts' own tools.

The test makes an emulated cluster (`p2pgen_lab.rigs.netns`): for each agent a network namespace on one bridge, with
its own address on a private /24; each agent listens on and advertises that address (never a loopback one) and trains
`examples/train_spot.py`. Agent p3's host is then cut off with its own `ip link set eth0 down` (a host whose
network goes away, both ways) and brought back with `ip link set eth0 up`:
- the majority (p0-p2) activates a generation without p3 and keeps committing steps;
- no certificate made while p3 is cut off names p3;
- after the heal p3's application comes back as a new incarnation and pulls; every member ends with one digest;
- the Raft trace checker finds no violation.
Skipped, with the reason, where network namespaces cannot be made (not root, no `ip`, a container without
CAP_NET_ADMIN). The cluster is always removed in `finally`.
"""

from __future__ import annotations

import glob
import json
import sys
import time
from pathlib import Path

import pytest

from p2pgen.raft import checker
from p2pgen_lab.rigs import netns
from p2pgen_lab.rigs.agents import active, active_members
from tests.integration.test_state_survives import committed

pytestmark = [pytest.mark.timeout(420), pytest.mark.slow]

APP = [sys.executable, str(Path(__file__).parents[2] / "examples" / "train_spot.py")]
STEPS = 1500
PORT = 23400


def test_four_agents_in_four_network_namespaces_train_and_survive_a_host_cut_off(cluster, tmp_path, monkeypatch):
    why = netns.unavailable()
    if why:
        pytest.skip(f"network namespaces unavailable: {why}")
    dirs = {n: tmp_path / n for n in ("summaries", "traces")}
    for d in dirs.values():
        d.mkdir()
    for key, value in (("P2PGEN_STEPS", STEPS), ("P2PGEN_STEP_DELAY", "0.02"),
                       ("P2PGEN_SUMMARY_DIR", dirs["summaries"]), ("P2PGEN_TRACE_DIR", dirs["traces"])):
        monkeypatch.setenv(key, str(value))
    hosts = netns.EmulatedCluster(4)
    try:
        hosts.create()
        addrs = [f"{a}:{PORT}" for a in hosts.addrs]
        peers = [f"p{i}" for i in range(4)]
        for i, (peer, addr) in enumerate(zip(peers, addrs)):
            cluster.start(peer, addr, [a for a in addrs if a != addr], command=APP,
                          extra=("--min-members=4", "--attach-grace=60"), prefix=hosts.prefix(i))
        show = cluster.wait(addrs[0], lambda s: len(active_members(s)) == 4 and len(s["raft"]["voters"]) >= 3, 120)
        voters = {v["agent"] for v in show["raft"]["voters"]}             # an odd number: 3 of the 4
        assert voters <= set(addrs) and all(n.split(":")[0] in hosts.addrs for n in show["raft"]["nodes"]), show
        for addr in addrs:                                 # every agent advertises its own address, not a loopback one
            with cluster.client(addr) as c:
                me = c.show()
            assert me["agent"]["addr"] == addr, me["agent"]
        cluster.wait_until(lambda: committed(dirs["traces"]) >= 20, 120, "20 steps committed")

        before = active(show)["generation"]
        hosts.cut(3)                                                # p3's host loses its network
        cut_at = time.monotonic()
        show = cluster.wait(addrs[0], lambda s: active(s) is not None and active(s)["generation"] > before
                            and {p for p, _ in active_members(s)} == set(peers[:3]), 60)
        cut_to_active = time.monotonic() - cut_at
        at_activation = committed(dirs["traces"])
        cluster.wait_until(lambda: committed(dirs["traces"]) >= at_activation + 20, 60, "the majority committing")
        last_cut = active(cluster.wait(addrs[0], lambda s: active(s) is not None))["generation"]

        hosts.heal(3)
        healed_at = time.monotonic()
        back = cluster.wait(addrs[0], lambda s: {p for p, _ in active_members(s)} == set(peers), 120)
        heal_to_active = time.monotonic() - healed_at
        assert dict(active_members(back))["p3"] > 1                          # a new incarnation (I3)
        with cluster.client(addrs[0]) as c:
            certs = [h["certificate"] for h in c.history() if h["certificate"]]
        for cert in certs:
            if before < cert["generation"] <= last_cut:
                assert "p3" not in {m["peer_id"] for m in cert["members"]}, cert

        for agent in list(cluster.agents.values()):
            cluster.wait_until(lambda: not agent.alive(), 240, f"{agent.peer_id} finishing")
            assert agent.proc.returncode == 0, cluster.logs()
        finals = [json.loads(Path(p).read_text()) for p in glob.glob(str(dirs["summaries"] / "*.json"))]
        assert sorted(f["peer"] for f in finals) == peers
        assert {f["revision"] for f in finals} == {STEPS} and len({f["digest"] for f in finals}) == 1, finals
        result = checker.check_dir(dirs["traces"])
        assert result.passed, result.render()
        print(f"\nnetns 1|3 link down: cut_to_majority_active_s={cut_to_active:.2f}, "
              f"heal_to_minority_active_s={heal_to_active:.2f}")
    finally:
        cluster.stop_all()
        hosts.remove()

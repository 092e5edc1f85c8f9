"""The emulated cluster (`p2pgen_lab.rigs.netns`): the topology format and its errors, and on a machine that can
make network namespaces, a real cluster: hosts reach each other at their own addresses, a host cut off with its own
`ip link` and healed, a partition between groups of hosts, shaping installed per destination, and nothing left
behind. No speed figure is asserted (the benchmarks measure rates)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from p2pgen import cli
from p2pgen_lab.rigs import netns

TOPOLOGY = """# two zones
intra 10gbit
inter 200mbit
zone east h0 h1
zone west 2 3   # plain indices work too
"""


def test_rates_parse_and_bad_ones_say_what_to_write():
    assert netns.parse_rate("1gbit") == 10 ** 9 and netns.parse_rate("200MBIT") == 200 * 10 ** 6
    assert netns.parse_rate("2.5gbit") == 2_500_000_000 and netns.format_rate(200 * 10 ** 6) == "200mbit"
    for bad in ("fast", "10", "0gbit", "-1mbit", "1gbps"):
        with pytest.raises(ValueError, match="like 200mbit"):
            netns.parse_rate(bad)


def test_a_topology_gives_each_pair_of_hosts_its_rate():
    topo = netns.parse_topology(TOPOLOGY + "zone north h4\nlink east north 1gbit\n", 5)
    assert topo.zones == {"east": (0, 1), "west": (2, 3), "north": (4,)}
    assert topo.rate(0, 1) == topo.rate(3, 2) == 10 ** 10
    assert topo.rate(1, 2) == topo.rate(4, 3) == 200 * 10 ** 6
    assert topo.rate(0, 4) == topo.rate(4, 1) == 10 ** 9
    assert not topo.is_uniform() and netns.Topology.uniform(3, 10 ** 9).is_uniform()
    assert "zone east: hosts h0, h1" in topo.describe() and "inter-zone 200mbit" in topo.describe()


@pytest.mark.parametrize("text, hosts, message", [
    ("intra 1gbit\nzone a h0 h1\nzone b h2\n", 3, r"topo:.*no `inter RATE` line"),
    ("intra 1gbit\ninter 1mbit\nzone a h0 h9\n", 2, r"topo:3: host 'h9' does not exist: the cluster has 2 hosts"),
    ("intra 1gbit\nzone a h0\n", 2, r"hosts h1 are in no zone"),
    ("intra 1gbit\ninter 1mbit\nzone a h0\nzone b h0 h1\n", 2, r"topo:4: host h0 is already in zone 'a'"),
    ("intra fast\n", 1, r"topo:1: rate 'fast'"),
    ("intra 1gbit\nzone a h0\nzone a h1\n", 2, r"topo:3: zone 'a' is defined twice"),
    ("intra 1gbit\nspeed 3\n", 1, r"topo:2: unknown statement 'speed'"),
    ("intra 1gbit\ninter 1mbit\nzone a h0\nzone b h1\nlink a c 1gbit\n", 2, r"topo:5: `link` names zone 'c'"),
    ("intra 1gbit\nzone a hx\n", 1, r"topo:2: 'hx' is not a host"),
])
def test_a_bad_topology_is_refused_with_its_line_and_reason(text, hosts, message):
    with pytest.raises(netns.TopologyError, match=message):
        netns.parse_topology(text, hosts, source="topo")


def test_options_that_contradict_each_other_are_refused(tmp_path):
    with pytest.raises(netns.ClusterError, match="add --hosts N"):
        netns.from_arguments(0, rate="1gbit")
    with pytest.raises(netns.ClusterError, match="not both"):
        netns.from_arguments(3, rate="1gbit", topology="t")
    with pytest.raises(netns.ClusterError, match="cannot read it"):
        netns.from_arguments(3, topology=str(tmp_path / "missing"))
    assert netns.from_arguments(0) is None


needs_netns = pytest.mark.skipif(bool(netns.unavailable()), reason=f"network namespaces: {netns.unavailable()}")


def _ours() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith(f"p2p{os.getpid()}")}


def _reach(cluster: netns.EmulatedCluster, src: int, dst: int, port: int = 23711) -> bool:
    """Whether host src opens a TCP connection to a listener in host dst (both run `python -c` in their host)."""
    server = subprocess.Popen([*cluster.prefix(dst), sys.executable, "-c",
                               "import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, "
                               f"socket.SO_REUSEADDR, 1); s.bind(({cluster.addrs[dst]!r}, {port})); s.listen(); "
                               "print('up', flush=True); s.settimeout(5); s.accept()"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "up"
        probe = subprocess.run([*cluster.prefix(src), sys.executable, "-c",
                                f"import socket; socket.create_connection(({cluster.addrs[dst]!r}, {port}), "
                                "timeout=1.5)"], capture_output=True, timeout=20)
        return probe.returncode == 0
    finally:
        server.kill()
        server.wait(10)


@needs_netns
@pytest.mark.timeout(120)
def test_hosts_reach_each_other_until_cut_or_partitioned_and_nothing_is_left_behind():
    cluster = netns.EmulatedCluster(4, netns.parse_topology(TOPOLOGY, 4))
    try:
        cluster.create()
        assert _ours() == set(cluster.names) and len(set(cluster.addrs)) == 4
        assert _reach(cluster, 0, 3) and _reach(cluster, 2, 1)
        classes = subprocess.run([*cluster.prefix(0), "tc", "class", "show", "dev", "eth0"],
                                 capture_output=True, text=True).stdout
        assert "rate 10Gbit" in classes and "rate 200Mbit" in classes, classes

        cluster.cut(1)
        assert not _reach(cluster, 0, 1) and _reach(cluster, 0, 2)
        cluster.heal(1)
        assert _reach(cluster, 0, 1)

        cluster.partition([0, 1])
        assert _reach(cluster, 0, 1) and _reach(cluster, 3, 2)
        assert not _reach(cluster, 0, 2) and not _reach(cluster, 3, 1)
        with pytest.raises(netns.ClusterError, match="already in place"):
            cluster.partition([2])
        cluster.heal_partition()
        assert _reach(cluster, 1, 3)
    finally:
        cluster.remove()
    assert _ours() == set()
    bridges = subprocess.run(["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True).stdout
    assert cluster.bridge not in bridges


@needs_netns
@pytest.mark.timeout(60)
def test_a_dead_runs_leftovers_are_removed_and_a_live_runs_are_not():
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"p2p{dead.pid}ah0"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    with netns.EmulatedCluster(2) as cluster:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        assert stale not in listed                   # create() removed it: its creator is gone
        assert netns.remove_stale() == [] and _ours() == set(cluster.names)


@needs_netns
@pytest.mark.timeout(30)
def test_a_worker_enters_its_host_before_it_opens_a_socket():
    with netns.EmulatedCluster(2) as cluster:
        seen: list[str] = []

        def inside() -> None:         # setns moves only the calling thread
            netns.enter(cluster.names[1])
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.bind((cluster.addrs[1], 0))
                seen.append(s.getsockname()[0])

        t = threading.Thread(target=inside)
        t.start()
        t.join(10)
        assert seen == [cluster.addrs[1]]
    with pytest.raises(netns.ClusterError, match="not found"):
        netns.enter("p2p-no-such-namespace")


@needs_netns
@pytest.mark.timeout(120)
def test_bench_allreduce_runs_one_rank_per_host_on_shaped_links(capsys):
    rc = cli.main(["bench", "allreduce", "--hosts", "2", "--rate", "1gbit", "--sizes", "64K", "--iters", "3",
                   "--rounds", "1", "--json"])
    assert rc == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["path"] == "ring" and row["p2pgen_s"] > 0 and row["gloo_s"] > 0
    assert _ours() == set()


def test_bench_allreduce_refuses_a_bad_topology_before_it_starts(tmp_path):
    bad = tmp_path / "zones.txt"
    bad.write_text("intra 1gbit\ninter 10mbit\nzone a h0 h7\n")
    with pytest.raises(SystemExit, match=r"zones.txt:3: host 'h7' does not exist"):
        cli.main(["bench", "allreduce", "--hosts", "2", "--topology", str(bad)])


def test_bench_recovery_on_hosts_needs_four_of_them():
    with pytest.raises(SystemExit, match="at least 4 hosts"):
        cli.main(["bench", "recovery", "--hosts", "3", "--rate", "1gbit", "--quick"])


def test_stress_on_hosts_needs_one_host_per_agent(capsys):
    assert cli.main(["stress", "--hosts", "3", "--agents", "5"]) == 2
    assert "one host per agent" in capsys.readouterr().err

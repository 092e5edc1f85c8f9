"""Integration: the Raft control plane under whole-host churn, on real agent processes.

Agents here are trivial members (no application): what is under test is the Raft group itself. Every test reads
the job through `show` and checks, besides its own claim, that the agents' running log hashes agree wherever two
of them applied the same index (log matching).
"""

from __future__ import annotations

import signal
import time

import pytest

from p2pgen_lab.rigs.agents import active_members, free_control_ports

pytestmark = pytest.mark.timeout(150)


def addrs_of(n: int) -> list[str]:
    return [f"127.0.0.1:{p}" for p in free_control_ports(n)]


def start_together(cluster, addrs: list[str], prefix: str = "p") -> None:
    for i, addr in enumerate(addrs):
        cluster.start(f"{prefix}{i}", addr, [a for a in addrs if a != addr], extra=(f"--min-members={len(addrs)}",))


def shows(cluster) -> dict[str, dict]:
    """`show` of every live agent that answers."""
    out = {}
    for agent in cluster.agents.values():
        if not agent.alive():
            continue
        try:
            with cluster.client(agent.addr) as c:
                out[agent.addr] = c.show()
        except Exception:     # starting, stopped or rejoining: not part of this snapshot
            continue
    return out


def assert_log_matching(cluster) -> None:
    """Two agents that applied the same index hold the same running hash there."""
    seen: dict[int, tuple[str, str]] = {}
    for addr, s in shows(cluster).items():
        for index, _term, digest in s["raft"]["hash"]:
            if index in seen:
                assert seen[index][1] == digest, f"log hashes differ at index {index}: {seen[index][0]} vs {addr}"
            seen[index] = (addr, digest)


def voters(show: dict) -> dict[str, str]:
    return {v["agent"]: v["node"] for v in show["raft"]["voters"]}


def test_an_agent_replaced_at_the_same_address_joins_as_a_new_identity(cluster):
    addrs = addrs_of(3)
    start_together(cluster, addrs)
    show = cluster.wait(addrs[0], lambda s: len(active_members(s)) == 3 and len(s["raft"]["voters"]) == 3)
    ids_seen = set(voters(show).values())
    victim = addrs[1]
    for round_ in range(3):
        old_id = voters(cluster.wait(addrs[0], lambda s: victim in voters(s)))[victim]
        cluster.agents["p1"].signal(signal.SIGKILL)
        time.sleep(1.0)                                           # "a lost spot instance", replaced within 1 s
        cluster.start("p1", victim, [addrs[0]])
        repaired = cluster.wait(addrs[0], lambda s: victim in voters(s) and voters(s)[victim] != old_id
                                and len(s["raft"]["voters"]) == 3 and len(active_members(s)) == 3, timeout=40)
        new_id = voters(repaired)[victim]
        assert new_id.split("/")[0] == old_id.split("/")[0]          # the same address ...
        assert new_id not in ids_seen                                 # ... never the same identity
        assert old_id not in repaired["raft"]["nodes"]                # the dead one was removed, by its id
        ids_seen.add(new_id)
        assert dict(active_members(repaired))["p1"] == round_ + 2     # a new incarnation each time (I3)
    assert_log_matching(cluster)


def test_voters_stay_bounded_and_dead_voters_are_replaced_down_to_two_agents(cluster):
    addrs = addrs_of(7)
    start_together(cluster, addrs)
    show = cluster.wait(addrs[0], lambda s: len(active_members(s)) == 7 and len(s["raft"]["voters"]) == 5,
                        timeout=60)
    assert len(show["raft"]["nonvoters"]) == 2                     # show lists both kinds
    alive = dict(zip(addrs, (f"p{i}" for i in range(7))))
    while len(alive) > 2:
        s = cluster.wait(next(iter(alive)), lambda s: s["raft"]["leader"] is not None)
        victim = sorted(a for a in voters(s) if a in alive)[-1]  # a voter, never chosen by leadership
        peer = alive.pop(victim)
        cluster.agents[peer].signal(signal.SIGKILL)
        expected = max(min(len(alive), 5), len(alive) if len(alive) < 5 else 5)
        observer = next(iter(alive))
        repaired = cluster.wait(observer, lambda s: peer not in dict(active_members(s))
                                and set(voters(s)) <= set(alive)
                                and len(s["raft"]["voters"]) == min(expected, 5), timeout=40)
        assert len(active_members(repaired)) == len(alive)
    assert_log_matching(cluster)


def test_concurrent_joins_all_become_members(cluster):
    addrs = addrs_of(7)
    cluster.start("p0", addrs[0], [])                              # one agent starts the job
    cluster.wait(addrs[0], lambda s: len(active_members(s)) == 1)
    for i in range(1, 5):                                          # four at the same moment, through p0
        cluster.start(f"p{i}", addrs[i], [addrs[0]])
    cluster.wait(addrs[0], lambda s: len(active_members(s)) == 5 and len(s["raft"]["voters"]) == 5, timeout=60)
    cluster.agents["p4"].signal(signal.SIGKILL)                    # one member is being evicted while ...
    cluster.start("p5", addrs[5], [addrs[1]])                       # ... two more join, through two members
    cluster.start("p6", addrs[6], [addrs[2]])
    cluster.wait(addrs[0], lambda s: sorted(p for p, _ in active_members(s)) == ["p0", "p1", "p2", "p3", "p5", "p6"]
                 and len(s["raft"]["voters"]) == 5 and addrs[4] not in voters(s), timeout=60)
    assert_log_matching(cluster)


def test_a_joiner_without_a_quorum_waits_and_says_why_then_joins(cluster):
    addrs = addrs_of(4)
    start_together(cluster, addrs[:3])
    cluster.wait(addrs[0], lambda s: len(active_members(s)) == 3)
    stopped = [cluster.agents["p1"], cluster.agents["p2"]]
    for agent in stopped:
        agent.signal(signal.SIGSTOP)                               # a majority of voters gone for a while
    try:
        joiner = cluster.start("p3", addrs[3], [addrs[0]])
        cluster.wait_until(lambda: "waiting" in joiner.log.read_text(), 20, "the joiner saying why it waits")
        time.sleep(6.0)
        assert joiner.alive(), "the joiner gave up:\n" + joiner.log.read_text()[-2000:]
    finally:
        for agent in stopped:
            agent.signal(signal.SIGCONT)
    cluster.wait(addrs[0], lambda s: "p3" in dict(active_members(s)), timeout=60)
    assert joiner.alive()


def test_a_removed_voter_is_refused_and_comes_back_under_a_new_identity(cluster):
    addrs = addrs_of(4)
    start_together(cluster, addrs)
    show = cluster.wait(addrs[0], lambda s: len(active_members(s)) == 4 and len(s["raft"]["voters"]) == 3)
    leader = show["raft"]["leader_agent"]
    victim = next(a for a in voters(show) if a != leader)
    old_id = voters(show)[victim]
    peer = next(p for p, a in cluster.agents.items() if a.addr == victim)
    cluster.agents[peer].signal(signal.SIGSTOP)
    try:
        # the leader's agent removes it and promotes the non-voting member: 3 voters again, without it
        cluster.wait(leader, lambda s: old_id not in s["raft"]["nodes"] and len(s["raft"]["voters"]) == 3
                     and peer not in dict(active_members(s)), timeout=40)
        term = cluster.wait(leader, lambda s: True)["raft"]["term"]
    finally:
        cluster.agents[peer].signal(signal.SIGCONT)
    back = cluster.wait(victim, lambda s: s["raft"]["self"] != old_id and s["raft"]["leader"] is not None
                        and peer in dict(active_members(s)), timeout=40)
    assert back["raft"]["self"] is None or back["raft"]["self"].split("/")[1] != old_id.split("/")[1]
    after = cluster.wait(leader, lambda s: peer in dict(active_members(s)))
    assert old_id not in after["raft"]["nodes"]
    assert after["raft"]["term"] == term, "the removed node disturbed the leader"
    with open(cluster.agents[peer].log) as f:
        assert f.read().count("registering again as a new incarnation") == 1   # once per eviction
    assert_log_matching(cluster)


@pytest.mark.timeout(240)
def test_sixteen_agents_form_and_survive_losing_two_voters_one_after_the_other(cluster):
    cluster.detect = ("--attach-grace=0", "--detector=fixed", "--detect-timeout=3.0", "--detect-floor=1.0",
                      "--heartbeat-interval=0.2")        # 16 agent processes on 2 cores: starved now and then
    addrs = addrs_of(16)
    start_together(cluster, addrs)
    show = cluster.wait(addrs[0], lambda s: len(active_members(s)) == 16 and len(s["raft"]["voters"]) == 5,
                        timeout=150)
    assert len(show["raft"]["nonvoters"]) == 11
    alive = dict(zip(addrs, (f"p{i}" for i in range(16))))
    for _ in range(2):
        s = cluster.wait(next(iter(alive)), lambda s: s["raft"]["leader"] is not None)
        victim = sorted(a for a in voters(s) if a in alive)[-1]
        peer = alive.pop(victim)
        cluster.agents[peer].signal(signal.SIGKILL)
        observer = next(iter(alive))
        cluster.wait(observer, lambda s: peer not in dict(active_members(s)) and victim not in voters(s)
                     and len(s["raft"]["voters"]) == 5, timeout=60)
    assert_log_matching(cluster)

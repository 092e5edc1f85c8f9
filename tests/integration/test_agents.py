"""Integration: real agent processes on 127.0.0.1 form a job, replace what dies, admit, evict and refuse.

Each test starts `p2pgen join` processes, drives them with signals (SIGKILL, SIGSTOP/SIGCONT, SIGTERM)
and checks the replicated state through `show`. Every process is stopped by pid in the fixture.
"""

from __future__ import annotations

import signal
import sys
import time

import pytest

from p2pgen.agent.faultplan import voter_is_up
from p2pgen.core import Ready, Register
from p2pgen.errors import P2PGenError
from p2pgen_lab.rigs.agents import active, active_members, free_control_ports

pytestmark = pytest.mark.timeout(90)

APP = [sys.executable, "-c", "import time; time.sleep(600)"]


def start_three(cluster, command=None):
    addrs = [f"127.0.0.1:{p}" for p in free_control_ports(3)]
    for i, addr in enumerate(addrs):
        cluster.start(f"p{i}", addr, [a for a in addrs if a != addr], command=command, extra=("--min-members=3",))
    show = cluster.wait(addrs[0], lambda s: len(active_members(s)) == 3)
    return addrs, show


def test_three_symmetric_agents_form_generation_one(cluster):
    addrs, show = start_three(cluster)
    cert = active(show)
    assert cert["generation"] == 1 and cert["parent"] == 0
    assert sorted(p for p, _ in active_members(show)) == ["p0", "p1", "p2"]
    assert [m["rank"] for m in cert["members"]] == [0, 1, 2]
    assert cert["raft_index"] > 0 and cert["raft_term"] >= 1
    # I1: every agent reports the very same certificate
    for addr in addrs[1:]:
        other = cluster.wait(addr, lambda s: active(s) is not None)
        assert active(other) == cert


def test_killed_application_is_replaced_by_a_new_incarnation(cluster):
    addrs, show = start_three(cluster, command=APP)
    g1 = active(show)["generation"]
    with cluster.client(addrs[1]) as c:
        pid = c.show()["agent"]["app_pid"]
    old = dict(active_members(show))["p1"]
    import os
    os.kill(pid, signal.SIGKILL)
    # a generation without p1's old incarnation becomes active (in the history: the restart can be so quick that
    # no `show` polled in between sees it) ...
    back = cluster.wait(addrs[0], lambda s: dict(active_members(s)).get("p1", old) > old)
    with cluster.client(addrs[0]) as c:
        certs = [h["certificate"] for h in c.history() if h["certificate"]]
    without = [c for c in certs if c["generation"] > g1 and "p1" not in {m["peer_id"] for m in c["members"]}]
    assert without, certs
    assert any(d["peer_id"] == "p1" and "SIGKILL" in d["reason"] for d in without[0]["departed"])
    # ... then one with p1 back under a new incarnation
    new = dict(active_members(back))["p1"]
    assert new > old
    # I3: commands carrying the old incarnation are refused
    with cluster.client(addrs[2]) as c:
        refused = c.submit(Register("p1", old, (("agent", addrs[1]),)))
        assert not refused["ok"] and "already seen" in refused["reason"]
        gen = c.show()["state"]["active"]["generation"]
        stale = c.submit(Ready(gen + 1, "p1", old, "proved", 0, ""))
        assert not stale["ok"]
        c.submit(Register("zz", 1))  # opens a proposal so that a pending generation exists
        pending = cluster.wait(addrs[2], lambda s: s["state"]["pending"] is not None
                               and any(m["peer_id"] == "zz" for m in s["state"]["pending"]["members"]))
        stale = c.submit(Ready(pending["state"]["pending"]["generation"], "p1", old, "proved", 0, ""))
        assert not stale["ok"] and "I3" in stale["reason"]
    with cluster.client(addrs[1]) as c:
        assert c.show()["agent"]["app_pid"] != pid


def test_leader_agent_kill_elects_new_leader_and_drops_its_member(cluster):
    addrs, show = start_three(cluster)
    leader_raft, leader_addr = show["raft"]["leader"], show["raft"]["leader_agent"]
    leader = next(a for a in cluster.agents.values() if a.addr == leader_addr)
    g = active(show)["generation"]
    leader.signal(signal.SIGKILL)
    survivor = next(a for a in addrs if a != leader_addr)
    after = cluster.wait(survivor, lambda s: active(s)["generation"] > g
                         and leader.peer_id not in dict(active_members(s)))
    assert after["raft"]["leader"] not in (None, leader_raft)
    assert len(active_members(after)) == 2
    # the dead leader's voter is removed by the new leader's agent (by its exact node id)
    repaired = cluster.wait(survivor, lambda s: leader_raft not in s["raft"]["nodes"])
    assert len(repaired["raft"]["voters"]) == 2


def test_fourth_agent_joins_through_any_member_then_leaves(cluster):
    addrs, show = start_three(cluster)
    (port,) = free_control_ports(1)
    addr4 = f"127.0.0.1:{port}"
    joiner = cluster.start("p3", addr4, [addrs[2]])            # any member: here the third
    joined = cluster.wait(addrs[0], lambda s: "p3" in dict(active_members(s)))
    assert len(active_members(joined)) == 4
    # 4 agents: 3 voters (an even count tolerates no more losses), the joiner a non-voting member
    assert len(joined["raft"]["voters"]) == 3 and joined["raft"]["nonvoters"] == [addr4]
    assert active(joined)["members"][-1]["peer_id"] == "p3"   # joiners are appended to the rank map
    joiner.signal(signal.SIGTERM)
    left = cluster.wait(addrs[0], lambda s: "p3" not in dict(active_members(s)) and not s["raft"]["nonvoters"])
    assert any(d["peer_id"] == "p3" and "left gracefully" in d["reason"] for d in active(left)["departed"])
    assert joiner.proc.wait(10) == 0


def test_a_voter_that_leaves_gracefully_says_it_left_not_that_no_quorum_recorded_it(cluster):
    """Seen in a stress run: a leaving voter whose removal the others committed (a removed node never hears
    that commit) warned that it "left without a Raft quorum to record it"."""
    addrs, show = start_three(cluster)
    leaver = cluster.agents["p2"]
    leaver.signal(signal.SIGTERM)
    left = cluster.wait(addrs[0], lambda s: "p2" not in dict(active_members(s)) and len(s["raft"]["voters"]) == 2)
    assert addrs[2] not in {v["agent"] for v in left["raft"]["voters"]}
    assert leaver.proc.wait(20) == 0
    assert "left without a Raft quorum" not in leaver.log.read_text(), leaver.log.read_text()


def test_a_voter_whose_application_finished_is_shown_leaving_until_it_is_gone(cluster, tmp_path):
    """The chaos guard counts a leaving voter as down (`voter_is_up`). An agent whose application finished cleanly
    leaves on its own, and `show` said `leaving: false` for it (only a requested leave counted): the guard let
    another voter's agent be killed while this one removed its voter, and the job lost its Raft majority."""
    app = [sys.executable, "-c", "import os, sys, time\n"
           f"while not os.path.exists({str(tmp_path)!r} + '/done-' + os.environ['P2PGEN_PEER_ID']): time.sleep(0.05)"]
    addrs, show = start_three(cluster, command=app)
    leaver = cluster.agents["p2"]
    voter = next(v for v in show["raft"]["voters"] if v["agent"] == addrs[2])
    with cluster.client(addrs[2]) as c:
        assert voter_is_up(voter, c.show())
    (tmp_path / "done-p2").touch()
    judged = []                                   # while p2 runs that voter, whether the guard counts it up
    while leaver.alive():
        try:
            with cluster.client(addrs[2]) as c:
                shown = c.show()
            if shown["raft"]["self"] == voter["node"]:
                judged.append(voter_is_up(voter, shown))
        except (OSError, P2PGenError):
            pass                                  # it is shutting down
        time.sleep(0.05)
    assert leaver.proc.wait(20) == 0, leaver.log.read_text()
    assert "application finished cleanly; leaving the job" in leaver.log.read_text()
    assert False in judged and True not in judged[judged.index(False):], judged


def test_paused_agent_is_evicted_and_rejoins_as_new_incarnation(cluster):
    addrs, show = start_three(cluster)
    victim = cluster.agents["p2"]
    old = dict(active_members(show))["p2"]
    victim.signal(signal.SIGSTOP)
    try:
        evicted = cluster.wait(addrs[0], lambda s: "p2" not in dict(active_members(s)))
        assert active(evicted)["generation"] > active(show)["generation"]
        time.sleep(0.5)
    finally:
        victim.signal(signal.SIGCONT)
    back = cluster.wait(addrs[0], lambda s: dict(active_members(s)).get("p2", old) > old)
    assert len(active_members(back)) == 3
    # it never resumed the old membership: old incarnation is tombstoned, never active again
    assert any(t["peer_id"] == "p2" and t["incarnation"] == old for t in back["state"]["tombstones"])
    with cluster.client(addrs[2]) as c:
        assert c.show()["agent"]["incarnation"] > old


def test_wrong_secret_is_refused_and_changes_nothing(cluster, tmp_path):
    addrs, show = start_three(cluster)
    bad = tmp_path / "bad-secret"
    bad.write_text("not-the-job-secret")
    (port,) = free_control_ports(1)
    intruder = cluster.start("mallory", f"127.0.0.1:{port}", [addrs[0]], secret_file=bad)
    assert intruder.proc.wait(30) == 2
    assert "authentication failed" in intruder.log.read_text()
    after = cluster.wait(addrs[0], lambda s: True)
    assert active(after) == active(show)
    assert after["raft"]["nodes"] == show["raft"]["nodes"]
    assert after["state"]["pending"] is None
    assert after["agent"]["refused_connections"] >= 1
    assert after["agent"]["refusals"]["rpc"]["auth_failed"] >= 1     # what `p2pgen show` prints as "refused:"


def test_the_last_voter_leaving_hands_the_voter_over_first(cluster):
    """A job of two agents has one Raft voter. Its agent leaving took the job's only voter with it: the other
    agent, a non-voting member, could commit nothing to the Raft log any more, and waited for a live member for
    ever. The leaving voter now has its successor promoted, hands leadership over and removes itself."""
    addrs = [f"127.0.0.1:{p}" for p in free_control_ports(2)]
    cluster.start("p0", addrs[0], [], command=APP)
    cluster.wait(addrs[0], lambda s: len(active_members(s)) == 1)          # p0 forms the job: its only voter
    cluster.start("p1", addrs[1], [addrs[0]], command=APP)
    show = cluster.wait(addrs[0], lambda s: len(active_members(s)) == 2)
    assert [v["agent"] for v in show["raft"]["voters"]] == [addrs[0]]
    leaver = cluster.agents["p0"]
    leaver.signal(signal.SIGTERM)
    assert leaver.proc.wait(30) == 0, leaver.log.read_text()
    after = cluster.wait(addrs[1], lambda s: [v["agent"] for v in s["raft"]["voters"]] == [addrs[1]]
                         and [p for p, _ in active_members(s)] == ["p1"], 30)
    assert after["raft"]["leader"] is not None
    assert "last Raft voter" not in leaver.log.read_text()

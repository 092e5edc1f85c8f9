"""Integration: network partitions as a fault, injected through `$P2PGEN_FAULTS` on 127.0.0.1.

Five agents train the exact integer mini-training (every agent a voter). Agents p3 and p4 are cut off from p0-p2
(both ways, only what p3 and p4 send, or only what they receive). The claims:
- the minority activates no generation: no certificate made while the partition lasts names p3 or p4, and the
  minority's own agents never apply a newer generation in the symmetric case;
- the majority continues: it activates a generation without the minority and keeps committing steps;
- after the heal the minority's applications come back as new incarnations, pull, and every member ends equal to
  the serial reference (equal digests); the Raft trace checker finds no violation.
The time from the heal to the minority being active again is printed (README, "Partitions as a fault").
A member alone in its generation (the two other applications restart slowly) whose agent is cut off one way (what it
sends is dropped, it hears everything) must stop committing within the detector's floor of the cut: it keeps
hearing the Raft leader, so only the lease (the job's echoes of its heartbeats) can tell it that nobody hears it.
The third case, a minority that can send but not hear, was a liveness bug: the majority kept hearing the deaf
agents' heartbeats, so nobody evicted them, while they, hearing no leader, could not vote `ready` for the re-form
their failed collectives requested. Heartbeats now say whom their sender cannot hear, and an agent that keeps
saying it cannot hear this one is reported like a silent one (`agent/heartbeat.py`).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from p2pgen import faults
from p2pgen.raft import checker
from p2pgen_lab.rigs.agents import active, active_members, free_control_ports
from tests.integration.test_state_survives import committed, finish
from tests.integration.test_training import read_traces

pytestmark = pytest.mark.timeout(300)

APP = [sys.executable, str(Path(__file__).parent / "apps" / "exact_train.py")]
STEPS = 400                  # 0.04 s a step: training goes on through the partition and the heal
PEERS = [f"p{i}" for i in range(5)]
MINORITY = PEERS[3:]


def generation_of(show: dict) -> int:
    return active(show)["generation"] if active(show) else -1


def certificates(cluster, addr: str) -> list[dict]:
    with cluster.client(addr) as c:
        return [h["certificate"] for h in c.history() if h["certificate"]]


def run_partition(cluster, tmp_path, monkeypatch, mode: str) -> dict[str, float]:
    """mode: `both` (symmetric), `mute` (what the minority sends is dropped), `deaf` (what it receives is)."""
    dirs = {n: tmp_path / n for n in ("summaries", "traces", "markers")}
    for d in dirs.values():
        d.mkdir()
    rules = tmp_path / "faults.json"
    faults.heal(rules)
    for key, value in (("EXACT_MARKERS", dirs["markers"]), ("EXACT_STEP_DELAY", "0.04"), ("EXACT_STEPS", STEPS),
                       ("P2PGEN_SUMMARY_DIR", dirs["summaries"]), ("P2PGEN_TRACE_DIR", dirs["traces"]),
                       (faults.ENV, rules)):
        monkeypatch.setenv(key, str(value))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parents[2]),
                                                      os.environ.get("PYTHONPATH", "")]))
    addrs = [f"127.0.0.1:{p}" for p in free_control_ports(5)]
    for peer, addr in zip(PEERS, addrs):
        cluster.start(peer, addr, [a for a in addrs if a != addr], command=APP,
                      extra=("--min-members=5", "--attach-grace=60"))
    cluster.wait(addrs[0], lambda s: len(active_members(s)) == 5 and len(s["raft"]["voters"]) == 5, 90)
    cluster.wait_until(lambda: committed(dirs["traces"]) >= 10, 90, "10 steps committed")

    majority, minority = addrs[:3], addrs[3:]
    before = generation_of(cluster.wait(addrs[0], lambda s: active(s) is not None))
    if mode == "deaf":
        faults.write_partition(rules, [majority, minority], one_way=True)
    else:
        faults.write_partition(rules, [minority, majority], one_way=mode == "mute")
    cut_at = time.monotonic()
    show = cluster.wait(addrs[0], lambda s: generation_of(s) > before and {p for p, _ in active_members(s)}
                        == set(PEERS[:3]), 60)
    figures = {"cut_to_majority_active_s": time.monotonic() - cut_at}
    during = generation_of(show)
    at_activation = committed(dirs["traces"])
    cluster.wait_until(lambda: committed(dirs["traces"]) >= at_activation + 10, 60, "the majority committing steps")
    if mode == "both":                  # the minority hears nothing: it cannot even learn of the new generation
        for addr in minority:
            with cluster.client(addr) as c:
                assert generation_of(c.show()) <= before
    last_cut = generation_of(cluster.wait(addrs[0], lambda s: active(s) is not None))

    faults.heal(rules)
    healed_at = time.monotonic()
    back = cluster.wait(addrs[0], lambda s: {p for p, _ in active_members(s)} == set(PEERS), 90)
    figures["heal_to_minority_active_s"] = time.monotonic() - healed_at
    assert all(inc > 1 for p, inc in active_members(back) if p in MINORITY), active_members(back)   # I3
    for cert in certificates(cluster, addrs[0]):
        if before < cert["generation"] <= last_cut:
            assert not {m["peer_id"] for m in cert["members"]} & set(MINORITY), cert
    assert during <= last_cut

    finals = finish(cluster, dirs["summaries"], STEPS, PEERS)
    assert len({f["digest"] for f in finals}) == 1
    result = checker.check_dir(dirs["traces"])
    assert result.passed, result.render()
    print(f"\npartition {mode} 2|3: " +
          ", ".join(f"{k}={v:.2f}" for k, v in figures.items()))
    return figures


@pytest.mark.slow
def test_a_symmetric_partition_2_3_leaves_the_majority_training_and_the_minority_rejoins(cluster, tmp_path,
                                                                                        monkeypatch):
    run_partition(cluster, tmp_path, monkeypatch, "both")


@pytest.mark.slow
def test_a_minority_that_can_hear_but_not_speak_activates_nothing_and_rejoins(cluster, tmp_path, monkeypatch):
    run_partition(cluster, tmp_path, monkeypatch, "mute")


def test_a_minority_that_can_speak_but_not_hear_is_left_behind_by_the_majority(cluster, tmp_path, monkeypatch):
    run_partition(cluster, tmp_path, monkeypatch, "deaf")


def test_a_member_alone_whose_agent_cannot_speak_stops_committing_within_the_floor(cluster, tmp_path, monkeypatch):
    """The member kept runs on an agent that does not lead (a leader that loses its quorum steps down within
    0.5 s, which the old fence saw; a follower keeps hearing the leader). Its return after the heal (evicted
    meanwhile, a new incarnation) is `run_partition`'s; here every next incarnation waits a minute."""
    traces, rules = tmp_path / "traces", tmp_path / "faults.json"
    traces.mkdir()
    faults.heal(rules)
    for key, value in (("EXACT_STEP_DELAY", "0.01"), ("EXACT_STEPS", 100000), ("P2PGEN_TRACE_DIR", traces),
                       ("EXACT_JOIN_DELAY", "p0:2:60,p1:2:60,p2:2:60"), (faults.ENV, rules)):
        monkeypatch.setenv(key, str(value))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parents[2]),
                                                      os.environ.get("PYTHONPATH", "")]))
    addrs = [f"127.0.0.1:{p}" for p in free_control_ports(3)]
    for i, addr in enumerate(addrs):
        cluster.start(f"p{i}", addr, [a for a in addrs if a != addr], command=APP,
                      extra=("--min-members=1", "--attach-grace=60"))
    show = cluster.wait(addrs[0], lambda s: len(active_members(s)) == 3 and len(s["raft"]["voters"]) == 3
                        and s["raft"]["leader_agent"] is not None, 90)
    cluster.wait_until(lambda: committed(traces) >= 5, 90, "5 steps committed by the three")
    alone = next(i for i, addr in enumerate(addrs) if addr != show["raft"]["leader_agent"])
    for addr in addrs[:alone] + addrs[alone + 1:]:   # their next incarnations wait a minute before they join
        with cluster.client(addr) as c:
            os.kill(c.show()["agent"]["app_pid"], signal.SIGKILL)
    cluster.wait(addrs[alone], lambda s: [p for p, _ in active_members(s)] == [f"p{alone}"], 60)
    at_alone = committed(traces)
    cluster.wait_until(lambda: committed(traces) >= at_alone + 20, 60, "20 steps committed alone")
    faults.write_partition(rules, [[addrs[alone]], addrs[:alone] + addrs[alone + 1:]], one_way=True)
    cut = time.time()
    time.sleep(3.0)                     # beyond the floor, the timeout and an election: the old fence's reach
    faults.heal(rules)
    window = faults.Window(cut, time.time(), frozenset({addrs[alone]}), frozenset({f"p{alone}"}), one_way=True)
    commits = [(e["t"], e["peer"]) for events in read_traces(traces).values() for e in events
               if e["event"] == "commit"]
    assert faults.minority_violations([window], commits, []) == []
    assert any(peer == f"p{alone}" and cut - 1.0 < t < cut for t, peer in commits)    # it trained up to the cut

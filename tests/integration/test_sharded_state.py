"""Integration: transactional repartition of sharded state across membership changes.

Four members run `apps/sharded_train.py`: a replicated vector w and a sharded vector m (4 shards, r = 2,
ZeRO-1 style). Then one application is killed (its agent restarts it: the new incarnation restored its local
copy, which holds no shards) and one whole host is killed (its agent too). At each change the election
chooses the new ownership map, the members that must receive a shard copy it from a surviving owner, and
only then does the generation activate. The final w equals the one-process reference only if every shard
survived at the right revision; the certificates say which shards moved, from whom, and why.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from p2pgen_lab.rigs.agents import active, free_control_ports
from tests.integration.apps.sharded_train import SHARDS, reference
from tests.integration.test_state_survives import committed, wait_certificate

pytestmark = pytest.mark.timeout(240)

APP = [sys.executable, str(Path(__file__).parent / "apps" / "sharded_train.py")]
PEERS = ("p0", "p1", "p2", "p3")


@pytest.fixture
def run_env(tmp_path, monkeypatch):
    dirs = {name: tmp_path / name for name in ("summaries", "traces")}
    for d in dirs.values():
        d.mkdir()
    monkeypatch.setenv("EXACT_STEP_DELAY", "0.05")
    monkeypatch.setenv("P2PGEN_SUMMARY_DIR", str(dirs["summaries"]))
    monkeypatch.setenv("P2PGEN_TRACE_DIR", str(dirs["traces"]))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parents[2]),
                                                      os.environ.get("PYTHONPATH", "")]))
    return dirs


def owners_of(cert: dict) -> dict[int, list[str]]:
    return {e["shard"]: [o.split("#")[0] for o in e["owners"]] for e in cert["ownership"]}


def test_shards_move_from_replicas_before_activation_and_training_stays_exact(cluster, run_env, monkeypatch):
    steps = 90
    monkeypatch.setenv("EXACT_STEPS", str(steps))
    addrs = [f"127.0.0.1:{p}" for p in free_control_ports(len(PEERS))]
    for peer, addr in zip(PEERS, addrs):
        cluster.start(peer, addr, [a for a in addrs if a != addr], command=APP,
                      extra=("--min-members=4", "--attach-grace=60"))
    first, _ = wait_certificate(cluster, addrs[0], lambda c: len(c["members"]) == 4 and c["ownership"], 90,
                                "the first generation of four")
    assert all(len(o) == 2 for o in owners_of(first).values()) and first["moved"] == []
    cluster.wait_until(lambda: committed(run_env["traces"]) >= 10, 90, "10 steps committed")

    # 1. an application crash: its new incarnation comes back without shards; they are copied from replicas
    with cluster.client(addrs[1]) as c:
        os.kill(c.show()["agent"]["app_pid"], signal.SIGKILL)
    killed_at = time.time()
    crash, history = wait_certificate(cluster, addrs[0], lambda c: c["activated_at"] > killed_at
                                and len(c["members"]) == 4
                                and any(m["peer_id"] == "p1" and m["incarnation"] > 1 for m in c["members"]), 90,
                                "the generation with p1's new incarnation")
    assert crash["moved"], crash                 # the new incarnation receives its share (rebalanced onto it)
    assert all(m["sources"] and "p1" not in m["sources"] for m in crash["moved"])
    assert any(m["to"].startswith("p1#") for m in crash["moved"])
    # while p1 was away, the shards it owned were copied from their other owner (a replica) to the others
    between = [c for c in history if killed_at < c["activated_at"] and c["generation"] < crash["generation"]]
    for cert in between:
        assert {rec["reconstruction_source"] for rec in cert["objects"]} == {"replica"}, cert["objects"]
    cluster.wait_until(lambda: committed(run_env["traces"]) >= crash["frontier"]["revision"] + 5, 90, "5 more steps")

    # 2. a whole host dies: 4 -> 3 members; p3's shards are copied from their other owner. The map to compare
    # with is the active one when p3 dies (on a loaded machine another generation may follow the crash's).
    before = active(cluster.wait(addrs[0], lambda s: active(s) is not None and len(active(s)["members"]) == 4))
    os.killpg(cluster.agents["p3"].pid, signal.SIGKILL)
    lost_at = time.time()
    three, history = wait_certificate(cluster, addrs[0], lambda c: c["activated_at"] > lost_at
                                      and len(c["members"]) == 3, 90, "the generation of three")
    held_by_p3 = {i for i, o in owners_of(before).items() if "p3" in o}
    assert {m["shard"] for m in three["moved"]} <= held_by_p3
    for i, owners in owners_of(three).items():
        assert len(owners) == 2 and "p3" not in owners
        if i not in held_by_p3:
            assert owners == owners_of(before)[i], "a shard whose owners survived does not move"
    assert three["regressed_from"] is None and three["ownership_version"] > before["ownership_version"]
    record = three["objects"][0]
    assert record["object_id"] == "m" and record["application_revision"] == three["frontier"]["revision"]
    assert set(record["old_owner_incarnations"]) == {str(i) for i in range(SHARDS)}

    for peer in ("p0", "p1", "p2"):
        agent = cluster.agents[peer]
        cluster.wait_until(lambda: not agent.alive(), 150, f"{peer} finishing")
        assert agent.proc.returncode == 0, cluster.logs()
    finals = [json.loads(Path(p).read_text()) for p in glob.glob(str(run_env["summaries"] / "*.json"))]
    assert sorted(f["peer"] for f in finals) == ["p0", "p1", "p2"]
    for f in finals:
        assert f["revision"] == steps and f["w"] == reference(steps).tolist(), f
    # memory: each member holds r/world of m's shards (8 of 4 * 2 shard copies over 3 members: 2 or 3 shards)
    assert sorted(len(f["held"]) for f in finals) in ([2, 3, 3], [2, 2, 4])
    assert all(c["regressed_from"] is None for c in history)


@pytest.mark.slow
def test_both_owners_hosts_lost_falls_back_to_a_checkpoint_holding_every_shard(cluster, run_env, tmp_path,
                                                                               monkeypatch):
    """Every owner of a shard loses its host (no local copy survives): the revision cannot be rebuilt whole,
    so the job waits (--regress-wait), then resumes from the newest checkpoint whose shards were all written
    by their first owners, loudly (regressed_from), and still ends equal to the reference."""
    steps, ckpts = 150, tmp_path / "checkpoints"
    monkeypatch.setenv("EXACT_STEPS", str(steps))
    peers = ("p0", "p1", "p2", "p3", "p4")
    addrs = [f"127.0.0.1:{p}" for p in free_control_ports(len(peers))]
    for peer, addr in zip(peers, addrs):
        cluster.start(peer, addr, [a for a in addrs if a != addr], command=APP,
                      extra=("--min-members=5", "--attach-grace=60", f"--checkpoint-dir={ckpts}",
                             "--checkpoint-every=10", "--regress-wait=3"))
    cluster.wait_until(lambda: committed(run_env["traces"]) >= 25, 120, "25 steps committed")
    with cluster.client(addrs[0]) as c:
        cert = c.show()["state"]["active"]
    owners = sorted({o.split("#")[0] for o in owners_of(cert)[0]})
    assert len(owners) == 2
    for owner in owners:                                            # both hosts of shard 0's owners, at once
        os.killpg(cluster.agents[owner].pid, signal.SIGKILL)
    lost_at = time.time()
    live = [a for p, a in zip(peers, addrs) if p not in owners]
    back, history = wait_certificate(cluster, live[0], lambda c: c["activated_at"] > lost_at, 90,
                                     "the generation after both owners were lost")
    assert back["regressed_from"] is not None and back["frontier_source"] == "checkpoint", back["recovery"]
    assert back["frontier"]["revision"] % 10 == 0 and "REGRESSED" in back["recovery"]
    assert {rec["reconstruction_source"] for rec in back["objects"]} == {"checkpoint"}
    assert all(len(o) == 2 and not set(o) & set(owners) for o in owners_of(back).values())
    survivors = [p for p in peers if p not in owners]
    for peer in survivors:
        agent = cluster.agents[peer]
        cluster.wait_until(lambda: not agent.alive(), 150, f"{peer} finishing")
        assert agent.proc.returncode == 0, cluster.logs()
    finals = [json.loads(Path(p).read_text()) for p in glob.glob(str(run_env["summaries"] / "*.json"))]
    assert sorted(f["peer"] for f in finals) == survivors
    for f in finals:
        assert f["revision"] == steps and f["w"] == reference(steps).tolist(), f

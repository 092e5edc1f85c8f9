"""Integration: every sample exactly once under churn, counted from the trace and checked in the state.

Four members train `apps/data_train.py` (the state is a histogram of the samples consumed; two members read
through `ElasticLoader` with two DataLoader worker processes, the others straight from the sampler). An
application is SIGKILLed, a whole host (agent and application) is killed and not replaced (world 4 -> 3), then
two peers join (-> 5). Then:
- every committed revision was committed in one generation, every rank of that generation logged the indices it
  used, and together they are exactly that revision's global batch;
- over the run every dataset index was used exactly as often as the sample stream holds it (once per epoch);
- every member ends with the serial reference histogram and one digest.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from p2pgen.data import ElasticSampler
from p2pgen.state import SharedState
from p2pgen_lab.rigs.agents import active_members, free_control_ports
from tests.integration.apps.data_train import BATCH, SEED, N, reference

pytestmark = pytest.mark.timeout(240)

APP = [sys.executable, str(Path(__file__).parent / "apps" / "data_train.py")]
STEPS = 120
HOLD_AT = 80        # from there the survivors slow down (20 s for the last 40 revisions) while the two joiners start


def read_log(directory: Path) -> list[dict]:
    out = []
    for path in glob.glob(str(directory / "*.jsonl")):
        out += [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return out


def committed(directory: Path) -> int:
    return max((e["rev"] + 1 for e in read_log(directory) if e["event"] == "commit"), default=0)


def test_every_sample_is_used_once_across_kills_and_joins(cluster, tmp_path, monkeypatch):
    dirs = {name: tmp_path / name for name in ("summaries", "log")}
    for d in dirs.values():
        d.mkdir()
    for key, value in (("DATA_STEPS", STEPS), ("DATA_LOG", dirs["log"]), ("P2PGEN_SUMMARY_DIR", dirs["summaries"]),
                       ("DATA_HOLD", f"{HOLD_AT}:5"),
                       ("PYTHONPATH", os.pathsep.join([str(Path(__file__).parents[2]),
                                                       os.environ.get("PYTHONPATH", "")]))):
        monkeypatch.setenv(key, str(value))
    addrs = [f"127.0.0.1:{p}" for p in free_control_ports(6)]
    peers = [f"p{i}" for i in range(6)]
    workers = {"p1": "2", "p3": "2", "p4": "2"}

    def start(i: int, extra: tuple[str, ...] = ()) -> None:
        cluster.start(peers[i], addrs[i], [a for a in addrs[:4] if a != addrs[i]], command=APP,
                      extra=("--attach-grace=60", *extra), env={"DATA_WORKERS": workers.get(peers[i], "0")})

    for i in range(4):
        start(i, ("--min-members=4",))
    cluster.wait_until(lambda: committed(dirs["log"]) >= 15, 120, "15 steps committed by 4 members")
    with cluster.client(addrs[2]) as c:
        os.kill(c.show()["agent"]["app_pid"], signal.SIGKILL)                 # an application dies
    at = committed(dirs["log"])
    cluster.wait_until(lambda: committed(dirs["log"]) >= at + 15, 60, "training on after the application kill")
    os.killpg(cluster.agents["p3"].pid, signal.SIGKILL)                        # a host dies: 4 -> 3
    cluster.wait(addrs[0], lambda s: sorted(p for p, _ in active_members(s)) == peers[:3], 60)
    at = committed(dirs["log"])
    cluster.wait_until(lambda: committed(dirs["log"]) >= at + 10, 60, "three members training")
    start(4)
    start(5)                                                                   # two join: 3 -> 5
    cluster.wait(addrs[0], lambda s: sorted(p for p, _ in active_members(s)) == peers[:3] + peers[4:], 90)

    for peer in ("p0", "p1", "p2", "p4", "p5"):
        agent = cluster.agents[peer]
        cluster.wait_until(lambda: not agent.alive(), 120, f"{peer} finishing")
        assert agent.proc.returncode == 0, cluster.logs()
    finals = [json.loads(Path(p).read_text()) for p in glob.glob(str(dirs["summaries"] / "*.json"))]
    assert sorted(f["peer"] for f in finals) == ["p0", "p1", "p2", "p4", "p5"]
    assert {f["revision"] for f in finals} == {STEPS} and len({f["digest"] for f in finals}) == 1
    assert all(f["counts"] == reference(STEPS).tolist() for f in finals)
    assert any(f["restarts"] for f in finals if f["peer"] in workers), "no loader ever dropped its prefetch"

    log = read_log(dirs["log"])
    generation_of: dict[int, set[int]] = defaultdict(set)
    for e in log:
        if e["event"] == "commit":
            generation_of[e["rev"]].add(e["gen"])
    assert sorted(generation_of) == list(range(STEPS)), "every revision committed"
    assert all(len(g) == 1 for g in generation_of.values()), "a revision committed in two generations"
    used: dict[tuple[int, int], dict[int, list[int]]] = defaultdict(dict)
    worlds: dict[tuple[int, int], int] = {}
    for e in log:
        if e["event"] == "used":
            used[(e["gen"], e["rev"])][e["rank"]] = e["ids"]
            worlds[(e["gen"], e["rev"])] = e["world"]
    sampler = ElasticSampler(SharedState(), N, BATCH, SEED)
    everything: list[int] = []
    seen_worlds = set()
    for rev, (gen,) in sorted(generation_of.items()):
        by_rank = used[(gen, rev)]
        seen_worlds.add(worlds[(gen, rev)])
        assert sorted(by_rank) == list(range(worlds[(gen, rev)])), f"revision {rev}: a rank's indices missing"
        ids = [i for rank in sorted(by_rank) for i in by_rank[rank]]
        assert ids == sampler.global_indices(rev).tolist(), f"revision {rev}: not its global batch"
        everything += ids
    assert {3, 4, 5} <= seen_worlds, seen_worlds
    counts = np.bincount(everything, minlength=N)
    epochs, rest = divmod(STEPS * BATCH, N)
    assert sorted(set(counts.tolist())) == ([epochs, epochs + 1] if rest else [epochs])
    assert np.array_equal(counts, reference(STEPS))

"""DiLoCo under agents, with an exact oracle: every committed outer revision equals the serial history that
replays the contributor sets the traces recorded, across an application killed during its inner steps, one
killed after the outer all-reduce, a host (agent and application) killed, and two joins.

The app (apps/diloco_train.py) keeps every value on a 2**-20 grid, so sums are exact in any order and the
single-process reference computes the same bits. From the traces: each committed revision was committed
in exactly one generation, every member of that generation said what it contributed, the contributors'
rounds were bound in one generation at distinct ranks (no sample twice in one outer step), and survivors of
the inner-phase kill contributed the rounds they had run before it (reused, no inner step run again).
"""

from __future__ import annotations

import glob
import json
import os
import signal
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from p2pgen_lab.rigs.agents import active_members, free_control_ports
from tests.integration.apps.diloco_train import reference

pytestmark = pytest.mark.timeout(240)

APP = [sys.executable, str(Path(__file__).parent / "apps" / "diloco_train.py")]
STEPS = 60
HOLD_AT = 40        # from there the survivors slow down (30 s for the last 20 revisions) while the two joiners
                    # are still importing torch under load


def trace_events(directory: Path) -> list[dict]:
    out = []
    for path in glob.glob(str(directory / "*.jsonl")):
        out += [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return out


def committed(directory: Path) -> int:
    return max((e["revision"] for e in trace_events(directory) if e["event"] == "commit"), default=0)


def test_outer_revisions_equal_the_serial_history_across_kills_and_joins(cluster, tmp_path, monkeypatch):
    dirs = {name: tmp_path / name for name in ("summaries", "traces", "markers")}
    for d in dirs.values():
        d.mkdir()
    env = {"DILOCO_STEPS": STEPS, "DILOCO_MARKERS": dirs["markers"], "P2PGEN_SUMMARY_DIR": dirs["summaries"],
           "P2PGEN_TRACE_DIR": dirs["traces"], "DILOCO_INNER_DELAY": 0.04,
           "DILOCO_FAULTS": "p1:inner:4,p2:after_allreduce:9", "DILOCO_HOLD": f"{HOLD_AT}:5",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    addrs = [f"127.0.0.1:{p}" for p in free_control_ports(6)]
    peers = [f"p{i}" for i in range(6)]

    def start(i: int, extra: tuple[str, ...] = ()) -> None:
        cluster.start(peers[i], addrs[i], [a for a in addrs[:4] if a != addrs[i]], command=APP,
                      extra=("--attach-grace=60", *extra))

    for i in range(4):
        start(i, ("--min-members=4",))
    cluster.wait_until(lambda: committed(dirs["traces"]) >= 16, 150, "16 outer steps past both app kills")
    os.killpg(cluster.agents["p3"].pid, signal.SIGKILL)                        # a host dies: 4 -> 3
    cluster.wait(addrs[0], lambda s: sorted(p for p, _ in active_members(s)) == peers[:3], 60)
    start(4)
    start(5)                                                                   # two join: 3 -> 5
    for peer in ("p0", "p1", "p2", "p4", "p5"):
        agent = cluster.agents[peer]
        cluster.wait_until(lambda: not agent.alive(), 150, f"{peer} finishing")
        assert agent.proc.returncode == 0, cluster.logs()
    assert sorted(os.listdir(dirs["markers"])) == ["p1_inner_4", "p2_after_allreduce_9"], "both faults fired"

    events = trace_events(dirs["traces"])
    generation_of: dict[int, set[int]] = defaultdict(set)
    for e in events:
        if e["event"] == "commit":
            generation_of[e["revision"] - 1].add(e["generation"])
    assert sorted(generation_of) == list(range(STEPS)), "every outer revision committed"
    assert all(len(g) == 1 for g in generation_of.values()), "an outer revision committed in two generations"
    members_of = {e["generation"]: e["world"] for e in events if e["event"] == "active"}
    said: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for e in events:
        if e["event"] == "outer":
            said[(e["generation"], e["revision"])].append(e)
    contributors, reused, worlds = [], 0, set()
    for revision in range(STEPS):
        (generation,) = generation_of[revision]
        records = said[(generation, revision)]
        assert len(records) == members_of[generation], f"revision {revision}: a member's contribution unknown"
        rounds = [r["round"] for r in records if r["weight"]]
        assert len({(gen, world) for _, gen, _, world in rounds}) == 1, f"revision {revision}: mixed rounds"
        assert len({rank for _, _, rank, _ in rounds}) == len(rounds), f"revision {revision}: a rank twice"
        assert all(rev == revision for rev, _, _, _ in rounds)
        contributors.append(sorted((rank, world) for _, _, rank, world in rounds))
        reused += sum(r["reused"] and r["inner_steps"] == 0 for r in records if r["weight"])
        worlds.add(members_of[generation])
    assert reused >= 2, "the survivors of the inner-phase kill ran their rounds again"
    assert {3, 5} <= worlds, worlds

    finals = [json.loads(Path(p).read_text()) for p in glob.glob(str(dirs["summaries"] / "*.json"))]
    assert sorted(f["peer"] for f in finals) == ["p0", "p1", "p2", "p4", "p5"]
    assert {f["revision"] for f in finals} == {STEPS} and len({f["digest"] for f in finals}) == 1
    expected = reference(contributors)
    assert all(torch.equal(torch.tensor(f["w"], dtype=torch.float64), expected) for f in finals)

"""FSDP2 on p2pgen across generation changes, on real processes.

Three members run examples/fsdp_spot.py (a float64 transformer sharded with fully_shard on each generation's
mesh). p1 SIGKILLs itself just before backward at revision 3, so the others are inside FSDP2's collectives
when it dies; its agent restarts it as a new incarnation, and a fourth peer joins; every member holds at
revision 6 until four members train together (so the model is re-sharded on worlds 3 -> 2 -> 3 -> 4). At the
end every member's parameters must be bit-identical and equal to the single-process float64 reference over
the same committed steps to 1e-12; every discarded step must have been discarded by GenerationChanged or
PeerLost (never a size-mismatch RuntimeError: an application that crashed would have been restarted, and
only p1 was, once).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from p2pgen_lab.rigs.agents import free_control_ports

pytestmark = pytest.mark.timeout(400)

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "fsdp_spot.py"
STEPS, SEED, LR, MOMENTUM = 9, 1, 0.1, 0.9
TOLERANCE = 1e-12      # members SUM shard gradients; the reference sums the whole batch: float64 re-association


def load_example():
    spec = importlib.util.spec_from_file_location("fsdp_spot", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_job(cluster, tmp_path, monkeypatch, app_args: list[str], faults: str = "", hold: str = "",
            joiner: bool = False, size: int = 3, name: str = "job") -> dict[str, dict]:
    markers, summaries = tmp_path / f"{name}-markers", tmp_path / f"{name}-summaries"
    markers.mkdir(exist_ok=True)
    summaries.mkdir(exist_ok=True)
    monkeypatch.setenv("FSDP_FAULTS", faults)
    monkeypatch.setenv("FSDP_MARKERS", str(markers))
    monkeypatch.setenv("FSDP_HOLD", hold)
    monkeypatch.setenv("P2PGEN_SUMMARY_DIR", str(summaries))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    app = [sys.executable, str(EXAMPLE), f"--seed={SEED}", f"--lr={LR}", f"--momentum={MOMENTUM}",
           "--step-delay=0.05", *app_args]
    addrs = [f"127.0.0.1:{p}" for p in free_control_ports(size + 1)]
    members = addrs[:size]
    for i, addr in enumerate(members):
        cluster.start(f"p{i}", addr, [a for a in members if a != addr], command=app,
                      extra=(f"--min-members={size}", "--attach-grace=60"))
    if joiner:
        cluster.wait_until(lambda: any(markers.iterdir()), 200, "p1 killing itself before backward")
        cluster.start(f"p{size}", addrs[size], [members[0]], command=app, extra=("--attach-grace=60",))
    for agent in [a for a in cluster.agents.values() if a.alive()]:
        cluster.wait_until(lambda: not agent.alive(), 300, f"{agent.peer_id} finishing")
        assert agent.proc.returncode == 0, cluster.logs()
    return {f["peer"]: f for f in (json.loads(p.read_text()) for p in summaries.glob("*.json"))}


def max_difference(final: dict, expected: dict[str, torch.Tensor]) -> float:
    return max((torch.tensor(final["params"][name], dtype=torch.float64).reshape(want.shape) - want).abs().max().item()
               for name, want in expected.items())


def test_fsdp2_survives_a_kill_and_a_join_and_equals_the_single_process_reference(cluster, tmp_path, monkeypatch):
    finals = run_job(cluster, tmp_path, monkeypatch, [f"--steps={STEPS}"], faults="p1:before_backward:3",
                     hold="6:4", joiner=True)
    assert sorted(finals) == ["p0", "p1", "p2", "p3"], cluster.logs()
    assert finals["p1"]["incarnation"] == 2 and all(finals[p]["incarnation"] == 1 for p in ("p0", "p2", "p3"))
    assert all(f["revision"] == STEPS for f in finals.values())
    assert len({f["digest"] for f in finals.values()}) == 1, "members ended with different parameters"
    discarded = {kind for f in finals.values() for kind in f["discarded_by"]}
    assert discarded and discarded <= {"GenerationChanged", "PeerLost"}, discarded
    assert {2, 3, 4} <= set(finals["p0"]["worlds"]), finals["p0"]["worlds"]

    example = load_example()
    expected = example.reference(STEPS, SEED, LR, MOMENTUM)
    for f in finals.values():
        assert max_difference(f, expected) <= TOLERANCE, (f["peer"], max_difference(f, expected))
    one_step_short = example.reference(STEPS - 1, SEED, LR, MOMENTUM)
    gap = max((expected[n] - one_step_short[n]).abs().max().item() for n in expected)
    assert gap > 1e6 * TOLERANCE, f"one step changes the parameters by only {gap}: the check is too loose"


@pytest.mark.slow
def test_a_job_restored_from_a_dcp_checkpoint_of_another_ends_where_the_reference_does(cluster, tmp_path, monkeypatch):
    """Job 1 (three members) saves FSDP2's sharded state with DCP at revision 3 and trains on to 6; job 2 (two
    members, new agents) starts from that checkpoint at revision 3 and trains to 6: both end at the reference."""
    steps, checkpoint = 6, str(tmp_path / "checkpoint")
    first = run_job(cluster, tmp_path, monkeypatch, [f"--steps={steps}", f"--checkpoint={checkpoint}", "--save-at=3"],
                    name="first")
    resumed = run_job(cluster, tmp_path, monkeypatch, [f"--steps={steps}", f"--resume={checkpoint}"], size=2,
                      name="resumed")
    assert sorted(first) == ["p0", "p1", "p2"] and sorted(resumed) == ["p0", "p1"], cluster.logs()
    assert all(f["steps_committed"] == 3 for f in resumed.values()), "the resumed job did not start at revision 3"
    expected = load_example().reference(steps, SEED, LR, MOMENTUM)
    for f in [*first.values(), *resumed.values()]:
        assert f["revision"] == steps and max_difference(f, expected) <= TOLERANCE, \
            (f["peer"], max_difference(f, expected))

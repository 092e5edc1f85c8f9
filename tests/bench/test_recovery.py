"""`p2pgen bench recovery`: the cheap pieces for real (per-step overhead of a no-op model on two agents,
through the CLI), the step-loop trace analysis on a hand-written transcript, and the JSON shape that
`p2pgen sim --recovery-json` reads. No speed figure is asserted."""

from __future__ import annotations

import json

import pytest

from p2pgen import cli
from p2pgen.bench import recovery
from p2pgen.simulator.costs import load_costs

pytestmark = pytest.mark.timeout(90)


def commit(peer: str, inc: int, generation: int, revision: int, t: float) -> dict:
    return {"event": "commit", "peer": peer, "incarnation": inc, "generation": generation, "revision": revision, "t": t}


def certificate(peer: str, inc: int, generation: int, world: int, t: float, activated_at: float) -> dict:
    return {"event": "certificate", "peer": peer, "incarnation": inc, "generation": generation, "world": world,
            "t": t, "activated_at": activated_at}


# A restart-all transcript: three members commit revisions 9 and 10 in generation 2; p1 is killed at
# t=10.0; everyone restarts (new incarnations) from the checkpoint at revision 8 and trains in generation 5.
RESTART_ALL = [
    *(commit(p, 1, 2, r, 9.0 + (r - 9) * 0.5) for p in recovery.PEERS for r in (9, 10)),
    *({"event": "start", "peer": p, "incarnation": 2, "t": 11.0} for p in recovery.PEERS),
    *(certificate(p, 2, 5, 3, 12.1, 12.0) for p in recovery.PEERS),
    *(commit(p, 2, 5, r, 12.0 + (r - 8) * 0.5) for p in recovery.PEERS for r in (9, 10, 11)),
]


def test_analysis_of_a_restart_all_fault_counts_the_rollback_and_the_restarts():
    fault = recovery.Fault("restart-all", "sigkill_app", "p1", 10.0)
    got = recovery.analyze_fault(RESTART_ALL, fault)
    assert got["revision_at_fault"] == 10
    assert got["rollback_steps"] == 2                       # revisions 9 and 10 are computed again
    assert got["to_active_s"] == pytest.approx(2.0)
    assert got["to_first_commit_s"] == pytest.approx(2.5)   # revision 9 again
    assert got["to_regain_s"] == pytest.approx(3.5)         # revision 11: past the pre-fault revision
    assert got["processes_started"] == 3


def test_json_keeps_the_keys_p2pgen_sim_reads_and_adds_every_section(tmp_path):
    membership = {k: [0.1, 0.2] for k in ("sigkill_app_to_active_s", "sigstop_app_to_active_s",
                                          "leader_agent_kill_to_active_s", "join_to_member_s")}
    fault = recovery.analyze_fault(RESTART_ALL, recovery.Fault("restart-all", "sigkill_app", "p1", 10.0))
    results = {"membership": membership, "steploop": [fault, {**fault, "policy": "p2pgen"}],
               "overhead": recovery.summarize_overhead({"world": 2, "steps_per_block": 10, "step_s": [0.02, 0.03],
                                                        "bare_s": [0.01, 0.01]})}
    doc = json.loads(recovery.to_json(results, 1.0, recovery.Plan.quick()))
    assert doc["agent_kill_to_active_s"]["p50"] == doc["leader_agent_kill_to_active_s"]["p50"]
    assert doc["steploop"]["summary"]["restart-all"]["sigkill_app"]["rollback_steps"]["p50"] == 2
    assert doc["step_overhead"]["overhead_us"] == pytest.approx(1500.0)
    (tmp_path / "recovery.json").write_text(json.dumps(doc))
    costs = load_costs(tmp_path / "recovery.json")
    assert costs.evict_p50 == pytest.approx(0.15)
    text = recovery.format_text(results, 1.0, recovery.Plan.quick())
    assert "restart-all p50" in text and "overhead/step" in text and "sigkill_app_to_active_s" in text


def test_cli_measures_the_per_step_overhead_of_a_no_op_model_on_two_agents(capsys):
    rc = cli.main(["bench", "recovery", "--quick", "--only", "overhead", "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert "sigkill_app_to_active_s" not in doc and "steploop" not in doc      # only the section asked for
    s = doc["step_overhead"]
    plan = recovery.Plan.quick()
    assert s["world"] == 2 and s["steps_per_block"] == plan.overhead_steps and s["blocks"] == plan.overhead_blocks
    assert len(s["step_us_blocks"]) == len(s["bare_us_blocks"]) == plan.overhead_blocks
    assert all(v > 0 for v in s["step_us_blocks"] + s["bare_us_blocks"])
    assert s["ratio"] > 0 and s["overhead_us_min"] <= s["overhead_us"] <= s["overhead_us_max"]

"""`p2pgen bench recovery`: the cheap pieces for real (per-step overhead of a no-op model on two agents,
through the CLI), the step-loop trace analysis on hand-written transcripts (rollback, heal), the table with
every peer, the skip of a peer that is not installed, and the JSON shape that `p2pgen sim --recovery-json`
reads. No speed figure is asserted."""

from __future__ import annotations

import json
import sys

import pytest

from p2pgen import cli
from p2pgen_lab.bench import recovery
from p2pgen_lab.simulator.costs import load_costs

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
    assert got["heal_s"] == pytest.approx(2.5)              # p1's new incarnation commits revision 9 at 12.5


# A p2pgen transcript: p1 is killed at t=10.0 after revision 10; p0 and p2 commit revision 11 in generation 3
# at 11.0 (nothing rolled back); p1's new incarnation starts at 11.5 and first commits revision 13 at 12.0.
P2PGEN = [
    *(commit(p, 1, 2, r, 9.0 + (r - 9) * 0.5) for p in recovery.PEERS for r in (9, 10)),
    certificate("p0", 1, 3, 2, 11.0, 10.9),
    *(commit(p, 1, 3, r, 11.0 + (r - 11) * 0.5) for p in ("p0", "p2") for r in (11, 12)),
    {"event": "start", "peer": "p1", "incarnation": 2, "t": 11.5},
    certificate("p0", 1, 4, 3, 12.0, 11.9),
    *(commit(p, 1 + (p == "p1"), 4, 13, 12.0) for p in recovery.PEERS),
]


def test_analysis_of_a_p2pgen_fault_measures_the_heal_of_the_victim_and_no_rollback():
    got = recovery.analyze_fault(P2PGEN, recovery.Fault("p2pgen", "sigkill_app", "p1", 10.0))
    assert got["rollback_steps"] == 0
    assert got["to_active_s"] == pytest.approx(0.9)
    assert got["to_first_commit_s"] == pytest.approx(1.0)
    assert got["to_regain_s"] == pytest.approx(1.0)
    assert got["heal_s"] == pytest.approx(2.0)
    assert got["processes_started"] == 0                    # p1 came back after the survivors regained


def test_the_leaders_elected_after_a_fault_count_distinct_terms_until_every_survivor_regained():
    """Two agents trace the new leader of term 3 (one election), a term-2 leader before the fault and a term-4
    one after the survivors regained are outside: 1. Without Raft traces the figure is absent (None)."""
    raft = [{"kind": "leader", "term": 2, "t": 9.5}, {"kind": "leader", "term": 3, "t": 10.4},
            {"kind": "leader", "term": 3, "t": 10.41}, {"kind": "vote", "term": 3, "t": 10.3},
            {"kind": "leader", "term": 4, "t": 20.0}]
    fault = recovery.Fault("p2pgen", "kill_agent", "p1", 10.0)
    assert recovery.analyze_fault(P2PGEN, fault, raft)["raft_leaders"] == 1
    storm = raft + [{"kind": "leader", "term": 5, "t": 10.6}]
    assert recovery.analyze_fault(P2PGEN, fault, storm)["raft_leaders"] == 2
    assert recovery.analyze_fault(P2PGEN, fault)["raft_leaders"] is None


def test_heal_ignores_the_victims_old_process_and_is_none_until_a_new_one_commits():
    old_only = [e for e in P2PGEN if not (e["peer"] == "p1" and e["incarnation"] == 2)]
    old_only.append(commit("p1", 1, 4, 13, 12.0))           # a commit of the old incarnation: not a heal
    got = recovery.analyze_fault(old_only, recovery.Fault("p2pgen", "sigstop_app", "p1", 10.0))
    assert got["heal_s"] is None
    summary = recovery.summarize_steploop([got])
    assert "heal_s" not in summary["p2pgen"]["sigstop_app"]
    assert summary["p2pgen"]["sigstop_app"]["to_first_commit_s"]["n"] == 1


def test_the_table_has_a_column_per_peer_and_prints_every_peers_settings():
    p2pgen = recovery.analyze_fault(P2PGEN, recovery.Fault("p2pgen", "sigkill_app", "p1", 10.0))
    records = [p2pgen, {**p2pgen, "policy": "torchft"},
               recovery.analyze_fault(RESTART_ALL, recovery.Fault("torchrun", "sigkill_app", "p1", 10.0))]
    text = recovery.format_steploop(recovery.summarize_steploop(records), recovery.Plan.quick(), 1.0,
                                    {"restart-all": "not asked for"})
    header = next(line for line in text.splitlines() if line.startswith("fault"))
    assert header.split()[-6:] == ["p2pgen", "p50/p99/max", "torchft", "p50/p99/max", "torchrun", "p50/p99/max"]
    heal = next(line for line in text.splitlines() if line.strip().startswith("heal"))
    assert heal.split()[-3:] == ["2000/2000/2000", "2000/2000/2000", "2500/2500/2500"]
    assert "--heartbeat_timeout_ms 1000" in text and "--max-restarts=" in text
    assert "restart-all: skipped: not asked for" in text


def test_a_fault_that_left_the_survivors_generation_alone_is_measured_in_it_and_said_so():
    """torchft: the victim had already dropped out of the quorum, so the survivors commit on in quorum 2."""
    same = [*(commit(p, 1, 2, r, 9.0 + (r - 9) * 0.5) for p in ("p0", "p2") for r in (9, 10, 11, 12))]
    got = recovery.analyze_fault(same, recovery.Fault("torchft", "sigkill_app", "p1", 10.2))
    assert "did not change it" in got["note"] and got["to_active_s"] is None
    assert got["to_first_commit_s"] == pytest.approx(0.3) and got["rollback_steps"] == 0


def test_a_p2pgen_fault_is_split_into_phases_that_add_up_to_its_first_commit():
    t = 10.0
    split = [{"event": "retire", "peer": p, "incarnation": 1, "generation": 2, "t": t + 0.02} for p in ("p0", "p2")]
    split += [{"event": "ready", "peer": p, "incarnation": 1, "generation": 3, "sent": t + 0.03, "t": t + 0.04}
              for p in ("p0", "p2")]
    split += [{"event": kind, "peer": p, "incarnation": 1, "generation": 3, "t": t + at}
              for p in ("p0", "p2") for kind, at in (("active", 0.05), ("connected", 0.06))]
    events = sorted(P2PGEN + split, key=lambda e: e["t"])
    got = recovery.analyze_fault(events, recovery.Fault("p2pgen", "sigkill_app", "p1", t))
    assert got["phases"] is not None and sum(got["phases"].values()) == pytest.approx(got["to_first_commit_s"])
    assert got["phases"]["first_step"] == pytest.approx(1.0 - 0.06)
    assert recovery.analyze_fault(events, recovery.Fault("torchft", "sigkill_app", "p1", t))["phases"] is None
    breakdown = recovery.summarize_breakdown([got, {**got, "policy": "torchft"}])
    assert list(breakdown) == ["sigkill_app"] and breakdown["sigkill_app"]["detect"]["n"] == 1
    assert "vote_commit" in recovery.format_breakdown(breakdown)


def test_the_heal_section_prints_torchfts_heal_from_the_same_run_beside_the_standby_table():
    heal = {"modes": {m: {"heal": {"n": 1, "p50": 0.1, "max": 0.1}, "phases": dict.fromkeys(
        ("retire", "launch", "start+imports", "attach", "register", "vote", "pull", "activate", "first commit"), 0.0),
        "standby_used": 1} for m in ("standby", "plain")}, "target_s": 0.5, "step_delay": 0.02}
    torchft = {**recovery.analyze_fault(P2PGEN, recovery.Fault("p2pgen", "sigkill_app", "p1", 10.0)),
               "policy": "torchft"}
    text = recovery.format_heal_section(heal, [torchft])
    assert "--standby 1" in text and "torchft, same run" in text and "heal p50 2.000 s" in text
    assert "torchft" not in recovery.format_heal_section(heal, None)


def test_a_peer_that_is_not_installed_is_skipped_with_its_reason(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torchft", None)           # import torchft raises ImportError
    peers, skipped = recovery.available_peers(("p2pgen", "torchft"))
    assert peers == ("p2pgen",) and "torchft is not installed" in skipped["torchft"]
    assert cli.main(["bench", "recovery", "--only", "steploop", "--peers", "torchft", "--json"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["steploop"]["faults"] == [] and "pip install" in doc["steploop"]["skipped"]["torchft"]
    assert "step loop without torchft" in out.err


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


def test_the_catchup_table_gives_the_median_and_the_range_of_the_rounds():
    row = {"size_bytes": 64 << 20, "sources": 2, "rounds": 3, "pull_GBps": 1.0, "raw_GBps": 1.5,
           "pull_over_raw": 0.66, "ratio_min": 0.6, "ratio_max": 0.71}
    text = recovery.format_catchup([row])
    line = next(line for line in text.splitlines() if line.startswith("64 MiB"))
    assert line.split()[-2:] == ["0.66", "0.60..0.71"] and "3 interleaved rounds" in text

"""The whole-host churn fault kinds (`replace_agent`, `kill_two_agents`) and the Raft checker beside the semantic one.

Unit level: the generated matrix injects both new kinds; the report carries the Raft checker's counts.
Integration: one schedule of the two new kinds under the
certified policy on real agents must pass both checkers.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from p2pgen.raft import checker as raft_checker
from p2pgen_lab.chaos import checker, report, runner
from p2pgen_lab.chaos.app import voters_outlive
from p2pgen_lab.chaos.schedule import Injection, Schedule, generate

pytestmark = pytest.mark.timeout(60)

def test_the_full_matrix_injects_both_new_kinds_at_step_and_transition_points():
    kinds = Counter((i.kind, i.point in ("pending", "catch_up")) for s in generate(1, 40, 6) for i in s.injections)
    for kind in ("replace_agent", "kill_two_agents"):
        assert kinds[(kind, False)] > 0 and kinds[(kind, True)] > 0


def test_the_report_sums_raft_violations_and_counts_traced_runs():
    clean = raft_checker.CheckResult(dict.fromkeys(raft_checker.CHECKS, 0), {}, {"indexes_compared": 4}, [])
    unsafe = raft_checker.CheckResult({**dict.fromkeys(raft_checker.CHECKS, 0), "one_leader_per_term": 2}, {},
                                      {"indexes_compared": 0}, [])
    verdict = checker.Verdict([], [], 1, [1.0], [0], 5.0, 14)
    row = report.summarize("certified", [verdict, verdict], [clean, unsafe])
    assert row["raft_violations"]["one_leader_per_term"] == 2 and row["raft_traced_runs"] == 1
    table = report.table([row])
    assert "raft violations" in table and "traced runs" in table
    assert report.raft_words(unsafe) == "UNSAFE: one_leader_per_term x2"
    assert report.raft_words(clean) == "ok"


@pytest.mark.timeout(240)
def test_an_agent_replaced_within_a_second_and_two_agents_lost_together_are_survived(tmp_path):
    schedule = Schedule(0, 0, 4, 14, (Injection("replace_agent", "before_allreduce", "p1", 4),
                                      Injection("kill_two_agents", "after_commit", "p2", 8)))
    result = runner.run(schedule, "certified", tmp_path, runner.RunConfig(timeout=90.0))
    verdict = checker.check(result.events, result.history, schedule.steps, result.stalled)
    raft = raft_checker.check_dir(tmp_path / "traces")
    assert verdict.injections == 2, result.harness
    assert verdict.passed, (verdict.failures, verdict.evidence[:5], result.harness, str(tmp_path))
    assert raft.passed and raft.evidence, raft.render()


def test_an_agent_kill_is_allowed_only_when_the_voters_left_up_are_a_majority():
    voters = [{"agent": a, "node": f"{a}/n"} for a in ("a", "b", "c")]
    raft = {"voters": voters}
    every = lambda v: True                                             # noqa: E731
    assert voters_outlive(raft, {"a"}, every) and voters_outlive(raft, {"a", "d"}, every)
    assert not voters_outlive(raft, {"a", "b"}, every)                 # two voters of three: the guard waits
    c_down = lambda v: v["agent"] != "c"                               # noqa: E731  (dead, replaced or leaving)
    assert not voters_outlive(raft, {"a"}, c_down) and voters_outlive(raft, {"d"}, c_down)
    assert voters_outlive({}, {"a", "b"}, c_down)                      # a view that does not say who votes


def test_a_stalled_run_keeps_what_every_live_agent_showed(tmp_path):
    """A run cut short by its timeout (here while the job still trains) leaves each live agent's `show`, the only
    record of what a stalled job waited for."""
    schedule = Schedule(0, 0, 4, 100_000, ())
    result = runner.run(schedule, "certified", tmp_path, runner.RunConfig(timeout=8.0))
    assert result.stalled, result.harness
    shown = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("stalled-*.json")}
    assert set(shown) == {f"stalled-p{i}.json" for i in range(4)}
    answered = [s for s in shown.values() if "error" not in s]       # an agent still joining answers an error
    assert answered and all("state" in s and "raft" in s for s in answered), shown

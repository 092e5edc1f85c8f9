"""The stress verdict on hand-made runs: stall, recovery, regressions, digests and the pass rule."""

from __future__ import annotations

import pytest

from p2pgen.progress import Commit
from p2pgen_lab.stress.verdict import (
    Activated,
    Fault,
    Verdict,
    digest_mismatches,
    max_stall,
    recoveries,
    regressions,
)

pytestmark = pytest.mark.timeout(30)


def commits(*points: tuple[float, int], peers=("a", "b"), digest=lambda r: f"d{r}") -> list[Commit]:
    return [Commit(t, p, 1, 1, r, digest(r)) for t, r in points for p in peers]


def test_the_longest_stall_is_cut_where_a_majority_of_the_voters_was_down():
    times = [0.0, 1.0, 2.0, 10.0, 11.0]
    assert max_stall(times, [(0.0, 20.0)], 0.0, 11.0) == (8.0, 2.0)
    assert max_stall(times, [(0.0, 4.0), (6.0, 20.0)], 0.0, 11.0) == (4.0, 6.0)
    assert max_stall(times, [(0.0, 20.0)], 0.0, 15.0) == (8.0, 2.0)        # 11 -> 15 is shorter
    assert max_stall(times, [(0.0, 20.0)], 0.0, 21.0) == (9.0, 11.0)       # until the end, or the majority left
    assert max_stall([], [], 0.0, 5.0) == (0.0, None)


def test_recovery_waits_for_a_revision_above_everything_committed_before_the_fault():
    cs = commits((1.0, 1), (2.0, 2)) + [Commit(5.5, "b", 1, 1, 2, "d2"), Commit(7.0, "a", 2, 2, 3, "d3")]
    assert recoveries([Fault(3.0, "kill_app", "x")], cs) == [4.0]          # b's late r2 is no recovery
    assert recoveries([Fault(0.5, "join", "x")], cs) == [0.5]
    assert recoveries([Fault(8.0, "kill_app", "x")], cs) == [None]


def test_a_generation_activated_below_the_highest_committed_revision_is_a_regression():
    cs = commits((1.0, 7), (2.0, 8))
    found = regressions([Activated(3, 5, 3.0, 8), Activated(4, 8, 4.0), Activated(2, 0, 0.5)], cs)
    assert found == [{"generation": 3, "revision": 5, "highest_committed": 8, "steps_lost": 3,
                      "regressed_from": 8, "t": 3.0}]


def test_after_a_declared_regression_only_the_new_branch_counts():
    cs = commits((1.0, 7), (2.0, 8), (4.0, 6), (4.5, 7), (6.0, 9))
    found = regressions([Activated(3, 5, 3.0, 8), Activated(4, 6, 5.0), Activated(5, 8, 7.0)], cs)
    # g4 at r6 is above the branch g3 began (r5 -> r7 committed again): only its one silent step lost counts
    assert [(r["generation"], r["highest_committed"], r["steps_lost"], r["regressed_from"]) for r in found] == [
        (3, 8, 3, 8), (4, 7, 1, None), (5, 9, 1, None)]


def test_one_revision_with_two_digests_is_a_mismatch_unless_a_regression_redid_it():
    cs = commits((1.0, 1), (2.0, 2)) + [Commit(3.0, "c", 1, 2, 2, "other"), Commit(4.0, "c", 1, 2, 3, "x")]
    found = digest_mismatches(cs)
    assert [m["revision"] for m in found] == [2] and found[0]["digests"] == {"d2": ["a#1", "b#1"], "other": ["c#1"]}
    redo = [{"revision": 1, "highest_committed": 2}]
    assert digest_mismatches(cs, redo) == []


def verdict(**changes) -> Verdict:
    fields = dict(violations={"log_matching": 0, "one_leader_per_term": 0}, checker_evidence=True, recovery=[1.0],
                  max_stall_s=3.0, max_stall_at=1.0, regressions=[], mismatches=[],
                  final_digests={"a": "x", "b": "x"}, settled=True)
    return Verdict(**{**fields, **changes})


def test_the_pass_rule_names_each_reason_to_fail():
    faults = [Fault(1.0, "kill_app", "[1.0 s] SIGKILL the application of p1")]
    assert verdict().failures(faults) == []
    assert "1 Raft safety violation(s) of log_matching" in verdict(
        violations={"log_matching": 1, "one_leader_per_term": 0}).failures(faults)
    assert "compared nothing" in verdict(checker_evidence=False).failures(faults)[0]
    assert "(next after 12.0 s)" in verdict(recovery=[12.0]).failures(faults)[0]
    assert verdict(recovery=[None]).failures(faults)[0].startswith("no committed step within 10 s after: [1.0 s]")
    assert "did not settle" in verdict(settled=False).failures(faults)[0]
    assert "final digests differ" in verdict(final_digests={"a": "x", "b": "y"}).failures(faults)[0]
    assert "final digests differ" in verdict(final_digests={"a": "x", "b": None}).failures(faults)[0]
    assert "no live member" in verdict(final_digests={}).failures(faults)[0]
    mismatch = [{"revision": 4, "digests": {"x": ["a#1"], "y": ["b#2"]}}]
    assert "revision 4" in verdict(mismatches=mismatch).failures(faults)[0]

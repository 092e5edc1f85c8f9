"""The fault planner: `join --local --chaos`'s draws in their documented order, its safety rules, and the minority
rule the lab's harnesses share with it."""

from __future__ import annotations

import random

import pytest

from p2pgen.agent.faultplan import (
    APPLICATION,
    GAP_SPREAD,
    HOST,
    MAX_FAULTS_IN_FLIGHT,
    LocalPlan,
    all_voters_live,
    keeps_quorum,
    pick_weighted,
    voter_is_up,
    voters_outlive,
)

pytestmark = pytest.mark.timeout(30)


def test_one_seed_replays_the_documented_draws_gap_then_kind_then_target() -> None:
    for seed in range(20):
        plan, ref = LocalPlan(3.0, seed, 4, True, 100), random.Random(seed)
        for fault in range(6):
            assert plan.due_after(10 * fault, 0.0) == 10 * fault + 3.0 * ref.uniform(*GAP_SPREAD)
            if fault % 2 == 0:
                bag = [APPLICATION, HOST]
                ref.shuffle(bag)
            assert plan.kind() == bag[-1 - fault % 2]
            assert plan.target(plan.kind(), {0: True, 2: True, 3: True}, (), True) == ref.choice([0, 2, 3])
            plan.injected()


def test_the_gap_counts_steps_only_with_steps_and_a_command_and_no_chaos_means_no_fault() -> None:
    assert LocalPlan(2.0, 0, 3, True, 50).counts_steps and not LocalPlan(2.0, 0, 3, True, None).counts_steps
    assert not LocalPlan(2.0, 0, 3, False, 50).counts_steps
    assert 100.0 + 1.0 <= LocalPlan(2.0, 0, 3, False, None).due_after(7, 100.0) <= 100.0 + 3.0
    assert LocalPlan(None, 0, 3, True, 50).due_after(0, 0.0) is None
    assert LocalPlan(2.0, 0, 3, True, 50).last_fault_revision() == 40


def test_the_kinds_fit_the_job_hosts_without_a_command_applications_below_three_agents() -> None:
    assert {LocalPlan(1.0, s, 3, False, None).kind() for s in range(10)} == {HOST}
    assert {LocalPlan(1.0, s, 2, True, None).kind() for s in range(10)} == {APPLICATION}
    kinds = []
    plan = LocalPlan(1.0, 5, 5, True, None)
    for _ in range(10):
        kinds.append(plan.kind())
        plan.injected()
    assert kinds.count(APPLICATION) == kinds.count(HOST) == 5


def test_a_target_is_never_recovering_an_application_needs_its_pid_and_a_host_the_whole_raft() -> None:
    plan = LocalPlan(1.0, 0, 4, True, None)
    state = plan.rng.getstate()
    assert plan.target(APPLICATION, {0: False, 1: True}, {1}, True) is None
    assert plan.target(HOST, {0: False, 1: True}, (), False) is None
    assert plan.target(APPLICATION, {}, (), True) is None
    assert plan.rng.getstate() == state, "a fault refused draws nothing"
    assert plan.target(HOST, {0: False, 1: True}, {1}, True) == 0
    assert plan.target(APPLICATION, {0: False, 1: True}, (), True) == 1
    assert LocalPlan.may_fault(set(range(MAX_FAULTS_IN_FLIGHT - 1)))
    assert not LocalPlan.may_fault(set(range(MAX_FAULTS_IN_FLIGHT)))


def test_the_minority_rule_counts_the_voters_already_down() -> None:
    assert keeps_quorum(5, 0, 2) and not keeps_quorum(5, 1, 2) and not keeps_quorum(4, 0, 2)
    assert all_voters_live(["a", "b", "c"], {"a", "b", "c", "d"}, 3)
    assert not all_voters_live(["a", "b", "c"], {"a", "b"}, 3) and not all_voters_live(["a", "b"], {"a", "b"}, 3)
    raft = {"voters": [{"node": n, "agent": n} for n in "abc"]}
    assert voters_outlive(raft, {"a"}, lambda v: True) and not voters_outlive(raft, {"a"}, lambda v: v["node"] != "b")


def _shown(node: str | None, leaving: bool) -> dict:
    return {"raft": {"self": node}, "agent": {"leaving": leaving}}


@pytest.mark.parametrize("shown, up", [
    (_shown("b:1/n", False), True),
    (None, False),                           # its agent did not answer
    (_shown("b:1/m", False), False),         # a replacement at that address runs another node
    (_shown(None, False), False),            # ... or none: it is a non-voting member now
    (_shown("b:1/n", True), False),          # leaving: it removes its voter soon
])
def test_a_voter_is_up_only_while_its_agent_answers_runs_it_and_is_not_leaving(shown, up) -> None:
    assert voter_is_up({"node": "b:1/n", "agent": "b:0"}, shown) is up


def test_a_voter_leaving_as_another_is_killed_makes_the_kill_wait() -> None:
    """Schedule #7 of `p2pgen chaos --seed 11`: p1 left (its application finished), p0's agent was killed 1.6 s
    later while p1's agent removed its voter, and the one voter left could never be elected leader."""
    voters = [{"node": f"{a}/n", "agent": a} for a in ("p0", "p1", "p2")]
    shows = {"p0": _shown("p0/n", False), "p1": _shown("p1/n", True), "p2": _shown("p2/n", False)}
    is_up = lambda v: voter_is_up(v, shows[v["agent"]])                # noqa: E731
    assert not voters_outlive({"voters": voters}, {"p0"}, is_up)
    shows["p1"] = _shown("p1/n", False)
    assert voters_outlive({"voters": voters}, {"p0"}, is_up)


def test_a_weighted_pick_takes_each_kind_in_proportion_to_its_weight() -> None:
    kinds, weights = ["x", "y", "z"], [1, 2, 1]
    assert [pick_weighted(kinds, weights, u) for u in (0.0, 0.24, 0.25, 0.74, 0.75, 0.999)] == \
        ["x", "x", "y", "y", "z", "z"]

"""`plan_recovery`: when `p2pgen recover` may re-form the job, and from whose state."""

from __future__ import annotations

from p2pgen.core.recovery import Survivor, plan_recovery

VOTERS = tuple(f"h:{i}1/n{i}" for i in range(5))


def survivor(i: int, applied=(3, 100), voter=True, leader="", epoch=0) -> Survivor:
    return Survivor(f"h:{i}0", epoch, VOTERS[i] if voter else "", VOTERS, leader, applied)


def test_two_of_five_voters_re_form_from_the_one_that_applied_most():
    plan = plan_recovery((survivor(0, (3, 100)), survivor(1, (3, 140))), frozenset({"h:20", "h:30", "h:40"}))
    assert plan.ok and plan.epoch == 1 and plan.seed == "h:10" and plan.followers == ("h:00",)
    assert "2 of 5 voters" in plan.reason


def test_the_term_of_the_last_applied_entry_decides_before_the_index():
    plan = plan_recovery((survivor(0, (4, 90)), survivor(1, (3, 140))), frozenset())
    assert plan.seed == "h:00"
    tie = plan_recovery((survivor(1, (3, 90)), survivor(0, (3, 90))), frozenset())
    assert tie.seed == "h:00"


def test_refused_while_a_majority_answers_or_a_leader_is_heard():
    majority = plan_recovery(tuple(survivor(i) for i in range(3)), frozenset())
    assert not majority.ok and "a majority of Raft epoch 0's voters answers (3 of 5" in majority.reason
    led = plan_recovery((survivor(0, leader=VOTERS[3]),), frozenset())
    assert not led.ok and "hears leader" in led.reason


def test_refused_when_an_agent_named_gone_answers_or_nobody_answers():
    back = plan_recovery((survivor(0), survivor(1)), frozenset({"h:10"}))
    assert not back.ok and "h:10" in back.reason and "gone for good" in back.reason
    assert not plan_recovery((), frozenset()).ok


def test_non_voting_survivors_count_as_survivors_not_voters_and_the_newest_epoch_rules():
    plan = plan_recovery((survivor(0), survivor(3, voter=False), survivor(4, voter=False)), frozenset())
    assert plan.ok and "1 of 5 voters" in plan.reason and set(plan.followers) | {plan.seed} == {"h:00", "h:30", "h:40"}
    newer = plan_recovery((survivor(0, (9, 9), epoch=1), survivor(1, (1, 500), epoch=2)), frozenset())
    assert newer.ok and newer.epoch == 3 and newer.seed == "h:10"

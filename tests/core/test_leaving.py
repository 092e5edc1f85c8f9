"""A leaving agent's plan (p2pgen.core.leaving), as tables: the first steps, the Raft configuration's, and what
it says when no quorum answers. The shell performing it: `Agent._leave` (tests/integration/test_agents.py,
test_drain.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2pgen.core.leaving import (
    CONFIRMED_OUT,
    FINISHED,
    FINISHED_MEANWHILE,
    LEFT_LAST,
    NO_QUORUM,
    LeavePlan,
    Shrink,
    leave_plan,
    said_after_asking,
    said_without_quorum,
    shrink_plan,
)


@pytest.mark.parametrize(("has_app", "app_stopping", "has_node", "registered", "plan"), [
    (True, False, True, True, LeavePlan(stop_app=True, raft=True, record=True, await_app=False)),
    (True, True, True, True, LeavePlan(stop_app=False, raft=True, record=True, await_app=True)),   # a drain
    (False, False, True, True, LeavePlan(stop_app=False, raft=True, record=True, await_app=False)),
    # not registered: the leave of the application's incarnation says its local copy is gone
    (True, False, True, False, LeavePlan(stop_app=True, raft=True, record=True, await_app=False)),
    (False, False, True, False, LeavePlan(stop_app=False, raft=True, record=False, await_app=False)),
    (True, False, False, True, LeavePlan(stop_app=True, raft=False, record=False, await_app=False)),
    (True, True, False, True, LeavePlan(stop_app=False, raft=False, record=False, await_app=False)),
])
def test_the_leave_is_recorded_before_the_voter_goes(has_app: bool, app_stopping: bool, has_node: bool,
                                                     registered: bool, plan: LeavePlan):
    assert leave_plan(has_app, app_stopping, has_node, registered) == plan


@pytest.mark.parametrize(("finished", "voter", "nodes", "leader", "live_others", "shrink"), [
    (True, True, 3, True, 2, Shrink(said=FINISHED)),
    (False, True, 3, True, 2, Shrink(transfer_leadership=True, remove_voter=True)),
    (False, True, 3, False, 2, Shrink(remove_voter=True)),
    (False, True, 1, True, 0, Shrink()),       # the last voter stays
    (False, False, 3, False, 2, Shrink()),     # a non-voting member has no voter to remove
    (False, True, 3, False, 1, Shrink(wait_for_voters=True)),       # {p, down, live}: {down, live} could not commit
    (False, True, 3, True, 1, Shrink(transfer_leadership=True, wait_for_voters=True)),
    (False, True, 5, False, 2, Shrink(wait_for_voters=True)),       # 2 of the 4 left: no majority
    (False, True, 5, False, 3, Shrink(remove_voter=True)),
    (False, True, 2, False, 1, Shrink(remove_voter=True)),          # the one left is a majority of one
    (False, True, 3, False, 0, Shrink(remove_voter=True)),          # hears none: tried, its failure said
])
def test_a_voter_goes_only_when_the_voters_left_keep_a_live_majority(finished: bool, voter: bool, nodes: int,
                                                                     leader: bool, live_others: int, shrink: Shrink):
    assert shrink_plan(finished, voter, nodes, leader, live_others) == shrink


@pytest.mark.parametrize(("nodes", "others_heard", "shrink"), [
    (1, 1, Shrink(wait_for_successor=True)),   # a job of two agents has one voter: its successor first
    (1, 0, Shrink()),                          # alone: nobody to hand over to
    (2, 1, Shrink(transfer_leadership=True, remove_voter=True)),   # the successor is in: go like any voter
])
def test_the_last_voter_waits_for_a_successor_while_others_live(nodes: int, others_heard: int, shrink: Shrink):
    live_other_voters = nodes - 1
    assert shrink_plan(False, True, nodes, True, live_other_voters, others_heard) == shrink


@given(st.integers(1, 9), st.data())
def test_a_removal_planned_never_leaves_fewer_live_voters_than_a_majority(nodes: int, data):
    """Whenever some other voter is heard and the plan removes this one, the live others are a majority of the
    configuration left."""
    live_others = data.draw(st.integers(1, nodes - 1)) if nodes > 1 else 0
    shrink = shrink_plan(False, True, nodes, data.draw(st.booleans()), live_others)
    if shrink.remove_voter and live_others:
        assert live_others > (nodes - 1) // 2


@pytest.mark.parametrize(("finished", "others_heard", "recorded", "said"), [
    (True, True, True, FINISHED_MEANWHILE),
    (True, False, False, FINISHED_MEANWHILE),
    (False, False, True, LEFT_LAST),
    (False, False, False, LEFT_LAST),
    (False, True, False, NO_QUORUM),
    (False, True, True, None),              # ask a live member first
])
def test_what_a_leave_without_quorum_says(finished: bool, others_heard: bool, recorded: bool, said):
    assert said_without_quorum(finished, others_heard, recorded) == said


def test_a_live_member_confirming_the_voter_is_out_ends_the_leave_quietly():
    assert said_after_asking(True) == CONFIRMED_OUT
    assert said_after_asking(False) == NO_QUORUM
    assert said_after_asking(None) == NO_QUORUM
    assert "left without a Raft quorum to record it (%s)" in NO_QUORUM.text and NO_QUORUM.level == "warning"

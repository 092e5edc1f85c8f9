"""The agent's decisions about its own member (p2pgen.core.steward), on the real machine."""

from __future__ import annotations

from p2pgen.core import Configure, GenerationMachine, Leave, LogPosition, Ready, Register, Suspect, Synced
from p2pgen.core.steward import Drain, drain_asked, hand_over_due, relaunch_due, standby_due, vote_owed


def machine_of(*commands) -> GenerationMachine:
    m = GenerationMachine("job")
    for i, command in enumerate(commands, 1):
        assert m.apply(command, LogPosition(1, i)).ok, command
    return m


def test_the_agent_owes_one_vote_per_pending_generation_for_its_own_current_member_only():
    m = machine_of(Register("a", 1), Register("b", 1))
    generation = m.pending.generation
    assert vote_owed(m, "a", 1, None) == generation
    assert vote_owed(m, "a", 1, (generation, 1)) is None          # voted already
    assert vote_owed(m, "a", 1, (generation - 1, 1)) == generation
    assert vote_owed(m, "a", 2, None) is None                     # not the member's incarnation
    assert vote_owed(m, "c", 1, None) is None                     # not proposed
    m.apply(Ready(generation, "a", 1, "proved", 0, ""), LogPosition(1, 3))
    m.apply(Ready(generation, "b", 1, "proved", 0, ""), LogPosition(1, 4))
    assert m.pending is None and vote_owed(m, "a", 1, None) is None


def test_a_dead_application_restarts_once_a_generation_without_it_is_certified_or_the_wait_is_over():
    m = machine_of(Register("a", 1), Register("b", 1))
    g = m.pending.generation
    m.apply(Ready(g, "a", 1, "proved", 0, ""), LogPosition(1, 3))
    m.apply(Ready(g, "b", 1, "proved", 0, ""), LogPosition(1, 4))
    m.apply(Suspect("a", "a", 1, "application died"), LogPosition(1, 5))
    assert not relaunch_due(m, ("a", 1), now=1.0, due=5.0)        # g (with a#1) still active: wait for b's
    assert relaunch_due(m, ("a", 1), now=5.0, due=5.0)            # bounded
    m.apply(Ready(m.pending.generation, "b", 1, "proved", 0, ""), LogPosition(1, 6))
    assert m.active.generation > g and relaunch_due(m, ("a", 1), now=1.0, due=5.0)   # certified without a#1


def test_nobody_left_or_a_held_proposal_does_not_wait_for_a_generation_without_the_dead_one():
    m = machine_of(Register("a", 1))
    m.apply(Ready(m.pending.generation, "a", 1, "proved", 3, "d3"), LogPosition(1, 2))
    m.apply(Suspect("a", "a", 1, "application died"), LogPosition(1, 3))
    assert not m.members and relaunch_due(m, ("a", 1), now=0.0, due=5.0)


def test_a_standby_starts_once_its_application_ran_in_the_active_generation_for_a_while_or_after_the_settle_wait():
    m = machine_of(Register("a", 1), Register("b", 1))
    due = lambda identity, age, quiet_for: standby_due(m, identity, age, 10.0, quiet_for, 1.0)   # noqa: E731
    assert not due(("a", 1), 1.0, 5.0)              # registered, nothing active yet
    assert due(("a", 1), 10.0, 0.0)                 # bounded
    m.apply(Ready(m.pending.generation, "a", 1, "proved", 0, ""), LogPosition(1, 3))
    m.apply(Ready(m.pending.generation, "b", 1, "proved", 0, ""), LogPosition(1, 4))
    assert not due(("a", 1), 0.5, 0.2)              # just activated: its first steps first
    assert due(("a", 1), 0.5, 1.0)                  # its start-up is over
    assert not due(("a", 2), 0.5, 1.0)              # a newer one still starting
    assert not due(None, 99.0, 99.0)                # no live application: its successor first


def test_a_leaver_alone_with_the_state_hands_it_over_to_a_member_registered_or_on_its_way_back():
    """Seen in `p2pgen stress --seed 3`: b's application died (its agent reported the copy it left), so a was
    the whole active generation and trained on alone; a was asked to leave and left at once, since no other
    member was registered; b's next incarnation resumed from its copy, 126 steps behind, and nobody knew."""
    m = machine_of(Configure(1, regress_wait=30.0, at=0.0), Register("a", 1, at=0.0), Register("b", 1, at=0.0))
    m.apply(Ready(m.pending.generation, "a", 1, "proved", 5, "d5", at=1.0), LogPosition(1, 4))
    m.apply(Ready(m.pending.generation, "b", 1, "proved", 5, "d5", at=1.0), LogPosition(1, 5))
    assert not hand_over_due(m, ("a", 1), now=2.0)                 # b holds the state too
    m.apply(Suspect("b", "b", 1, "application died", kept_revision=5, kept_digest="d5",
                    kept_lineage=m.active.generation,
                    at=3.0), LogPosition(1, 6))
    m.apply(Ready(m.pending.generation, "a", 1, "proved", 5, "d5", at=3.0), LogPosition(1, 7))
    assert [x.identity for x in m.active.members] == [("a", 1)] and not [x for x in m.members if x.peer_id == "b"]
    assert hand_over_due(m, ("a", 1), now=4.0)                     # b#2 is on its way back: wait for it
    assert not hand_over_due(m, ("a", 1), now=33.0)                # not after regress_wait
    assert not hand_over_due(m, ("b", 1), now=4.0)                 # only the one holding the state
    m.apply(Register("b", 2, at=5.0), LogPosition(1, 8))
    assert hand_over_due(m, ("a", 1), now=5.0)                     # registered, not holding it yet
    m.apply(Ready(m.pending.generation, "a", 1, "proved", 40, "d40", at=6.0), LogPosition(1, 9))
    m.apply(Ready(m.pending.generation, "b", 2, "proved", 5, "d5", at=6.0), LogPosition(1, 10))
    assert m.pending.election.frontier.revision == 40
    m.apply(Synced(m.pending.generation, "b", 2, "d40", at=6.5), LogPosition(1, 11))
    assert not hand_over_due(m, ("a", 1), now=7.0)                 # b#2 pulled it: a may leave


def test_a_leaver_alone_in_the_job_leaves_at_once():
    m = machine_of(Register("a", 1, at=0.0))
    m.apply(Ready(m.pending.generation, "a", 1, "proved", 5, "d5", at=1.0), LogPosition(1, 2))
    assert not hand_over_due(m, ("a", 1), now=2.0)
    m.apply(Register("b", 1, at=3.0), LogPosition(1, 3))
    m.apply(Leave("b", 1, at=4.0), LogPosition(1, 4))
    assert not hand_over_due(m, ("a", 1), now=5.0)                 # b left: nobody to hand it to


def test_a_leaver_whose_dead_application_left_the_copy_the_job_waits_for_hands_it_over_first():
    """Seen in a CI run of `p2pgen stress --seed 1`: p6 trained alone in a one-member generation up to r1542,
    its application was evicted and restarted, its agent reported the local copy (r1542), and the others'
    proposal was held for it. p6 was asked to leave before its next incarnation registered: the agent deleted
    its local copy and left, so the job waited 30 s (regress_wait) for a copy that no longer existed, then
    fell back to r1443. A leaver whose host holds that copy stays until its next incarnation handed it over."""
    m = machine_of(Configure(1, regress_wait=30.0, at=0.0), Register("a", 1, at=0.0), Register("b", 1, at=0.0))
    m.apply(Ready(m.pending.generation, "a", 1, "proved", 5, "d5", at=1.0), LogPosition(1, 4))
    m.apply(Ready(m.pending.generation, "b", 1, "proved", 5, "d5", at=1.0), LogPosition(1, 5))
    m.apply(Suspect("b", "b", 1, "application died", kept_revision=5, kept_digest="d5",
                    kept_lineage=m.active.generation, at=2.0), LogPosition(1, 6))
    m.apply(Ready(m.pending.generation, "a", 1, "proved", 5, "d5", at=2.0), LogPosition(1, 7))
    alone = m.active.generation
    m.apply(Suspect("a", "a", 1, "application died", kept_revision=40, kept_digest="d40", kept_lineage=alone,
                    at=3.0), LogPosition(1, 8))
    m.apply(Register("b", 2, at=4.0), LogPosition(1, 9))
    m.apply(Ready(m.pending.generation, "b", 2, "proved", 5, "d5", at=4.0), LogPosition(1, 10))
    assert m.pending.hold is not None and m.pending.hold.certified == 40      # the job waits for a's copy
    local = (40, alone)
    assert hand_over_due(m, ("a", None), now=5.0, local=local)             # a#2 not registered yet: stay
    assert not hand_over_due(m, ("a", None), now=5.0)                       # no copy on a's host: nothing to hand
    assert not hand_over_due(m, ("b", 2), now=5.0, local=(5, alone))        # b holds nothing the others lack
    assert not hand_over_due(m, ("a", None), now=34.0, local=local)        # the job stopped waiting for it
    m.apply(Register("a", 2, at=6.0), LogPosition(1, 11))
    assert hand_over_due(m, ("a", 2), now=6.0, local=local)                # registered, not voted
    m.apply(Ready(m.pending.generation, "b", 2, "proved", 5, "d5", at=6.5), LogPosition(1, 12))
    m.apply(Ready(m.pending.generation, "a", 2, "proved", 40, "d40", at=6.5), LogPosition(1, 13))
    assert m.pending.election.frontier.revision == 40
    assert hand_over_due(m, ("a", 2), now=7.0, local=local)                # voted; b has not pulled it yet
    m.apply(Synced(m.pending.generation, "b", 2, "d40", at=7.5), LogPosition(1, 14))
    assert {x.identity for x in m.active.members} == {("a", 2), ("b", 2)}
    assert not hand_over_due(m, ("a", 2), now=8.0, local=(41, m.active.generation))   # b holds it: a may go


def test_a_leaver_without_a_copy_above_the_others_leaves_at_once():
    m = machine_of(Configure(1, regress_wait=30.0, at=0.0), Register("a", 1, at=0.0), Register("b", 1, at=0.0))
    m.apply(Ready(m.pending.generation, "a", 1, "proved", 5, "d5", at=1.0), LogPosition(1, 4))
    m.apply(Ready(m.pending.generation, "b", 1, "proved", 5, "d5", at=1.0), LogPosition(1, 5))
    generation = m.active.generation
    m.apply(Suspect("a", "a", 1, "application died", kept_revision=5, kept_digest="d5", kept_lineage=generation,
                    at=2.0), LogPosition(1, 6))
    m.apply(Ready(m.pending.generation, "b", 1, "proved", 7, "d7", at=2.0), LogPosition(1, 7))
    assert m.active.generation > generation
    assert not hand_over_due(m, ("a", None), now=3.0, local=(5, generation))   # b went on past a's copy


def test_a_drain_hands_over_then_stops_the_application_at_a_boundary_then_leaves():
    from p2pgen.core.steward import LEAVE_RESERVE_S, Drain, drain_step

    drain = Drain(since=100.0, deadline=125.0, hand_over_wait=20.0)
    assert drain.leave_by == 125.0 - LEAVE_RESERVE_S
    assert drain_step(drain, 101.0, hand_over=True, app_stoppable=True)[0] == "stay"
    assert drain_step(drain, 101.0, hand_over=False, app_stoppable=True)[0] == "stop_app"
    asked = Drain(100.0, 125.0, 20.0, app_asked=101.0)
    assert drain_step(asked, 102.0, hand_over=False, app_stoppable=True)[0] == "wait_app"
    assert drain_step(asked, 102.0, hand_over=False, app_stoppable=False)[0] == "leave"   # it stopped
    assert drain_step(drain, 101.0, hand_over=True, app_stoppable=False)[0] == "stay"     # restarting to hand over
    late = drain_step(drain, 115.0, hand_over=True, app_stoppable=True)
    assert late == ("leave", "the drain's deadline is near: leave now")               # the deadline wins


def test_a_drain_whose_deadline_is_already_near_leaves_at_once():
    from p2pgen.core.steward import Drain, drain_step

    assert Drain(since=50.0, deadline=52.0, hand_over_wait=20.0).leave_by == 50.0
    assert drain_step(Drain(50.0, 52.0, 20.0), 50.0, hand_over=True, app_stoppable=True)[0] == "leave"


def test_a_drain_ends_by_its_timeout_or_the_notice_and_a_second_request_only_brings_it_forward():
    first = drain_asked(None, now=100.0, timeout=25.0, until_taken=None, hand_over_wait=30.0)
    assert first == Drain(100.0, 125.0, 30.0)
    assert drain_asked(None, 100.0, 25.0, until_taken=5.0, hand_over_wait=30.0).deadline == 105.0
    assert drain_asked(None, 100.0, 25.0, until_taken=-3.0, hand_over_wait=30.0).deadline == 100.0   # taken already
    asked = Drain(100.0, 125.0, 30.0, app_asked=101.0)
    assert drain_asked(asked, 102.0, 25.0, None, 30.0) is None                 # later than the drain under way
    assert drain_asked(asked, 102.0, 25.0, 10.0, 30.0) == Drain(100.0, 112.0, 30.0, app_asked=101.0)

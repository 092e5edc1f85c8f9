"""The save policy: when a commit snapshots the state for the local copy (pure; a table and properties)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pgen.state.savepolicy import BUDGET, BUSY, CADENCE, SAVE, SavePolicy, decide, save_period

pytestmark = pytest.mark.timeout(60)

POLICY = SavePolicy(every=1, budget=0.05, max_lag=64)


@pytest.mark.parametrize("policy, revision, snapshotted, busy, step_s, snapshot_s, want", [
    (POLICY, 1, 0, False, 0.0, 0.0, SAVE),            # nothing measured yet: the first commit saves
    (POLICY, 5, 4, True, 0.1, 0.001, BUSY),           # the writer is not free: the step does not wait
    (POLICY, 5, 4, False, 0.1, 0.004, SAVE),          # 4 ms of snapshot per 100 ms step: within 5 %
    (POLICY, 5, 4, False, 0.1, 0.04, BUDGET),         # 40 ms per 100 ms: over budget...
    (POLICY, 12, 4, False, 0.1, 0.04, BUDGET),        # ...spread over 8 steps, but 12 is no multiple of 8...
    (POLICY, 16, 4, False, 0.1, 0.04, SAVE),          # ...16 is: every member with these figures saves there
    (POLICY, 16, 13, False, 0.1, 0.04, BUDGET),       # less than half a period after the last snapshot
    (POLICY, 16, 12, False, 0.1, 0.04, SAVE),         # half a period: the next aligned revision saves
    (POLICY, 8, 4, False, 0.1, 0.05, BUDGET),         # 10 steps' worth: the period is 16
    (POLICY, 68, 4, False, 0.1, 100.0, SAVE),         # max_lag revisions: a snapshot whatever it costs
    (POLICY, 68, 4, True, 0.1, 0.0, BUSY),            # ...but still never waiting for the writer
    (SavePolicy(every=3), 6, 4, False, 1.0, 0.0, CADENCE),
    (SavePolicy(every=3), 7, 4, False, 1.0, 0.0, BUDGET),   # every=3 saves on multiples of 3
    (SavePolicy(every=3), 9, 6, False, 1.0, 0.0, SAVE),
])
def test_the_decision_table(policy, revision, snapshotted, busy, step_s, snapshot_s, want):
    assert decide(policy, revision, snapshotted, busy, step_s, snapshot_s) == want


@pytest.mark.parametrize("kwargs", [dict(every=0), dict(max_lag=0), dict(budget=0.0), dict(budget=float("nan"))])
def test_a_bad_policy_is_refused_saying_what_is_allowed(kwargs):
    with pytest.raises(ValueError, match="must be >= 1 and budget > 0"):
        SavePolicy(**kwargs)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.floats(0.01, 1.0), st.integers(1, 100), st.floats(1e-4, 1.0), st.floats(0.0, 2.0),
       st.integers(1, 300))
def test_steady_steps_keep_the_snapshots_within_budget_and_the_lag_within_max_lag(every, budget, max_lag, step_s,
                                                                                  snapshot_s, steps):
    """Constant step and snapshot costs, a writer that finishes within a step: snapshots take at most the budget
    of the step time (plus the ones max_lag forces), and the copy is never more than max(every, max_lag) behind."""
    policy = SavePolicy(every=every, budget=budget, max_lag=max_lag)
    snapshotted, forced, saves = 0, 0, 0
    for revision in range(1, steps + 1):
        since = revision - snapshotted
        if decide(policy, revision, snapshotted, False, step_s, snapshot_s) == SAVE:
            saves += 1
            forced += since >= max_lag and snapshot_s > budget * since * step_s
            snapshotted = revision
        assert revision - snapshotted < max(every, max_lag)
    assert (saves - forced) * snapshot_s <= budget * steps * step_s + 1e-9


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 500), st.integers(0, 500), st.booleans(), st.floats(0.0, 1.0), st.floats(0.0, 1.0),
       st.floats(0.0, 1.0))
def test_a_cheaper_snapshot_is_never_refused_where_a_dearer_one_was_taken(revision, snapshotted, busy, step_s,
                                                                          cost, cheaper):
    if decide(POLICY, revision, snapshotted, busy, step_s, cost) == SAVE:
        assert decide(POLICY, revision, snapshotted, busy, step_s, min(cost, cheaper)) == SAVE
    if busy:
        assert decide(POLICY, revision, snapshotted, busy, step_s, cost) != SAVE


@pytest.mark.parametrize("every, step_s, save_s, want", [
    (1, 0.0, 0.0, 1), (1, 0.1, 0.0, 1), (1, 0.0, 1.0, 1), (3, 0.0, 0.0, 3), (3, 0.1, 0.04, 12),
    (1, 0.1, 0.005, 1), (1, 0.1, 0.0051, 2), (1, 0.1, 0.04, 8), (1, 0.1, 0.041, 16), (8, 0.1, 0.001, 8),
    (1, 5e-324, 1.0, 128), (1, 1e-300, 1e300, 128),      # a cost no period fits (even an infinite ratio): past max_lag
])
def test_the_period_is_every_times_the_smallest_power_of_two_within_budget(every, step_s, save_s, want):
    assert save_period(SavePolicy(every=every), step_s, save_s) == want


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-4, 1.0), st.floats(0.0, 0.5), st.floats(0.0, 0.5), st.integers(1, 400))
def test_members_with_different_costs_save_at_nested_revisions(step_s, cost_a, cost_b, steps):
    """Two lock-step members whose saves cost differently: the revisions where one saves are a subset of the
    other's (so the job pays a slow step where the dearer saver saves, not at two unrelated sets of steps)."""
    policy = SavePolicy(max_lag=1 << 20)

    def saves(cost: float) -> set[int]:
        snapshotted, taken = 0, set()
        for revision in range(1, steps + 1):
            if decide(policy, revision, snapshotted, False, step_s, cost) == SAVE:
                snapshotted = revision
                taken.add(revision)
        return taken

    a, b = saves(cost_a), saves(cost_b)
    assert a <= b or b <= a

"""The contribution rule of an outer step: a transcript of the cases churn makes, and a property over
any mix of held rounds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2pgen.core.outer import NOT_STARTED, OuterPlan, Round, offer, plan_outer_step

pytestmark = pytest.mark.timeout(60)


def test_transcript_of_the_churn_cases() -> None:
    bound_in_3 = Round(revision=7, generation=3, rank=1, world=4)
    # a fresh outer step: nobody holds a round, everyone starts one
    assert plan_outer_step(None, 7, NOT_STARTED) == OuterPlan(start=True, contribute=True)
    # a member was lost during the inner phase: the survivors' rounds of generation 3 are kept
    assert offer(bound_in_3, 7) == 3
    assert plan_outer_step(bound_in_3, 7, 3) == OuterPlan(start=False, contribute=True)
    # the joiner of generation 4 contributes nothing this time and runs no round
    assert plan_outer_step(None, 7, 3) == OuterPlan(start=False, contribute=False)
    # a round bound in an older generation than the agreed one is left out
    assert plan_outer_step(Round(7, 2, 0, 5), 7, 3).weight == 0
    # a round for an older revision (the member pulled a newer state) is stale: it offers nothing
    assert offer(Round(6, 3, 1, 4), 7) == NOT_STARTED
    assert plan_outer_step(Round(6, 3, 1, 4), 7, NOT_STARTED).start


def test_an_agreed_offer_below_ones_own_is_refused() -> None:
    with pytest.raises(ValueError, match="MAX of every member's offer"):
        plan_outer_step(Round(7, 3, 0, 2), 7, NOT_STARTED)


rounds = st.one_of(st.none(), st.builds(lambda rev, gen, rank: Round(rev, gen, rank, 8),
                                        st.integers(5, 7), st.integers(0, 4), st.integers(0, 7)))


@given(st.lists(rounds, min_size=1, max_size=8), st.integers(1, 6))
def test_contributors_share_one_generation_and_someone_always_contributes(held, generation) -> None:
    revision = 7
    agreed = max(offer(h, revision) for h in held)
    plans = [plan_outer_step(h, revision, agreed) for h in held]
    assert sum(p.weight for p in plans) >= 1
    bound = {generation if p.start else h.generation for p, h in zip(plans, held) if p.contribute}
    assert len(bound) == 1, "contributors bound their rounds in one generation"
    assert all(p.start for p in plans) or not any(p.start for p in plans)

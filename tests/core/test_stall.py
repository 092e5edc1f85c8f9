"""`StallWatch`: when a member counts as stalled, on hand-made samples and as a property."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2pgen.core.stall import StallWatch


def test_an_operation_that_receives_nothing_stalls_from_its_start_and_bytes_restart_the_count():
    w = StallWatch()
    assert w.sample(1.0, None, 0) == 0.0
    assert w.sample(1.1, 1.0, 100) == pytest.approx(0.1)     # in flight since 1.0, nothing new seen yet
    assert w.sample(1.3, 1.0, 100) == pytest.approx(0.3)
    assert w.sample(1.4, 1.0, 900) == 0.0                    # bytes arrived: progress now
    assert w.sample(1.6, 1.0, 900) == pytest.approx(0.2)
    assert w.sample(1.7, None, 900) == 0.0                   # done
    assert w.sample(2.05, 2.0, 900) == pytest.approx(0.05)   # the next operation counts from its own start


@given(st.lists(st.tuples(st.floats(0.0, 0.5), st.booleans(), st.booleans(), st.integers(0, 3)), max_size=60))
def test_stalled_is_the_time_since_the_operation_began_or_bytes_last_arrived_and_0_without_one(steps):
    """A model: an operation starts (or the previous one ends) at a sample; bytes arriving at a sample move
    the last progress to it. The watch answers exactly now - last progress, or 0 with nothing in flight."""
    w, now, op, received, progress = StallWatch(), 0.0, None, 0, 0.0
    for gap, new_op, ends, more in steps:
        now += gap
        if ends:
            op = None
        elif new_op or op is None:
            op, progress = now, now
        if more and op is not None:
            received, progress = received + more, now
        stalled = w.sample(now, op, received)
        assert stalled == (0.0 if op is None else pytest.approx(now - progress))

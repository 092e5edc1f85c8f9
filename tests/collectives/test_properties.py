"""Property test: for random shapes, dtypes, world sizes 1-5, collectives and ops, every member's result
equals the numpy reference, and all members hold the same bits."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2pgen.testing import conformance


@st.composite
def cases(draw):
    world = draw(st.integers(1, 5))
    collective = draw(st.sampled_from(conformance.COLLECTIVES))
    dtype = draw(st.sampled_from(conformance.DTYPES))
    ops = conformance.OPS if dtype in conformance.FLOAT_DTYPES else ("sum", "min", "max")
    op = draw(st.sampled_from(ops))
    shape = tuple(draw(st.lists(st.integers(0, 40), min_size=0, max_size=3)))
    if draw(st.booleans()):
        shape = (draw(st.integers(0, 5000)),)   # spans several 4 KiB frames
    torch = dtype == "bfloat16" or draw(st.booleans())
    case = conformance.Case(collective, shape, dtype, op, root=draw(st.integers(0, 4)),
                            seed=draw(st.integers(0, 2**32 - 1)), torch=torch)
    return world, case


@pytest.mark.timeout(90)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases())
def test_collectives_match_numpy_reference(members, world_case):
    world, case = world_case
    group = members(world)
    digests = group.run(lambda b: conformance.run_case(b, case))
    conformance.check_identical(digests, case)

"""Property test: for random shapes (some around the shared-memory all_reduce's smallest size), dtypes,
world sizes 1-5, collectives, ops (every one the dtype takes) and all_to_all layouts, every member's result
equals the numpy reference, and all members of a replicating collective hold the same bits."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from p2pgen.collectives.backend import REDUCTIONS
from p2pgen.testing import conformance


@st.composite
def cases(draw):
    world = draw(st.integers(1, 5))
    collective = draw(st.sampled_from(conformance.COLLECTIVES))
    dtype = draw(st.sampled_from(conformance.DTYPES))
    if collective in conformance.REDUCING:
        assume(dtype not in conformance.MOVE_ONLY)
        op = draw(st.sampled_from([op.value for op, dtypes in REDUCTIONS.items() if dtype in dtypes]))
    else:
        op = "sum"
    layout = draw(st.sampled_from(conformance.LAYOUTS)) if collective == "all_to_all" else "even"
    shape = tuple(draw(st.lists(st.integers(0, 40), min_size=0, max_size=3)))
    size = draw(st.sampled_from(["small", "frames", "shm"]))
    if size == "frames":
        shape = (draw(st.integers(0, 5000)),)   # spans several 4 KiB frames
    elif size == "shm":
        shape = (draw(st.integers(40_000, 70_000)),)   # around shm.MIN_BYTES (world 2's threshold), any element size
    torch = dtype == "bfloat16" or draw(st.booleans())
    case = conformance.Case(collective, shape, dtype, op, root=draw(st.integers(0, 4)),
                            seed=draw(st.integers(0, 2**32 - 1)), torch=torch, layout=layout)
    return world, case


@pytest.mark.timeout(90)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases())
def test_collectives_match_numpy_reference(members, world_case):
    world, case = world_case
    group = members(world)
    digests = group.run(lambda b: conformance.run_case(b, case))
    conformance.check_identical(digests, case)

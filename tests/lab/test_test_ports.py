"""Test workers take agent ports from disjoint slices of the test port range."""
import os

import pytest

from p2pgen_lab.rigs.agents import PORT_HIGH, PORT_LOW, PORTS_PER_AGENT, port_range, worker_port_range


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_worker_slices_are_disjoint_and_inside_the_range(workers):
    slices = [worker_port_range(w, workers) for w in range(workers)]
    assert slices[0][0] == PORT_LOW and slices[-1][1] <= PORT_HIGH
    for (_, high), (next_low, _) in zip(slices, slices[1:]):
        assert high <= next_low
    assert all(high - low >= 10 * PORTS_PER_AGENT for low, high in slices)


def test_a_worker_slice_is_a_valid_port_range(monkeypatch):
    low, high = worker_port_range(1, 2)
    monkeypatch.setenv("P2PGEN_TEST_PORTS", f"{low}-{high}")
    assert port_range() == (low, high)


@pytest.mark.parametrize("worker, workers", [(2, 2), (-1, 2), (0, 1000)])
def test_a_worker_outside_the_slices_is_refused(worker, workers):
    with pytest.raises(ValueError, match="test worker"):
        worker_port_range(worker, workers)


def test_this_worker_takes_ports_from_its_own_slice():
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not worker.startswith("gw"):
        pytest.skip("not run under pytest-xdist")
    assert port_range() == worker_port_range(int(worker[2:]), int(count))

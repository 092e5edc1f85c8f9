"""Shared fixtures. Each pytest-xdist worker takes agent ports from its own slice of the test port range, so an
agent one test starts late can never find its port taken by an agent another worker started meanwhile."""
import os

import pytest

from p2pgen_lab.rigs.agents import Cluster, worker_port_range


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and count.isdigit() and "P2PGEN_TEST_PORTS" not in os.environ:
        low, high = worker_port_range(int(worker[2:]), int(count))
        os.environ["P2PGEN_TEST_PORTS"] = f"{low}-{high}"


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()

import pytest

from p2pgen_lab.rigs.agents import Cluster


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()

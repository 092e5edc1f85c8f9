import pytest

from p2pgen.testing.agents import Cluster


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()

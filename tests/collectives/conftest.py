"""Shared fixtures: one LocalCluster per world size, each with live tcp backends of one generation."""

from __future__ import annotations

import pytest

from p2pgen.testing.cluster import LocalCluster
from p2pgen.transport import TransportConfig

# Small frames, so that modest arrays already exercise segmentation and pipelining.
SMALL_FRAMES = TransportConfig(chunk_bytes=4096, max_frame_bytes=8192, connect_timeout=10.0)


class Members:
    def __init__(self, world: int) -> None:
        self.cluster = LocalCluster(world, config=SMALL_FRAMES)
        self.backends = self.cluster.backends(generation=1)

    def run(self, fn):
        return self.cluster.run(fn, self.backends, timeout=30.0)


@pytest.fixture(scope="session")
def members():
    made: dict[int, Members] = {}

    def get(world: int) -> Members:
        if world not in made:
            made[world] = Members(world)
        return made[world]

    yield get
    for m in made.values():
        m.cluster.close()

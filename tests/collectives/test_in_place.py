"""The opt-in in-place all_reduce: the whole conformance suite passes with it (bit-identical results on
every member, every dtype and op), and the result lands in the caller's own buffer."""

from __future__ import annotations

import numpy as np
import pytest

from p2pgen.collectives import TcpBackend
from p2pgen.testing import conformance
from p2pgen.testing.cluster import LocalCluster
from p2pgen.transport import TransportConfig

SMALL_FRAMES = TransportConfig(chunk_bytes=4096, max_frame_bytes=8192)   # segmentation at modest sizes


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_in_place_all_reduce_passes_conformance(world):
    with LocalCluster(world, config=SMALL_FRAMES) as cluster:
        backends = [TcpBackend(t, g, in_place_all_reduce=True)
                    for t, g in zip(cluster.transports, cluster.groups(generation=1))]
        conformance.check_backend(lambda fn: cluster.run(fn, backends, timeout=30.0), world)
        bufs = [np.arange(100_000, dtype=np.float32) * (i + 1) for i in range(world)]
        out = cluster.run(lambda b: b.all_reduce(bufs[b.rank]), backends)
        expected = np.arange(100_000, dtype=np.float32) * sum(range(1, world + 1))
        for i in range(world):
            assert out[i] is bufs[i]
            assert np.array_equal(bufs[i], expected)

"""Mixed jobs: device buffers staged through host memory over the tcp backend keep the Backend contract
(correct results; buffers untouched when a collective raises); host buffers pass through uncopied."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from p2pgen.collectives.staged import HostStagedBackend, Stager
from p2pgen.errors import GenerationChanged, PeerLost
from p2pgen.testing import conformance
from p2pgen.testing.cluster import LocalCluster

pytestmark = pytest.mark.timeout(30)


class Device:
    """Stands in for a CUDA buffer: memory the tcp backend cannot take directly."""

    def __init__(self, arr: np.ndarray) -> None:
        self.mem = arr


STAGER = Stager(lambda o: isinstance(o, Device), lambda d: d.mem.copy(), lambda d, h: np.copyto(d.mem, h))


def _staged(cluster, generation=1):
    return [HostStagedBackend(b, [STAGER]) for b in cluster.backends(generation)]


def test_device_buffers_are_reduced_through_host_copies():
    with LocalCluster(3) as cluster:
        backends = _staged(cluster)
        out = cluster.run(lambda b: b.all_reduce(Device(np.full(7, b.rank + 1.0))).mem.tolist(), backends)
        assert out == [[6.0] * 7] * 3

        def gather(b):
            o = Device(np.zeros(6, np.int64))
            b.all_gather(o, Device(np.array([b.rank, 10 * b.rank])))
            return o.mem.tolist()

        assert cluster.run(gather, backends) == [[0, 0, 1, 10, 2, 20]] * 3


def test_host_buffers_pass_through_and_the_conformance_suite_holds():
    with LocalCluster(2) as cluster:
        backends = _staged(cluster)
        conformance.check_backend(lambda fn: cluster.run(fn, backends), 2)
        x = np.ones(3)
        assert cluster.run(lambda b: b.all_reduce(x if b.rank == 0 else np.ones(3)) is x, backends)[0]


def test_a_failed_collective_leaves_the_device_buffer_untouched():
    with LocalCluster(2) as cluster:
        backends = _staged(cluster)
        cluster.run(lambda b: b.barrier(), backends)
        buf = Device(np.full(1 << 16, 5.0))
        box = {}

        def body():
            try:
                backends[0].all_reduce(buf)
            except (GenerationChanged, PeerLost) as e:
                box["error"] = e

        t = threading.Thread(target=body, daemon=True)
        t.start()
        time.sleep(0.1)
        backends[0].abort("generation 2 proposed")
        t.join(5)
        assert isinstance(box.get("error"), GenerationChanged)
        assert np.all(buf.mem == 5.0)
        assert "generation 2 proposed" in backends[0].failed and backends[1].failed is None
        backends[1].abort("done")

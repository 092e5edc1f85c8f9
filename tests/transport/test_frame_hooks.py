"""The data plane's public per-frame hook (p2pgen.transport.hooks): every frame a collective posts or receives,
and every chunk a shard pull receives, is reported with its plane, kind, operation and chunk index, on the thread
that moved it; a hook that raises fails that operation (the chaos benchmark's mid-collective kill relies on
running at that exact point); removing the hook stops the reports."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from p2pgen.errors import P2PGenError
from p2pgen.testing.cluster import LocalCluster
from p2pgen.transport import FrameKind, hooks

pytestmark = pytest.mark.timeout(60)


def test_every_frame_of_an_all_reduce_is_reported_posted_and_received():
    events: list[hooks.FrameEvent] = []
    lock = threading.Lock()

    def record(event: hooks.FrameEvent) -> None:
        with lock:
            events.append(event)

    remove = hooks.add_frame_hook(record)
    try:
        with LocalCluster(3) as cluster:
            backends = cluster.backends(1)
            cluster.run(lambda b: b.all_reduce(np.full(3000, float(b.rank + 1)), op="sum"), backends)
            collective = [e for e in events if e.kind == FrameKind.COLLECTIVE]
            posted = [e for e in collective if e.direction == "posted"]
            received = [e for e in collective if e.direction == "received"]
            assert posted and len(posted) == len(received)
            assert {e.plane for e in collective} == {hooks.COLLECTIVE}
            ring = 2 * (3 - 1)                    # reduce-scatter then all-gather: 2(world-1) frames per member
            assert len(posted) >= 3 * ring and sorted({e.chunk for e in posted})[:ring] == list(range(ring))
            assert {e.peer[0] for e in posted} <= {"peer0", "peer1", "peer2"}
            for b in backends:
                b.close()
    finally:
        remove()
    seen = len(events)
    with LocalCluster(2) as cluster:
        backends = cluster.backends(1)
        cluster.run(lambda b: b.all_reduce(np.ones(10), op="sum"), backends)
        for b in backends:
            b.close()
    assert len(events) == seen, "a removed hook was called"


def test_a_hook_that_raises_fails_the_collective_at_that_frame():
    def fail_first(event: hooks.FrameEvent) -> None:
        if event.direction == "posted" and event.peer[0] == "peer0" and event.chunk == 0:
            raise P2PGenError("fault injected after frame 0")

    remove = hooks.add_frame_hook(fail_first)
    try:
        with LocalCluster(2) as cluster:
            backends = cluster.backends(1)
            with pytest.raises(P2PGenError):       # the injected error or the PeerLost it caused, not a hang
                cluster.run(lambda b: b.all_reduce(np.ones(1000), op="sum"), backends, timeout=30)
            for b in backends:
                b.abort("test over")
                b.close()
    finally:
        remove()

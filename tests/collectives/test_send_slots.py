"""The reduce-scatter's receive slots: a partial reduction is computed in the slot it arrived in and sent from
there, and a slot whose frame the sender thread has not sent yet is never reused (the frame goes through the
work buffer instead). Both paths give the conformance suite's bit-identical results."""

from __future__ import annotations

import numpy as np
import pytest

from p2pgen.collectives import TcpBackend
from p2pgen.testing import conformance
from p2pgen.testing.cluster import LocalCluster
from p2pgen.transport import TransportConfig
from p2pgen.transport.connection import Connection

SMALL_FRAMES = TransportConfig(chunk_bytes=4096, max_frame_bytes=8192)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("world", [3, 4])
def test_every_slot_busy_falls_back_to_the_work_buffer(monkeypatch, world, in_place):
    monkeypatch.setattr(Connection, "is_sent", lambda self, ticket: ticket == 0)
    with LocalCluster(world, config=SMALL_FRAMES) as cluster:
        backends = [TcpBackend(t, g, in_place_all_reduce=in_place)
                    for t, g in zip(cluster.transports, cluster.groups(generation=1))]
        conformance.check_backend(lambda fn: cluster.run(fn, backends, timeout=30.0), world)


@pytest.mark.timeout(60)
def test_a_slot_is_reused_only_after_its_frame_was_sent(monkeypatch):
    """Every reuse of a slot happens after the sender thread handed the frame sent from it to the kernel."""
    reused_early = []
    real_post = Connection.post

    def post(self, kind, op_seq, chunk, payload, inline=False, digest=None):
        for ticket, view, snapshot in list(getattr(self, "_watch", [])):
            if not self.is_sent(ticket) and not np.array_equal(view, snapshot):
                reused_early.append(ticket)
        ticket = real_post(self, kind, op_seq, chunk, payload, inline, digest)
        self._watch = [w for w in getattr(self, "_watch", []) if not self.is_sent(w[0])]
        self._watch.append((ticket, payload, payload.copy()))
        return ticket

    monkeypatch.setattr(Connection, "post", post)
    with LocalCluster(4, config=SMALL_FRAMES) as cluster:
        backends = cluster.backends(generation=1)
        bufs = [np.random.default_rng(i).standard_normal(50_000).astype(np.float32) for i in range(4)]
        expected = bufs[0].copy()
        for b in bufs[1:]:
            expected = expected + b
        out = cluster.run(lambda be: be.all_reduce(bufs[be.rank].copy()), backends)
    assert not reused_early
    for o in out:
        assert np.array_equal(o, out[0])
    np.testing.assert_allclose(out[0], expected, rtol=1e-5, atol=1e-5)

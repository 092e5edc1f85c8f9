"""Test double: a data-plane member in its own process, driven by its parent over a pipe.

Messages from the parent: ("group", generation, endpoints, self_index), ("exit",). The member reports
("port", port), ("running", shm_active) after its first all_reduce, ("failed", error class, message, monotonic time)
when a collective raises, ("aborted", quiescence, open connections) and ("done", ok, connections open
before the first collective) for the next generation. It all-reduces `rank + 1` in a loop until a
collective fails, so a parent that SIGKILLs one member catches the others mid all-reduce.
"""

from __future__ import annotations

import time

import numpy as np

from p2pgen.collectives import TcpBackend
from p2pgen.errors import P2PGenError
from p2pgen.testing.cluster import SECRET
from p2pgen.testing.ports import open_transport
from p2pgen.transport import Group, TransportConfig

JOB = "kill-test"
ELEMENTS = 1 << 20


def member_main(pipe, peer_id: str, incarnation: int) -> None:
    transport = open_transport(JOB, SECRET, peer_id, incarnation, TransportConfig(chunk_bytes=256 << 10))
    try:
        pipe.send(("port", transport.port))
        _, gen, endpoints, index = pipe.recv()
        backend = TcpBackend(transport, Group(JOB, gen, endpoints, index))
        _loop_until_failure(pipe, backend)
        pipe.send(("aborted", backend.abort("a member was lost"), transport.open_connections()))
        _, gen, endpoints, index = pipe.recv()
        backend = TcpBackend(transport, Group(JOB, gen, endpoints, index))
        before = transport.open_connections()
        buf = np.full(ELEMENTS, index + 1.0, np.float32)
        backend.all_reduce(buf)
        n = len(endpoints)
        pipe.send(("done", bool(np.all(buf == n * (n + 1) / 2)), before))
        pipe.recv()
    finally:
        transport.close()


def _loop_until_failure(pipe, backend: TcpBackend) -> None:
    reported = False
    while True:
        buf = np.full(ELEMENTS, backend.rank + 1.0, np.float32)
        try:
            backend.all_reduce(buf)
        except P2PGenError as e:
            pipe.send(("failed", type(e).__name__, str(e), time.monotonic()))
            return
        if not reported:
            pipe.send(("running", backend.shm_active))
            reported = True

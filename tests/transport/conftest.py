"""Fixtures: a real member (rank 1 of generation 5) listening on loopback, and a rogue rank 0 that dials it."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from p2pgen.collectives import TcpBackend
from p2pgen.testing.ports import open_transport
from p2pgen.transport import Endpoint, Group, TransportConfig
from p2pgen_lab.rigs.rogue import RoguePeer

JOB = "job-under-test"
SECRET = b"the-right-secret-0123456789abcdef"
ROGUE = ("peer0", 1000)
CONFIG = TransportConfig(max_frame_bytes=64 << 10, chunk_bytes=16 << 10, connect_timeout=5.0,
                         handshake_timeout=2.0, abort_timeout=5.0)


class Target:
    """The honest member: rank 1 of `generation`, with the rogue listed as rank 0."""

    def __init__(self, config: TransportConfig = CONFIG) -> None:
        self.transport = open_transport(JOB, SECRET, "peer1", 2000, config)
        self.backend: TcpBackend | None = None

    def open(self, generation: int) -> TcpBackend:
        rogue = Endpoint(ROGUE[0], ROGUE[1], "127.0.0.1", 1)   # never dialed: the lower rank dials
        self.backend = TcpBackend(self.transport, Group(JOB, generation, [rogue, self.transport.endpoint()], 1))
        return self.backend

    def rogue(self, generation: int, secret: bytes = SECRET, identity: tuple[str, int] = ROGUE) -> RoguePeer:
        return RoguePeer(JOB, secret, identity[0], identity[1], generation)

    def recv_in_thread(self, buf: np.ndarray) -> Pending:
        return Pending(lambda: self.backend.recv(buf, 0))


class Pending:
    """A call running on its own thread; `result(timeout)` returns its value or raises its error."""

    def __init__(self, fn) -> None:
        self.value = self.error = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn) -> None:
        try:
            self.value = fn()
        except BaseException as e:   # handed to the test thread
            self.error = e

    def result(self, timeout: float):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"call still blocked after {timeout}s"
        if self.error is not None:
            raise self.error
        return self.value


@pytest.fixture
def target():
    t = Target()
    try:
        yield t
    finally:
        t.transport.close()

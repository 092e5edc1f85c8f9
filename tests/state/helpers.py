"""Helpers for the state tests: deterministic states, servers on free ports below 32768, and a state
source in its own process (run as `python -m tests.state.helpers SEED NBYTES GENERATION PEER INC PULLER`)."""

from __future__ import annotations

import errno
import random
import subprocess
import sys

import numpy as np

from p2pgen.state import ServerConfig, SharedState, Source, StateServer

JOB = "state-test"
SECRET = b"state-test-secret-0123456789abcdef"
PORT_RANGE = (20000, 32000)


def make_state(seed: int, nbytes: int, revision: int = 10, pieces: int = 4) -> SharedState:
    """`pieces` float32 tensors of nbytes/pieces each, plus a bias, step and RNG objects."""
    rng = np.random.default_rng(seed)
    n = nbytes // pieces // 4
    tensors = {f"layer{i}.weight": rng.standard_normal(n, dtype=np.float32) for i in range(pieces)}
    tensors["bias"] = np.arange(7, dtype=np.int64)
    return SharedState(tensors, {"step": revision, "rng": rng.bit_generator.state}, revision=revision)


def open_server(state: SharedState, me: tuple[str, int], allowed: set[str] | None = None,
                secret: bytes = SECRET, config: ServerConfig = ServerConfig()) -> StateServer:
    """A StateServer on a random free port in PORT_RANGE; `allowed` peer_ids (None: anyone)."""
    def authorize(peer_id: str, incarnation: int, generation: int) -> bool:
        return allowed is None or peer_id in allowed
    for _ in range(200):
        try:
            return StateServer(state, job=JOB, secret=secret, me=me, authorize=authorize,
                               port=random.randrange(*PORT_RANGE), config=config)
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
    raise OSError(errno.EADDRINUSE, f"no free port in {PORT_RANGE}")


def source_of(server: StateServer) -> Source:
    return Source(server.me[0], server.me[1], server.host, server.port)


class SourceProcess:
    """A state source in a child process, serving make_state(seed, nbytes) for `generation`."""

    def __init__(self, seed: int, nbytes: int, generation: int, peer_id: str, incarnation: int,
                 puller: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.state.helpers", str(seed), str(nbytes), str(generation), peer_id,
             str(incarnation), puller], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        port = int(self.proc.stdout.readline())
        self.source = Source(peer_id, incarnation, "127.0.0.1", port)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def _child(seed: int, nbytes: int, generation: int, peer_id: str, incarnation: int, puller: str) -> None:
    server = open_server(make_state(seed, nbytes), (peer_id, incarnation), {puller})
    with server.serving(generation):
        print(server.port, flush=True)
        sys.stdin.read()   # serve until the parent closes our stdin (or kills us)
    server.close()


if __name__ == "__main__":
    a = sys.argv[1:]
    _child(int(a[0]), int(a[1]), int(a[2]), a[3], int(a[4]), a[5])

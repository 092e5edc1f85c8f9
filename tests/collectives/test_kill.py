"""SIGKILL one member of four in the middle of an all-reduce (real processes, through shared memory and
around the ring): every survivor raises within a bounded time, none hangs, and the old generation's
connections are closed before the next generation's first collective, which then succeeds among the
survivors."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest

from p2pgen.transport import PROVED, Endpoint
from p2pgen_lab.rigs.member_process import member_main

WORLD = 4
VICTIM = 2
BOUND_S = 5.0


def _expect(pipe, kind: str, timeout: float = 20.0):
    assert pipe.poll(timeout), f"no {kind!r} report within {timeout}s: a member hangs"
    msg = pipe.recv()
    assert msg[0] == kind, msg
    return msg


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shm", ["1", "0"], ids=["shared-memory", "ring"])
def test_sigkill_mid_all_reduce_survivors_raise_and_regroup(shm, monkeypatch):
    monkeypatch.setenv("P2PGEN_SHM", shm)         # the members are spawned with this environment
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    try:
        for i in range(WORLD):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=member_main, args=(child, f"peer{i}", 100 + i), daemon=True)
            p.start()
            pipes.append(parent)
            procs.append(p)
        ports = [_expect(pipe, "port")[1] for pipe in pipes]
        endpoints = [Endpoint(f"peer{i}", 100 + i, "127.0.0.1", ports[i]) for i in range(WORLD)]
        for i, pipe in enumerate(pipes):
            pipe.send(("group", 1, endpoints, i))
        for pipe in pipes:
            assert _expect(pipe, "running")[1] == (shm == "1")
        time.sleep(0.1)
        killed_at = time.monotonic()
        os.kill(procs[VICTIM].pid, signal.SIGKILL)

        survivors = [i for i in range(WORLD) if i != VICTIM]
        for i in survivors:
            _, kind, message, at = _expect(pipes[i], "failed")
            assert kind in ("PeerLost", "ProtocolError"), (kind, message)
            assert "all_reduce" in message
            assert at - killed_at < BOUND_S, f"rank {i} took {at - killed_at:.2f}s to notice"
        for i in survivors:
            _, quiescence, still_open = _expect(pipes[i], "aborted")
            assert quiescence == PROVED
            assert still_open == []

        new = [endpoints[i] for i in survivors]
        for index, i in enumerate(survivors):
            pipes[i].send(("group", 2, new, index))
        for i in survivors:
            _, ok, before_first = _expect(pipes[i], "done")
            assert ok
            assert all(gen == 2 for gen, _ in before_first)
        for i in survivors:
            pipes[i].send(("exit",))
            procs[i].join(10)
            assert procs[i].exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
            p.join(5)

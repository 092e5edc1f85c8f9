"""Catch-up throughput on loopback, beside raw TCP in the same run (for `p2pgen bench recovery`).

Owns: `catchup_throughput`, which pulls `size_bytes` of state from 1..n source processes and, in the
same run, moves the same bytes with plain `sendall` / `recv_into` from as many sender processes, so the
two figures share the machine's load: `rounds` rounds, each one pull and one raw transfer, the order
alternating, medians and the range of the per-round ratios (one pull against one raw transfer swung
0.58-1.29 at 64 MiB x 2; with 3 rounds the median of 256 MiB x 2 ranged 0.65-0.95 between runs, with 5
rounds 0.78-0.79 in two runs). Sources are separate processes so that their hashing and sending do not share
the puller's GIL.

Invariant: both figures move the same bytes over the same number of connections; the pull figure
includes everything a real catch-up pays (connect, handshake, manifest, finding which tensors the
joiner already holds, per-chunk checksums, tensor digests, writing the user's tensors, the final digest).
"""

from __future__ import annotations

import errno
import multiprocessing as mp
import random
import socket
import statistics
import threading
import time

import numpy as np

from p2pgen.core.model import Frontier
from p2pgen.state.pull import PullConfig, Source, pull_state
from p2pgen.state.server import StateServer
from p2pgen.state.shared import SharedState

JOB = "bench-catchup"
SECRET = b"bench-catchup-secret-0123456789ab"
GENERATION = 1
PIECES = 8
PORT_RANGE = (20000, 32000)


def catchup_throughput(size_bytes: int, sources: int = 1, chunk_bytes: int = 4 << 20, rounds: int = 5) -> dict:
    """GB/s of a pull of `size_bytes` from `sources` processes, and of raw loopback TCP of the same bytes: medians
    of `rounds` interleaved rounds; `pull_over_raw` is the median of the per-round ratios (`ratio_min`..`max`)."""
    if sources < 1 or rounds < 1:
        raise ValueError(f"sources and rounds must be >= 1, got {sources} and {rounds}")
    ctx = mp.get_context("spawn")
    children = [_Child(ctx, _serve_state, size_bytes, f"src{i}") for i in range(sources)]
    pulls: list[float] = []
    raws: list[float] = []
    try:
        ports = [c.ready() for c in children]
        source_state = _state(size_bytes, seed=1)
        frontier = Frontier(source_state.revision, source_state.digest())
        del source_state
        srcs = [Source(f"src{i}", 1, "127.0.0.1", p) for i, p in enumerate(ports)]
        config = PullConfig(chunk_bytes=chunk_bytes, max_frame_bytes=max(chunk_bytes, 16 << 20))
        for r in range(rounds):
            for step in ("pull", "raw") if r % 2 == 0 else ("raw", "pull"):
                if step == "raw":
                    raws.append(_raw_tcp_seconds(size_bytes, sources))
                    continue
                state = _state(size_bytes, seed=None)       # a joiner's state, resident, not yet the frontier
                start = time.perf_counter()
                report = pull_state(state, job=JOB, secret=SECRET, me=("bench-puller", 1), generation=GENERATION,
                                    frontier=frontier, sources=srcs, config=config, progress=False)
                pulls.append(time.perf_counter() - start)
                del state
    finally:
        for c in children:
            c.stop()
    pull_s, raw_s = statistics.median(pulls), statistics.median(raws)
    ratios = [raw / pull for pull, raw in zip(pulls, raws)]
    return {"size_bytes": size_bytes, "sources": sources, "chunk_bytes": chunk_bytes, "rounds": rounds,
            "pull_seconds": pull_s, "pull_GBps": size_bytes / pull_s / 1e9,
            "raw_seconds": raw_s, "raw_GBps": size_bytes / raw_s / 1e9,
            "pull_over_raw": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "bytes_by_source": report.bytes_by_source}


def _state(size_bytes: int, seed: int | None) -> SharedState:
    """PIECES uint8 tensors summing to size_bytes: random bytes (seed), or zeros written (seed None) so
    their pages are resident, as a live application's tensors are."""
    sizes = [size_bytes // PIECES + (1 if i < size_bytes % PIECES else 0) for i in range(PIECES)]
    rng = np.random.default_rng(seed) if seed is not None else None
    tensors = {f"t{i}": (rng.integers(0, 256, n, dtype=np.uint8) if rng else np.full(n, 0, np.uint8))
               for i, n in enumerate(sizes)}
    return SharedState(tensors, {"step": 1}, revision=1 if seed is not None else 0)


class _Child:
    """A spawned helper process that reports a port, then runs until told to stop (by pipe, then pid)."""

    def __init__(self, ctx, target, *args) -> None:
        self.pipe, child_end = ctx.Pipe()
        self.proc = ctx.Process(target=target, args=(child_end, *args), daemon=True)
        self.proc.start()

    def ready(self, timeout: float = 120.0) -> int:
        if not self.pipe.poll(timeout):
            raise TimeoutError(f"bench helper pid {self.proc.pid} did not start within {timeout}s")
        return self.pipe.recv()

    def stop(self) -> None:
        try:
            self.pipe.send("stop")
        except OSError:
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)


def _serve_state(pipe, size_bytes: int, peer_id: str) -> None:
    server = _on_free_port(lambda port: StateServer(_state(size_bytes, seed=1), job=JOB, secret=SECRET,
                                                    me=(peer_id, 1), authorize=lambda *_: True, port=port,
                                                    host="127.0.0.1"))
    with server.serving(GENERATION):
        pipe.send(server.port)
        pipe.recv()
    server.close()


def _send_raw(pipe, nbytes: int, port: int) -> None:
    data = np.ones(nbytes, np.uint8)
    pipe.send(0)
    pipe.recv()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(memoryview(data))
        sock.recv(1)


def _raw_tcp_seconds(size_bytes: int, senders: int) -> float:
    """Seconds to receive size_bytes over `senders` plain TCP connections (recv_into a buffer)."""
    listener = _on_free_port(lambda port: socket.create_server(("127.0.0.1", port), backlog=senders))
    ctx = mp.get_context("spawn")
    shares = [size_bytes // senders + (1 if i < size_bytes % senders else 0) for i in range(senders)]
    children = [_Child(ctx, _send_raw, n, listener.getsockname()[1]) for n in shares]
    buf = np.empty(size_bytes, np.uint8)
    buf.fill(0)   # fault the pages in before timing, as the pull's buffers are
    try:
        for c in children:
            c.ready()
        start = time.perf_counter()
        for c in children:
            c.pipe.send("go")
        offsets = np.cumsum([0, *shares])
        threads = [threading.Thread(target=_recv_share, args=(listener, memoryview(buf)[offsets[i]:offsets[i + 1]]))
                   for i in range(senders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - start
    finally:
        listener.close()
        for c in children:
            c.proc.join(10)
            if c.proc.is_alive():
                c.proc.kill()


def _recv_share(listener: socket.socket, view: memoryview) -> None:
    sock, _ = listener.accept()
    with sock:
        got = 0
        while got < len(view):
            k = sock.recv_into(view[got:])
            if k == 0:
                raise ConnectionError(f"raw sender closed after {got} of {len(view)} bytes")
            got += k
        sock.sendall(b"k")


def _on_free_port(open_on):
    for _ in range(200):
        try:
            return open_on(random.randrange(*PORT_RANGE))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
    raise OSError(errno.EADDRINUSE, f"no free port in {PORT_RANGE}")

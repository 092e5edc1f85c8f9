"""No-op model of `p2pgen bench recovery`'s per-step overhead, run under a `p2pgen join` agent:

    python -m p2pgen_lab.bench.apps.noop --out FILE [--steps-per-block N] [--blocks B]

Once active, every member runs the same sequence in one generation: blocks of N steps through
`peer.steps()` (each step: one all-reduce of a 4-byte buffer, then `commit()`), alternating (ABBA) with
blocks of N bare `peer._backend.all_reduce` calls of the same buffer, the baseline. Rank 0 writes the
per-block seconds to FILE as JSON; every member then exits cleanly, so its agent leaves the job.
Invariant: both kinds of block run in the same process, generation and communicator; a generation
change during the measurement is an error, never a figure.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

import p2pgen
from p2pgen.peer import Peer, Step

WARMUP_STEPS = 20


def time_steps(steps: Iterator[Step], buf: np.ndarray, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        step = next(steps)
        with step:
            step.all_reduce(buf, op="sum")
            step.commit()
        if not step.committed:
            raise RuntimeError(f"step {step.revision} was discarded: {step.discarded}")
    return time.perf_counter() - start


def time_bare(peer: Peer, buf: np.ndarray, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        peer._backend.all_reduce(buf, op="sum")
    return time.perf_counter() - start


def measure(peer: Peer, n: int, blocks: int) -> dict:
    buf = np.ones(1, np.float32)
    steps = peer.steps()
    time_steps(steps, buf, WARMUP_STEPS)
    generation = peer.generation
    step_s: list[float] = []
    bare_s: list[float] = []
    for block in range(blocks):
        if block % 2 == 0:
            step_s.append(time_steps(steps, buf, n))
            bare_s.append(time_bare(peer, buf, n))
        else:
            bare_s.append(time_bare(peer, buf, n))
            step_s.append(time_steps(steps, buf, n))
    if peer.generation != generation:
        raise RuntimeError(f"generation changed from {generation} to {peer.generation} during the measurement")
    return {"world": peer.world, "generation": generation, "steps_per_block": n, "step_s": step_s, "bare_s": bare_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="rank 0 writes its JSON here")
    parser.add_argument("--steps-per-block", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=6)
    args = parser.parse_args()
    peer = p2pgen.join(state=p2pgen.SharedState(tensors={"x": np.zeros(1, np.float32)}))
    result = measure(peer, args.steps_per_block, args.blocks)
    if peer.rank == 0:
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        tmp.replace(args.out)
    peer.close()


if __name__ == "__main__":
    main()

"""Workload of `p2pgen bench survive`, run under a `p2pgen join` agent:

    python -m p2pgen_lab.bench.apps.survive --mbytes S --step-delay D

State: S MB of float32 in 4 tensors (the "model"), all of it in the SharedState, so a local copy or a
checkpoint saves all S MB and a catch-up moves all S MB. Step r: every member contributes the integer
vector (r + rank) * ones(256), all-reduced with SUM, added into 256 elements of tensor r % 4 (exact
in float32, so every member holds the same bytes). The per-step compute is negligible: what the
benchmark measures is the cost of keeping and recovering the state. It trains until its agent stops it;
its p2pgen trace (`$P2PGEN_TRACE_DIR`) records every commit, restore, pull and catch-up.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import p2pgen

PIECES, WIDTH = 4, 256


def initial_state(mbytes: float) -> p2pgen.SharedState:
    n = max(WIDTH, int(mbytes * 1e6) // 4 // PIECES)
    return p2pgen.SharedState({f"w{i}": np.full(n, float(i), np.float32) for i in range(PIECES)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mbytes", type=float, default=16.0)
    parser.add_argument("--step-delay", type=float, default=0.02)
    args = parser.parse_args()
    state = initial_state(args.mbytes)
    peer = p2pgen.join(state=state)
    for step in peer.steps():
        with step:
            contribution = np.full(WIDTH, float(step.revision + step.rank), np.float32)
            time.sleep(args.step_delay)
            step.all_reduce(contribution, op="sum")
            target = state.tensors[f"w{step.revision % PIECES}"]
            target[:WIDTH] += contribution
            step.commit()


if __name__ == "__main__":
    main()

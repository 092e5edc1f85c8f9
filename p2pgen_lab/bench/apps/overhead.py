"""Workload of `p2pgen bench survive --only overhead`, run under a `p2pgen join` agent:

    python -m p2pgen_lab.bench.apps.overhead --mbytes S

State: one float32 torch tensor of S MiB that every step updates in full. Step r: a tiny all-reduce (the
step's only collective), then `w.add_(1.0)` (the shared state is written after the last collective, as
the step contract asks), then `step.commit()`. Nothing else: the step rate it reaches is the update's
memory traffic plus the step's fixed cost, so the local copy's cost shows as the ratio of the rates with
and without it. It trains until its agent stops it; its trace (`$P2PGEN_TRACE_DIR`) records every commit
with the revision of the last local-copy snapshot.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import p2pgen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mbytes", type=float, default=16.0)
    args = parser.parse_args()
    state = p2pgen.SharedState({"w": torch.zeros(int(args.mbytes * (1 << 20)) // 4)})
    peer = p2pgen.join(state=state)
    tiny = np.zeros(8, np.float32)
    for step in peer.steps():
        with step:
            tiny[:] = step.rank
            step.all_reduce(tiny, op="sum")
            state.tensors["w"].add_(1.0)
            step.commit()


if __name__ == "__main__":
    main()

"""An exact mini-training with sharded state (ZeRO-1 style), for integration tests of repartition.

Replicated: `w`, an int64 vector. Sharded: `m`, an int64 "moment" vector of the same length cut into
SHARDS shards owned by R members each (p2pgen chooses the owners; they change with the membership).
Step r: the global batch's contribution `total` is all-reduced (as in exact_train); each member updates
the shards of `m` it owns, m = (m * 17 + total) mod 2**31; the first owner of each shard puts its new
slice into a zero vector, an all_reduce SUM gives every member the whole `m`; then
w = (w * 31 + total + m) mod 2**31. The final w equals the one-process `reference(steps)` only if every
shard of m survived every membership change at the right revision (I5 for sharded state).
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

import p2pgen
from tests.integration.apps.exact_train import BATCH, MOD, SIZE, contribution

SHARDS, R = 4, 2


def reference(steps: int) -> np.ndarray:
    w, m = np.arange(SIZE, dtype=np.int64), np.zeros(SIZE, dtype=np.int64)
    for r in range(steps):
        total = contribution(r, 0, BATCH)
        m = (m * 17 + total) % MOD
        w = (w * 31 + total + m) % MOD
    return w


def first_owned(peer: p2pgen.Peer) -> set[int]:
    me = f"{peer.peer_id}#{peer.incarnation}"
    return {shard for _, shard, owners in peer.certificate.ownership if owners[0] == me}


def main() -> None:
    steps = int(os.environ.get("EXACT_STEPS", 40))
    delay = float(os.environ.get("EXACT_STEP_DELAY", 0.05))
    state = p2pgen.SharedState(tensors={"w": np.arange(SIZE, dtype=np.int64)})
    m = state.shard("m", SIZE, SHARDS, "int64", r=int(os.environ.get("SHARD_R", R)))
    peer = p2pgen.join(state=state)
    most_held = 0
    for step in peer.steps():
        if state.revision >= steps:
            break
        with step:
            lo, hi = step.rank * BATCH // step.world, (step.rank + 1) * BATCH // step.world
            total = contribution(step.revision, lo, hi)
            time.sleep(delay)
            step.all_reduce(total, op="sum")
            full = np.zeros(SIZE, dtype=np.int64)
            updated = {}
            for i in m.owned():
                a, b = m.bounds(i)
                updated[i] = (m.held[i] * 17 + total[a:b]) % MOD
                if i in first_owned(peer):
                    full[a:b] = updated[i]
            step.all_reduce(full, op="sum")
            for i, value in updated.items():        # the state changes only after the last collective
                np.copyto(m.held[i], value)
            w = state.tensors["w"]
            np.copyto(w, (w * 31 + total + full) % MOD)
            most_held = max(most_held, m.nbytes_held)
            step.commit()
    summary = {"peer": peer.peer_id, "incarnation": peer.incarnation, "revision": state.revision,
               "w": state.tensors["w"].tolist(), "held": m.owned(), "held_bytes": m.nbytes_held,
               "most_held_bytes": most_held, **peer.stats}
    with open(os.path.join(os.environ["P2PGEN_SUMMARY_DIR"], f"{peer.peer_id}-{peer.incarnation}.json"), "w") as f:
        json.dump(summary, f)
    peer.close()
    sys.exit(0)


if __name__ == "__main__":
    main()

"""An exact mini-training for integration tests: integer arithmetic, every step's effect known exactly.

State: `w`, an int64 vector. Step r: the global batch is the sample ids [r*B, (r+1)*B); member `rank` of
`world` takes a contiguous shard of it and contributes the sum of contribution(s) over its samples; an
all_reduce SUM gives the same total whatever the world size; then w = (w * 31 + total) mod 2**31.
Because the update does not commute, the final w equals the reference only if every step was applied
exactly once and in order (I5). `reference(steps)` computes it in one process.

Faults (env EXACT_FAULTS="peer:point:revision,..." with point in {mid_step, after_allreduce}) make this
process SIGKILL itself once (a marker file in EXACT_MARKERS records that it fired). EXACT_JOIN_DELAY=
"peer:incarnation:seconds,..." makes that incarnation wait before it joins (a slow restart). EXACT_SIZE sets the
vector's length (default 64; read at import: a test that sets it passes it to `reference` too).
EXACT_PROGRESS=DIR: every fifth revision committed, the file DIR/PEER-INCARNATION holds it (a test waits on it
for a member's collectives to be under way).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np

import p2pgen

SIZE = int(os.environ.get("EXACT_SIZE", 64))    # elements of `w` (and of every step's all_reduce)
BATCH, MOD = 24, 2 ** 31


def contribution(revision: int, lo: int, hi: int, size: int = SIZE) -> np.ndarray:
    ids = np.arange(revision * BATCH + lo, revision * BATCH + hi, dtype=np.int64)
    cols = np.arange(size, dtype=np.int64)
    return ((ids[:, None] * 7919 + cols[None, :] * 104729) % 1009).sum(axis=0)


def update(w: np.ndarray, total: np.ndarray) -> None:
    np.copyto(w, (w * 31 + total) % MOD)


def reference(steps: int, size: int = SIZE) -> np.ndarray:
    """`w` after `steps` steps, computed in one process (`size`: EXACT_SIZE as this module was imported)."""
    w = np.arange(size, dtype=np.int64)
    for r in range(steps):
        update(w, contribution(r, 0, BATCH, size))
    return w


def maybe_fault(peer: str, point: str, revision: int) -> None:
    for spec in filter(None, os.environ.get("EXACT_FAULTS", "").split(",")):
        who, where, when = spec.split(":")
        marker = os.path.join(os.environ["EXACT_MARKERS"], spec.replace(":", "_"))
        if (who, where, int(when)) == (peer, point, revision) and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


def delay_join() -> None:
    me = (os.environ.get("P2PGEN_PEER_ID"), os.environ.get("P2PGEN_INCARNATION"))
    for spec in filter(None, os.environ.get("EXACT_JOIN_DELAY", "").split(",")):
        who, incarnation, seconds = spec.split(":")
        if (who, incarnation) == me:
            time.sleep(float(seconds))


def note_progress(peer, revision: int) -> None:
    directory = os.environ.get("EXACT_PROGRESS")
    if directory and revision % 5 == 0:
        path = os.path.join(directory, f"{peer.peer_id}-{peer.incarnation}")
        with open(path + ".tmp", "w") as f:
            f.write(str(revision))
        os.replace(path + ".tmp", path)


def main() -> None:
    delay_join()
    steps = int(os.environ.get("EXACT_STEPS", 40))
    delay = float(os.environ.get("EXACT_STEP_DELAY", 0.05))
    state = p2pgen.SharedState(tensors={"w": np.arange(SIZE, dtype=np.int64)})
    peer = p2pgen.join(state=state)
    for step in peer.steps():
        if state.revision >= steps:
            break
        with step:
            lo, hi = step.rank * BATCH // step.world, (step.rank + 1) * BATCH // step.world
            total = contribution(step.revision, lo, hi)
            time.sleep(delay)
            maybe_fault(peer.peer_id, "mid_step", step.revision)
            step.all_reduce(total, op="sum")
            maybe_fault(peer.peer_id, "after_allreduce", step.revision)
            update(state.tensors["w"], total)
            step.commit()
        note_progress(peer, state.revision)
    summary = {"peer": peer.peer_id, "incarnation": peer.incarnation, "revision": state.revision,
               "digest": state.digest(), "w": state.tensors["w"].tolist(), **peer.stats}
    with open(os.path.join(os.environ["P2PGEN_SUMMARY_DIR"], f"{peer.peer_id}-{peer.incarnation}.json"), "w") as f:
        json.dump(summary, f)
    peer.close()
    sys.exit(0)


if __name__ == "__main__":
    main()

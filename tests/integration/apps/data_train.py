"""An exact data test: the state is a histogram of the samples consumed, fed by `p2pgen.data`.

State: `counts`, int64[N], and the sampler's record. Step r: this member takes its indices of revision r's global
batch (from an ElasticSampler, or through an ElasticLoader with DATA_WORKERS worker processes when that is set),
logs them (DATA_LOG/<peer>-<incarnation>.jsonl, `used` before the all-reduce, `commit` after the commit), adds one
per index into a local histogram, all-reduces it (SUM) and adds the total to `counts`. After R committed steps the
state must equal the serial reference: every index counted as often as the first R * B positions of the sample
stream hold it (`reference`); one sample skipped or used twice shows in `counts` and in every digest.
DATA_HOLD="REVISION:WORLD" slows the members down from REVISION on (a pause of HOLD_PAUSE_S before each step)
while their generation has fewer than WORLD members, so that joiners still starting up on a loaded machine join
before the job reaches its last revision; the steps still run and commit (a pending generation is joined at a
commit, so a member that stopped stepping would never let the joiners in).
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

import p2pgen
from p2pgen.data import ElasticLoader, ElasticSampler, stream

N, BATCH, SEED = 97, 12, 11
HOLD_PAUSE_S = 0.5


class Ids:
    """The dataset: sample i is the number i."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return i


def reference(steps: int) -> np.ndarray:
    record = ElasticSampler(p2pgen.SharedState(), N, BATCH, SEED).record
    return np.bincount(stream(record, 0, steps * BATCH), minlength=N).astype(np.int64)


def main() -> None:
    steps = int(os.environ.get("DATA_STEPS", 60))
    delay = float(os.environ.get("DATA_STEP_DELAY", 0.03))
    workers = int(os.environ.get("DATA_WORKERS", "0"))
    state = p2pgen.SharedState(tensors={"counts": np.zeros(N, dtype=np.int64)})
    sampler = ElasticSampler(state, N, BATCH, SEED)
    loader = ElasticLoader(Ids(), sampler, num_workers=workers) if workers else None
    peer = p2pgen.join(state=state)
    log = open(os.path.join(os.environ["DATA_LOG"], f"{peer.peer_id}-{peer.incarnation}.jsonl"), "a", buffering=1)
    hold_at, hold_world = (int(v) for v in os.environ.get("DATA_HOLD", "0:0").split(":"))
    for step in peer.steps():
        if state.revision >= steps:
            break
        if hold_world and state.revision >= hold_at and step.world < hold_world:
            time.sleep(HOLD_PAUSE_S)
        with step:
            if loader is not None:
                batch = loader.batch(step)
                ids = [] if batch is None else batch.tolist()
            else:
                ids = sampler.indices(step).tolist()
            key = {"peer": peer.peer_id, "gen": step.generation, "rev": step.revision, "rank": step.rank,
                   "world": step.world}
            log.write(json.dumps({"event": "used", **key, "ids": ids}) + "\n")
            local = np.bincount(np.asarray(ids, dtype=np.int64), minlength=N).astype(np.int64)
            time.sleep(delay)
            step.all_reduce(local, op="sum")
            state.tensors["counts"] += local
            step.commit()
            log.write(json.dumps({"event": "commit", **key}) + "\n")
    summary = {"peer": peer.peer_id, "incarnation": peer.incarnation, "revision": state.revision,
               "digest": state.digest(), "counts": state.tensors["counts"].tolist(),
               "restarts": loader.restarts if loader else 0}
    with open(os.path.join(os.environ["P2PGEN_SUMMARY_DIR"], f"{peer.peer_id}-{peer.incarnation}.json"), "w") as f:
        json.dump(summary, f)
    if loader is not None:
        loader.close()
    peer.close()
    sys.exit(0)


if __name__ == "__main__":
    main()

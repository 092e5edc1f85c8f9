"""Step-loop workload of `p2pgen bench recovery`, run under a `p2pgen join` agent:

    python -m p2pgen_lab.bench.apps.steploop --policy {p2pgen,restart-all} --trace-dir DIR --checkpoint FILE

Model: linear regression y = W x trained by SGD with momentum; W and its momentum are float32 (OUT x IN),
4 MiB of SharedState together. The global batch of revision r is drawn from (seed, r) and split into
`world` contiguous shards; each member all-reduces (SUM) its shard's gradient, divided by the global
batch size, so a step does not depend on the world size. It trains until its agent stops it.

Policies:
- `p2pgen`: the step loop as documented in `p2pgen.peer`: a generation change discards the step in
  flight; a restarted process starts from the initial state and pulls the frontier before it trains.
- `restart-all` (what torchrun does): the first generation change after this process was active ends
  it (exit code RESTART_EXIT); its agent starts a new incarnation, which loads the last checkpoint.
  Rank 0 writes the checkpoint every `--checkpoint-every` commits.
Output: the p2pgen trace of every process (`<trace-dir>/<peer>-<incarnation>.jsonl`, wall-clock `t`),
plus one `certificate` event (with `activated_at`) at the first step of each generation it trains in.
Invariant: the checkpoint file is replaced atomically and holds the tensors of the revision it names.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

import p2pgen
from p2pgen.auth import load_secret
from p2pgen.core.follower import Action, Exit, FollowerPolicy
from p2pgen.peer import Peer, PeerObserver

IN, OUT, GLOBAL_BATCH = 1024, 512, 32
LR, MOMENTUM = 0.01, 0.9
RESTART_EXIT = 75


RESTART_ALL = FollowerPolicy(restart_on_change=True)


class RestartOnChange(PeerObserver):
    """restart-all: the follower says Exit at the first generation change after this process was active; end the
    process at once with RESTART_EXIT (its agent restarts it), as torchrun's workers do."""

    def before(self, peer: Peer, action: Action) -> None:
        if isinstance(action, Exit) and peer._backend is not None:
            peer._trace.record("restart_all", generation=peer._backend.generation, revision=peer.state.revision)
            peer._trace.close()
            os._exit(RESTART_EXIT)


def initial_tensors() -> dict[str, np.ndarray]:
    w = np.random.default_rng(1).standard_normal((OUT, IN), dtype=np.float32) * 0.01
    return {"w": w, "m": np.zeros_like(w)}


def target_weights() -> np.ndarray:
    return np.random.default_rng(2).standard_normal((OUT, IN), dtype=np.float32) * 0.05


def shard_gradient(w: np.ndarray, w_true: np.ndarray, revision: int, rank: int, world: int) -> np.ndarray:
    """The gradient of rank's shard of revision's global batch, divided by the global batch size."""
    x = np.random.default_rng(revision).standard_normal((GLOBAL_BATCH, IN), dtype=np.float32)
    lo, hi = rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world
    xs = x[lo:hi]
    err = xs @ w.T - xs @ w_true.T
    return (err.T @ xs) / np.float32(GLOBAL_BATCH)


def apply_update(state: p2pgen.SharedState, grad: np.ndarray) -> None:
    m, w = state.tensors["m"], state.tensors["w"]
    m *= MOMENTUM
    m += grad
    w -= LR * m


def save_checkpoint(path: Path, state: p2pgen.SharedState) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp.npz")
    np.savez(tmp, w=state.tensors["w"], m=state.tensors["m"], revision=state.revision)
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> p2pgen.SharedState | None:
    if not path.exists():
        return None
    with np.load(path) as z:
        return p2pgen.SharedState(tensors={"w": z["w"].copy(), "m": z["m"].copy()}, revision=int(z["revision"]))


def join(policy: str, state: p2pgen.SharedState, trace_dir: Path) -> Peer:
    env = os.environ
    if policy == "p2pgen":       # a warm standby learns its incarnation inside join(): name the trace there
        env["P2PGEN_TRACE_DIR"] = str(trace_dir)
        return p2pgen.join(state=state)
    trace = str(trace_dir / f"{env['P2PGEN_PEER_ID'].replace('/', '_')}-{env['P2PGEN_INCARNATION']}.jsonl")
    return Peer(env["P2PGEN_JOB"], state, env["P2PGEN_AGENT"], env["P2PGEN_PEER_ID"], int(env["P2PGEN_INCARNATION"]),
                load_secret(env.get("P2PGEN_SECRET_FILE"), env["P2PGEN_JOB"]), env["P2PGEN_DATA_ADDR"],
                env["P2PGEN_STATE_ADDR"], trace_path=trace, policy=RESTART_ALL, observer=RestartOnChange())


def train(peer: Peer, state: p2pgen.SharedState, args: argparse.Namespace) -> None:
    w_true, generation = target_weights(), None
    for step in peer.steps():
        if step.generation != generation:
            generation = step.generation
            peer._trace.record("certificate", generation=generation, world=step.world,
                              activated_at=peer.certificate.activated_at if peer.certificate else None)
        with step:
            time.sleep(args.step_delay)
            grad = shard_gradient(state.tensors["w"], w_true, step.revision, step.rank, step.world)
            step.all_reduce(grad, op="sum")
            apply_update(state, grad)
            step.commit()
        if step.committed and args.policy == "restart-all" and step.rank == 0 \
                and state.revision % args.checkpoint_every == 0:
            save_checkpoint(args.checkpoint, state)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", choices=("p2pgen", "restart-all"), required=True)
    parser.add_argument("--trace-dir", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True, help="restart-all: the checkpoint file")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="restart-all: commits between checkpoints")
    parser.add_argument("--step-delay", type=float, default=0.02, help="seconds of pretend compute per step")
    args = parser.parse_args()
    loaded = load_checkpoint(args.checkpoint) if args.policy == "restart-all" else None
    state = loaded or p2pgen.SharedState(tensors=initial_tensors())
    peer = join(args.policy, state, args.trace_dir)
    peer._trace.record("start", policy=args.policy, revision=state.revision)
    train(peer, state, args)


if __name__ == "__main__":
    main()

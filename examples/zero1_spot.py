"""ZeRO-1 on spot instances: AdamW whose optimizer state is sharded (r = 2) and survives peers dying and joining.

Run it under agents, which restart a killed process as a new incarnation:

    p2pgen join --local 4 --chaos 3 --steps 300 -- python examples/zero1_spot.py
    python examples/zero1_spot.py --reference --steps 300 --compare $P2PGEN_SUMMARY_DIR

The parameters of a small MLP are one flat float64 vector, replicated on every member (in the SharedState).
The AdamW moments (`exp_avg`, `exp_avg_sq`) are two sharded objects of the same length, cut into SHARDS
shards each owned by r = 2 members: each member holds about r / world of them. p2pgen chooses the owners at
every membership change, copies the shards that change owner from a surviving owner before the generation
activates, and refuses to resume (or resumes from a checkpoint, loudly) when every owner of a shard died.

A step: each member computes the gradient of its slice of the global batch (deterministic from the
revision, independent of the world size); the gradients are all-reduced (SUM); each member applies AdamW to
the slices it owns; the first owner of each shard writes its new parameter slice into a zero vector and an
all-reduce (SUM) gives every member the whole new parameter vector (x + 0 is exact). The final parameters
equal those of `--reference` (one process, unsharded AdamW) up to the rounding of the gradient sums, whose
order depends on the world size.

For tests and harnesses, `$P2PGEN_FINISH_FILE` (if set) holds the last step until that file exists, so that a
scripted fault near the end is not cut off by members that finished and left with their shards, and
`$P2PGEN_CRASH_FILE` (if set) makes the peers it names crash once at a step boundary.

At the end every peer prints one JSON line (`summary`: revision, optimizer bytes held, final parameters'
digest) and writes it to $P2PGEN_SUMMARY_DIR if set.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import signal
import time

import numpy as np
import torch

import p2pgen

GLOBAL_BATCH = 64
IN, HIDDEN, OUT = 16, 32, 4
SHARDS = 8
SHAPES = {"w1": (HIDDEN, IN), "b1": (HIDDEN,), "w2": (OUT, HIDDEN), "b2": (OUT,)}
N_PARAMS = sum(math.prod(s) for s in SHAPES.values())


def initial_params(seed: int) -> np.ndarray:
    g = torch.Generator().manual_seed(seed)
    parts = [torch.randn(*s, generator=g, dtype=torch.float64) * 0.3 if k.startswith("w")
             else torch.zeros(*s, dtype=torch.float64) for k, s in SHAPES.items()]
    return torch.cat([p.reshape(-1) for p in parts]).numpy()


def batch(seed: int, revision: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [rank*B/world, (rank+1)*B/world) of revision's global batch (B = GLOBAL_BATCH)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + revision)
    x = torch.randn(GLOBAL_BATCH, IN, generator=g, dtype=torch.float64)
    target = torch.sin(x[:, :OUT] * 2.0) + 0.1 * x[:, OUT:2 * OUT]
    lo, hi = rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world
    return x[lo:hi], target[lo:hi]


def gradient(flat: np.ndarray, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """Gradient of sum-of-squares / GLOBAL_BATCH over these rows, flat, with the loss appended."""
    p = torch.from_numpy(flat.copy()).requires_grad_(True)
    views, offset = {}, 0
    for k, s in SHAPES.items():
        views[k] = p[offset:offset + math.prod(s)].view(*s)
        offset += math.prod(s)
    pred = torch.tanh(x @ views["w1"].T + views["b1"]) @ views["w2"].T + views["b2"]
    loss = ((pred - y) ** 2).sum() / GLOBAL_BATCH
    (g,) = torch.autograd.grad(loss, [p])
    return np.concatenate([g.numpy(), [loss.item()]])


def adamw(p: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, t: int, lr: float,
          betas=(0.9, 0.999), eps=1e-8, wd=0.01) -> None:
    """torch.optim.AdamW's update, elementwise, in place on these slices (t: the step number, from 1)."""
    p *= 1 - lr * wd
    m *= betas[0]
    m += (1 - betas[0]) * g
    v *= betas[1]
    v += (1 - betas[1]) * g * g
    denom = np.sqrt(v / (1 - betas[1] ** t)) + eps
    p -= (lr / (1 - betas[0] ** t)) * m / denom


def first_owned(peer: p2pgen.Peer, object_id: str) -> set[int]:
    me = f"{peer.peer_id}#{peer.incarnation}"
    return {shard for obj, shard, owners in peer.certificate.ownership if obj == object_id and owners[0] == me}


def crash_if_told(peer: p2pgen.Peer) -> None:
    """Fault injection for tests: when the file `$P2PGEN_CRASH_FILE` names this peer (comma-separated peer ids),
    the process SIGKILLs itself once, at a step boundary (as an application crash between steps would)."""
    path = os.environ.get("P2PGEN_CRASH_FILE")
    if not path or not os.path.exists(path):
        return
    marker = f"{path}.{peer.peer_id}.done"
    with open(path) as f:
        named = f.read().split(",")
    if peer.peer_id in named and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


def train(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    state = p2pgen.SharedState(tensors={"params": initial_params(args.seed)}, objects={"seed": args.seed})
    exp_avg = state.shard("exp_avg", N_PARAMS, SHARDS, "float64", r=args.r)
    exp_avg_sq = state.shard("exp_avg_sq", N_PARAMS, SHARDS, "float64", r=args.r)
    peer = p2pgen.join(state=state)
    started, last_loss, held = time.monotonic(), float("nan"), []
    finish_file = os.environ.get("P2PGEN_FINISH_FILE")
    for step in peer.steps():
        if state.revision >= args.steps:
            break
        crash_if_told(peer)
        if finish_file and state.revision == args.steps - 1 and not os.path.exists(finish_file):
            with step:                            # harnesses: hold the last step until they say the run may end
                step.barrier()
                time.sleep(0.05)
            continue
        with step:
            params = state.tensors["params"]
            x, y = batch(args.seed, step.revision, step.rank, step.world)
            flat = gradient(params, x, y)
            time.sleep(args.step_delay)
            step.all_reduce(flat, op="sum")
            new_params, updates = np.zeros(N_PARAMS), {}
            for i in exp_avg.owned():
                a, b = exp_avg.bounds(i)
                p, m, v = params[a:b].copy(), exp_avg.held[i].copy(), exp_avg_sq.held[i].copy()
                adamw(p, flat[a:b], m, v, step.revision + 1, args.lr)
                updates[i] = (m, v)
                if i in first_owned(peer, "exp_avg"):
                    new_params[a:b] = p
            step.all_reduce(new_params, op="sum")
            for i, (m, v) in updates.items():      # the state changes only after the step's last collective
                np.copyto(exp_avg.held[i], m)
                np.copyto(exp_avg_sq.held[i], v)
            np.copyto(params, new_params)
            last_loss = float(flat[-1])
            step.commit()
        if step.committed:
            held.append(exp_avg.nbytes_held + exp_avg_sq.nbytes_held)
            if step.revision % 50 == 0:
                print(f"{peer.peer_id}#{peer.incarnation} revision {state.revision} world {step.world} loss "
                      f"{last_loss:.5f} optimizer state held {held[-1]} of {2 * N_PARAMS * 8} bytes", flush=True)
    summary = {"peer": peer.peer_id, "incarnation": peer.incarnation, "revision": state.revision,
               "digest": state.digest(), "loss": last_loss, "seconds": round(time.monotonic() - started, 3),
               "optimizer_bytes_total": 2 * N_PARAMS * 8, "optimizer_bytes_held": held[-1] if held else 0,
               "optimizer_bytes_held_max": max(held, default=0), "world": peer.world,
               "params": state.tensors["params"].tolist(), **peer.stats}
    print("summary " + json.dumps({k: v for k, v in summary.items() if k != "params"}), flush=True)
    if os.environ.get("P2PGEN_SUMMARY_DIR"):
        path = os.path.join(os.environ["P2PGEN_SUMMARY_DIR"], f"{peer.peer_id}-{peer.incarnation}.json")
        with open(path, "w") as f:
            json.dump(summary, f)
    peer.close()


def reference(args: argparse.Namespace) -> np.ndarray:
    """The same training in one process with unsharded AdamW."""
    params, m, v = initial_params(args.seed), np.zeros(N_PARAMS), np.zeros(N_PARAMS)
    for r in range(args.steps):
        x, y = batch(args.seed, r, 0, 1)
        flat = gradient(params, x, y)
        adamw(params, flat[:-1], m, v, r + 1, args.lr)
    return params


def compare(args: argparse.Namespace) -> None:
    ref = reference(args)
    rows = []
    for path in sorted(glob.glob(os.path.join(args.compare, "*.json"))):
        s = json.load(open(path))
        if "params" not in s:
            continue
        diff = float(np.max(np.abs(np.asarray(s["params"]) - ref)))
        rows.append((s["peer"], s["incarnation"], s["revision"], s["world"], s["optimizer_bytes_held"],
                     s["optimizer_bytes_total"], diff))
    print(f"{'peer':<8}{'revision':>9}{'world':>6}{'optimizer bytes held':>22}{'of total':>9}{'max |p - ref|':>15}")
    for peer, inc, rev, world, held, total, diff in rows:
        print(f"{peer + '#' + str(inc):<8}{rev:>9}{world:>6}{held:>22}{held / total:>9.2f}{diff:>15.2e}")
    if not rows:
        raise SystemExit(f"no summaries in {args.compare}")
    if any(r[2] != args.steps for r in rows):
        raise SystemExit("a member did not reach --steps")
    worst = max(r[-1] for r in rows)
    print(f"largest difference from the unsharded single-process reference: {worst:.2e}")
    if worst > args.tolerance:
        raise SystemExit(f"differs from the reference by more than {args.tolerance}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=int(os.environ.get("P2PGEN_STEPS", 200)))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--r", type=int, default=2, help="replication factor of the optimizer state")
    parser.add_argument("--step-delay", type=float, default=float(os.environ.get("P2PGEN_STEP_DELAY", 0.01)),
                        help="seconds of pretend compute per step (so that faults land mid-training)")
    parser.add_argument("--reference", action="store_true", help="run the unsharded single-process reference")
    parser.add_argument("--compare", metavar="DIR", help="with --reference: compare the summaries in DIR to it")
    parser.add_argument("--tolerance", type=float, default=1e-9)
    args = parser.parse_args()
    if args.reference:
        if args.compare:
            compare(args)
        else:
            print(json.dumps({"params_digest": float(np.sum(reference(args)))}))
        return
    train(args)


if __name__ == "__main__":
    main()

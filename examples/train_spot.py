"""Tolerant training on spot instances: a small torch model that keeps training while peers die and join.

Run it under agents, which restart a killed process as a new incarnation:

    p2pgen join --local 4 --chaos 10 --steps 200 -- python examples/train_spot.py

Each peer trains an MLP on synthetic, deterministic data (revision r's global batch is generated from
(seed, r) and split into `world` contiguous shards, so a step's global batch does not depend on the world
size). Gradients are sums of per-sample losses divided by the *global* batch size and all-reduced with
SUM. SGD with momentum is written out by hand so that every piece of optimizer state is in the
SharedState. A killed peer's replacement pulls the state from the others before it trains again.

At the end every peer writes one JSON summary to $P2PGEN_SUMMARY_DIR if set (`join --local` prints them as
one table), or else prints it as one line (`summary {...}`): generations seen, steps committed and discarded,
seconds spent between generations, final digest.
Under `p2pgen stress` and `join --local --chaos` its Peer reports every committed step and ends `steps()`
at the revision the harness asks for (nothing in this script: `p2pgen.progress`, a no-op elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

import p2pgen

GLOBAL_BATCH = 64
IN, HIDDEN, OUT = 16, 32, 4


def build_state(seed: int) -> p2pgen.SharedState:
    g = torch.Generator().manual_seed(seed)
    params = {
        "w1": torch.randn(HIDDEN, IN, generator=g) * 0.3, "b1": torch.zeros(HIDDEN),
        "w2": torch.randn(OUT, HIDDEN, generator=g) * 0.3, "b2": torch.zeros(OUT),
    }
    momentum = {f"m_{k}": torch.zeros_like(v) for k, v in params.items()}
    return p2pgen.SharedState(tensors={**params, **momentum}, objects={"seed": seed})


def shard(seed: int, revision: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [rank*B/world, (rank+1)*B/world) of revision's global batch (B = GLOBAL_BATCH)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + revision)
    x = torch.randn(GLOBAL_BATCH, IN, generator=g)
    target = torch.sin(x[:, :OUT] * 2.0) + 0.1 * x[:, OUT:2 * OUT]
    lo, hi = rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world
    return x[lo:hi], target[lo:hi]


def local_gradients(state: p2pgen.SharedState, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, float]:
    t = state.tensors
    params = [t[k].detach().requires_grad_(True) for k in ("w1", "b1", "w2", "b2")]
    w1, b1, w2, b2 = params
    pred = torch.tanh(x @ w1.T + b1) @ w2.T + b2
    loss = ((pred - y) ** 2).sum() / GLOBAL_BATCH
    grads = torch.autograd.grad(loss, params)
    return torch.cat([gr.reshape(-1) for gr in grads] + [loss.detach().reshape(1)]), float(loss.detach())


def apply_update(state: p2pgen.SharedState, flat: torch.Tensor, lr: float, momentum: float) -> None:
    offset = 0
    with torch.no_grad():
        for name in ("w1", "b1", "w2", "b2"):
            p, m = state.tensors[name], state.tensors[f"m_{name}"]
            g = flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
            m.mul_(momentum).add_(g)
            p.add_(m, alpha=-lr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=int(os.environ.get("P2PGEN_STEPS", 200)))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--step-delay", type=float, default=float(os.environ.get("P2PGEN_STEP_DELAY", 0.01)),
                        help="seconds of pretend compute per step (so that faults land mid-training)")
    args = parser.parse_args()
    torch.set_num_threads(1)

    state = build_state(args.seed)
    peer = p2pgen.join(state=state)
    started, last_loss = time.monotonic(), float("nan")
    for step in peer.steps():
        if state.revision >= args.steps:
            break
        with step:
            x, y = shard(args.seed, step.revision, step.rank, step.world)
            flat, _ = local_gradients(state, x, y)
            time.sleep(args.step_delay)
            step.all_reduce(flat, op="sum")
            last_loss = float(flat[-1])
            apply_update(state, flat[:-1], args.lr, args.momentum)
            step.commit()
    summary = {"peer": peer.peer_id, "incarnation": peer.incarnation, "revision": state.revision,
               "digest": state.digest(), "loss": last_loss, "seconds": round(time.monotonic() - started, 3),
               **peer.stats}
    if os.environ.get("P2PGEN_SUMMARY_DIR"):      # `join --local` collects them into one table
        path = os.path.join(os.environ["P2PGEN_SUMMARY_DIR"], f"{peer.peer_id}-{peer.incarnation}.json")
        with open(path, "w") as f:
            json.dump(summary, f)
    else:
        print("summary " + json.dumps(summary), flush=True)
    peer.close()


if __name__ == "__main__":
    main()

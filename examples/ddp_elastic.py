"""DDP on p2pgen: a torch model in DistributedDataParallel that keeps training while peers die and join.

Run it under agents, which restart a killed process as a new incarnation:

    p2pgen join --local 3 --chaos 2 --steps 200 -- python examples/ddp_elastic.py

p2pgen is the torch.distributed backend, set up with torch's own idiom: after `p2pgen.join(...)`,
`dist.init_process_group("p2pgen")` needs no other argument (the agent's environment says everything), and
`dist.get_rank()`/`get_world_size()` follow the generation. `p2pgen.torch.DistributedDataParallel` all-reduces
the gradient buckets in the current generation; the training loop is wrapped in `peer.steps()`.
Each step runs inside `with step, p2pgen.torch.unwrap_errors():`: a peer dying in the middle of the
bucket all-reduce makes backward raise, the step is discarded (the optimizer did not run) and the loop
retries it in the next generation. A joiner (or a restarted peer) pulls the parameters and the
optimizer's momentum from the others, which the SharedState holds by reference.

The global batch of revision r is generated from (seed, r) and split into `world` contiguous shards; the
loss is a sum of per-sample terms divided by the *global* batch size, and DDP SUMs the gradients, so a
step's update does not depend on the world size: `reference(steps, seed)` computes the same training in
one process (tests compare against it).

At the end every peer prints one JSON line (`summary`) and writes it to $P2PGEN_SUMMARY_DIR if set: its
parameters, digest, the worlds it trained in, and the peer's statistics. Test hooks (environment):
DDP_FAULTS="peer:before_backward:REV,..." makes that peer SIGKILL itself once at that point (marker
files in DDP_MARKERS); DDP_HOLD="REV:WORLD" makes the members wait at revision REV, committing
nothing, until the generation has WORLD members (so that a joiner takes part before the run ends).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import torch
import torch.distributed as dist

import p2pgen
import p2pgen.torch

GLOBAL_BATCH = 48
IN, HIDDEN, OUT = 8, 16, 3


def build_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT)).double()


def build_optimizer(model: torch.nn.Module, lr: float, momentum: float) -> torch.optim.SGD:
    """SGD whose momentum buffers exist from the start (zeros: the same first update as a fresh SGD), so
    the SharedState can hold them and a joiner pulls them."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    for p in model.parameters():
        optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p)
    return optimizer


def shared_state(model: torch.nn.Module, optimizer: torch.optim.SGD, seed: int) -> p2pgen.SharedState:
    """The parameters and momentum buffers, by reference (a pull writes them in place)."""
    tensors = {}
    for name, p in model.named_parameters():
        tensors[name] = p.detach()
        tensors[f"momentum.{name}"] = optimizer.state[p]["momentum_buffer"]
    return p2pgen.SharedState(tensors=tensors, objects={"seed": seed})


def shard(seed: int, revision: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [rank*B/world, (rank+1)*B/world) of revision's global batch (B = GLOBAL_BATCH)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + revision)
    x = torch.randn(GLOBAL_BATCH, IN, generator=g, dtype=torch.float64)
    y = torch.sin(x[:, :OUT] * 2.0) + 0.1 * x[:, OUT:2 * OUT]
    lo, hi = rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world
    return x[lo:hi], y[lo:hi]


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((model(x) - y) ** 2).sum() / GLOBAL_BATCH


def reference(steps: int, seed: int, lr: float, momentum: float) -> dict[str, torch.Tensor]:
    """The same training in one process, each step on the whole global batch."""
    model = build_model(seed)
    optimizer = build_optimizer(model, lr, momentum)
    for revision in range(steps):
        optimizer.zero_grad()
        loss_of(model, *shard(seed, revision, 0, 1)).backward()
        optimizer.step()
    return {name: p.detach() for name, p in model.named_parameters()}


def maybe_fault(peer: str, point: str, revision: int) -> None:
    for spec in filter(None, os.environ.get("DDP_FAULTS", "").split(",")):
        who, where, when = spec.split(":")
        marker = os.path.join(os.environ["DDP_MARKERS"], spec.replace(":", "_"))
        if (who, where, int(when)) == (peer, point, revision) and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


def holding(step: p2pgen.Step) -> bool:
    """True while DDP_HOLD says to wait at this revision for more members (see the module docstring)."""
    hold = os.environ.get("DDP_HOLD")
    if not hold:
        return False
    revision, world = map(int, hold.split(":"))
    return step.revision == revision and step.world < world


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=int(os.environ.get("P2PGEN_STEPS", 100)))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--step-delay", type=float, default=float(os.environ.get("P2PGEN_STEP_DELAY", 0.02)),
                        help="seconds of pretend compute per step (so that faults land mid-training)")
    args = parser.parse_args()
    torch.set_num_threads(1)

    module = build_model(args.seed)
    optimizer = build_optimizer(module, args.lr, args.momentum)
    state = shared_state(module, optimizer, args.seed)
    peer = p2pgen.join(state=state)
    dist.init_process_group("p2pgen")
    model = p2pgen.torch.DistributedDataParallel(module)
    worlds: set[int] = set()
    for step in peer.steps():
        if state.revision >= args.steps:
            break
        if holding(step):
            with step:
                step.barrier()           # agrees on the step boundary, so a pending join is admitted
            time.sleep(0.1)
            continue
        with step, p2pgen.torch.unwrap_errors():
            optimizer.zero_grad()
            loss = loss_of(model, *shard(args.seed, step.revision, step.rank, step.world))
            time.sleep(args.step_delay)
            maybe_fault(peer.peer_id, "before_backward", step.revision)
            loss.backward()              # DDP's bucket all-reduces run here, in this step's generation
            optimizer.step()
            step.commit()
            worlds.add(step.world)
    summary = {"peer": peer.peer_id, "incarnation": peer.incarnation, "revision": state.revision,
               "digest": state.digest(), "worlds": sorted(worlds),
               "params": {name: p.detach().reshape(-1).tolist() for name, p in module.named_parameters()},
               **peer.stats}
    print("summary " + json.dumps({k: v for k, v in summary.items() if k != "params"}), flush=True)
    if os.environ.get("P2PGEN_SUMMARY_DIR"):
        path = os.path.join(os.environ["P2PGEN_SUMMARY_DIR"], f"{peer.peer_id}-{peer.incarnation}.json")
        with open(path, "w") as f:
            json.dump(summary, f)
    dist.destroy_process_group()
    peer.close()


if __name__ == "__main__":
    main()

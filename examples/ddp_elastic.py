"""DDP on p2pgen: an ordinary torch DDP script whose training loop is wrapped in `peer.steps()`.

Run it under agents, which restart a killed process as a new incarnation:

    p2pgen join --local 3 --chaos 20 --steps 100 -- python examples/ddp_elastic.py

It is torch's idiom: `dist.init_process_group("p2pgen")` (no other argument: the agent's environment says
everything, and the backend joins the job), torch's own `DistributedDataParallel(model)`, a mean loss over
the local batch. What p2pgen adds is the loop: `peer = p2pgen.torch.peer(model, optimizer)` (the job's Peer;
a joiner or restarted process pulls the model and optimizer state from the others, so DDP's construction
broadcast has nothing to do: before its first step a process is a world of one), then
`for step in peer.steps(): with step: ... step.commit()`. `dist.get_rank()`/`get_world_size()` follow the
generation. A peer dying in the middle of DDP's bucket all-reduce makes backward raise; `with step:` sees
the generation change behind torch's RuntimeError, the step is discarded (the optimizer did not run) and
the loop retries it in the next generation.

The global batch of revision r is generated from (seed, r) and split into `world` contiguous shards of
equal size (GLOBAL_BATCH divides evenly for 1-6, 8, 10 and 12 members); each member's loss is the mean over
its shard and DDP averages the gradients, so a step's update is the global batch's mean gradient whatever
the world size: `reference(steps, seed)` computes the same training in one process (tests compare against it).

At the end every peer prints one JSON line (`summary`) and writes it to $P2PGEN_SUMMARY_DIR if set: its
parameters, digest, the worlds it trained in, and the peer's statistics. Test hooks (environment, see
`fault_hooks`): DDP_FAULTS="peer:before_backward:REV,..." makes that peer SIGKILL itself once at that point
(marker files in DDP_MARKERS); DDP_HOLD="REV:WORLD" makes the members wait at revision REV, committing
nothing, until the generation has WORLD members (so that a joiner takes part before the run ends).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import p2pgen
import p2pgen.torch

GLOBAL_BATCH = 240
IN, HIDDEN, OUT = 8, 16, 3


def build_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT)).double()


def shard(seed: int, revision: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [rank*B/world, (rank+1)*B/world) of revision's global batch (B = GLOBAL_BATCH)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + revision)
    x = torch.randn(GLOBAL_BATCH, IN, generator=g, dtype=torch.float64)
    y = torch.sin(x[:, :OUT] * 2.0) + 0.1 * x[:, OUT:2 * OUT]
    lo, hi = rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world
    return x[lo:hi], y[lo:hi]


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((model(x) - y) ** 2).sum(dim=1).mean()


def reference(steps: int, seed: int, lr: float, momentum: float) -> dict[str, torch.Tensor]:
    """The same training in one process, each step on the whole global batch."""
    model = build_model(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    for revision in range(steps):
        optimizer.zero_grad()
        loss_of(model, *shard(seed, revision, 0, 1)).backward()
        optimizer.step()
    return {name: p.detach() for name, p in model.named_parameters()}


def fault_hooks(peer_id: str) -> tuple[Callable[[int], None], Callable[[p2pgen.Step], bool]]:
    """(fault, holding): what DDP_FAULTS and DDP_HOLD ask for (see the module docstring); no-ops if unset."""
    faults = [spec.split(":") for spec in filter(None, os.environ.get("DDP_FAULTS", "").split(","))]
    hold = tuple(map(int, os.environ["DDP_HOLD"].split(":"))) if os.environ.get("DDP_HOLD") else None

    def fault(revision: int) -> None:
        for who, where, when in faults:
            marker = os.path.join(os.environ["DDP_MARKERS"], f"{who}_{where}_{when}")
            if (who, where, int(when)) == (peer_id, "before_backward", revision) and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)

    def holding(step: p2pgen.Step) -> bool:
        return hold is not None and step.revision == hold[0] and step.world < hold[1]

    return fault, holding


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

    dist.init_process_group("p2pgen")
    model = DistributedDataParallel(build_model(args.seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    peer = p2pgen.torch.peer(model, optimizer)
    fault, holding = fault_hooks(peer.peer_id)
    worlds: set[int] = set()
    for step in peer.steps():
        if step.revision >= args.steps:
            break
        if holding(step):
            with step:
                step.barrier()           # agrees on the step boundary, so a pending join is admitted
            time.sleep(0.1)
            continue
        with step:
            optimizer.zero_grad()
            x, y = shard(args.seed, step.revision, dist.get_rank(), dist.get_world_size())
            loss = loss_of(model, x, y)
            time.sleep(args.step_delay)
            fault(step.revision)
            loss.backward()              # DDP's bucket all-reduces run here, in this step's generation
            optimizer.step()
            step.commit()
            worlds.add(dist.get_world_size())
    summary = {"peer": peer.peer_id, "incarnation": peer.incarnation, "revision": peer.state.revision,
               "digest": peer.state.digest(), "worlds": sorted(worlds),
               "params": {name: p.detach().reshape(-1).tolist() for name, p in model.module.named_parameters()},
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

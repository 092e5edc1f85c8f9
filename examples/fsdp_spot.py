"""FSDP2 on p2pgen, exact and elastic: a small transformer sharded with `fully_shard` keeps training while peers
die and join, and ends with the parameters of a single-process float64 run over the same committed steps.

Run it under agents, which restart a killed process as a new incarnation:

    p2pgen join --local 4 --chaos 6 --steps 40 -- python examples/fsdp_spot.py --check-reference

How it stays exact across world changes. FSDP2 needs a fixed world, so each generation gets its own torch
group and mesh (`p2pgen.torch.generation_mesh()`) and sharding: the model is sharded on the generation's mesh
from the *replicas* every member keeps (full parameters and SGD momentum buffers, in the SharedState, so a
joiner or a restarted peer pulls them like any p2pgen state), trained for one step (FSDP2's all-gathers and
its reduce-scatter, a SUM over the members, run in the step's generation), and the step's new parameters and
momentum are all-gathered back into the replicas before `commit()` (all of them gathered first, then copied,
so a step that fails leaves the replicas as they were). When a generation changes inside a step, the
generation group's collectives raise GenerationChanged (PeerLost when a member vanished first): the step is
discarded, the sharded model is dropped, and the retried step re-shards from the replicas on the new mesh.
The global batch of revision r is generated from (seed, r) and split into `world` contiguous shards, and the
loss is a sum of per-token terms over the *global* batch, so a step means the same thing at any world size;
`reference(steps, seed, lr, momentum)` is the same training in one process.

DCP (torch.distributed.checkpoint): `--checkpoint DIR --save-at R` saves FSDP2's sharded state dict (model
and optimizer, as DTensors) over the generation group at the start of step R; `--resume DIR` starts a job
from such a checkpoint: each member loads it, unsharded, into its replicas and starts at revision R.

At the end every peer prints one JSON line (`summary`) and writes it to $P2PGEN_SUMMARY_DIR if set: its
parameters, digest, the worlds it trained in, the errors that discarded its steps, and the peer's statistics
(with `--check-reference`, also the largest difference from the single-process reference's parameters).
Test hooks (environment): FSDP_FAULTS="peer:before_backward:REV,..." makes that peer SIGKILL itself once at
that point (marker files in FSDP_MARKERS); FSDP_HOLD="REV:WORLD" makes the members wait at revision REV,
committing nothing, until the generation has WORLD members.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import distribute_tensor

import p2pgen
import p2pgen.torch

# FSDP2 warns that the root's output is a view (nn.Linear on a 3-D input returns one); nothing here
# modifies it in place, which is what the warning is about.
warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")

VOCAB, DIM, HEADS, FF, LAYERS, SEQ = 16, 16, 2, 32, 2, 6
GLOBAL_BATCH = 12


class TinyTransformer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(DIM, HEADS, FF, dropout=0.0, batch_first=True) for _ in range(LAYERS))
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def build_model(seed: int) -> TinyTransformer:
    torch.manual_seed(seed)
    return TinyTransformer().double()


def replicas(seed: int) -> dict[str, torch.Tensor]:
    """The state every member keeps in full: `param.NAME` and `momentum.NAME` (zeros: a fresh SGD's first
    update is the same as with zero momentum buffers)."""
    out = {}
    for name, p in build_model(seed).named_parameters():
        out[f"param.{name}"] = p.detach().clone()
        out[f"momentum.{name}"] = torch.zeros_like(p.detach())
    return out


def batch(seed: int, revision: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [rank*B/world, (rank+1)*B/world) of revision r's global batch (B = GLOBAL_BATCH sequences)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + revision)
    x = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ), generator=g)
    y = (x * 3 + torch.roll(x, 1, dims=1)) % VOCAB
    lo, hi = rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world
    return x[lo:hi], y[lo:hi]


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1), reduction="sum") / (GLOBAL_BATCH * SEQ)


def new_sgd(params, lr: float, momentum: float) -> torch.optim.SGD:
    return torch.optim.SGD(params, lr=lr, momentum=momentum)


def reference(steps: int, seed: int, lr: float, momentum: float) -> dict[str, torch.Tensor]:
    """The same training in one process, each step on the whole global batch."""
    model = build_model(seed)
    optimizer = new_sgd(model.parameters(), lr, momentum)
    for p in model.parameters():
        optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p.detach())
    for revision in range(steps):
        optimizer.zero_grad()
        loss_of(model, *batch(seed, revision, 0, 1)).backward()
        optimizer.step()
    return {name: p.detach() for name, p in model.named_parameters()}


class Sharded:
    """One generation's FSDP2 model and optimizer, built from the replicas on that generation's mesh."""

    def __init__(self, state: p2pgen.SharedState, seed: int, lr: float, momentum: float) -> None:
        mesh = p2pgen.torch.generation_mesh("cpu")     # this generation's group, one mesh dimension
        self.group = mesh.get_group()
        self.generation = self.group.generation
        self.model = build_model(seed)
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                p.copy_(state.tensors[f"param.{name}"])
        for layer in self.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        for module in self.model.modules():
            if isinstance(module, torch.distributed.fsdp.FSDPModule):
                module.set_gradient_divide_factor(1.0)            # SUM over the members: see loss_of
        self.optimizer = new_sgd(self.model.parameters(), lr, momentum)
        for name, p in self.model.named_parameters():             # this member's shard of each buffer
            full = state.tensors[f"momentum.{name}"].clone()
            self.optimizer.state[p]["momentum_buffer"] = distribute_tensor(full, mesh, p.placements,
                                                                           src_data_rank=None)

    def train(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        loss_of(self.model, x, y).backward()          # FSDP2's reduce-scatter runs here, in this generation
        self.optimizer.step()

    def gather_into(self, state: p2pgen.SharedState) -> None:
        """The replicas become the full parameters and momentum; all gathered before any is written."""
        full = {}
        for name, p in self.model.named_parameters():
            full[f"param.{name}"] = p.full_tensor()
            full[f"momentum.{name}"] = self.optimizer.state[p]["momentum_buffer"].full_tensor()
        with torch.no_grad():
            for key, value in full.items():
                state.tensors[key].copy_(value)

    def save(self, checkpoint: str, revision: int) -> None:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd, "revision": torch.tensor(revision)},
                 checkpoint_id=checkpoint, process_group=self.group)

    def close(self) -> None:
        dist.destroy_process_group(self.group)


def load_checkpoint(checkpoint: str, seed: int) -> tuple[dict[str, torch.Tensor], int]:
    """(replicas, revision) from a DCP checkpoint of `Sharded.save`, loaded unsharded in this process."""
    tensors = replicas(seed)
    names = [k.removeprefix("param.") for k in tensors if k.startswith("param.")]
    target = {"model": {n: tensors[f"param.{n}"] for n in names},
              "optim": {"state": {n: {"momentum_buffer": tensors[f"momentum.{n}"]} for n in names}},
              "revision": torch.tensor(0)}
    dcp.load(target, checkpoint_id=checkpoint, no_dist=True)
    return tensors, int(target["revision"])


def maybe_fault(peer: str, point: str, revision: int) -> None:
    for spec in filter(None, os.environ.get("FSDP_FAULTS", "").split(",")):
        who, where, when = spec.split(":")
        marker = os.path.join(os.environ["FSDP_MARKERS"], spec.replace(":", "_"))
        if (who, where, int(when)) == (peer, point, revision) and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


def holding(step: p2pgen.Step) -> bool:
    """True while FSDP_HOLD says to wait at this revision for more members (see the module docstring)."""
    hold = os.environ.get("FSDP_HOLD")
    if not hold:
        return False
    revision, world = map(int, hold.split(":"))
    return step.revision == revision and step.world < world


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=int(os.environ.get("P2PGEN_STEPS", 40)))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--step-delay", type=float, default=float(os.environ.get("P2PGEN_STEP_DELAY", 0.05)),
                        help="seconds of pretend compute per step (so that faults land mid-training)")
    parser.add_argument("--checkpoint", help="DCP checkpoint directory (with --save-at)")
    parser.add_argument("--save-at", type=int, help="save a DCP checkpoint at the start of this revision")
    parser.add_argument("--resume", help="start from this DCP checkpoint (its revision and state)")
    parser.add_argument("--check-reference", action="store_true",
                        help="also run the single-process reference and report the largest parameter difference")
    args = parser.parse_args()
    torch.set_num_threads(1)

    tensors, revision = load_checkpoint(args.resume, args.seed) if args.resume else (replicas(args.seed), 0)
    state = p2pgen.SharedState(tensors=tensors, objects={"seed": args.seed}, revision=revision)
    peer = p2pgen.join(state=state)
    dist.init_process_group("p2pgen")               # the agent's environment says everything
    sharded: Sharded | None = None
    worlds: set[int] = set()
    discarded_by: dict[str, int] = {}
    for step in peer.steps():
        if state.revision >= args.steps:
            break
        if holding(step):
            with step:
                step.barrier()                      # agrees on the step boundary, so a pending join is admitted
            time.sleep(0.1)
            continue
        with step, p2pgen.torch.unwrap_errors():
            if sharded is None or sharded.generation != step.generation:
                sharded = _rebuild(sharded, state, args)
            if args.save_at == step.revision and args.checkpoint:
                sharded.save(args.checkpoint, step.revision)
            x, y = batch(args.seed, step.revision, step.rank, step.world)
            time.sleep(args.step_delay)
            maybe_fault(peer.peer_id, "before_backward", step.revision)
            sharded.train(x, y)
            sharded.gather_into(state)
            step.commit()
            worlds.add(step.world)
        if step.discarded is not None:              # the sharded copy may be half-updated: re-shard from replicas
            name = type(step.discarded).__name__
            discarded_by[name] = discarded_by.get(name, 0) + 1
            sharded = _rebuild(sharded, None, args)
    summary = {"peer": peer.peer_id, "incarnation": peer.incarnation, "revision": state.revision,
               "digest": state.digest(), "worlds": sorted(worlds), "discarded_by": discarded_by,
               "params": {k.removeprefix("param."): v.reshape(-1).tolist() for k, v in state.tensors.items()
                          if k.startswith("param.")},
               **peer.stats}
    if args.check_reference:
        expected = reference(state.revision, args.seed, args.lr, args.momentum)
        summary["reference_max_diff"] = max((state.tensors[f"param.{n}"] - w).abs().max().item()
                                            for n, w in expected.items())
    print("summary " + json.dumps({k: v for k, v in summary.items() if k != "params"}), flush=True)
    if os.environ.get("P2PGEN_SUMMARY_DIR"):
        path = os.path.join(os.environ["P2PGEN_SUMMARY_DIR"], f"{peer.peer_id}-{peer.incarnation}.json")
        with open(path, "w") as f:
            json.dump(summary, f)
    dist.destroy_process_group()
    peer.close()


def _rebuild(old: Sharded | None, state: p2pgen.SharedState | None, args: argparse.Namespace) -> Sharded | None:
    """Drop `old` (its generation group too); with a state, shard it anew on the current generation."""
    if old is not None:
        old.close()
    return Sharded(state, args.seed, args.lr, args.momentum) if state is not None else None


if __name__ == "__main__":
    main()

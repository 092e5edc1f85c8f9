"""The workload of `p2pgen bench diloco`: one small model and seeded task, trained four ways.

    python -m p2pgen_lab.bench.apps.diloco_task --mode MODE --log FILE [--sync-every H] [--compress int8]
        [--target-loss L] [--rank R --world W --master HOST:PORT]   (mode ddp)

Task: regress the outputs of a fixed teacher MLP (seed 0) from Gaussian inputs; the student is the same
shape (DIM -> HIDDEN -> HIDDEN -> DIM, float32, 1.18 M parameters, 4.5 MiB), starts from seed 1 on every
member, and trains with AdamW (lr 1e-3) on batches of BATCH samples per member. The samples of a step are a
function of (step, index, rank, world), so every mode sees the same data order. Modes:
- `ddp`: torch DDP on gloo (RANK/WORLD/--master), one all-reduce of the gradients per step;
- `sync`: under a p2pgen agent, one revision per step, the gradient all-reduced (AVG) through the step;
- `diloco`: under a p2pgen agent, `p2pgen.torch.DiLoCo` with `--sync-every H` (outer SGD, lr 0.7,
  momentum 0.9, Nesterov) and optional `--compress`.
Every member evaluates the (global) parameters on a fixed held-out batch at every outer step (every
EVAL_EVERY steps in the synchronous modes): the same number on every member, so they all stop at the same
step once it is at most `--target-loss` (the benchmark stops a run that has not reached it in time). The log
(JSON lines) holds `start`, then `eval` records {t, steps (inner steps per member so far), outer, loss}
and a final `end`.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

DIM, HIDDEN, BATCH, EVAL_BATCH, EVAL_EVERY = 64, 1024, 32, 512, 10
INNER_LR, OUTER_LR, OUTER_MOMENTUM = 1e-3, 0.7, 0.9


def mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN),
                               torch.nn.ReLU(), torch.nn.Linear(HIDDEN, DIM))


TEACHER = None


def teacher() -> torch.nn.Module:
    global TEACHER
    if TEACHER is None:
        TEACHER = mlp(0).requires_grad_(False)
    return TEACHER


def batch(step: int, index: int, rank: int, world: int, size: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples of inner step `index` of `step` for member `rank` of `world` (its shard of world x size)."""
    g = torch.Generator().manual_seed(((step * 1009 + index) * 64 + world) * 64 + rank + 1)
    x = torch.randn(size, DIM, generator=g)
    with torch.no_grad():
        return x, teacher()(x)


def eval_loss(model: torch.nn.Module) -> float:
    x, y = batch(-1, 0, 0, 1, EVAL_BATCH)
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), y))


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(x), y)


class Log:
    def __init__(self, path: str) -> None:
        self.file = open(path, "a", buffering=1)
        self.started = False

    def write(self, event: str, **fields) -> None:
        self.file.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")


def run_ddp(args: argparse.Namespace, log: Log) -> None:
    import torch.distributed as dist

    host, port = args.master.rsplit(":", 1)
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=args.rank, world_size=args.world)
    model = torch.nn.parallel.DistributedDataParallel(mlp(1))
    opt = torch.optim.AdamW(model.parameters(), lr=INNER_LR)
    _prime(model, opt)                     # the same optimizer history as the synchronous p2pgen mode
    log.write("start")
    step = 0
    while True:
        x, y = batch(step, 0, args.rank, args.world)
        loss_of(model, x, y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % EVAL_EVERY == 0 and _done(log, model.module, step, step, args):
            break
    dist.destroy_process_group()


def _started(log: Log, step) -> None:
    """Log "start" at the first step of this process in the job's first generation: every member is there
    (the agents wait for --min-members), as DDP's init_process_group and torchft's wait for every replica."""
    if step.revision == 0 and not log.started:
        log.write("start")
    log.started = True


def _done(log: Log, model: torch.nn.Module, steps: int, outer: int, args: argparse.Namespace) -> bool:
    loss = eval_loss(model)
    log.write("eval", steps=steps, outer=outer, loss=loss)
    return loss <= args.target_loss


def run_sync(args: argparse.Namespace, log: Log) -> None:
    import p2pgen
    import p2pgen.torch  # noqa: F401 - shared_tensors

    model = mlp(1)
    opt = torch.optim.AdamW(model.parameters(), lr=INNER_LR)
    _prime(model, opt)
    state = p2pgen.SharedState(tensors=p2pgen.torch.shared_tensors(model, opt))
    peer = p2pgen.join(state=state)
    params = [p for p in model.parameters()]
    stop = False
    for step in peer.steps():
        _started(log, step)
        if stop:
            break
        with step:
            x, y = batch(step.revision, 0, step.rank, step.world)
            loss_of(model, x, y).backward()
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            step.all_reduce(flat, op="avg")
            _unflatten(flat, params)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step.commit()
        revision = peer.state.revision
        if revision % EVAL_EVERY == 0:
            stop = _done(log, model, revision, revision, args)
    peer.close()


def _prime(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """AdamW holds state only after a step: take one with zero gradients (no change) on every member."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    lr = [g["lr"] for g in opt.param_groups]
    for g in opt.param_groups:
        g["lr"], g["weight_decay_saved"] = 0.0, g["weight_decay"]
        g["weight_decay"] = 0.0
    opt.step()
    for g, value in zip(opt.param_groups, lr):
        g["lr"], g["weight_decay"] = value, g.pop("weight_decay_saved")
    opt.zero_grad(set_to_none=True)


def _unflatten(flat: torch.Tensor, params: list[torch.Tensor]) -> None:
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()


def run_diloco(args: argparse.Namespace, log: Log) -> None:
    import p2pgen
    from p2pgen.torch import DiLoCo

    model = mlp(1)
    diloco = DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=INNER_LR),
                    torch.optim.SGD(model.parameters(), lr=OUTER_LR, momentum=OUTER_MOMENTUM, nesterov=True),
                    sync_every=args.sync_every, fragments=args.fragments, compress=args.compress)
    state = p2pgen.SharedState(tensors=diloco.tensors())
    peer = p2pgen.join(state=state)
    global_model = mlp(1)
    stop = False

    def inner(b) -> torch.Tensor:
        x, y = batch(b.revision, b.index, b.rank, b.world)
        return loss_of(model, x, y)

    for step in peer.steps():
        _started(log, step)
        if stop:
            break
        with step:
            diloco.outer_step(step, inner)
        if step.committed:
            with torch.no_grad():
                for (name, p) in global_model.named_parameters():
                    p.copy_(state.tensors[f"diloco.param.{name}"])
            stop = _done(log, global_model, diloco.inner_steps_run, peer.state.revision, args)
    peer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("ddp", "sync", "diloco"), required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--sync-every", type=int, default=50)
    parser.add_argument("--fragments", type=int, default=1)
    parser.add_argument("--compress", default=None)
    parser.add_argument("--target-loss", type=float, default=0.0)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--master", default="")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    log = Log(args.log)
    {"ddp": run_ddp, "sync": run_sync, "diloco": run_diloco}[args.mode](args, log)
    log.write("end")


if __name__ == "__main__":
    main()

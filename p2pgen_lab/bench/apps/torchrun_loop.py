"""The step-loop workload of `p2pgen bench recovery` under torchrun, and the rendezvous store its agents share.

    torchrun ... -m p2pgen_lab.bench.apps.torchrun_loop worker --peer p0 --trace-dir DIR --checkpoint FILE
    python -m p2pgen_lab.bench.apps.torchrun_loop store --port PORT

`worker`: one process per node, started (and restarted) by a torchrun agent. Same model, data and update as
`p2pgen_lab.bench.apps.steploop` (its functions); the shard's gradient is all-reduced (SUM) with
`torch.distributed.all_reduce` over gloo (timeout `--timeout`). Any error ends the process (torchrun's
contract: the agents restart every worker and rendezvous again). A worker loads the checkpoint that rank 0
writes every `--checkpoint-every` commits (atomically, `steploop.save_checkpoint`), or starts from the
initial state; it never gets state from a peer.
`store`: a TCPStore server for the c10d rendezvous, run apart from the agents (`--rdzv-conf is_host=false`)
so that killing a node never takes the rendezvous with it, as with an etcd service.

Trace (`<trace-dir>/<peer>-<pid>.jsonl`, `p2pgen.peer.Trace`'s shape, incarnation = this process's pid):
`start`, a `certificate` when the process group is up (generation = the wall-clock ms of rank 0 at that
moment, broadcast, so that it grows from one rendezvous round to the next; world; activated_at), and a
`commit` per step (generation, revision, rank, world).
Invariant: a worker's revision is the number of steps its tensors hold, a checkpoint file holds the
tensors of the revision it names, and a worker dies with its agent (PR_SET_PDEATHSIG: torchrun starts
workers in sessions of their own, so nothing else would end one whose agent was SIGKILLed).
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import p2pgen
from p2pgen.agent.supervisor import die_with_parent
from p2pgen.peer import Trace
from p2pgen_lab.bench.apps.steploop import (
    apply_update,
    initial_tensors,
    load_checkpoint,
    save_checkpoint,
    shard_gradient,
    target_weights,
)


def serve_store(port: int) -> None:
    """Serve a TCPStore on 127.0.0.1:port until killed."""
    _store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, multi_tenant=True)
    while True:
        time.sleep(3600)


def work(args: argparse.Namespace) -> None:
    die_with_parent()      # torchrun starts workers in sessions of their own: none outlives its agent
    trace = Trace(str(args.trace_dir / f"{args.peer}-{os.getpid()}.jsonl"), (args.peer, os.getpid()))
    state = load_checkpoint(args.checkpoint) or p2pgen.SharedState(tensors=initial_tensors())
    trace.record("start", policy="torchrun", revision=state.revision,
                 restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    stamp = torch.tensor([int(time.time() * 1000)], dtype=torch.int64)
    dist.broadcast(stamp, 0)
    generation = int(stamp.item())
    trace.record("certificate", generation=generation, world=world, activated_at=time.time())
    w_true = target_weights()
    while True:
        time.sleep(args.step_delay)
        grad = shard_gradient(state.tensors["w"], w_true, state.revision + 1, rank, world)
        dist.all_reduce(torch.from_numpy(grad), op=dist.ReduceOp.SUM)
        apply_update(state, grad)
        state.revision += 1
        trace.record("commit", generation=generation, revision=state.revision, rank=rank, world=world)
        if rank == 0 and state.revision % args.checkpoint_every == 0:
            save_checkpoint(args.checkpoint, state)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)
    w = sub.add_parser("worker", help="the training process torchrun starts")
    w.add_argument("--peer", required=True, help="node id (p0, p1, ...)")
    w.add_argument("--trace-dir", type=Path, required=True)
    w.add_argument("--checkpoint", type=Path, required=True)
    w.add_argument("--checkpoint-every", type=int, default=20, help="rank 0's commits between checkpoints")
    w.add_argument("--step-delay", type=float, default=0.02, help="seconds of pretend compute per step")
    w.add_argument("--timeout", type=float, default=10.0, help="gloo process group timeout, seconds")
    s = sub.add_parser("store", help="the rendezvous TCPStore, apart from the agents")
    s.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    if args.role == "store":
        serve_store(args.port)
    else:
        work(args)


if __name__ == "__main__":
    main()

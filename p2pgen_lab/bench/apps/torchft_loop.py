"""The step-loop workload of `p2pgen bench recovery` as one torchft replica group of one process:

    python -m p2pgen_lab.bench.apps.torchft_loop --peer p0 --lighthouse http://127.0.0.1:PORT --store-port P \
        --manager-port Q --trace-dir DIR [--step-delay 0.02] [--timeout 10]

Same model, data and update as `p2pgen_lab.bench.apps.steploop` (its functions): W and its momentum, float32,
4 MiB together; the gradient of this replica's shard of the global batch is all-reduced (SUM) through
torchft's `Manager.allreduce` over a `ProcessGroupGloo`, and applied only when `manager.should_commit()`.
A new replica heals through torchft's own recovery: the Manager's quorum names a peer that sends its
`state_dict` (torchft's HTTP checkpoint transport), applied through `load_state_dict`; no file is read.
The quorum is taken synchronously at the start of every step (`use_async_quorum=False`), so a healing
replica has the peer's state before it computes.

Trace (`<trace-dir>/<peer>-<pid>.jsonl`, `p2pgen.peer.Trace`'s shape, incarnation = this process's pid):
`start`, then per step committed `commit` (generation = torchft's quorum id, revision = the Manager's step
after the commit, rank and world of the replica in the quorum), and a `certificate` (generation, world,
activated_at = when this process got the quorum) at its first step in each quorum.
Invariant: the tensors change only in a step that `should_commit()` accepted, and the revision traced is
the number of steps the model holds.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
from torch.distributed import ReduceOp, TCPStore
from torchft import Manager, ProcessGroupGloo
from torchft.checkpointing import HTTPTransport

import p2pgen
from p2pgen.peer import Trace
from p2pgen_lab.bench.apps.steploop import apply_update, initial_tensors, shard_gradient, target_weights

MIN_REPLICAS = 2


def make_manager(args: argparse.Namespace, state: p2pgen.SharedState) -> Manager:
    """A Manager for a replica group of one process (its TCPStore already serves `--store-port`)."""
    timeout = timedelta(seconds=args.timeout)

    def state_dict() -> dict[str, torch.Tensor]:
        return {k: torch.from_numpy(v) for k, v in state.tensors.items()}

    def load_state_dict(loaded: dict[str, torch.Tensor]) -> None:
        for k, v in loaded.items():
            np.copyto(state.tensors[k], v.numpy())

    return Manager(pg=ProcessGroupGloo(timeout=timeout), load_state_dict=load_state_dict, state_dict=state_dict,
                   min_replica_size=MIN_REPLICAS, use_async_quorum=False, timeout=timeout, quorum_timeout=timeout,
                   connect_timeout=timeout, rank=0, world_size=1, store_addr="127.0.0.1", store_port=args.store_port,
                   lighthouse_addr=args.lighthouse, replica_id=args.peer, port=args.manager_port,
                   hostname="127.0.0.1", checkpoint_transport=HTTPTransport(timeout=timeout, num_chunks=0))


def train(manager: Manager, state: p2pgen.SharedState, trace: Trace, step_delay: float) -> None:
    w_true, quorum = target_weights(), None
    while True:
        manager.start_quorum()
        rank, world = manager.participating_rank(), manager.num_participants()
        if manager._quorum_id != quorum:          # torchft exposes the quorum id only as this attribute
            quorum = manager._quorum_id
            trace.record("certificate", generation=quorum, world=world, activated_at=time.time())
        time.sleep(step_delay)
        revision = manager.current_step() + 1
        grad = shard_gradient(state.tensors["w"], w_true, revision, rank or 0, max(world, 1))
        manager.allreduce(torch.from_numpy(grad), reduce_op=ReduceOp.SUM).wait()
        if manager.should_commit():
            apply_update(state, grad)
            state.revision = manager.current_step()
            trace.record("commit", generation=quorum, revision=state.revision, rank=rank, world=world)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", required=True, help="host id (p0, p1, ...): the replica id's prefix")
    parser.add_argument("--lighthouse", required=True, help="the lighthouse's address, http://HOST:PORT")
    parser.add_argument("--store-port", type=int, required=True, help="this replica group's TCPStore port")
    parser.add_argument("--manager-port", type=int, required=True, help="this replica's ManagerServer port")
    parser.add_argument("--trace-dir", type=Path, required=True)
    parser.add_argument("--step-delay", type=float, default=0.02, help="seconds of pretend compute per step")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="Manager (collective, quorum, connect) and ProcessGroupGloo timeout, seconds")
    args = parser.parse_args()
    trace = Trace(str(args.trace_dir / f"{args.peer}-{os.getpid()}.jsonl"), (args.peer, os.getpid()))
    trace.record("start", policy="torchft", revision=0)
    state = p2pgen.SharedState(tensors=initial_tensors())
    # the replica group's store; this frame holds it for the life of the process
    _store = TCPStore("127.0.0.1", args.store_port, is_master=True, wait_for_workers=False)
    manager = make_manager(args, state)
    train(manager, state, trace, args.step_delay)


if __name__ == "__main__":
    main()

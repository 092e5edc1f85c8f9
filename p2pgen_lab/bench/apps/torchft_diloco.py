"""The torchft row of `p2pgen bench diloco`: the shipped task under torchft 0.2.0's `DiLoCo`, one replica per host.

    python -m p2pgen_lab.bench.apps.torchft_diloco --log FILE --rank I --world N --address HOST \
        --lighthouse http://HOST0:PORT [--sync-every H] [--target-loss L] [--wait-all] [--timeout 10]

One torchft replica group of one process: its TCPStore, ManagerServer and checkpoint server listen on
this host's address (`--address`, the hostname the Manager and the checkpoint transport advertise), the
lighthouse is host 0's. The task is
`p2pgen_lab.bench.apps.diloco_task`'s: model `mlp(1)`, data `batch(outer step, inner index, rank, world)`, inner
AdamW (lr 1e-3), outer SGD (lr 0.7, momentum 0.9, Nesterov) every H inner steps through
`torchft.local_sgd.DiLoCo` (one fragment, pseudo-gradients all-reduced over torchft's `ProcessGroupGloo`).
The outer step, rank and world of a batch are torchft's: the Manager's committed steps, the replica's rank
and the participants of the last quorum (before its first quorum, a restarted replica uses `--rank` and
`--world`). With `--wait-all` (the first start) the replica takes quorums until all `--world` replicas are
in one before it logs `start`; every member starts from the same seed, so no state is sent (`init_sync`
off); a replica started again heals from a peer at its first sync, through torchft's HTTP transport.

Log (JSON lines, the shape of `diloco_task`'s): `start`, an `eval` {t, steps, outer, loss} of the global
parameters after every committed outer step (stop once loss <= `--target-loss`: every member sees the same
number at the same step), a `reset` {kind, outer, error} for every outer step torchft threw away on this
replica (kind `sync failed`: `should_commit` was false, the H inner steps discarded and the parameters
restored to the last global ones; kind `healed`: the replica's state replaced by a peer's), and `end`.
Invariant: the parameters evaluated are the global ones (torchft leaves the model at them after a commit),
and an outer step counts as committed only when the outer optimizer stepped.
"""

from __future__ import annotations

import argparse
import os
import time
import urllib.parse
from datetime import timedelta

import torch
from torch.distributed import TCPStore
from torchft import Manager, ProcessGroupGloo
from torchft.checkpointing import HTTPTransport
from torchft.local_sgd import DiLoCo

from p2pgen_lab.bench.apps.diloco_task import INNER_LR, OUTER_LR, OUTER_MOMENTUM, Log, batch, eval_loss, loss_of, mlp

STORE_PORT, MANAGER_PORT = 23610, 23611
MIN_REPLICAS = 2
QUORUM_TIMEOUT_S = 60.0        # a DiLoCo outer step, and a restarted replica's start, fit in it
START_TIMEOUT_S = 90.0         # the first quorum of all replicas: every one importing torch
START_RETRY_S = 0.1


class HostTransport(HTTPTransport):
    """torchft's HTTP checkpoint transport, advertising this host's address: torchft's names the machine's
    hostname, which every emulated host shares and which none of them reaches."""

    def __init__(self, host: str, timeout: timedelta) -> None:
        super().__init__(timeout=timeout, num_chunks=0)
        self.host = host

    def metadata(self) -> str:
        url = urllib.parse.urlsplit(self.address())
        return url._replace(netloc=f"{self.host}:{url.port}").geturl()


class Replica:
    """The model, its optimizers and the Manager of one replica, with what torchft did at the last sync."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.model = mlp(1)
        self.inner = torch.optim.AdamW(self.model.parameters(), lr=INNER_LR)
        self.outer = torch.optim.SGD(self.model.parameters(), lr=OUTER_LR, momentum=OUTER_MOMENTUM, nesterov=True)
        self.committed = self.healed = False
        self.outer.register_step_post_hook(self._outer_stepped)
        timeout = timedelta(seconds=args.timeout)
        # the replica group's store; this object holds it for the life of the process
        self.store = TCPStore(args.address, STORE_PORT, is_master=True, wait_for_workers=False)
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=timeout), load_state_dict=self._load, state_dict=self._state,
            min_replica_size=MIN_REPLICAS, use_async_quorum=False, timeout=timeout,
            quorum_timeout=timedelta(seconds=QUORUM_TIMEOUT_S), connect_timeout=timeout, rank=0, world_size=1,
            store_addr=args.address, store_port=STORE_PORT, lighthouse_addr=args.lighthouse,
            replica_id=f"m{args.rank}", port=MANAGER_PORT, hostname=args.address, init_sync=False,
            checkpoint_transport=HostTransport(args.address, timeout))

    def _outer_stepped(self, *_: object) -> None:
        self.committed = True

    def _state(self) -> dict[str, object]:
        return {"model": self.model.state_dict(), "inner": self.inner.state_dict()}

    def _load(self, state: dict[str, object]) -> None:
        self.model.load_state_dict(state["model"])
        self.inner.load_state_dict(state["inner"])
        self.healed = True

    def wait_all(self, world: int) -> None:
        """Take quorums until one holds all `world` replicas."""
        while True:
            self.manager.start_quorum(timeout=timedelta(seconds=START_TIMEOUT_S))
            if self.manager.num_participants() >= world:
                return
            time.sleep(START_RETRY_S)

    def rank_world(self, args: argparse.Namespace) -> tuple[int, int]:
        rank = self.manager.participating_rank()
        return (args.rank, args.world) if rank is None else (rank, self.manager.num_participants())


def train(replica: Replica, args: argparse.Namespace, log: Log) -> None:
    """Inner steps under DiLoCo until an evaluation reaches the target."""
    manager, model, steps = replica.manager, replica.model, 0
    with DiLoCo(manager, [model], replica.inner, replica.outer, sync_every=args.sync_every):
        while True:
            outer = manager.current_step()
            rank, world = replica.rank_world(args)
            x, y = batch(outer, steps % args.sync_every, rank, world)
            loss_of(model, x, y).backward()
            replica.committed = replica.healed = False
            replica.inner.step()                    # the H-th one syncs, inside DiLoCo's hook
            replica.inner.zero_grad(set_to_none=True)
            steps += 1
            if steps % args.sync_every == 0 and _after_sync(replica, log, steps, args.target_loss):
                return


def _after_sync(replica: Replica, log: Log, steps: int, target: float) -> bool:
    """Log what the sync just done gave; True once the global parameters are at the target."""
    outer = replica.manager.current_step()
    if replica.healed:
        log.write("reset", kind="healed", outer=outer, error=None)
    if not replica.committed:
        error = replica.manager.errored()
        why = None if error is None else str(error.original_exception)
        log.write("reset", kind="sync failed", outer=outer, error=why)
        return False
    loss = eval_loss(replica.model)
    log.write("eval", steps=steps, outer=outer, loss=loss)
    return loss <= target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", required=True)
    parser.add_argument("--rank", type=int, required=True, help="this host's index: the replica id m<rank>")
    parser.add_argument("--world", type=int, required=True, help="the number of hosts")
    parser.add_argument("--address", required=True, help="this host's address: store, ManagerServer, gloo")
    parser.add_argument("--lighthouse", required=True, help="the lighthouse, http://HOST:PORT")
    parser.add_argument("--sync-every", type=int, default=50)
    parser.add_argument("--target-loss", type=float, default=0.0)
    parser.add_argument("--wait-all", action="store_true", help="first start: wait for every replica")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="Manager (collectives, connect) and ProcessGroupGloo timeout, seconds")
    args = parser.parse_args()
    if args.sync_every < 1 or not 0 <= args.rank < args.world:
        parser.error("--sync-every must be >= 1 and 0 <= --rank < --world")
    torch.set_num_threads(1)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    log = Log(args.log)
    replica = Replica(args)
    if args.wait_all:
        replica.wait_all(args.world)
    log.write("start")
    train(replica, args, log)
    log.write("end")
    replica.manager.shutdown(wait=False)


if __name__ == "__main__":
    main()

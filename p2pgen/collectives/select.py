"""The one place where a generation's backend is chosen: `tcp` (default) or `nccl`.

- `offer_comm_id(kind, pending, identity)`: what this member puts in `Ready.comm_id` for the proposed
  generation: a fresh NCCL unique id (hex) if it is the proposal's rank 0 and the job runs nccl, else "".
  Core copies rank 0's offer into the certificate's `comm_id`, so the id belongs to that generation only.
- `backend_factory(kind, active, transport, group)`: the Backend of the certified generation. `tcp` is the CPU
  ring, wrapped in host staging so GPU members can use it with CUDA tensors, and with a hierarchical all_reduce
  over the certificate's groups when its topology says so (`collectives.hierarchical`); `nccl` joins the
  communicator named by the certificate's `comm_id`.

Invariant: every member of one generation builds the same kind of backend from the same certificate; a
`nccl` certificate without a valid `comm_id` is refused with a message, never replaced by a local id.
"""

from __future__ import annotations

from typing import Any

from p2pgen.collectives import hierarchical
from p2pgen.collectives.backend import Backend
from p2pgen.collectives.staged import HostStagedBackend
from p2pgen.collectives.tcp import TcpBackend
from p2pgen.core.view import ActiveGeneration, PendingGeneration

KINDS = ("tcp", "nccl")


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown backend {kind!r}: use one of {', '.join(KINDS)}")
    return kind


def offer_comm_id(kind: str, pending: PendingGeneration, identity: tuple[str, int], nccl: Any = None) -> str:
    """Ready.comm_id for `pending`: a new NCCL unique id from its rank 0 when `kind` is nccl, else ""."""
    if check_kind(kind) != "nccl" or pending.rank_of(identity) != 0:
        return ""
    from p2pgen.collectives.nccl import new_comm_id

    if nccl is None:
        from p2pgen.collectives import nccl_lib

        nccl = nccl_lib.load()
    return new_comm_id(nccl)


def backend_factory(kind: str, active: ActiveGeneration, transport: Any, group: Any, **nccl_options: Any) -> Backend:
    """The backend of the certified generation `active` for this member (`group`: its transport Group)."""
    if check_kind(kind) == "tcp":
        tcp = TcpBackend(transport, group)
        groups = active.hierarchy()
        if groups is not None:
            hierarchical.attach(tcp, groups)
        return HostStagedBackend(tcp)
    from p2pgen.collectives.nccl import NcclBackend

    if group.generation != active.generation:
        raise ValueError(f"group is of generation {group.generation}, certificate of {active.generation}")
    return NcclBackend(active.comm_id, group.rank, group.world, active.generation, group=group,
                       **nccl_options)

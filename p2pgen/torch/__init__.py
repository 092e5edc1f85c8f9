"""torch.distributed on p2pgen: a registered `p2pgen` backend whose collectives run in the current generation.

`import p2pgen.torch` registers the backend for the cpu and cuda devices. Three ways in:

- **Under an agent** (`p2pgen join ... -- python train.py`): torch's idiom, plus the step loop.
  ```python
  dist.init_process_group("p2pgen")        # no argument: joins the job the agent started this process for
  model = torch.nn.parallel.DistributedDataParallel(module)   # torch's own DDP
  optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
  peer = p2pgen.torch.peer(model, optimizer)   # a joiner pulls model and optimizer state from the others
  for step in peer.steps():
      with step:                            # a generation change, even inside DDP's backward, discards the step
          loss = model(x_shard).pow(2).mean()
          loss.backward()                   # bucket all-reduces (AVG) run in this step's generation
          optimizer.step()
          step.commit()
  ```
  Before its first step the process is a world of one (`ALONE` in p2pgen.torch.group): DDP's construction
  check and broadcast run there, trivially, and the state pull before the first step makes the joiner's
  parameters the job's. `peer(model, ...)` *adopts* torch's DDP (`adopt`): a reducer that never rebuilds its
  buckets and gradients averaged over each step's generation. `p2pgen.torch.DistributedDataParallel` is the
  same with gradients SUMMED (write the loss over the global batch).
  When the script joined first (`peer = p2pgen.join(state=state)`), `init_process_group("p2pgen")` runs on
  that Peer instead. `p2pgen.torch.init_process_group(peer)` does the same for a given Peer, Backend or
  callable. Outside an agent, `init_process_group("p2pgen")` without a rendezvous raises ValueError saying
  how to start the script.
  The default group *follows* the generation: `dist.get_rank()`/`get_world_size()` and every `dist.*` call use the
  generation current when the call is issued. For code that caches the world (DeviceMesh, DTensor, FSDP2,
  functional collectives, torch.distributed.checkpoint), `p2pgen.torch.generation_group()` returns a group
  *bound* to the current generation, and `generation_mesh()` a DeviceMesh over it: rebuild them (and what
  is sharded on them) in each new generation; once its generation is retired, its calls raise
  GenerationChanged. (Build meshes with `generation_mesh()`: see its docstring for why.)
- **Fixed membership, no agents**: `dist.init_process_group("p2pgen", init_method=..., rank=..., world_size=...)`
  (any torch rendezvous: env://, tcp://, file://, a store) gives one generation that never changes
  (p2pgen.torch.fixed); a fast CPU backend and what torch's own test suite runs against.
- **Subgroups**: `dist.new_group(ranks)` on a p2pgen default group runs in the same generation as its
  parent (a generation change fails it the same way); with another default backend it meets through the
  store as a fixed group.

Contract:
- Every collective torch users reach for: all_reduce (+coalesced), broadcast, reduce, all_gather (list,
  into_tensor, coalesced, uneven shapes), reduce_scatter (list, tensor, coalesced), all_to_all(_single) with
  splits, gather, scatter, barrier, send/recv, the object collectives, `_coalescing_manager`, and
  `monitored_barrier` (call `p2pgen.torch.monitored_barrier`: torch's `dist.monitored_barrier` refuses every
  backend but gloo by name). Reductions: SUM, PRODUCT, MIN, MAX on float16, bfloat16, float32, float64, int8,
  uint8, int32, int64 and bool; AVG on floats; BAND/BOR/BXOR on integers and bool (gloo's set, plus AVG);
  data movement of any dtype. Anything else raises TypeError/ValueError at the call, naming the collective,
  op, dtype and what is supported, before anything is issued.
- Operations run in issue order on one worker thread per process; the communicator is chosen when the
  operation is *issued*, so an operation issued in generation G never runs in another one. With a Peer,
  collectives go through the step (traced; the step's first one agrees on the step boundary); send/recv and
  subgroups run on the step's generation directly. A `recv` blocks the operations issued after it, as in
  MPI; receives name their source (no any-source receive) and tags are not matched (pair sends and
  receives in order). Do not block on another operation inside a future's callback (callbacks run on the
  worker thread).
- In place, as in torch: all_reduce/broadcast write their tensor, the others their outputs. Outputs are
  written only when the operation succeeded; when it fails every tensor passed in is as it was.
- A generation change in the middle of an operation: its `Work` is completed and failed; `work.wait()` and
  `work.get_future().wait()` raise the p2pgen error itself (`GenerationChanged`, or `PeerLost` when a member
  vanished first); `dist.all_reduce(...)` without `async_op` raises it from the call; later operations of
  that generation fail the same way. Inside DDP's backward torch wraps it in a RuntimeError:
  `unwrap_errors()` turns it back, so that `with step:` discards the step and the loop retries it.

Design. torch fixes a C++ ProcessGroup's rank and size when it is built, and C++ Backends cannot be written
in Python, so the group is a Python subclass of torch's ProcessGroup that overrides every collective torch
calls (from Python and through C++'s virtual dispatch), names itself, and asks where its communicator comes
from at every call (p2pgen.torch.group). The alternative, one torch group per generation under the default
name, would force every holder of the default group (a DDP model) to be rebuilt at each change; the
following default group keeps `dist.*` calls and the DDP object valid for the life of the process, and
`generation_group()` gives the code that needs a fixed world exactly that, for one generation.

Invariants kept: an operation runs only in the generation it was issued in, and with a Peer only through
that generation's Step, so never before the generation's certificate (I4); a step one of whose operations
failed raises and is discarded, never committed (I5).
"""

import importlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from p2pgen.peer import Peer, current_peer, join
from p2pgen.torch import fixed
from p2pgen.torch.ddp import DistributedDataParallel, adopt, allreduce_hook, average_hook, default_group, unwrap_errors
from p2pgen.torch.diloco import DiLoCo, InnerBatch, OuterReport
from p2pgen.torch.group import BACKEND, P2PGenProcessGroup, Work, bound_to, following, subgroup_of

__all__ = ["BACKEND", "DiLoCo", "DistributedDataParallel", "InnerBatch", "OuterReport", "P2PGenProcessGroup", "Work",
           "adopt", "allreduce_hook", "average_hook", "default_group",
           "generation_group", "generation_mesh", "init_process_group", "monitored_barrier", "peer", "shared_tensors",
           "unwrap_errors"]


@dataclass(frozen=True)
class _Bind:
    """pg_options of `generation_group`: bind the new group to this generation."""

    generation: int


def _p2pgen_default() -> P2PGenProcessGroup | None:
    group = dist.group.WORLD if dist.is_initialized() else None
    return group if isinstance(group, P2PGenProcessGroup) else None


def _create(options: Any, pg_options: Any) -> P2PGenProcessGroup:
    """torch's creator for backend "p2pgen" (see the module docstring for which group each call gets)."""
    rank, size = options.group_rank, options.group_size
    parent = _p2pgen_default()
    if isinstance(pg_options, _Bind):
        if parent is None:
            raise RuntimeError("generation_group() needs the p2pgen default group: "
                               'dist.init_process_group("p2pgen") first')
        return P2PGenProcessGroup(bound_to(parent._comm, pg_options.generation), rank, size, kind="generation")
    if pg_options is not None:
        return P2PGenProcessGroup(following(pg_options), rank, size)
    if parent is not None:
        ranks = list(options.global_ranks_in_group) or list(range(size))
        return P2PGenProcessGroup(subgroup_of(parent._comm, ranks), rank, size, kind="subgroup")
    if os.environ.get("P2PGEN_AGENT"):
        return P2PGenProcessGroup(following(current_peer() or join()), rank, size)
    comm, close = fixed.rendezvous(options.store, rank, size, options.timeout, options.group_id)
    return P2PGenProcessGroup(following(comm), rank, size, kind="fixed", on_shutdown=close)


dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])


def init_process_group(source: Any) -> P2PGenProcessGroup:
    """`dist.init_process_group("p2pgen")` with `source` (a Peer, a Backend, or a callable returning the
    communicator) as where the default group's communicator comes from; returns the group.

    No rendezvous store is involved (p2pgen's membership comes from Raft), so a process-local HashStore is
    passed; the rank and size given to torch are the source's current ones when known, else 0 and 1.
    """
    rank, size = _initial_position(following(source)())
    dist.init_process_group(BACKEND, store=dist.HashStore(), rank=rank, world_size=size, pg_options=source)
    return default_group()


def peer(model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None) -> Peer:
    """The Peer that the default p2pgen group runs on (the one `dist.init_process_group("p2pgen")` joined the
    job with, or `p2pgen.join()`'s): loop over `peer.steps()`. `model` and `optimizer`, when given, are added
    to its SharedState by reference (`shared_tensors`), so a joiner or a restarted process pulls them from
    the others; call it before the first step. A torch DistributedDataParallel `model` is adopted first
    (`adopt`: see p2pgen.torch.ddp).
    """
    default_group()
    the_peer = current_peer()
    if the_peer is None:
        raise RuntimeError('p2pgen.torch.peer() needs a process started by a p2pgen agent and '
                           'dist.init_process_group("p2pgen") (the fixed-membership backend has no Peer): run the '
                           "script under `p2pgen join --local 2 -- python SCRIPT`")
    if model is not None or optimizer is not None:
        if the_peer.stats["generations"] or the_peer._backend is not None:
            raise RuntimeError("p2pgen.torch.peer(model, optimizer) after the first step: the members' states "
                               "would differ; share the model and optimizer before `for step in peer.steps()`")
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            adopt(model)
        the_peer.state.tensors.update(shared_tensors(model, optimizer))
    return the_peer


def shared_tensors(model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None = None
                   ) -> dict[str, torch.Tensor]:
    """The tensors that make a training replica, by reference: `model.<name>` for each parameter and buffer,
    `optimizer.<parameter name>.<key>` for each tensor of the optimizer's per-parameter state.

    torch's SGD creates its momentum buffers in its first step; without dampening they are created here as
    zeros (SGD's first update is then the same as a fresh one's), so every member holds them from the start. Any other
    optimizer must already hold its state (run it once before sharing), else ValueError.
    """
    named = dict(model.named_parameters()) if model is not None else {}
    out = {f"model.{name}": p.detach() for name, p in named.items()}
    out.update({f"model.{name}": b for name, b in (model.named_buffers() if model is not None else ())})
    if optimizer is None:
        return out
    names = {id(p): name for name, p in named.items()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in names:
                raise ValueError("the optimizer holds a parameter that is not the model's: pass the model whose "
                                 "parameters the optimizer was built with")
            out.update(_optimizer_tensors(optimizer, group, p, names[id(p)]))
    return out


def _optimizer_tensors(optimizer: torch.optim.Optimizer, group: dict[str, Any], p: torch.Tensor,
                       name: str) -> dict[str, torch.Tensor]:
    state = optimizer.state[p]
    sgd = type(optimizer) is torch.optim.SGD and not group.get("dampening", 0)
    if not state and sgd and group.get("momentum", 0):
        state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    if not state and not sgd:
        raise ValueError(f"{type(optimizer).__name__} holds no state for {name} yet: torch creates it in the "
                         "first optimizer step; only SGD's (without dampening) is created here. Share after a "
                         "first step taken the "
                         "same way on every member, or share the model alone and rebuild the optimizer")
    out = {}
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{type(optimizer).__name__}'s state {key!r} of {name} is a "
                             f"{type(value).__name__}, not a tensor: a SharedState holds tensors only")
        out[f"optimizer.{name}.{key}"] = value
    return out


def _initial_position(comm: Any) -> tuple[int, int]:
    return (comm.rank, comm.world) if comm is not None else (0, 1)


def generation_group() -> P2PGenProcessGroup:
    """A torch group bound to the current generation (call it inside a step): its rank and size are the
    generation's and never change, so DeviceMesh (`DeviceMesh.from_group(group, "cpu")`), DTensor, FSDP2,
    functional collectives and DCP can use it. Once the generation is retired, every call on it raises
    GenerationChanged: build the next generation's group then (and `dist.destroy_process_group(old)`)."""
    comm = default_group()._current()
    if comm.generation is None:
        raise RuntimeError("generation_group() binds a group to a generation: call it inside a step "
                           "(`for step in peer.steps(): with step: ...`); before its first step the process has none")
    return dist.new_group(backend=BACKEND, pg_options=_Bind(comm.generation))


def generation_mesh(device_type: str = "cpu") -> Any:
    """A 1-D DeviceMesh over `generation_group()`, its dimension named after the generation
    (`generation<G>`); `mesh.get_group()` is the group (destroy it when the generation is over).

    Why the name: DeviceMesh equality (and so DTensor's caches of sharding decisions, which hold a mesh)
    compares ranks, layout and dimension names, never the process group. A mesh of generation 5 over ranks
    0..3 would equal generation 3's over the same ranks, and DTensor would reuse the older mesh, and its
    retired group, from its caches; distinct names keep every generation's mesh its own."""
    from torch.distributed.device_mesh import DeviceMesh

    group = generation_group()
    return DeviceMesh.from_group(group, device_type, mesh_dim_names=(f"generation{group.generation}",))


def monitored_barrier(group: P2PGenProcessGroup | None = None, timeout: timedelta | None = None,
                      wait_all_ranks: bool = False) -> None:
    """torch's monitored_barrier on a p2pgen group (torch's own refuses every backend but gloo): returns once
    every member arrived; on rank 0 raises RuntimeError naming the ranks that did not arrive within `timeout`
    (the first one, or all with `wait_all_ranks`), and the group's generation fails on every member."""
    (group or default_group()).monitored_barrier(timeout, wait_all_ranks)


def _agent_env_rendezvous(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs: Any) -> Iterator[Any]:
    """torch's env:// rendezvous, except in a process an agent started without torch's variables: there the
    membership is the agent's, so the store is process-local and rank/size are the Peer's current ones.
    Where neither an agent nor torch's variables are there, torch's error says what to do about both."""
    if os.environ.get("P2PGEN_AGENT") and "MASTER_ADDR" not in os.environ:
        peer = current_peer()
        step = peer._current_step if peer is not None else None
        yield (dist.HashStore(), step.rank, step.world) if step is not None else (dist.HashStore(), 0, 1)
        raise RuntimeError("p2pgen's agent rendezvous yields once")
    try:
        yield from _torch_env_rendezvous(url, timeout=timeout, **kwargs)
    except ValueError as e:
        if "P2PGEN_AGENT" in os.environ:
            raise
        raise ValueError(
            f"{e}. This process was not started by a p2pgen agent (P2PGEN_AGENT is not set) and lacks some of "
            "torch's rendezvous variables. For the elastic p2pgen backend, start the script under agents: "
            "`p2pgen join --local 2 -- python SCRIPT` (or `p2pgen join --job J --id ID --listen HOST:PORT "
            "-- python SCRIPT` on each host); for a fixed group without agents, pass init_method=, rank= and "
            "world_size= to dist.init_process_group (or set MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE, "
            "as torchrun does)") from None


_handlers = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
_torch_env_rendezvous = _handlers["env"]
_handlers["env"] = _agent_env_rendezvous

"""DDP on p2pgen: a DistributedDataParallel that keeps working across generation changes, its comm hook,
and `unwrap_errors`, which turns torch's wrapped RuntimeError back into the p2pgen error.

Invariant: DDP's collectives are a function of the model alone (no bucket rebuild), so members that run the
same model issue the same ones in every step, joiners included; a step one of whose operations failed
raises (through `unwrap_errors` inside DDP's backward) and is discarded, never committed (I5).
"""

# No `from __future__ import annotations` here: DDP checks a comm hook's annotations against the real types.
import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from p2pgen.errors import P2PGenError
from p2pgen.torch import group as _group
from p2pgen.torch.group import P2PGenProcessGroup


def default_group() -> P2PGenProcessGroup:
    group = dist.group.WORLD
    if not isinstance(group, P2PGenProcessGroup):
        raise RuntimeError(f"the default process group is {group!r}, not p2pgen's: call "
                           'dist.init_process_group("p2pgen") (or p2pgen.torch.init_process_group(peer)) first')
    return group


@contextlib.contextmanager
def unwrap_errors(group: P2PGenProcessGroup | None = None) -> Iterator[None]:
    """Re-raise a p2pgen error that torch wrapped in a RuntimeError (DDP's reducer does, in backward).

    Use it inside `with step:` (`with step, p2pgen.torch.unwrap_errors():`) so that the step sees
    GenerationChanged/PeerLost and discards itself. Only errors raised while an operation of `group` (of any
    p2pgen group when None: DDP's, FSDP2's generation group, subgroups) failed are translated; any other
    exception passes unchanged.
    """
    count = group.failures if group is not None else _group.failures.mark()
    try:
        yield
    except P2PGenError:
        raise
    except RuntimeError as e:
        if group is not None:
            last = group.last_failure if group.failures != count else None
        else:
            last = _group.failures.unwrap(e, count)
        if last is not None:
            raise last from e
        raise


def allreduce_hook(group: P2PGenProcessGroup, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """DDP comm hook: SUM the bucket in the generation current when the bucket is ready."""
    return group.all_reduce_future(bucket.buffer(), "sum")


def average_hook(group: P2PGenProcessGroup, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """DDP comm hook: AVG the bucket over the members of the generation current when the bucket is ready
    (torch DDP's own semantics, with the world of this step rather than the world DDP was built in)."""
    return group.all_reduce_future(bucket.buffer(), "avg")


def adopt(ddp: torch.nn.parallel.DistributedDataParallel) -> None:
    """Make torch's own DistributedDataParallel, built on the p2pgen default group, safe across generation
    changes (called by `p2pgen.torch.peer(model, ...)` before the first step). Two things in torch's DDP
    assume a fixed world, and both are changed here:

    - the reducer *rebuilds* its buckets once, after the first backward of its life (a broadcast of the new
      layout from rank 0). A joiner would do that steps after the survivors did, and the members would then
      issue different collectives. The reducer is rebuilt with `find_unused_parameters=True`, as
      `p2pgen.torch.DistributedDataParallel` does (see its docstring): a layout that is a function of the
      model alone, never rebuilt. This is the rebuild torch's own `__setstate__` does after unpickling.
    - without a comm hook the reducer divides gradients by the world size it first saw; `average_hook`
      averages over the members of each step's generation instead (a hook the script registered is kept).

    What stays torch's: gradients are averaged (write the loss as the mean over the local batch, as for any
    DDP script); buffers are broadcast from rank 0 before each forward (`broadcast_buffers`), in the step."""
    if isinstance(ddp, DistributedDataParallel):
        return                                     # p2pgen's own: built this way
    if not isinstance(ddp.process_group, P2PGenProcessGroup):
        raise ValueError(f"this DistributedDataParallel runs on {ddp.process_group!r}, not on p2pgen's default "
                         'group: build it after dist.init_process_group("p2pgen"), without process_group=')
    if ddp.static_graph:
        raise ValueError("static_graph=True is not supported on p2pgen: its reducer checks the graph of the "
                         "first iterations, which a joiner runs later than the others; drop static_graph")
    if getattr(ddp, "_adopted_by_p2pgen", False):
        return
    if not ddp.find_unused_parameters:
        ddp.find_unused_parameters = True
        parameters, expect_sparse_gradient = ddp._build_params_for_reducer()
        ddp._ddp_init_helper(parameters, expect_sparse_gradient,
                             ddp._build_debug_param_to_name_mapping(parameters), False)
    if not ddp._comm_hooks:
        ddp.register_comm_hook(ddp.process_group, average_hook)
    ddp._adopted_by_p2pgen = True


class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    """torch DDP on a p2pgen group that survives generation changes.

    Gradients are SUMMED over the members (no division by the world size): write the loss as a sum of
    per-sample terms divided by the global batch size. Keyword arguments go to torch's DDP, except
    `init_sync` (always False: p2pgen's state pull already makes every member hold the frontier state, and a
    joiner builds its DDP while the others are mid-training), `find_unused_parameters` (always True) and
    `static_graph` (always False).

    Why find_unused_parameters: torch's reducer otherwise *rebuilds* its buckets once, after the first
    backward of its life (two broadcasts, then a new bucket layout). A joiner's reducer would do that
    steps later than the survivors', so in between the members would all-reduce different bucket
    layouts. With find_unused_parameters=True torch never rebuilds: the layout is a function of the
    model alone, and every member, joiner or survivor, issues the same collectives in every step (the
    bucket all-reduces, then a small int32 all-reduce of the used-parameter map).
    """

    def __init__(self, module: torch.nn.Module, process_group: "P2PGenProcessGroup | None" = None,
                 **kwargs: Any) -> None:
        for name, allowed in (("init_sync", False), ("find_unused_parameters", True), ("static_graph", False)):
            if kwargs.pop(name, allowed) != allowed:
                raise ValueError(f"{name}={not allowed} is not supported on p2pgen (see "
                                 "p2pgen.torch.DistributedDataParallel's docstring)")
        group = process_group or default_group()
        super().__init__(module, process_group=group, init_sync=False, find_unused_parameters=True, **kwargs)
        self.register_comm_hook(group, allreduce_hook)

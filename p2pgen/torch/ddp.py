"""DDP on p2pgen: a DistributedDataParallel that keeps working across generation changes, its comm hook,
and `unwrap_errors`, which turns torch's wrapped RuntimeError back into the p2pgen error.

Invariant: DDP's collectives are a function of the model alone (no bucket rebuild), so members that run the
same model issue the same ones in every step, joiners included; a step one of whose operations failed
raises (through `unwrap_errors` inside DDP's backward) and is discarded, never committed (I5).
"""

# No `from __future__ import annotations` here: DDP checks a comm hook's annotations against the real types.
import contextlib
from typing import Any, Iterator

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
    record = group or _group.failures
    count = record.failures if group is not None else record.count
    try:
        yield
    except P2PGenError:
        raise
    except RuntimeError as e:
        now, last = (group.failures, group.last_failure) if group is not None else (record.count, record.last)
        if now != count and last is not None:
            raise last from e
        raise


def allreduce_hook(group: P2PGenProcessGroup, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """DDP comm hook: SUM the bucket in the generation current when the bucket is ready."""
    return group.all_reduce_future(bucket.buffer(), "sum")


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

"""The Backend protocol every collective implementation (tcp, nccl) provides, and the reductions it defines.

Contract for callers:
- A backend is bound to exactly one generation. Every member calls the same collectives in the same
  order with buffers of the same shape and dtype; ranks are positions in that generation's member list.
- Collectives are in place (`all_reduce`, `broadcast`) or write an output buffer; all are synchronous.
- Results are bit-identical on every member.
- Failure: a collective raises GenerationChanged (the generation was aborted) or PeerLost /
  ProtocolError (a member died or misbehaved); the backend is then unusable, and every later call
  raises too. **A buffer you passed is exactly as you passed it when a collective raises**: outputs are
  written only after every frame they need arrived and verified. The collective may still have
  completed on other members.
- Bad input (an op a dtype does not define, mismatched sizes, a rank outside the generation) raises
  TypeError/ValueError at the call, naming what was wrong and what is supported, before anything is sent,
  so the members stay in step.
- `abort(reason)` and `close()` are idempotent and thread-safe; `abort` returns the quiescence
  ("proved" once every worker of this generation stopped, else "unknown").

Reductions (`REDUCTIONS`, the same set as torch's gloo on CPU, plus AVG): SUM, PRODUCT, MIN and MAX on every
float, integer and bool dtype (on bool SUM and MAX are a logical or, PRODUCT and MIN a logical and); AVG on
float dtypes; BAND, BOR and BXOR on integer and bool dtypes. Data movement (broadcast, all_gather,
all_to_all, send/recv) takes any dtype: it moves bytes.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


class ReduceOp(str, enum.Enum):
    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"


FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INT_DTYPES = ("int8", "uint8", "int32", "int64")
BOOL_DTYPES = ("bool",)
_ARITHMETIC = FLOAT_DTYPES + INT_DTYPES + BOOL_DTYPES
_BITWISE = INT_DTYPES + BOOL_DTYPES

REDUCTIONS: dict[ReduceOp, tuple[str, ...]] = {
    ReduceOp.SUM: _ARITHMETIC, ReduceOp.PRODUCT: _ARITHMETIC, ReduceOp.MIN: _ARITHMETIC,
    ReduceOp.MAX: _ARITHMETIC, ReduceOp.AVG: FLOAT_DTYPES,
    ReduceOp.BAND: _BITWISE, ReduceOp.BOR: _BITWISE, ReduceOp.BXOR: _BITWISE,
}


def as_op(op: ReduceOp | str) -> ReduceOp:
    """`op` as a ReduceOp; an unknown name raises ValueError listing the known ones."""
    try:
        return ReduceOp(op)
    except ValueError:
        raise ValueError(f"unknown reduce op {op!r}; use one of {[o.value for o in ReduceOp]}") from None


def check_reduction(what: str, op: ReduceOp, dtype: str,
                    table: dict[ReduceOp, tuple[str, ...]] = REDUCTIONS) -> None:
    """Raise TypeError, naming the collective, the op, the dtype and what is supported, unless `table`
    defines `op` on `dtype`."""
    if dtype in table.get(op, ()):
        return
    takes = table.get(op)
    if not takes:
        supported = ", ".join(o.value for o in table)
        raise TypeError(f"{what}: reduce op {op.value} (on {dtype}) is not supported by this backend; "
                        f"it supports {supported}")
    defined = [o.value for o, dtypes in table.items() if dtype in dtypes]
    on_dtype = f"{dtype} takes {', '.join(defined)}" if defined else f"{dtype} is not reduced at all"
    raise TypeError(f"{what}: reduce op {op.value} is not defined for {dtype}; {op.value} takes "
                    f"{', '.join(takes)} ({on_dtype})")


def splits(given: Sequence[int] | None, total: int, world: int, what: str) -> list[int]:
    """Per-rank element counts of an all_to_all buffer: `given`, or `total` cut into `world` equal parts."""
    if given is None or len(given) == 0:
        if total % world:
            raise ValueError(f"{what}: {total} elements do not split into {world} equal parts; pass split sizes")
        return [total // world] * world
    counts = [int(c) for c in given]
    if len(counts) != world or any(c < 0 for c in counts) or sum(counts) != total:
        raise ValueError(f"{what}: split sizes {counts} must be {world} non-negative counts summing to the "
                         f"buffer's {total} elements")
    return counts


@runtime_checkable
class Backend(Protocol):
    """The communicator of one generation on one member: everything the Peer and p2pgen.torch use of it.
    Implemented by TcpBackend (CPU ring), NcclBackend (GPUs) and HostStagedBackend (device tensors through
    host memory); the conformance suite (`p2pgen.testing.conformance`) holds them to the same contract."""

    rank: int
    world: int
    generation: int
    group: Any                  # the Group (endpoints and this member's rank) the backend was built for

    @property
    def op_seq(self) -> int: ...            # collectives issued so far (traced with every step's collectives)

    @property
    def failed(self) -> str | None: ...     # why the backend failed (a lost peer, an abort), or None

    def connect(self) -> None: ...           # make the generation's links now rather than on first use

    def all_reduce(self, buf: Any, op: ReduceOp | str = ReduceOp.SUM) -> Any: ...

    def broadcast(self, buf: Any, root: int) -> Any: ...

    def all_gather(self, output: Any, input: Any) -> Any: ...

    def reduce_scatter(self, output: Any, input: Any, op: ReduceOp | str = ReduceOp.SUM) -> Any: ...

    def all_to_all(self, output: Any, input: Any, output_splits: Sequence[int] | None = None,
                   input_splits: Sequence[int] | None = None) -> Any: ...

    def send(self, buf: Any, dst: int) -> None: ...

    def recv(self, buf: Any, src: int) -> Any: ...

    def barrier(self) -> None: ...

    def abort(self, reason: str) -> str: ...

    def close(self) -> None: ...

"""Conformance suite every collective Backend must pass (tcp, and nccl on the fake NCCL).

A `Case` names one collective call. `run_case(backend, case)` runs it on one member: every member
derives the inputs of *all* ranks from the case's seed, so each can compute the numpy reference
itself and check its own result; it returns a digest of its output, and `check_identical` demands the
same digest from every member (bit-identical results).

Inputs are chosen so that every result is exact and the reference is exact too: SUM/AVG take small
integers (in range for int8 and uint8 at world 5; AVG is one division of the exact sum, like the backend's),
PRODUCT takes factors in {-2, -1, 1, 2} ({1, 2} for uint8; 2**5 fits every dtype), MIN/MAX take arbitrary
values of the dtype, the bitwise ops arbitrary bit patterns; bool takes 0/1. So every comparison is exact.
Which (op, dtype) pairs a backend must reduce is its reductions table (`backend.REDUCTIONS` for tcp,
`nccl_buffers.REDUCTIONS` for nccl); `check_refusals` demands that every other pair raise TypeError at the
call, naming the op and the dtype, with the members still in step afterwards. `MOVE_ONLY` dtypes are only
moved (broadcast, all_gather, all_to_all, send/recv).

`Case.alias` gives the in-place variants: the input of all_gather, or the output of reduce_scatter, is a
view into the other buffer at this rank's own slot (`own`, the layout torch's FSDP2 and NCCL call in-place),
at the next rank's slot (`other`), or half a slot off (`offset`, overlapping two slots); for all_to_all `own`
means one buffer as both input and output. all_reduce and broadcast are in-place by definition (one
buffer). A backend that writes an output before it has read an aliased input fails these cases.

`Case.layout` shapes an all_to_all: `even` (no split sizes passed: equal segments of `shape`), `uneven`
(random segment sizes from the seed, zeros included), `gather` (every rank sends only to the root) and
`scatter` (only the root sends), the two patterns torch's gather and scatter run as.

Drive it with `check_backend(run_members, world, reductions)`, where run_members(fn) calls fn(backend) on
every member of a live group and returns the results in rank order (threads, processes, GPUs: your choice).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from p2pgen.collectives.backend import FLOAT_DTYPES, INT_DTYPES, REDUCTIONS, Backend, ReduceOp

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "send_recv", "barrier")
REDUCING = ("all_reduce", "reduce_scatter")
ALIASES = ("none", "own", "other", "offset")
ALIASED = ("all_gather", "reduce_scatter", "all_to_all")   # the collectives with a separate input and output
LAYOUTS = ("even", "uneven", "gather", "scatter")
OPS = tuple(op.value for op in ReduceOp)
MOVE_ONLY = ("int16",)
DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",) + MOVE_ONLY
_REDUCE = {"sum": np.add, "avg": np.add, "product": np.multiply, "min": np.minimum, "max": np.maximum,
           "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}
Reductions = dict[ReduceOp, tuple[str, ...]]


@dataclass(frozen=True)
class Case:
    collective: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    op: str = "sum"
    root: int = 0
    seed: int = 0
    torch: bool = False   # numpy arrays, or torch CPU tensors (bfloat16 needs torch)
    alias: str = "none"   # in-place variants (see the module docstring)
    layout: str = "even"  # all_to_all's segment sizes (see the module docstring)

    def __post_init__(self) -> None:
        if self.collective not in COLLECTIVES:
            raise ValueError(f"unknown collective {self.collective!r}; one of {COLLECTIVES}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; one of {DTYPES}")
        if self.dtype == "bfloat16" and not self.torch:
            raise ValueError("bfloat16 cases need torch=True")
        if self.op not in OPS:
            raise ValueError(f"unknown op {self.op!r}; one of {OPS}")
        if self.collective in REDUCING and self.dtype not in REDUCTIONS[ReduceOp(self.op)]:
            raise ValueError(f"{self.op} of {self.dtype} is not defined (see backend.REDUCTIONS)")
        if self.alias not in ALIASES:
            raise ValueError(f"unknown alias {self.alias!r}; one of {ALIASES}")
        if self.alias != "none" and self.collective not in ALIASED:
            raise ValueError(f"alias={self.alias!r} applies to {ALIASED} only, not {self.collective}")
        if self.layout not in LAYOUTS or self.layout != "even" and self.collective != "all_to_all":
            raise ValueError(f"layout={self.layout!r}: one of {LAYOUTS}, and other than 'even' only for all_to_all")
        if self.collective == "all_to_all" and self.alias not in ("none", "own"):
            raise ValueError("all_to_all's in-place variant is alias='own' (one buffer as input and output)")
        if self.collective == "all_to_all" and self.alias == "own" and self.layout != "even":
            raise ValueError("an in-place all_to_all needs layout='even' (input and output of one size)")


def splits_matrix(case: Case, world: int) -> list[list[int]]:
    """S[i][j]: elements rank i sends to rank j in an all_to_all case."""
    n = _prod(case.shape)
    root = case.root % world
    if case.layout == "even":
        return [[n] * world for _ in range(world)]
    if case.layout == "gather":
        return [[n if j == root else 0 for j in range(world)] for _ in range(world)]
    if case.layout == "scatter":
        return [[n if i == root else 0 for _ in range(world)] for i in range(world)]
    rng = np.random.default_rng([case.seed, 7])
    return [[int(c) for c in rng.integers(0, n + 1, size=world)] for _ in range(world)]


def inputs(case: Case, world: int) -> list[np.ndarray]:
    """Every rank's input, as float64/int64 numpy arrays exactly representable in case.dtype."""
    rng = np.random.default_rng(case.seed)
    if case.collective == "all_to_all":
        shapes = [(sum(row),) for row in splits_matrix(case, world)]
    elif case.collective == "reduce_scatter":
        shapes = [(world * _prod(case.shape),)] * world
    else:
        shapes = [case.shape] * world
    return [_values(rng, case, shape) for shape in shapes]


def _values(rng: np.random.Generator, case: Case, shape: tuple[int, ...]) -> np.ndarray:
    dtype, op = case.dtype, case.op
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(np.int64)
    if dtype in FLOAT_DTYPES:
        if op in ("min", "max"):
            return _round_to(rng.standard_normal(shape) * 1e3, dtype)
        if op == "product":
            return rng.choice([-2.0, -1.0, 1.0, 2.0], size=shape)
        return rng.integers(-40, 41, size=shape).astype(np.float64)
    info = np.iinfo(dtype)
    if op in ("min", "max", "band", "bor", "bxor"):
        return rng.integers(int(info.min), int(info.max), size=shape, endpoint=True, dtype=np.int64)
    if op == "product":
        return rng.choice([1, 2] if info.min == 0 else [-2, -1, 1, 2], size=shape).astype(np.int64)
    low, high = (0, 40) if info.min == 0 else (-20, 20) if info.bits == 8 else (-40, 40)
    return rng.integers(low, high + 1, size=shape).astype(np.int64)


def reference(case: Case, xs: Sequence[np.ndarray], rank: int) -> np.ndarray:
    """What rank `rank` must hold after the collective, in case.dtype (bfloat16 as float32 values)."""
    world = len(xs)
    typed = [_as_dtype(x, case.dtype) for x in xs]
    if case.collective in REDUCING:
        acc = typed[0].copy()
        for x in typed[1:]:
            _REDUCE[case.op](acc, x, out=acc)
        if case.op == "avg":
            acc = _round_to(acc / world, case.dtype) if case.dtype == "bfloat16" else acc / acc.dtype.type(world)
        if case.collective == "reduce_scatter":
            m = acc.size // world
            return acc[rank * m:(rank + 1) * m]
        return acc
    if case.collective == "all_gather":
        return np.stack(typed)
    if case.collective == "broadcast":
        return typed[case.root]
    if case.collective == "all_to_all":
        matrix = splits_matrix(case, world)
        return np.concatenate([typed[i][sum(matrix[i][:rank]):sum(matrix[i][:rank + 1])] for i in range(world)])
    if case.collective == "send_recv":
        return typed[(rank - 1) % world] if world > 1 else typed[rank]
    return np.zeros(0)


def run_case(backend: Backend, case: Case) -> str:
    """Run `case` on this member, check it against the reference, return the digest of the output."""
    world, rank = backend.world, backend.rank
    xs = inputs(case, world)
    mine = _make(xs[rank], case)
    if case.collective == "all_reduce":
        out = backend.all_reduce(mine, case.op)
    elif case.collective == "reduce_scatter":
        if case.alias == "none":
            out = _make(np.zeros(_prod(case.shape)), case)
        else:
            out = _window(mine, alias_offset(case.alias, rank, world, _prod(case.shape)), _prod(case.shape))
        backend.reduce_scatter(out, mine, case.op)
    elif case.collective == "all_gather":
        out = _make(np.zeros((world,) + case.shape), case)
        if case.alias != "none":
            n = _prod(case.shape)
            window = _window(out, alias_offset(case.alias, rank, world, n), n)
            window[...] = mine.reshape(-1)
            mine = window.reshape(case.shape)
        backend.all_gather(out, mine)
    elif case.collective == "broadcast":
        out = backend.broadcast(mine, case.root % world)
    elif case.collective == "all_to_all":
        out = _all_to_all(backend, mine, case)
    elif case.collective == "send_recv":
        out = _send_recv(backend, mine, case)
    else:
        backend.barrier()
        out = _make(np.zeros(0), case)
    got, want = _to_numpy(out, case), reference(_rooted(case, world), xs, rank)
    if got.shape != want.shape or not np.array_equal(got, want, equal_nan=True):
        raise AssertionError(f"rank {rank}/{world} {case}: result differs from the numpy reference\n"
                             f"got  {got.ravel()[:8]}...\nwant {want.ravel()[:8]}...")
    return xxhash.xxh3_64_hexdigest(np.ascontiguousarray(got).tobytes())


def check_identical(digests: Sequence[str], case: Case) -> None:
    """Members of a replicating collective hold the same bits (reduce_scatter, all_to_all and send/recv
    differ by design)."""
    if case.collective in ("reduce_scatter", "all_to_all", "send_recv"):
        return
    if len(set(digests)) != 1:
        raise AssertionError(f"{case}: members hold different bits: {list(digests)}")


def standard_cases(world: int, reductions: Reductions = REDUCTIONS) -> list[Case]:
    """A fixed list: every collective; every (op, dtype) pair `reductions` defines, on all_reduce and
    reduce_scatter; every dtype moved by every data-movement collective; all_to_all in every layout;
    sizes around the chunking; the in-place variants."""
    cases = [Case("barrier", ())]
    for i, dtype in enumerate(DTYPES):
        torch = dtype == "bfloat16" or i % 2 == 1
        for j, op in enumerate(OPS):
            if dtype not in reductions.get(ReduceOp(op), ()):
                continue
            big = op in ("sum", "max") and dtype in ("float32", "bfloat16", "int64")
            cases.append(Case("all_reduce", (3, 1001) if big else (2, 129), dtype, op, seed=i * 10 + j, torch=torch))
            cases.append(Case("reduce_scatter", (257,) if big else (33,), dtype, op, seed=i * 10 + j + 1,
                              torch=torch))
        cases.append(Case("all_gather", (5, 7), dtype, seed=i + 2, torch=torch))
        cases.append(Case("broadcast", (4099,) if dtype == "float64" else (67,), dtype, root=world - 1, seed=i + 3,
                          torch=torch))
        cases.append(Case("send_recv", (2, 3000) if dtype == "int32" else (5,), dtype, seed=i + 4, torch=torch))
        cases.append(Case("all_to_all", (3,), dtype, seed=i + 5, torch=torch))
    for k, layout in enumerate(LAYOUTS):
        for shape, dtype, torch in (((1500,), "float64", False), ((7,), "bfloat16", True)):
            cases.append(Case("all_to_all", shape, dtype, root=world - 1, seed=40 + k, torch=torch, layout=layout))
    cases.append(Case("all_reduce", (0,)))
    cases.append(Case("all_to_all", (0,), "int64"))
    cases.append(Case("all_reduce", (1,), "int64", "max"))
    cases += in_place_cases(world)
    return cases


def in_place_cases(world: int) -> list[Case]:
    """Every aliasing pattern of every two-buffer collective, numpy and torch, sizes around the chunking."""
    aliases = ALIASES[1:] if world > 1 else ("own",)
    cases = []
    for i, alias in enumerate(aliases):
        for collective in ALIASED:
            if collective == "all_to_all" and alias != "own":
                continue
            for shape, dtype, torch in (((5, 7), "float32", False), ((3001,), "bfloat16", True),
                                        ((1500,), "int64", True)):
                cases.append(Case(collective, shape, dtype, "sum", seed=10 + i, torch=torch, alias=alias))
    return cases


def alias_offset(alias: str, rank: int, world: int, n: int) -> int:
    """Element offset of the aliased n-element window inside the world*n-element buffer."""
    if alias == "own" or world == 1:
        return rank * n
    if alias == "other":
        return ((rank + 1) % world) * n
    return min(rank * n + n // 2 + 1, (world - 1) * n)    # "offset": straddles two slots


def check_backend(run_members: Callable[[Callable[[Backend], Any]], list[Any]], world: int,
                  reductions: Reductions = REDUCTIONS) -> None:
    """Run every standard case on a live group of `world` members, then the refusals; raises AssertionError
    on a failure."""
    for case in standard_cases(world, reductions):
        check_identical(run_members(lambda b, c=case: run_case(b, c)), case)
    check_refusals(run_members, reductions)


def refused_pairs(reductions: Reductions) -> list[tuple[str, str]]:
    """(op, dtype) pairs of this suite that `reductions` does not define: the backend must refuse them."""
    return [(op, dtype) for op in OPS for dtype in DTYPES if dtype not in reductions.get(ReduceOp(op), ())]


def check_refusals(run_members: Callable[[Callable[[Backend], Any]], list[Any]], reductions: Reductions) -> None:
    """Every member calls all_reduce and reduce_scatter with every refused (op, dtype) pair: each must raise
    TypeError naming the op and the dtype, before anything is sent, so a SUM all_reduce afterwards still
    gives the right answer."""
    pairs = refused_pairs(reductions)

    def body(backend: Backend) -> int:
        for op, dtype in pairs:
            buf = _make(np.zeros(backend.world * 2), Case("broadcast", (), dtype, torch=True))
            for name, call in (("all_reduce", lambda: backend.all_reduce(buf, op)),
                               ("reduce_scatter", lambda: backend.reduce_scatter(buf[:2], buf, op))):
                try:
                    call()
                except TypeError as e:
                    if op not in str(e) or dtype not in str(e) or name not in str(e):
                        raise AssertionError(f"{name} of {op} on {dtype}: the error does not name the "
                                             f"collective, op and dtype: {e}") from None
                else:
                    raise AssertionError(f"{name} of {op} on {dtype} did not raise TypeError")
        check = np.ones(3, np.int64)
        backend.all_reduce(check)
        return int(check[0])

    counts = run_members(body)
    if any(c != len(counts) for c in counts):
        raise AssertionError(f"after the refusals a SUM all_reduce of ones gave {counts}: members out of step")


# ---- helpers -------------------------------------------------------------------------------------
def _all_to_all(backend: Backend, mine: Any, case: Case) -> Any:
    world, rank = backend.world, backend.rank
    matrix = splits_matrix(case, world)
    if case.alias == "own":
        backend.all_to_all(mine, mine)
        return mine
    out = _make(np.zeros(sum(row[rank] for row in matrix)), case)
    if case.layout == "even":
        backend.all_to_all(out, mine)
    else:
        backend.all_to_all(out, mine, [row[rank] for row in matrix], matrix[rank])
    return out


def _send_recv(backend: Backend, mine: Any, case: Case) -> Any:
    """A ring shift: rank r sends to r+1 and receives from r-1 (rank 0 sends first, the rest receive first)."""
    world, rank = backend.world, backend.rank
    if world == 1:
        return mine
    out = _make(np.zeros(case.shape), case)
    if rank == 0:
        backend.send(mine, 1 % world)
        backend.recv(out, world - 1)
    else:
        backend.recv(out, rank - 1)
        backend.send(mine, (rank + 1) % world)
    return out


def _rooted(case: Case, world: int) -> Case:
    return Case(case.collective, case.shape, case.dtype, case.op, case.root % world, case.seed, case.torch,
                case.alias, case.layout)


def _window(buf: Any, offset: int, n: int) -> Any:
    """A flat n-element view of `buf` (numpy array or torch tensor) starting at element `offset`."""
    return buf.reshape(-1)[offset:offset + n]


def _prod(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        import torch

        return torch.from_numpy(np.asarray(x, np.float32)).to(torch.bfloat16).float().numpy().astype(np.float64)
    return np.asarray(x).astype(dtype).astype(np.float64)


def _as_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    return x.astype(np.float32 if dtype == "bfloat16" else dtype)


def _make(x: np.ndarray, case: Case) -> Any:
    if not case.torch:
        return np.array(x, copy=True).astype(case.dtype)
    import torch

    return torch.from_numpy(np.array(x, copy=True)).to(getattr(torch, case.dtype))


def _to_numpy(out: Any, case: Case) -> np.ndarray:
    if isinstance(out, np.ndarray):
        return out
    return out.float().numpy() if case.dtype == "bfloat16" else out.numpy()

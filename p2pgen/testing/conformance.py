"""Conformance suite every collective Backend must pass (tcp now, nccl later).

A `Case` names one collective call. `run_case(backend, case)` runs it on one member: every member
derives the inputs of *all* ranks from the case's seed, so each can compute the numpy reference
itself and check its own result; it returns a digest of its output, and `check_identical` demands the
same digest from every member (bit-identical results).

Inputs of SUM/AVG cases are small integers in every dtype, so any summation order is exact and the
reference is exact too (AVG: one division of the exact sum, like the backend's); MIN/MAX cases use
arbitrary values. So every comparison is exact equality.

`Case.alias` gives the in-place variants: the input of all_gather, or the output of reduce_scatter, is a
view into the other buffer at this rank's own slot (`own`, the layout torch's FSDP2 and NCCL call in-place),
at the next rank's slot (`other`), or half a slot off (`offset`, overlapping two slots). all_reduce and
broadcast are in-place by definition (one buffer). A backend that writes an output before it has read an
aliased input fails these cases.

Drive it with `check_backend(run_members, world)`, where run_members(fn) calls fn(backend) on every
member of a live group and returns the results in rank order (threads, processes, GPUs: your choice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import xxhash

from p2pgen.collectives.backend import Backend

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "send_recv", "barrier")
ALIASES = ("none", "own", "other", "offset")
ALIASED = ("all_gather", "reduce_scatter")   # the collectives with a separate input and output
OPS = ("sum", "avg", "min", "max")
FLOAT_DTYPES = ("float32", "float64", "bfloat16")
DTYPES = FLOAT_DTYPES + ("int32", "int64")
_REDUCE = {"sum": np.add, "avg": np.add, "min": np.minimum, "max": np.maximum}


@dataclass(frozen=True)
class Case:
    collective: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    op: str = "sum"
    root: int = 0
    seed: int = 0
    torch: bool = False   # numpy arrays, or torch CPU tensors (bfloat16 needs torch)
    alias: str = "none"   # in-place variants of all_gather / reduce_scatter (see the module docstring)

    def __post_init__(self) -> None:
        if self.collective not in COLLECTIVES:
            raise ValueError(f"unknown collective {self.collective!r}; one of {COLLECTIVES}")
        if self.dtype == "bfloat16" and not self.torch:
            raise ValueError("bfloat16 cases need torch=True")
        if self.op == "avg" and self.dtype not in FLOAT_DTYPES:
            raise ValueError(f"avg of {self.dtype} is not defined")
        if self.alias not in ALIASES:
            raise ValueError(f"unknown alias {self.alias!r}; one of {ALIASES}")
        if self.alias != "none" and self.collective not in ALIASED:
            raise ValueError(f"alias={self.alias!r} applies to {ALIASED} only, not {self.collective}")


def inputs(case: Case, world: int) -> list[np.ndarray]:
    """Every rank's input, as float64/int64 numpy arrays exactly representable in case.dtype."""
    rng = np.random.default_rng(case.seed)
    shape = (world * _prod(case.shape),) if case.collective == "reduce_scatter" else case.shape
    out = []
    for _ in range(world):
        if case.dtype in FLOAT_DTYPES and case.op in ("min", "max"):
            x = rng.standard_normal(shape) * 1e3
            out.append(_round_to(x, case.dtype))
        else:
            out.append(rng.integers(-40, 41, size=shape).astype(np.float64 if case.dtype in FLOAT_DTYPES
                                                              else np.int64))
    return out


def reference(case: Case, xs: Sequence[np.ndarray], rank: int) -> np.ndarray:
    """What rank `rank` must hold after the collective, in case.dtype (bfloat16 as float32 values)."""
    world = len(xs)
    typed = [_as_dtype(x, case.dtype) for x in xs]
    if case.collective in ("all_reduce", "reduce_scatter"):
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
    """Members of a replicating collective hold the same bits (reduce_scatter and send/recv differ by design)."""
    if case.collective in ("reduce_scatter", "send_recv"):
        return
    if len(set(digests)) != 1:
        raise AssertionError(f"{case}: members hold different bits: {list(digests)}")


def standard_cases(world: int) -> list[Case]:
    """A fixed smoke list: every collective, op and dtype at least once, sizes around the chunking."""
    cases = [Case("barrier", ())]
    for i, dtype in enumerate(DTYPES):
        torch = dtype == "bfloat16" or i % 2 == 1
        for op in OPS:
            if op == "avg" and dtype not in FLOAT_DTYPES:
                continue
            cases.append(Case("all_reduce", (3, 1001), dtype, op, seed=i, torch=torch))
            cases.append(Case("reduce_scatter", (257,), dtype, op, seed=i + 1, torch=torch))
        cases.append(Case("all_gather", (5, 7), dtype, seed=i + 2, torch=torch))
        cases.append(Case("broadcast", (4099,), dtype, root=world - 1, seed=i + 3, torch=torch))
        cases.append(Case("send_recv", (2, 3000), dtype, seed=i + 4, torch=torch))
    cases.append(Case("all_reduce", (0,)))
    cases.append(Case("all_reduce", (1,), "int64", "max"))
    cases += in_place_cases(world)
    return cases


def in_place_cases(world: int) -> list[Case]:
    """Every aliasing pattern of every two-buffer collective, numpy and torch, sizes around the chunking."""
    aliases = ALIASES[1:] if world > 1 else ("own",)
    cases = []
    for i, alias in enumerate(aliases):
        for collective in ALIASED:
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


def check_backend(run_members: Callable[[Callable[[Backend], Any]], list[Any]], world: int) -> None:
    """Run every standard case on a live group of `world` members; raises AssertionError on a failure."""
    for case in standard_cases(world):
        check_identical(run_members(lambda b, c=case: run_case(b, c)), case)


# ---- helpers -------------------------------------------------------------------------------------
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
                case.alias)


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
        return np.array(x, dtype=case.dtype, copy=True)
    import torch

    return torch.from_numpy(np.array(x, copy=True)).to(getattr(torch, case.dtype))


def _to_numpy(out: Any, case: Case) -> np.ndarray:
    if isinstance(out, np.ndarray):
        return out
    return out.float().numpy() if case.dtype == "bfloat16" else out.numpy()

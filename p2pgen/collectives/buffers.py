"""User buffers (numpy arrays, torch CPU tensors) as flat element views, and the reduction kernels.

Invariant: a Flat shares memory with the user's buffer (no copy); bfloat16 travels as its raw 16-bit
pattern and is reduced by torch, everything else by numpy, always element-wise, so a reduction gives the
same bits on every member that runs it on the same inputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from p2pgen.collectives.backend import ReduceOp

NUMPY_DTYPES = (np.float32, np.float64, np.int32, np.int64)
_NP_KERNELS = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum}


class Flat:
    """`elems`: 1-D numpy view of the buffer (int16 bit patterns for bfloat16); `raw`: its bytes."""

    def __init__(self, obj: Any, what: str) -> None:
        self.obj = obj
        self.bf16 = False
        if isinstance(obj, np.ndarray):
            self.elems = _numpy_view(obj, what)
        elif type(obj).__module__.startswith("torch"):
            self.elems, self.bf16 = _torch_view(obj, what)
        else:
            raise TypeError(f"{what} is a {type(obj).__name__}: pass a numpy array or a torch CPU tensor")
        self.raw = self.elems.view(np.uint8)
        self.dtype_name = "bfloat16" if self.bf16 else self.elems.dtype.name

    @property
    def size(self) -> int:
        return self.elems.size

    @property
    def is_integer(self) -> bool:
        return not self.bf16 and self.elems.dtype.kind == "i"

    def same_kind(self, other: "Flat") -> bool:
        return self.dtype_name == other.dtype_name


def _numpy_view(arr: np.ndarray, what: str) -> np.ndarray:
    if arr.dtype.type not in NUMPY_DTYPES:
        raise TypeError(f"{what} has dtype {arr.dtype}; supported: float32, float64, int32, int64")
    if not arr.flags.c_contiguous or not arr.flags.writeable:
        raise ValueError(f"{what} must be a writable C-contiguous array: pass np.ascontiguousarray(x)")
    return arr.reshape(-1)


def _torch_view(t: Any, what: str) -> tuple[np.ndarray, bool]:
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} is a {type(t).__name__}: pass a numpy array or a torch CPU tensor")
    if t.device.type != "cpu":
        raise ValueError(f"{what} is on {t.device}: the tcp backend takes CPU tensors (use nccl for GPUs)")
    if not t.is_contiguous():
        raise ValueError(f"{what} is not contiguous: pass x.contiguous()")
    flat = t.detach().view(-1)
    if t.dtype == torch.bfloat16:
        return flat.view(torch.int16).numpy(), True
    if t.dtype not in (torch.float32, torch.float64, torch.int32, torch.int64):
        raise TypeError(f"{what} has dtype {t.dtype}; supported: float32, float64, bfloat16, int32, int64")
    return flat.numpy(), False


def combine(op: ReduceOp, bf16: bool, out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """out = op(a, b), element-wise; `out` may alias `a`."""
    if not bf16:
        _NP_KERNELS[op](a, b, out=out)
        return
    import torch

    ta, tb, to = (torch.from_numpy(x).view(torch.bfloat16) for x in (a, b, out))
    {ReduceOp.SUM: torch.add, ReduceOp.AVG: torch.add, ReduceOp.MIN: torch.minimum,
     ReduceOp.MAX: torch.maximum}[op](ta, tb, out=to)


def divide(bf16: bool, arr: np.ndarray, n: int) -> None:
    """arr /= n in place (the final step of AVG, run by exactly one member per element)."""
    if not bf16:
        np.divide(arr, arr.dtype.type(n), out=arr)
        return
    import torch

    torch.from_numpy(arr).view(torch.bfloat16).div_(n)

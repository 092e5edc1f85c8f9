"""User buffers (numpy arrays, torch CPU tensors) as flat element views, and the reduction kernels.

Invariant: a Flat shares memory with the user's buffer (no copy) and has the user's element size. Dtypes
numpy lacks travel as integers of the same size (bfloat16 as its 16-bit pattern, float8 as bytes); only
bfloat16 among them is reduced, by torch, everything else by numpy, always element-wise, so a reduction
gives the same bits on every member that runs it on the same inputs. Which op a dtype takes is
`backend.REDUCTIONS`; data movement takes every dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from p2pgen.collectives.backend import ReduceOp

NUMPY_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                "uint64", "bool", "complex64", "complex128")
_BITS = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}      # dtypes numpy lacks, by element size
_NP_KERNELS = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PRODUCT: np.multiply,
               ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and,
               ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor}
_TORCH_KERNELS = {ReduceOp.SUM: "add", ReduceOp.AVG: "add", ReduceOp.PRODUCT: "mul", ReduceOp.MIN: "minimum",
                  ReduceOp.MAX: "maximum"}


class Flat:
    """`elems`: 1-D numpy view of the buffer (bit patterns for dtypes numpy lacks); `raw`: its bytes;
    `dtype_name`: the user's dtype (`bfloat16`, `float32`, ...)."""

    def __init__(self, obj: Any, what: str) -> None:
        self.obj = obj
        if isinstance(obj, np.ndarray):
            self.elems, self.dtype_name = _numpy_view(obj, what), obj.dtype.name
        elif type(obj).__module__.startswith("torch"):
            self.elems, self.dtype_name = _torch_view(obj, what)
        else:
            raise TypeError(f"{what} is a {type(obj).__name__}: pass a numpy array or a torch CPU tensor")
        self.raw = self.elems.view(np.uint8)

    @property
    def bf16(self) -> bool:
        return self.dtype_name == "bfloat16"

    @property
    def size(self) -> int:
        return self.elems.size

    def same_kind(self, other: Flat) -> bool:
        return self.dtype_name == other.dtype_name


def _numpy_view(arr: np.ndarray, what: str) -> np.ndarray:
    if arr.dtype.name not in NUMPY_DTYPES or not arr.dtype.isnative:
        raise TypeError(f"{what} has dtype {arr.dtype}; supported: {', '.join(NUMPY_DTYPES)} (native byte order)")
    if not arr.flags.c_contiguous or not arr.flags.writeable:
        raise ValueError(f"{what} must be a writable C-contiguous array: pass np.ascontiguousarray(x)")
    return arr.reshape(-1)


def _torch_view(t: Any, what: str) -> tuple[np.ndarray, str]:
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} is a {type(t).__name__}: pass a numpy array or a torch CPU tensor")
    if t.device.type != "cpu":
        raise ValueError(f"{what} is on {t.device}: the tcp backend takes CPU tensors (use nccl for GPUs)")
    if not t.is_contiguous():
        raise ValueError(f"{what} is not contiguous: pass x.contiguous()")
    if t.is_quantized or t.is_sparse or t.dtype.is_complex and t.is_conj():
        raise TypeError(f"{what} is a quantized, sparse or lazily conjugated tensor: pass a plain dense tensor")
    name = str(t.dtype).removeprefix("torch.")
    flat = t.detach().view(-1)
    if name in NUMPY_DTYPES:
        return flat.numpy(), name
    bits = _BITS.get(t.element_size())
    if bits is None:
        raise TypeError(f"{what} has dtype {t.dtype} ({t.element_size()} bytes per element), which p2pgen "
                        "cannot move; use a dtype of 1, 2, 4 or 8 bytes")
    return flat.view(getattr(torch, np.dtype(bits).name)).numpy(), name


def combine(op: ReduceOp, bf16: bool, out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """out = op(a, b), element-wise; `out` may be `a` or `b` (exactly). The caller checked that op takes the dtype."""
    if not bf16:
        _NP_KERNELS[op](a, b, out=out)
        return
    import torch

    ta, tb, to = (torch.from_numpy(x).view(torch.bfloat16) for x in (a, b, out))
    getattr(torch, _TORCH_KERNELS[op])(ta, tb, out=to)


def divide(bf16: bool, arr: np.ndarray, n: int) -> None:
    """arr /= n in place (the final step of AVG, run by exactly one member per element)."""
    if not bf16:
        np.divide(arr, arr.dtype.type(n), out=arr)
        return
    import torch

    torch.from_numpy(arr).view(torch.bfloat16).div_(n)

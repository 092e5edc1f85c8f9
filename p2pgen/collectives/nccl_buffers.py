"""What the nccl backend passes to NCCL for a user buffer: a device pointer, an element count, an NCCL
datatype and the device it lives on; plus the reduce-op mapping. Pure functions, no CUDA call.

Buffers are CuPy arrays (`a.data.ptr`, `a.size`, `a.dtype`, `a.device.id`) or torch CUDA tensors
(`t.data_ptr()`, `t.numel()`, `t.dtype`, `t.device.index`), taken as they are: no copy, no conversion.
Numpy arrays and torch CPU tensors are described too (`host=True`), for the fake NCCL of the CPU tests.

Datatypes: NCCL's own (`DTYPES`) travel as themselves; bool travels as uint8 (0/1), as torch's
ProcessGroupNCCL does, with SUM reduced as MAX (both a logical or; uint8 SUM could overflow past 1); any other
dtype (int16, float8, complex, ...) only moves, as bytes (`wire`). Reductions (`REDUCTIONS`): SUM, PRODUCT,
MIN, MAX on float, integer and bool dtypes, AVG on floats (NCCL >= 2.10); NCCL has no bitwise ops.

Invariant: a `DevBuf` covers exactly the user's elements (C-contiguous, so `ptr .. ptr + nbytes`); datatypes
and ops outside the tables are refused with a message naming what is supported, never mapped to a neighbour
(bool's SUM-as-MAX is the same reduction, not a neighbour).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from p2pgen.collectives.backend import FLOAT_DTYPES, INT_DTYPES, ReduceOp, check_reduction

# cupy_backends/cuda/libs/nccl.pxd: ncclDataType_t and ncclRedOp_t values, looked up by name on the module.
DTYPES = {"int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "uint32": "NCCL_UINT32",
          "int64": "NCCL_INT64", "uint64": "NCCL_UINT64", "float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32",
          "float64": "NCCL_FLOAT64", "bfloat16": "NCCL_BFLOAT16", "bool": "NCCL_UINT8"}
ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8,
            "uint64": 8, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "complex64": 8, "complex128": 16,
            "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1}
OPS = {ReduceOp.SUM: "NCCL_SUM", ReduceOp.AVG: "NCCL_AVG", ReduceOp.PRODUCT: "NCCL_PROD",
       ReduceOp.MIN: "NCCL_MIN", ReduceOp.MAX: "NCCL_MAX"}
_ARITHMETIC = FLOAT_DTYPES + INT_DTYPES + ("bool",)
REDUCTIONS: dict[ReduceOp, tuple[str, ...]] = {
    ReduceOp.SUM: _ARITHMETIC, ReduceOp.PRODUCT: _ARITHMETIC, ReduceOp.MIN: _ARITHMETIC,
    ReduceOp.MAX: _ARITHMETIC, ReduceOp.AVG: FLOAT_DTYPES}
AVG_MIN_VERSION = 21000        # ncclAvg exists from NCCL 2.10 (version code 2*10000 + 10*100)


@dataclass(frozen=True)
class DevBuf:
    obj: Any
    ptr: int
    count: int
    dtype: str
    device: int                # CUDA device index (-1: host memory, fake NCCL only)
    framework: str             # "cupy" | "torch" | "numpy"

    @property
    def nbytes(self) -> int:
        return self.count * ITEMSIZE[self.dtype]

    def overlaps(self, other: DevBuf) -> bool:
        return (self.nbytes > 0 and other.nbytes > 0 and self.device == other.device
                and self.ptr < other.ptr + other.nbytes and other.ptr < self.ptr + self.nbytes)


def describe(obj: Any, what: str, host: bool = False) -> DevBuf:
    """The DevBuf of a CuPy array or torch CUDA tensor (`host=True`: of a numpy array or torch CPU tensor)."""
    module = type(obj).__module__.split(".")[0]
    if module == "torch":
        buf = _torch(obj, what, host)
    elif module == "cupy" and not host:
        buf = _cupy(obj, what)
    elif module == "numpy" and host:
        buf = _numpy(obj, what)
    else:
        wanted = "a numpy array or torch CPU tensor" if host else "a CuPy array or a torch CUDA tensor"
        raise TypeError(f"{what} is a {type(obj).__module__}.{type(obj).__name__}: pass {wanted}")
    if buf.dtype not in ITEMSIZE:
        raise TypeError(f"{what} has dtype {buf.dtype}; supported: {', '.join(ITEMSIZE)}")
    return buf


def nccl_dtype(nccl: Any, buf: DevBuf, what: str = "this collective") -> int:
    """NCCL's datatype for a reduction on `buf` (its own dtype; bool as uint8)."""
    if buf.dtype not in DTYPES:
        raise TypeError(f"{what}: NCCL cannot reduce {buf.dtype}; it reduces {', '.join(DTYPES)}")
    return int(getattr(nccl, DTYPES[buf.dtype]))


def wire(nccl: Any, buf: DevBuf) -> tuple[int, int]:
    """(NCCL datatype, count) that moves `buf`'s bytes unchanged: its own dtype if NCCL has it, else bytes."""
    if buf.dtype in DTYPES:
        return int(getattr(nccl, DTYPES[buf.dtype])), buf.count
    return int(nccl.NCCL_UINT8), buf.nbytes


def nccl_op(nccl: Any, op: ReduceOp, buf: DevBuf, version: int, what: str = "this collective") -> int:
    """NCCL's op for `op` on `buf` (REDUCTIONS); AVG also needs NCCL >= 2.10; bool SUM is MAX."""
    check_reduction(f"{what} (nccl)", op, buf.dtype, REDUCTIONS)
    if op is ReduceOp.AVG and version < AVG_MIN_VERSION:
        raise ValueError(f"avg needs NCCL 2.10 or newer (this NCCL is {version_text(version)}): use sum")
    if buf.dtype == "bool" and op is ReduceOp.SUM:
        op = ReduceOp.MAX
    return int(getattr(nccl, OPS[op]))


def version_text(code: int) -> str:
    """2.21.5 for 22105 (NCCL >= 2.9 encodes major*10000 + minor*100 + patch; older major*1000 + ...)."""
    if code >= 20000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def _torch(t: Any, what: str, host: bool) -> DevBuf:
    kind = t.device.type
    if host and kind != "cpu" or not host and kind != "cuda":
        raise ValueError(f"{what} is on {t.device}: the nccl backend takes CUDA tensors "
                         "(for CPU tensors use --backend tcp)" if not host else
                         f"{what} is on {t.device}: the fake NCCL works on host memory")
    if not t.is_contiguous():
        raise ValueError(f"{what} is not contiguous: pass x.contiguous()")
    dtype = str(t.dtype).removeprefix("torch.")
    return DevBuf(t, int(t.data_ptr()), int(t.numel()), dtype, -1 if host else int(t.device.index), "torch")


def _cupy(a: Any, what: str) -> DevBuf:
    if not a.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous: pass cupy.ascontiguousarray(x)")
    return DevBuf(a, int(a.data.ptr), int(a.size), a.dtype.name, int(a.device.id), "cupy")


def _numpy(a: Any, what: str) -> DevBuf:
    if not a.flags.c_contiguous or not a.flags.writeable:
        raise ValueError(f"{what} must be a writable C-contiguous array: pass np.ascontiguousarray(x)")
    return DevBuf(a, int(a.ctypes.data), int(a.size), a.dtype.name, -1, "numpy")

"""What the nccl backend passes to NCCL for a user buffer: a device pointer, an element count, an NCCL
datatype and the device it lives on; plus the reduce-op mapping. Pure functions, no CUDA call.

Buffers are CuPy arrays (`a.data.ptr`, `a.size`, `a.dtype`, `a.device.id`) or torch CUDA tensors
(`t.data_ptr()`, `t.numel()`, `t.dtype`, `t.device.index`), taken as they are: no copy, no conversion.
Numpy arrays and torch CPU tensors are described too (`host=True`), for the fake NCCL of the CPU tests.

Invariant: a `DevBuf` covers exactly the user's elements (C-contiguous, so `ptr .. ptr + nbytes`); datatypes
and ops outside the tables are refused with a message, never mapped to a neighbour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from p2pgen.collectives.backend import ReduceOp

# cupy_backends/cuda/libs/nccl.pxd: ncclDataType_t and ncclRedOp_t values, looked up by name on the module.
DTYPES = {"int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "int64": "NCCL_INT64",
          "float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
          "bfloat16": "NCCL_BFLOAT16"}
ITEMSIZE = {"int8": 1, "uint8": 1, "int32": 4, "int64": 8, "float16": 2, "float32": 4, "float64": 8, "bfloat16": 2}
OPS = {ReduceOp.SUM: "NCCL_SUM", ReduceOp.AVG: "NCCL_AVG", ReduceOp.MIN: "NCCL_MIN", ReduceOp.MAX: "NCCL_MAX"}
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

    @property
    def is_integer(self) -> bool:
        return self.dtype.startswith(("int", "uint"))

    def overlaps(self, other: "DevBuf") -> bool:
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
    if buf.dtype not in DTYPES:
        raise TypeError(f"{what} has dtype {buf.dtype}; supported: {', '.join(DTYPES)}")
    return buf


def nccl_dtype(nccl: Any, buf: DevBuf) -> int:
    return int(getattr(nccl, DTYPES[buf.dtype]))


def nccl_op(nccl: Any, op: ReduceOp, buf: DevBuf, version: int) -> int:
    """NCCL's op for `op` on `buf`; AVG needs a float buffer and NCCL >= 2.10."""
    if op is ReduceOp.AVG:
        if buf.is_integer:
            raise TypeError(f"avg of {buf.dtype} is not defined: use sum and divide as you need")
        if version < AVG_MIN_VERSION:
            raise ValueError(f"avg needs NCCL 2.10 or newer (this NCCL is {version_text(version)}): use sum")
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

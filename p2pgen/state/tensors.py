"""Byte-level access to the tensors of a SharedState: numpy arrays and torch tensors (CPU or CUDA).

Owns: the canonical description of a tensor (dtype name, shape, byte size), a read-only byte view for
hashing and sending, an in-place write of verified bytes, and the change counter used by the digest
cache. torch is imported only when a torch tensor is seen, so numpy-only processes never load it.

Invariant: the bytes hashed, sent and written are the tensor's elements in C order, so two tensors with
equal dtype name, shape and elements have equal bytes whatever their memory layout or device.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np


def is_torch(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def check(name: str, value: Any) -> None:
    """Raise TypeError/ValueError if `value` cannot be shared as a tensor."""
    if is_torch(value):
        if value.layout != sys.modules["torch"].strided:
            raise TypeError(f"tensor {name!r} has layout {value.layout}: only dense (strided) tensors can be shared")
        return
    if not isinstance(value, np.ndarray):
        raise TypeError(f"tensor {name!r} is a {type(value).__name__}: share a numpy array or a torch tensor, "
                        "or put small values in `objects`")
    if value.dtype.hasobject:
        raise TypeError(f"numpy array {name!r} holds Python objects: put it in `objects` instead")
    if not value.dtype.isnative:
        raise ValueError(f"numpy array {name!r} is not in native byte order: convert it with "
                         "`a.astype(a.dtype.newbyteorder('='))`")


def dtype_name(value: Any) -> str:
    """'float32', 'bfloat16', ...: the same name for a numpy array and a torch tensor of one dtype."""
    if is_torch(value):
        return str(value.dtype).removeprefix("torch.")
    return value.dtype.name


def shape(value: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in value.shape)


def nbytes(value: Any) -> int:
    if is_torch(value):
        return value.numel() * value.element_size()
    return int(value.nbytes)


def version(value: Any) -> int | None:
    """torch's in-place modification counter (`_version`); None for numpy, which has none."""
    return int(value._version) if is_torch(value) else None


def identity(value: Any) -> tuple[int, int]:
    """(id, data address): changes when the entry is replaced or its storage reallocated."""
    if is_torch(value):
        return (id(value), int(value.data_ptr()))
    return (id(value), int(value.__array_interface__["data"][0]))


def host_bytes(value: Any) -> np.ndarray:
    """A 1-D uint8 array of the elements in C order: a view when the tensor is contiguous on the CPU,
    else a copy (non-contiguous tensors, CUDA tensors)."""
    if is_torch(value):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        return t.contiguous().reshape(-1).view(sys.modules["torch"].uint8).numpy()
    return np.ascontiguousarray(value).reshape(-1).view(np.uint8)


def writable_bytes(value: Any) -> np.ndarray | None:
    """A writable 1-D uint8 view of the tensor's own memory (contiguous CPU tensors), or None (CUDA,
    non-contiguous, read-only). Writes through it are invisible to torch's `_version`: call
    `mark_written` afterwards."""
    if is_torch(value):
        if value.device.type != "cpu" or not value.is_contiguous():
            return None
        return value.detach().reshape(-1).view(sys.modules["torch"].uint8).numpy()
    if not (value.flags.c_contiguous and value.flags.writeable):
        return None
    return value.reshape(-1).view(np.uint8)


def mark_written(value: Any) -> None:
    """Tell torch that `value` was written behind its back (bumps `_version`, as an in-place op would,
    so autograd and the digest cache see the change); nothing for numpy."""
    if is_torch(value):
        sys.modules["torch"].autograd.graph.increment_version(value)


def write_in_place(value: Any, data: np.ndarray) -> None:
    """Copy verified bytes `data` (1-D uint8, len == nbytes(value)) into `value` without replacing it,
    so references held elsewhere (optimizer state, module parameters) stay valid."""
    if is_torch(value):
        torch = sys.modules["torch"]
        src = torch.from_numpy(data).view(value.dtype).reshape(value.shape)
        with torch.no_grad():
            value.copy_(src)
        return
    value[...] = data.view(value.dtype).reshape(value.shape)

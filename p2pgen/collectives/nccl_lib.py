"""Finding `cupy.cuda.nccl` and the libnccl it binds to, without importing CuPy at package import.

How CuPy finds libnccl (cupy/_environment.py, `_preload_library('nccl')`, CuPy 13/14 wheels): it first looks
for the copy that `python -m cupyx.tools.install_library --library nccl --cuda 12.x` puts under
`$CUPY_CUDA_LIB_PATH` (default `~/.cupy/cuda_lib`), then asks the dynamic loader for `libnccl.so.2`
(LD_LIBRARY_PATH, ldconfig). The `nvidia-nccl-cu12`/`-cu13` wheels install `site-packages/nvidia/nccl/lib/
libnccl.so.2`, which is on neither path. So before importing `cupy.cuda.nccl`, `load()` loads that file
itself (by path, RTLD_GLOBAL): the loader then resolves CuPy's `libnccl.so.2` dependency to the library
already in the process. `$P2PGEN_NCCL_LIB` names another file to load instead; torch CUDA wheels load the
same wheel's library when `torch` is imported first.

Invariant: importing this module imports nothing from CuPy or CUDA; `load()` either returns a usable module or
raises `NcclUnavailable` saying what is missing and how to install it.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import os
from typing import Any

from p2pgen.errors import P2PGenError

WHEELS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12")
INSTALL_HINT = 'pip install -e ".[gpu]"  (cupy-cuda12x and nvidia-nccl-cu12)'


class NcclUnavailable(P2PGenError):
    """CuPy, its NCCL binding or libnccl cannot be loaded here."""


def wheel_library() -> str | None:
    """Path of libnccl.so.2 from an installed nvidia-nccl wheel, or None."""
    for name in WHEELS:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        path = str(dist.locate_file("nvidia/nccl/lib/libnccl.so.2"))
        if os.path.exists(path):
            return path
    return None


def load() -> Any:
    """`cupy.cuda.nccl`, with libnccl preloaded from `$P2PGEN_NCCL_LIB` or the nvidia-nccl wheel if present."""
    path = os.environ.get("P2PGEN_NCCL_LIB") or wheel_library()
    if path:
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise NcclUnavailable(f"could not load libnccl from {path}: {e}") from None
    try:
        module = importlib.import_module("cupy.cuda.nccl")
    except ImportError as e:
        raise NcclUnavailable(f"CuPy is not importable ({e}): {INSTALL_HINT}") from None
    if not getattr(module, "available", False):
        raise NcclUnavailable(f"CuPy found no libnccl.so.2 (looked for it{' at ' + path if path else ''} and "
                              f"on the loader path): {INSTALL_HINT}, or set P2PGEN_NCCL_LIB")
    return module


def cupy_major() -> int:
    """CuPy's major version (13: unique id as a tuple of chars; 14: bytes)."""
    import cupy

    return int(cupy.__version__.split(".")[0])

"""GPU tests: each one is marked `gpu` and skipped, with the reason, where CuPy, its NCCL or a CUDA device is
missing (always the case in CI)."""

from __future__ import annotations

import pytest


def _why_not() -> str | None:
    try:
        from p2pgen.collectives import nccl_lib

        nccl_lib.load()
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device"
    except Exception as e:      # any reason CuPy/NCCL/CUDA is unusable here is a skip reason
        return f"{type(e).__name__}: {e}"
    return None


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            reason = reason or _why_not() or "ok"
            if reason != "ok":
                item.add_marker(pytest.mark.skip(reason=f"needs a GPU with CuPy NCCL: {reason}"))

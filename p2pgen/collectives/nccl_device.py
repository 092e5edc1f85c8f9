"""The CUDA side of the nccl backend through CuPy: current device, streams, events, workspace, copies.

`CupyDevice` is the real implementation; `p2pgen.testing.fake_nccl.FakeDevice` has the same methods on host
memory. The backend never touches CUDA except through one of them, so its lifecycle and watchdog logic run
on the CPU in tests.

Streams: a collective runs on the stream the caller is using for its buffer (CuPy: the current stream;
torch: `torch.cuda.current_stream(device)`, wrapped with `cupy.cuda.ExternalStream`), so it is ordered with
the caller's own kernels and needs no synchronisation of its own. Completion is observed with a CUDA event
recorded after the collective (`cudaEventQuery` through `Event.done`), never by blocking the host.
"""

from __future__ import annotations

from typing import Any

from p2pgen.collectives.nccl_buffers import DevBuf, describe


class CupyDevice:
    """CUDA through CuPy (imported here, when a nccl backend is built, never at package import)."""

    host = False

    def __init__(self) -> None:
        import cupy

        self._cupy = cupy

    def describe(self, obj: Any, what: str) -> DevBuf:
        return describe(obj, what)

    def current_device(self) -> int:
        return int(self._cupy.cuda.runtime.getDevice())

    def use(self, device: int) -> None:
        """Make `device` current in the calling thread (CUDA's current device is per thread)."""
        self._cupy.cuda.Device(device).use()

    def stream_for(self, buf: DevBuf) -> Any:
        if buf.framework == "torch":
            import torch

            return self._cupy.cuda.ExternalStream(torch.cuda.current_stream(buf.device).cuda_stream, buf.device)
        return self._cupy.cuda.get_current_stream()

    def current_stream(self) -> Any:
        return self._cupy.cuda.get_current_stream()

    def record(self, stream: Any) -> Any:
        event = self._cupy.cuda.Event(block=False, disable_timing=True)
        event.record(stream)
        return event

    def done(self, event: Any) -> bool:
        return bool(event.done)

    def alloc(self, nbytes: int) -> tuple[int, Any]:
        """(pointer, owner): device memory from CuPy's pool, alive while `owner` is referenced."""
        mem = self._cupy.cuda.alloc(max(nbytes, 1))
        return int(mem.ptr), mem

    def copy(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        rt = self._cupy.cuda.runtime
        rt.memcpyAsync(dst, src, nbytes, rt.memcpyDeviceToDevice, stream.ptr)

"""Host staging of a snapshot: copying a tensor's committed bytes into host memory the writer owns.

Owns the interface between a local-copy snapshot and the device that holds the tensors. `start`
enqueues the copy of one tensor into a host buffer and returns at once; `fence` (in the step's thread,
before the commit returns) orders every later write to those tensors after the copies' reads; `wait` (in
the writer's thread) returns once every started copy has landed, so the writer hashes final bytes only.

- `CpuStager`: CPU tensors; `start` copies at once (a memcpy of the tensor), `fence` and `wait` have
  nothing left to do. It is also the stand-in the writer's logic is tested with.
- `CudaStager`: CUDA tensors; `start` records an event on the tensor's current stream and, on a side
  stream that waits for it, copies the tensor into a pinned host buffer (`non_blocking`); `fence` makes
  the current stream wait for those copies, so the next step's kernels that write the tensors run after
  them while the host thread goes on at once; `wait` synchronizes the copies' events. Measured only
  where a GPU is available (see docs/benchmarks/survive.md).

Invariant: a host buffer handed to `start` holds exactly the tensor's bytes at the commit once `wait`
returned, whatever the step did to the tensor after `fence`.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol

import numpy as np

from p2pgen.state import tensors as tz


class HostStager(Protocol):
    def start(self, value: Any, into: np.ndarray) -> None:
        """Enqueue the copy of tensor `value`'s bytes (C order) into `into` (1-D uint8 of its size)."""

    def fence(self) -> None:
        """Order every later write to the started tensors after their copies' reads."""

    def wait(self) -> None:
        """Return once every started copy has landed in its host buffer."""


class CpuStager:
    """The stager of CPU tensors (and the stand-in for a device in tests): copies at `start`."""

    def start(self, value: Any, into: np.ndarray) -> None:
        np.copyto(into, tz.host_bytes(value))

    def fence(self) -> None:
        return None

    def wait(self) -> None:
        return None


class CudaStager:
    """Device-to-host copies of CUDA tensors into pinned buffers on a side stream (see the module docstring);
    CPU tensors of the same state are copied at `start`, as `CpuStager` does.

    The pinned buffers are reused from one save to the next while the tensors' sizes are unchanged."""

    def __init__(self) -> None:
        torch = sys.modules["torch"]
        self._torch = torch
        self._stream = torch.cuda.Stream()
        self._pinned: list[Any] = []              # one pinned buffer per CUDA tensor, in the order started
        self._pending: list[tuple[Any, Any, Any, np.ndarray]] = []  # (done event, stream, pinned, host target)

    def start(self, value: Any, into: np.ndarray) -> None:
        torch = self._torch
        if not (tz.is_torch(value) and value.device.type == "cuda"):
            np.copyto(into, tz.host_bytes(value))
            return
        current = torch.cuda.current_stream(value.device)
        ready = torch.cuda.Event()
        ready.record(current)
        index = len(self._pending)
        if index == len(self._pinned) or self._pinned[index].numel() != into.nbytes:
            buffer = torch.empty(int(into.nbytes), dtype=torch.uint8, pin_memory=True)
            self._pinned[index:index + 1] = [buffer]
        pinned = self._pinned[index]
        with torch.cuda.stream(self._stream):
            self._stream.wait_event(ready)
            pinned.copy_(value.detach().contiguous().reshape(-1).view(torch.uint8), non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._stream)
        self._pending.append((done, current, pinned, into))

    def fence(self) -> None:
        for done, current, _pinned, _into in self._pending:
            current.wait_event(done)

    def wait(self) -> None:
        pending, self._pending = self._pending, []
        for done, _current, pinned, into in pending:
            done.synchronize()
            np.copyto(into, pinned.numpy())


def stager_for(values: list[Any]) -> HostStager:
    """The stager for these tensors: CudaStager if any is a CUDA tensor, else CpuStager.

    Raises ValueError for a tensor on a device other than the CPU and CUDA (it has no host staging here)."""
    devices = {v.device.type if tz.is_torch(v) else "cpu" for v in values}
    if devices - {"cpu", "cuda"}:
        raise ValueError(f"the state holds tensors on {sorted(devices - {'cpu', 'cuda'})}: the local copy stages "
                         "CPU and CUDA tensors only; move them to one of those, or run without the local copy "
                         "(--no-local-state)")
    return CudaStager() if "cuda" in devices else CpuStager()

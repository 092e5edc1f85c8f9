"""Host staging: GPU buffers over a CPU backend (`--backend tcp` with CUDA tensors), for mixed jobs.

`HostStagedBackend(inner)` wraps a backend that takes host buffers (the tcp ring). A CUDA buffer (torch CUDA
tensor, CuPy array) is copied to host memory, the inner collective runs on the copy, and outputs are copied
back to the device only after it returned. Host buffers pass straight through. So GPU members can run the
protocol where NCCL cannot (several ranks on one GPU with an NCCL older than 2.30, GPUs next to CPU-only
members), at host-copy speed.

Invariant: the Backend contract holds unchanged. A device buffer is written only after the inner collective
succeeded, so when it raises every buffer passed in is exactly as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from p2pgen.collectives.backend import Backend, ReduceOp


@dataclass(frozen=True)
class Stager:
    """How one kind of device buffer goes to host memory and back."""

    matches: Callable[[Any], bool]
    to_host: Callable[[Any], Any]
    back: Callable[[Any, Any], None]        # back(device_buffer, host_copy)


def _is_torch_cuda(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and getattr(getattr(obj, "device", None), "type", "") == "cuda"


def _is_cupy(obj: Any) -> bool:
    return type(obj).__module__.split(".")[0] == "cupy"


def _cupy_to_host(a: Any) -> Any:
    import cupy

    return cupy.asnumpy(a)


TORCH_CUDA = Stager(_is_torch_cuda, lambda t: t.detach().to("cpu"), lambda t, h: t.copy_(h))
CUPY = Stager(_is_cupy, _cupy_to_host, lambda a, h: a.set(h))
DEFAULT_STAGERS: tuple[Stager, ...] = (TORCH_CUDA, CUPY)


class HostStagedBackend:
    """A Backend over `inner` that also takes device buffers (see the module docstring)."""

    def __init__(self, inner: Backend, stagers: Sequence[Stager] = DEFAULT_STAGERS) -> None:
        self.inner, self._stagers = inner, tuple(stagers)
        self.rank, self.world, self.generation = inner.rank, inner.world, inner.generation
        self.group = getattr(inner, "group", None)

    def __repr__(self) -> str:
        return f"HostStagedBackend({self.inner!r})"

    @property
    def op_seq(self) -> int:
        return self.inner.op_seq

    @property
    def reductions(self) -> Any:
        return self.inner.reductions

    @property
    def failed(self) -> str | None:
        """Why the inner backend is unusable, or None."""
        return self.inner.failed

    def activity(self) -> tuple[float | None, int] | None:
        """The inner backend's `activity()` (see `TcpBackend.activity`), or None when it has none (nccl)."""
        activity = getattr(self.inner, "activity", None)
        return activity() if activity is not None else None

    def counters(self) -> dict[str, int]:
        """The inner backend's wire counters (see `TcpBackend.counters`)."""
        return self.inner.counters()

    def all_reduce(self, buf: Any, op: ReduceOp | str = ReduceOp.SUM) -> Any:
        return self._run(lambda b: self.inner.all_reduce(b, op), buf)

    def broadcast(self, buf: Any, root: int) -> Any:
        return self._run(lambda b: self.inner.broadcast(b, root), buf)

    def all_gather(self, output: Any, input: Any) -> Any:
        return self._run(lambda o, i: self.inner.all_gather(o, i), output, input)

    def reduce_scatter(self, output: Any, input: Any, op: ReduceOp | str = ReduceOp.SUM) -> Any:
        return self._run(lambda o, i: self.inner.reduce_scatter(o, i, op), output, input)

    def all_to_all(self, output: Any, input: Any, output_splits: Sequence[int] | None = None,
                   input_splits: Sequence[int] | None = None) -> Any:
        return self._run(lambda o, i: self.inner.all_to_all(o, i, output_splits, input_splits), output, input)

    def subgroup(self, ranks: Sequence[int]) -> HostStagedBackend:
        """The inner backend's subgroup of `ranks`, staged the same way (the inner backend must have one)."""
        make = getattr(self.inner, "subgroup", None)
        if make is None:
            raise NotImplementedError(f"{type(self.inner).__name__} has no subgroups")
        return HostStagedBackend(make(ranks), self._stagers)

    def send(self, buf: Any, dst: int) -> None:
        self.inner.send(self._host(buf)[0], dst)

    def recv(self, buf: Any, src: int) -> Any:
        return self._run(lambda b: self.inner.recv(b, src), buf)

    def post_send(self, buf: Any, dst: int) -> Callable[[], None] | None:
        """The inner backend's non-blocking send of a host buffer (None for a device buffer, or without one)."""
        host, stager = self._host(buf)
        post = getattr(self.inner, "post_send", None)
        return post(host, dst) if post is not None and stager is None else None

    def recv_any(self, buf: Any) -> int:
        source: list[int] = []
        self._run(lambda b: source.append(self.inner.recv_any(b)), buf)
        return source[0]

    def barrier(self) -> None:
        self.inner.barrier()

    def monitored_barrier(self, timeout: float, wait_all_ranks: bool = False) -> None:
        make = getattr(self.inner, "monitored_barrier", None)
        if make is None:
            raise NotImplementedError(f"{type(self.inner).__name__} has no monitored barrier")
        make(timeout, wait_all_ranks)

    def connect(self) -> None:
        self.inner.connect()

    def abort(self, reason: str) -> str:
        return self.inner.abort(reason)

    def close(self) -> None:
        self.inner.close()

    def _run(self, call: Callable[..., Any], output: Any, *inputs: Any) -> Any:
        """call(host output, host inputs...); the output goes back to its device only after call returned."""
        host_out, stager = self._host(output)
        call(host_out, *(self._host(x)[0] for x in inputs))
        if stager is not None:
            stager.back(output, host_out)
        return output

    def _host(self, obj: Any) -> tuple[Any, Stager | None]:
        for stager in self._stagers:
            if stager.matches(obj):
                return stager.to_host(obj), stager
        return obj, None

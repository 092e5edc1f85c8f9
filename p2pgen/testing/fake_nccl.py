"""A fake `cupy.cuda.nccl` and CUDA device on host memory: the test double of the nccl backend.

`FakeNccl` has the surface the backend uses (constants, `get_version`, `get_unique_id`, `groupStart`/`groupEnd`,
`NcclError`, `NcclCommunicator(ndev, commId, rank)` with allReduce/reduceScatter/allGather/broadcast/send/recv/
abort/destroy/check_async_error) and behaves like NCCL where the backend's logic depends on it:
- init blocks until all `ndev` ranks of one unique id have called it (a rank that never comes hangs the
  others), unless `fail_init` is set;
- calls only enqueue: an operation runs when every rank has enqueued its matching call (send/recv: the
  matching peer call), so a rank that never calls leaves the others' events pending forever;
- calls between `groupStart()` and `groupEnd()` are enqueued like any other (enqueueing never blocks here, so
  a group needs nothing more); a rank never sends to itself (NCCL would allow it inside a group; the backend
  copies its own segment instead, and the fake refuses a self send so that a change there is noticed);
- `abort()` ends the communicator's pending operations without writing anything (their events complete);
- `inject_async_error(rank, text)` makes `check_async_error()` raise on that rank;
- NCCL defines overlapping send/recv buffers only in its in-place layout (allGather: send = recv +
  rank*count; reduceScatter: recv = send + rank*count); for any other overlap the fake takes the worst legal
  outcome and poisons the output (0xFF bytes) before it reads the inputs, so a backend that relies on it fails.
Every call is recorded in `calls` as (name, rank, ...). `FakeDevice` (one per member thread) provides the
backend's device methods: host buffers (numpy arrays, torch CPU tensors), one stream, events over it.

Invariant: the fake never writes a buffer of an operation that did not complete on every rank.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from p2pgen.collectives.nccl_buffers import DevBuf, describe

_DTYPES = {0: "int8", 1: "uint8", 2: "int32", 3: "uint32", 4: "int64", 5: "uint64", 6: "float16", 7: "float32",
           8: "float64", 9: "bfloat16"}


class FakeNcclError(RuntimeError):
    def __init__(self, text: str) -> None:
        super().__init__(f"NCCL_ERROR_REMOTE_ERROR: {text}")


class FakeNccl:
    """The module double. `cupy_major` picks the unique-id form: 14 -> bytes, 13 -> tuple of signed chars."""

    available = True
    NcclError = FakeNcclError
    NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = 0, 1, 2, 3, 4
    NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64 = 0, 1, 2, 3, 4, 5
    NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64, NCCL_BFLOAT16 = 6, 7, 8, 9

    def __init__(self, version: int = 22105, cupy_major: int = 14) -> None:
        self.version, self.cupy_major = version, cupy_major
        self.calls: list[tuple] = []
        self.fail_init: BaseException | None = None
        self.async_errors: dict[int, str] = {}
        self.stopped = threading.Event()          # set by stop(): blocked fake inits give up
        self._lock = threading.Condition()
        self._worlds: dict[bytes, _World] = {}
        self._streams: dict[int, FakeStream] = {}
        self._ptrs = itertools.count(0x1000, 0x10)
        fake = self

        class NcclCommunicator(_FakeComm):
            def __init__(self, ndev: int, commId: Any, rank: int) -> None:
                super().__init__(fake, ndev, commId, rank)

        self.NcclCommunicator = NcclCommunicator

    # ---- module functions ------------------------------------------------------------------------
    def get_version(self) -> int:
        return self.version

    def groupStart(self) -> None:
        self.record("groupStart", -1)

    def groupEnd(self) -> None:
        self.record("groupEnd", -1)

    def get_unique_id(self) -> bytes | tuple[int, ...]:
        raw = os.urandom(128)
        self.record("get_unique_id", -1)
        return raw if self.cupy_major >= 14 else tuple(b - 256 if b > 127 else b for b in raw)

    # ---- test controls ----------------------------------------------------------------------------
    def device(self, index: int = 0) -> FakeDevice:
        return FakeDevice(self, index)

    def inject_async_error(self, rank: int, text: str) -> None:
        self.async_errors[rank] = text

    def stop(self) -> None:
        """Release every blocked fake init (test teardown)."""
        self.stopped.set()
        with self._lock:
            self._lock.notify_all()

    def record(self, name: str, rank: int, *rest: Any) -> None:
        with self._lock:
            self.calls.append((name, rank, *rest))

    def names(self, rank: int | None = None) -> list[str]:
        return [c[0] for c in self.calls if rank is None or c[1] == rank]

    # ---- internals ----------------------------------------------------------------------------------
    def _stream(self) -> FakeStream:
        stream = FakeStream(next(self._ptrs))
        self._streams[stream.ptr] = stream
        return stream


class FakeStream:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr
        self.pending: list[threading.Event] = []


class FakeEvent:
    def __init__(self, ops: list[threading.Event]) -> None:
        self.ops = ops

    @property
    def done(self) -> bool:
        return all(op.is_set() for op in self.ops)


class FakeDevice:
    """Device methods of the nccl backend on host memory (see p2pgen.collectives.nccl_device.CupyDevice)."""

    host = True

    def __init__(self, fake: FakeNccl, index: int) -> None:
        self.fake, self.index = fake, index
        self.stream = fake._stream()
        self.used: list[int] = []
        self._owners: list[Any] = []

    def describe(self, obj: Any, what: str) -> DevBuf:
        buf = describe(obj, what, host=True)
        return DevBuf(buf.obj, buf.ptr, buf.count, buf.dtype, self.index, buf.framework)

    def current_device(self) -> int:
        return self.index

    def use(self, device: int) -> None:
        self.used.append(device)

    def stream_for(self, buf: DevBuf) -> FakeStream:
        return self.stream

    def current_stream(self) -> FakeStream:
        return self.stream

    def record(self, stream: FakeStream) -> FakeEvent:
        return FakeEvent(list(stream.pending))

    def done(self, event: FakeEvent) -> bool:
        return event.done

    def alloc(self, nbytes: int) -> tuple[int, Any]:
        arr = np.zeros(max(nbytes, 1), np.uint8)
        self._owners = [arr]           # the backend holds one workspace at a time
        return int(arr.ctypes.data), arr

    def copy(self, dst: int, src: int, nbytes: int, stream: FakeStream) -> None:
        ctypes.memmove(dst, src, nbytes)


class _World:
    """The ranks of one unique id: init rendezvous and the operations they enqueued."""

    def __init__(self, ndev: int) -> None:
        self.ndev = ndev
        self.joined: set[int] = set()
        self.slots: dict[tuple, dict[int, _Call]] = {}


class _Call:
    def __init__(self, rank: int, args: tuple, done: threading.Event, comm: _FakeComm) -> None:
        self.rank, self.args, self.done, self.comm = rank, args, done, comm


class _FakeComm:
    def __init__(self, fake: FakeNccl, ndev: int, comm_id: Any, rank: int) -> None:
        if fake.cupy_major >= 14 and not isinstance(comm_id, bytes) or fake.cupy_major < 14 and not isinstance(
                comm_id, tuple):
            raise TypeError(f"CuPy {fake.cupy_major} takes the unique id as "
                            f"{'bytes' if fake.cupy_major >= 14 else 'a tuple'}, got {type(comm_id).__name__}")
        if len(comm_id) != 128:
            raise AssertionError("unique id must have 128 items")
        self.fake, self.ndev, self.rank_ = fake, ndev, rank
        self.key = bytes(v & 0xFF for v in comm_id)
        self.alive = True
        self.seq = 0
        self.p2p: dict[tuple[str, int], int] = {}
        self.pending: list[threading.Event] = []
        fake.record("init", rank, ndev)
        if fake.fail_init is not None:
            raise fake.fail_init
        self.world = self._join()

    def _join(self) -> _World:
        with self.fake._lock:
            world = self.fake._worlds.setdefault(self.key, _World(self.ndev))
            world.joined.add(self.rank_)
            self.fake._lock.notify_all()
            while len(world.joined) < self.ndev and not self.fake.stopped.is_set():
                self.fake._lock.wait(0.05)
        if len(world.joined) < self.ndev:
            raise FakeNcclError("init abandoned (fake stopped)")
        self.fake.record("init_done", self.rank_)
        return world

    # ---- the CuPy surface -----------------------------------------------------------------------------
    def rank_id(self) -> int:
        return self.rank_

    def allReduce(self, send: int, recv: int, count: int, dtype: int, op: int, stream: int) -> None:
        self._enqueue(("allReduce", self._next()), (send, recv, count, dtype, op), stream)

    def reduceScatter(self, send: int, recv: int, count: int, dtype: int, op: int, stream: int) -> None:
        self._enqueue(("reduceScatter", self._next()), (send, recv, count, dtype, op), stream)

    def allGather(self, send: int, recv: int, count: int, dtype: int, stream: int) -> None:
        self._enqueue(("allGather", self._next()), (send, recv, count, dtype), stream)

    def broadcast(self, send: int, recv: int, count: int, dtype: int, root: int, stream: int) -> None:
        self._enqueue(("broadcast", self._next()), (send, recv, count, dtype, root), stream)

    def send(self, buf: int, count: int, dtype: int, peer: int, stream: int) -> None:
        if peer == self.rank_:
            raise FakeNcclError(f"rank {peer} sends to itself")
        self._enqueue(("p2p", self.rank_, peer, self._pair("send", peer)), (buf, count, dtype), stream)

    def recv(self, buf: int, count: int, dtype: int, peer: int, stream: int) -> None:
        self._enqueue(("p2p", peer, self.rank_, self._pair("recv", peer)), (buf, count, dtype), stream)

    def check_async_error(self) -> None:
        text = self.fake.async_errors.get(self.rank_)
        if text is not None:
            raise FakeNcclError(text)

    def abort(self) -> None:
        self.fake.record("abort", self.rank_)
        self.alive = False
        for op in self.pending:           # NCCL's abort ends the kernels: events complete, nothing written
            op.set()

    def destroy(self) -> None:
        self.fake.record("destroy", self.rank_)
        self.alive = False

    # ---- matching and running ----------------------------------------------------------------------------
    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def _pair(self, kind: str, peer: int) -> int:
        n = self.p2p.get((kind, peer), 0)
        self.p2p[(kind, peer)] = n + 1
        return n

    def _enqueue(self, slot: tuple, args: tuple, stream_ptr: int) -> None:
        if not self.alive:
            raise FakeNcclError("communicator was aborted")
        self.fake.record(slot[0], self.rank_, *args)
        done = threading.Event()
        self.pending.append(done)
        self.fake._streams[stream_ptr].pending.append(done)
        with self.fake._lock:
            calls = self.world.slots.setdefault(slot, {})
            calls[self.rank_] = _Call(self.rank_, args, done, self)
            ready = len(calls) == (2 if slot[0] == "p2p" else self.ndev)
            if ready:
                del self.world.slots[slot]
        if ready and all(c.comm.alive for c in calls.values()):
            _RUN[slot[0]](calls, self.ndev, *slot[1:3] if slot[0] == "p2p" else ())
            for c in calls.values():
                c.done.set()


def _view(ptr: int, count: int, dtype: int) -> np.ndarray:
    name = _DTYPES[dtype]
    np_dtype = np.int16 if name == "bfloat16" else np.dtype(name)
    nbytes = count * np.dtype(np_dtype).itemsize
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * max(nbytes, 1)).from_address(ptr))[:nbytes]
    return raw.view(np_dtype)


def _reduce(parts: list[np.ndarray], dtype: int, op: int, world: int) -> np.ndarray:
    bf16 = _DTYPES[dtype] == "bfloat16"
    vals = [_bf16_to_f32(p) if bf16 else p.copy() for p in parts]
    acc = vals[0]
    kernel: Callable = {0: np.add, 1: np.multiply, 4: np.add, 2: np.maximum, 3: np.minimum}[op]
    for v in vals[1:]:
        kernel(acc, v, out=acc)
    if op == 4:
        acc = acc / acc.dtype.type(world)
    return _f32_to_bf16(acc) if bf16 else acc


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(x: np.ndarray) -> np.ndarray:
    import torch

    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16).view(torch.int16).numpy()


def _all_reduce(calls: dict[int, _Call], world: int) -> None:
    send, recv, count, dtype, op = calls[0].args
    result = _reduce([_view(c.args[0], count, dtype) for c in calls.values()], dtype, op, world)
    for c in calls.values():
        _view(c.args[1], count, dtype)[:] = result


def _overlap(a: int, a_bytes: int, b: int, b_bytes: int) -> bool:
    return a_bytes > 0 and b_bytes > 0 and a < b + b_bytes and b < a + a_bytes


def _poison_undefined_aliasing(calls: dict[int, _Call], world: int, gather: bool) -> None:
    """Overlapping send/recv outside NCCL's in-place layout is undefined: write garbage first."""
    for r, c in calls.items():
        send, recv, count, dtype = c.args[:4]
        item = _view(send, 1, dtype).itemsize
        send_bytes, recv_bytes = (count * item, count * world * item) if gather else (count * world * item,
                                                                                      count * item)
        in_place = send == recv + r * count * item if gather else recv == send + r * count * item
        if not in_place and _overlap(send, send_bytes, recv, recv_bytes):
            _view(recv, recv_bytes, 1)[:] = 0xFF


def _reduce_scatter(calls: dict[int, _Call], world: int) -> None:
    _poison_undefined_aliasing(calls, world, gather=False)
    _, _, count, dtype, op = calls[0].args
    result = _reduce([_view(c.args[0], count * world, dtype) for c in calls.values()], dtype, op, world)
    for r, c in calls.items():
        _view(c.args[1], count, dtype)[:] = result[r * count:(r + 1) * count]


def _all_gather(calls: dict[int, _Call], world: int) -> None:
    _poison_undefined_aliasing(calls, world, gather=True)
    _, _, count, dtype = calls[0].args
    result = np.concatenate([_view(calls[r].args[0], count, dtype).copy() for r in range(world)])
    for c in calls.values():
        _view(c.args[1], count * world, dtype)[:] = result


def _broadcast(calls: dict[int, _Call], world: int) -> None:
    _, _, count, dtype, root = calls[0].args
    data = _view(calls[root].args[0], count, dtype).copy()
    for c in calls.values():
        _view(c.args[1], count, dtype)[:] = data


def _p2p(calls: dict[int, _Call], world: int, src: int, dst: int) -> None:
    buf, count, dtype = calls[src].args
    _view(calls[dst].args[0], count, dtype)[:] = _view(buf, count, dtype)


_RUN: dict[str, Callable[..., None]] = {
    "allReduce": _all_reduce, "reduceScatter": _reduce_scatter, "allGather": _all_gather,
    "broadcast": _broadcast, "p2p": _p2p}


class FakeClock:
    """A clock for deadlines: `now` moves only by `advance`, or by `step` on every read when step > 0."""

    def __init__(self, start: float = 1000.0, step: float = 0.0) -> None:
        self.now, self.step = start, step
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            value = self.now
            self.now += self.step
            return value

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll `predicate` (tests): True once it holds, False after `timeout` real seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.002)
    return predicate()


class FakeNcclGroup:
    """`world` nccl backends of one generation on one FakeNccl, each member on its own thread in `run`."""

    def __init__(self, world: int, generation: int = 1, fake: FakeNccl | None = None, **backend_kw: Any) -> None:
        from p2pgen.collectives.nccl import NcclBackend, new_comm_id

        self.fake = fake or FakeNccl()
        comm_id = new_comm_id(self.fake)
        self.backends = [NcclBackend(comm_id, r, world, generation, nccl=self.fake, device=self.fake.device(),
                                     cupy_major=self.fake.cupy_major, **backend_kw) for r in range(world)]

    def run(self, fn: Callable[[Any], Any], timeout: float = 30.0) -> list[Any]:
        """fn(backend) on every member concurrently; results in rank order, or the first member's error."""
        results: list[Any] = [None] * len(self.backends)
        errors: list[BaseException | None] = [None] * len(self.backends)

        def body(i: int) -> None:
            try:
                results[i] = fn(self.backends[i])
            except BaseException as e:   # reported to the caller below
                errors[i] = e

        threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(len(self.backends))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
        if any(t.is_alive() for t in threads):
            self.close()
            raise TimeoutError(f"members still running after {timeout}s (aborted them)")
        for e in errors:
            if e is not None:
                raise e
        return results

    def close(self) -> None:
        for b in self.backends:
            b.close()
        self.fake.stop()

"""The `nccl` backend: collectives of one generation on one NCCL communicator, through `cupy.cuda.nccl`.

One communicator per generation: its NCCL unique id is made by the generation's rank 0
(`new_comm_id()`), travels as hex in rank 0's `ready` vote and comes back in the certificate's `comm_id`,
so every member of generation G, and nobody else, joins the communicator of G (DESIGN, "Data plane").

Lifecycle (`Lifecycle`, a small state machine):
    created --connect()--> initialising --NCCL init returned--> ready
    created | initialising | ready --abort()--> aborted --close()--> closed
- abort() first runs every registered CUDA-graph destroyer (`add_graph`), newest first, then calls
  `NcclCommunicator.abort()` (ncclCommAbort). The communicator is never left to its destructor; close()
  aborts too.
- Bounded initialisation. `NcclCommunicator(ndev, commId, rank)` is a blocking ncclCommInitRank that waits
  for every rank (CuPy exposes no non-blocking config, and its wrapper raises on ncclInProgress, so
  NCCL_COMM_BLOCKING=0 cannot be used through it). It therefore runs in its own daemon thread, with the GIL
  released by CuPy (`with nogil`), while connect() waits for it with a deadline (`init_timeout`) and wakes up
  at once if abort() is called (the peer's watcher aborts as soon as a member of G leaves). On the deadline
  connect() raises PeerLost and the backend is aborted. If the init returns later, its thread finds the
  backend no longer `initialising` and aborts the fresh communicator itself. No collective was enqueued on a
  communicator that never became ready, so quiescence is still "proved"; the stuck thread (counted in
  `stats["stuck_inits"]`) ends with the process when the agent restarts it.
- Watchdog. Every collective records a CUDA event after its NCCL call and waits by polling the event,
  `check_async_error()` and its deadline (`op_timeout`) together (`verdict`, a pure function). An abort from
  another thread wakes it within one poll. `check_async_error` only stops a wait early: membership changes
  come from the agent's failure detector, never from NCCL's error query (DESIGN).

Buffers are taken as they are (device pointers, the caller's stream; no host copy). With `stage_outputs`
(default) NCCL writes into a private device workspace that is copied into the output only after the
collective completed, so a collective that raises leaves every buffer as it was (the Backend contract).
`stage_outputs=False` writes outputs in place (one device copy less, e.g. for benchmarks); a collective that
raises may then have written part of its output. An input that overlaps its output other than in NCCL's own
in-place layout (all_gather: input = output slot `rank`; reduce_scatter: output = input slot `rank`) is
undefined in NCCL, so such a call is always staged, whatever `stage_outputs` says.

all_to_all (and so gather and scatter) is one NCCL group of sends and receives (`groupStart`/`groupEnd`):
each member sends its segment j to rank j and receives segment i from rank i; its own segment is a device
copy. Data movement takes any dtype (dtypes NCCL lacks move as bytes); reductions take `nccl_buffers.REDUCTIONS`.

Thread safety: NCCL calls on the communicator are serialised by a lock; abort() takes that lock for at most
`abort_lock_timeout` and then aborts anyway, since ncclCommAbort is how a blocked NCCL call is released.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from p2pgen.collectives.backend import ReduceOp, as_op, splits
from p2pgen.collectives.nccl_buffers import DTYPES, ITEMSIZE, REDUCTIONS, DevBuf, nccl_dtype, nccl_op, wire
from p2pgen.collectives.nccl_id import decode, encode, to_cupy
from p2pgen.errors import GenerationChanged, PeerLost

PROVED, UNKNOWN = "proved", "unknown"


class State(str, enum.Enum):
    CREATED = "created"
    INITIALISING = "initialising"
    READY = "ready"
    ABORTED = "aborted"
    CLOSED = "closed"


_MOVES = {
    State.CREATED: {State.INITIALISING, State.ABORTED},
    State.INITIALISING: {State.READY, State.ABORTED},
    State.READY: {State.ABORTED},
    State.ABORTED: {State.CLOSED},
    State.CLOSED: set(),
}


class Lifecycle:
    """The communicator's state, with only the moves drawn in the module docstring allowed."""

    def __init__(self) -> None:
        self.state = State.CREATED
        self.history: list[State] = [State.CREATED]

    def move(self, to: State) -> None:
        if to not in _MOVES[self.state]:
            raise RuntimeError(f"communicator cannot go from {self.state.value} to {to.value}")
        self.state = to
        self.history.append(to)


def verdict(now: float, deadline: float, done: bool, abort_reason: str | None,
            async_error: str | None) -> tuple[str, str]:
    """What a waiting collective does next: ("aborted" | "done" | "failed" | "timeout" | "wait", reason).

    Abort wins over done: ncclCommAbort ends the kernels, so an event that completed after an abort says
    nothing about the data (the caller reads `done` before it reads the abort flag)."""
    if abort_reason is not None:
        return "aborted", abort_reason
    if done:
        return "done", "the collective completed"
    if async_error is not None:
        return "failed", f"NCCL reported an asynchronous error ({async_error})"
    if now >= deadline:
        return "timeout", "the collective did not complete before its deadline"
    return "wait", "in flight"


def new_comm_id(nccl: Any) -> str:
    """A fresh NCCL unique id as a certificate `comm_id` (rank 0 of the proposed generation calls this)."""
    return encode(nccl.get_unique_id())


class NcclBackend:
    """Collectives of one generation on one NCCL communicator. Construct cheaply; connect() initialises."""

    reductions = REDUCTIONS          # the (op, dtype) pairs it reduces (NCCL has no bitwise ops)

    def __init__(self, comm_id: str, rank: int, world: int, generation: int, *, nccl: Any = None,
                 device: Any = None, device_index: int | None = None, cupy_major: int | None = None,
                 group: Any = None, init_timeout: float = 60.0, op_timeout: float = 300.0,
                 abort_lock_timeout: float = 1.0, stage_outputs: bool = True,
                 clock: Callable[[], float] = time.monotonic, poll_s: float = 0.0005) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in 0..{world - 1}")
        if nccl is None:
            from p2pgen.collectives import nccl_lib

            nccl, cupy_major = nccl_lib.load(), nccl_lib.cupy_major() if cupy_major is None else cupy_major
        if device is None:
            from p2pgen.collectives.nccl_device import CupyDevice

            device = CupyDevice()
        self.rank, self.world, self.generation, self.group = rank, world, generation, group
        self._nccl, self._dev = nccl, device
        self._uid = to_cupy(decode(comm_id), 14 if cupy_major is None else cupy_major)
        self.device_index = device.current_device() if device_index is None else device_index
        self.version = int(nccl.get_version())
        self.init_timeout, self.op_timeout, self.poll_s = init_timeout, op_timeout, poll_s
        self.abort_lock_timeout, self.stage_outputs, self._clock = abort_lock_timeout, stage_outputs, clock
        self.lifecycle = Lifecycle()
        self.stats: dict[str, float] = {"init_s": 0.0, "abort_s": 0.0, "stuck_inits": 0}
        self._lock = threading.Lock()           # NCCL calls on the communicator, state moves
        self._abort_lock = threading.Lock()     # one abort at a time
        self._comm: Any = None
        self._abort_reason: str | None = None
        self._quiescence = PROVED
        self._init_done = threading.Event()
        self._init_error: BaseException | None = None
        self._graphs: list[Callable[[], None]] = []
        self._op_seq = 0
        self._work: tuple[int, Any] = (0, None)
        self._work_bytes = 0

    def __repr__(self) -> str:
        return (f"NcclBackend(generation={self.generation}, rank={self.rank}, world={self.world}, "
                f"state={self.lifecycle.state.value})")

    @property
    def op_seq(self) -> int:
        """Collectives started in this generation (the same number on every member after each one)."""
        return self._op_seq

    @property
    def failed(self) -> str | None:
        """Why this backend is unusable (aborted or closed), or None."""
        return self._abort_reason

    # ---- lifecycle -----------------------------------------------------------------------------
    def connect(self) -> None:
        """Initialise the communicator (all members must call it); bounded by `init_timeout`."""
        with self._lock:
            self._check_usable()
            if self.lifecycle.state is State.READY:
                return
            if self.lifecycle.state is State.CREATED:
                self.lifecycle.move(State.INITIALISING)
                threading.Thread(target=self._init_body, name=f"p2pgen-nccl-init-g{self.generation}",
                                 daemon=True).start()
        started = self._clock()
        deadline = started + self.init_timeout
        while not self._init_done.wait(self.poll_s * 20):
            if self._abort_reason is not None:
                raise GenerationChanged(self._abort_reason)
            if self._clock() >= deadline:
                self.stats["stuck_inits"] += 1
                reason = (f"NCCL init of generation {self.generation} did not finish in {self.init_timeout:g} s: "
                          "a member is gone or never started it")
                self.abort(reason)
                raise PeerLost(reason)
        self.stats["init_s"] = self._clock() - started
        if self._init_error is not None:
            reason = f"NCCL init of generation {self.generation} failed: {self._init_error}"
            self.abort(reason)
            raise PeerLost(reason)
        with self._lock:
            self._check_usable()

    def _init_body(self) -> None:
        try:
            self._dev.use(self.device_index)
            comm = self._nccl.NcclCommunicator(self.world, self._uid, self.rank)
        except Exception as e:      # handed to connect(), which aborts the backend and raises PeerLost
            self._init_error = e
            self._init_done.set()
            return
        with self._lock:
            adopted = self.lifecycle.state is State.INITIALISING
            if adopted:
                self._comm = comm
                self.lifecycle.move(State.READY)
        if not adopted:             # retired while NCCL was initialising: nobody else holds this communicator
            comm.abort()
        self._init_done.set()

    def add_graph(self, destroy: Callable[[], None]) -> None:
        """Register a CUDA graph that captured this communicator; abort() calls `destroy` before it aborts
        the communicator (e.g. `backend.add_graph(torch_graph.reset)`)."""
        with self._lock:
            self._check_usable()
            self._graphs.append(destroy)

    def abort(self, reason: str) -> str:
        """Retire this generation: destroy captured graphs, then abort the communicator. Idempotent, thread-safe;
        returns the quiescence ("proved": no collective of this generation can still write anything)."""
        with self._abort_lock:
            if self._abort_reason is not None:
                return self._quiescence
            self._abort_reason = reason        # first, so that a waiter that sees its event done still aborts
            started = time.monotonic()
            locked = self._lock.acquire(timeout=self.abort_lock_timeout)
            try:
                self._quiescence = self._retire()
            finally:
                if locked:
                    self._lock.release()
            self.stats["abort_s"] = time.monotonic() - started
            return self._quiescence

    def _retire(self) -> str:
        graphs, self._graphs = self._graphs[::-1], []
        comm, self._comm = self._comm, None
        self.lifecycle.move(State.ABORTED)
        quiescence = PROVED
        for destroy in graphs:
            try:
                destroy()
            except Exception:       # a graph that cannot be destroyed may still launch this communicator
                quiescence = UNKNOWN
        if comm is not None:
            try:
                comm.abort()
            except Exception:
                quiescence = UNKNOWN
        return quiescence

    def close(self) -> None:
        """Abort (never destroy through the destructor) and mark closed. Idempotent."""
        self.abort("communicator closed by its owner")
        with self._lock:
            if self.lifecycle.state is State.ABORTED:
                self.lifecycle.move(State.CLOSED)

    # ---- collectives ---------------------------------------------------------------------------
    def all_reduce(self, buf: Any, op: ReduceOp | str = ReduceOp.SUM) -> Any:
        b = self._dev.describe(buf, "all_reduce buffer")
        code = nccl_op(self._nccl, as_op(op), b, self.version, "all_reduce")
        dtype = nccl_dtype(self._nccl, b, "all_reduce")
        self._collective(b, lambda c, out, s: c.allReduce(b.ptr, out, b.count, dtype, code, s))
        return buf

    def reduce_scatter(self, output: Any, input: Any, op: ReduceOp | str = ReduceOp.SUM) -> Any:
        out = self._dev.describe(output, "reduce_scatter output")
        inp = self._dev.describe(input, "reduce_scatter input")
        self._check_pair(out, inp, "reduce_scatter")
        code = nccl_op(self._nccl, as_op(op), inp, self.version, "reduce_scatter")
        dtype = nccl_dtype(self._nccl, inp, "reduce_scatter")
        self._collective(out, lambda c, o, s: c.reduceScatter(inp.ptr, o, out.count, dtype, code, s),
                         force_stage=_undefined_alias(inp, out, out.ptr == inp.ptr + self.rank * out.nbytes))
        return output

    def all_gather(self, output: Any, input: Any) -> Any:
        out, inp = self._dev.describe(output, "all_gather output"), self._dev.describe(input, "all_gather input")
        self._check_pair(inp, out, "all_gather")
        dtype, count = wire(self._nccl, inp)
        self._collective(out, lambda c, o, s: c.allGather(inp.ptr, o, count, dtype, s),
                         force_stage=_undefined_alias(inp, out, inp.ptr == out.ptr + self.rank * inp.nbytes))
        return output

    def broadcast(self, buf: Any, root: int) -> Any:
        b = self._dev.describe(buf, "broadcast buffer")
        self._check_rank(root, "root")
        dtype, count = wire(self._nccl, b)
        self._collective(b, lambda c, o, s: c.broadcast(b.ptr, o, count, dtype, root, s),
                         write_back=root != self.rank)
        return buf

    def all_to_all(self, output: Any, input: Any, output_splits: Sequence[int] | None = None,
                   input_splits: Sequence[int] | None = None) -> Any:
        """Rank r's input segment j goes to rank j's output segment r (see tcp's all_to_all); one NCCL group."""
        out, inp = self._dev.describe(output, "all_to_all output"), self._dev.describe(input, "all_to_all input")
        if out.dtype != inp.dtype:
            raise TypeError(f"all_to_all: dtypes differ ({inp.dtype} vs {out.dtype})")
        sends = splits(input_splits, inp.count, self.world, "all_to_all input")
        gets = splits(output_splits, out.count, self.world, "all_to_all output")
        if sends[self.rank] != gets[self.rank]:
            raise ValueError(f"all_to_all: rank {self.rank} sends itself {sends[self.rank]} elements but expects "
                             f"{gets[self.rank]}")
        dtype, _ = wire(self._nccl, inp)
        item = ITEMSIZE[inp.dtype]
        per = 1 if inp.dtype in DTYPES else item          # wire units per element (bytes for dtypes NCCL lacks)
        at_in, at_out = _starts(sends), _starts(gets)
        stream = self._dev.stream_for(out)                 # the stream _collective launches on

        def launch(c: Any, o: int, s: int) -> None:
            mine = sends[self.rank] * item
            if mine:
                self._dev.copy(o + at_out[self.rank] * item, inp.ptr + at_in[self.rank] * item, mine, stream)
            self._nccl.groupStart()
            try:
                for peer in range(self.world):
                    if peer != self.rank and sends[peer]:
                        c.send(inp.ptr + at_in[peer] * item, sends[peer] * per, dtype, peer, s)
                    if peer != self.rank and gets[peer]:
                        c.recv(o + at_out[peer] * item, gets[peer] * per, dtype, peer, s)
            finally:
                self._nccl.groupEnd()

        self._collective(out, launch, force_stage=inp.overlaps(out))
        return output

    def barrier(self) -> None:
        """Returns once every member has entered the barrier (a one-element all_reduce on a private buffer)."""
        ptr, _ = self._workspace(4)
        stream = self._dev.current_stream()
        int32 = int(self._nccl.NCCL_INT32)
        self._launch_and_wait(stream, lambda c, s: c.allReduce(ptr, ptr, 1, int32, int(self._nccl.NCCL_SUM), s))

    def send(self, buf: Any, dst: int) -> None:
        """Returns once NCCL completed the send (pair it with `recv` on `dst`)."""
        b = self._dev.describe(buf, "send buffer")
        self._check_peer(dst, "dst")
        dtype, count = wire(self._nccl, b)
        self._launch_and_wait(self._dev.stream_for(b), lambda c, s: c.send(b.ptr, count, dtype, dst, s), p2p=True)

    def recv(self, buf: Any, src: int) -> Any:
        b = self._dev.describe(buf, "recv buffer")
        self._check_peer(src, "src")
        dtype, count = wire(self._nccl, b)
        self._collective(b, lambda c, o, s: c.recv(o, count, dtype, src, s), p2p=True)
        return buf

    # ---- launching and waiting -----------------------------------------------------------------
    def _collective(self, out: DevBuf, launch: Callable[[Any, int, int], None], write_back: bool = True,
                    p2p: bool = False, force_stage: bool = False) -> None:
        """Run `launch(comm, output_ptr, stream_ptr)`; with stage_outputs the output goes to the workspace
        and is copied into `out` only once the collective completed (and that copy is waited for, so the
        workspace is free again when this returns)."""
        stream = self._dev.stream_for(out)
        if out.device != self.device_index:
            raise ValueError(f"buffer is on device {out.device}, this communicator on device {self.device_index}")
        staged = (self.stage_outputs or force_stage) and write_back and out.nbytes > 0
        target = self._workspace(out.nbytes)[0] if staged else out.ptr
        self._launch_and_wait(stream, lambda c, s: launch(c, target, s), p2p)
        if staged:
            self._dev.copy(out.ptr, target, out.nbytes, stream)
            copied = self._dev.record(stream)
            while not self._dev.done(copied):      # a device copy cannot hang; no abort may cut it short
                time.sleep(self.poll_s)

    def _launch_and_wait(self, stream: Any, launch: Callable[[Any, int], None], p2p: bool = False) -> None:
        """Every collective (send/recv aside) advances `op_seq` by one on every member, as in tcp."""
        if self.lifecycle.state is not State.READY:
            self.connect()
        with self._lock:
            self._check_usable()
            self._op_seq += not p2p
            try:
                launch(self._comm, stream.ptr)
            except Exception as e:
                failure: BaseException | None = e
            else:
                failure = None
                event = self._dev.record(stream)
        if failure is not None:
            reason = f"NCCL call failed in generation {self.generation}: {failure}"
            self.abort(reason)
            raise PeerLost(reason) from failure
        self._wait(event)

    def _wait(self, event: Any) -> None:
        deadline = self._clock() + self.op_timeout
        pause = 0.0
        while True:
            done = self._dev.done(event)
            abort_reason = self._abort_reason
            async_error = None if done or abort_reason else self._async_error()
            what, reason = verdict(self._clock(), deadline, done, abort_reason, async_error)
            if what == "done":
                return
            if what == "aborted":
                raise GenerationChanged(reason)
            if what in ("failed", "timeout"):
                reason = f"generation {self.generation}: {reason} (op_timeout {self.op_timeout:g} s)"
                self.abort(reason)
                raise PeerLost(reason)
            time.sleep(pause)
            pause = min(self.poll_s, pause * 2 or 1e-6)

    def _async_error(self) -> str | None:
        with self._lock:
            if self._comm is None:
                return None
            try:
                self._comm.check_async_error()
            except Exception as e:
                return str(e)
        return None

    # ---- helpers -------------------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._abort_reason is not None:
            raise GenerationChanged(self._abort_reason)

    def _workspace(self, nbytes: int) -> tuple[int, Any]:
        if self._work_bytes < nbytes or self._work[1] is None:
            self._work = self._dev.alloc(nbytes)
            self._work_bytes = nbytes
        return self._work

    def _check_pair(self, small: DevBuf, big: DevBuf, name: str) -> None:
        if small.dtype != big.dtype:
            raise TypeError(f"{name}: dtypes differ ({small.dtype} vs {big.dtype})")
        if big.count != small.count * self.world:
            raise ValueError(f"{name}: the larger buffer has {big.count} elements, expected world "
                             f"({self.world}) x {small.count} = {small.count * self.world}")

    def _check_rank(self, rank: int, what: str) -> None:
        if not isinstance(rank, int) or not 0 <= rank < self.world:
            raise ValueError(f"{what}={rank!r} is not a rank of generation {self.generation} (0..{self.world - 1})")

    def _check_peer(self, rank: int, what: str) -> None:
        self._check_rank(rank, what)
        if rank == self.rank:
            raise ValueError(f"{what}={rank} is this member itself: send/recv need another rank")


def _starts(counts: list[int]) -> list[int]:
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return out


def _undefined_alias(inp: DevBuf, out: DevBuf, nccl_in_place: bool) -> bool:
    """True when `inp` overlaps `out` in a layout NCCL does not define (anything but its in-place one)."""
    return inp.overlaps(out) and not nccl_in_place

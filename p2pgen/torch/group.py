"""The `p2pgen` torch ProcessGroup: every torch.distributed call, run on the communicator of the generation
current when the call is issued, on one worker thread per process, as torch `Work`.

Owns: `P2PGenProcessGroup` (a Python subclass of torch's ProcessGroup that overrides every collective torch
reaches from Python or from C++: functional collectives, DeviceMesh, DTensor and FSDP2 call the coalesced and
single-tensor forms), its `Work`, the process's worker thread, and where each group's communicator comes
from (`following`, `bound_to`, subgroups).

Kinds of group (all the same class; they differ by where the communicator of an operation comes from):
- following: the communicator of whatever generation is current when the call is issued (a Peer's current
  step, or a fixed Backend, or a callable); `rank()`/`size()` follow it. The default group under an agent.
- bound to generation G: G's communicator, or GenerationChanged once G is retired; rank and size are G's
  for its whole life, so torch's C++ side (DeviceMesh, functional collectives) may cache them.
- a subgroup (torch's `new_group(ranks)`): its parent's communicator restricted to `ranks`, in the same
  generation as the parent, failed by a generation change the same way.

Invariants: an operation runs on the communicator chosen when it was issued (so never in a generation it
was not issued in), in issue order across every p2pgen group of the process (one worker thread: members
that issue the same operations in the same order run them in the same order); a failed operation's Work
raises the p2pgen error itself (GenerationChanged / PeerLost); arguments are checked at the call
(p2pgen.torch.ops), so bad input raises there and nothing is issued.
"""

# No `from __future__ import annotations`: DDP checks a comm hook's annotations against the real types.
import os
import queue
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from p2pgen.collectives import Backend, ReduceOp
from p2pgen.collectives.backend import REDUCTIONS
from p2pgen.errors import GenerationChanged
from p2pgen.peer import Peer, Step, recognize_wrapped_errors
from p2pgen.torch import ops

BACKEND = "p2pgen"

Resolve = Callable[[], Any]          # the communicator for an operation issued now (None: no generation yet)


class StepComm:
    """One step's view of its generation: collectives through the Step (the step's first one agrees on the
    step boundary), point-to-point and subgroups on the step's backend directly."""

    def __init__(self, step: Step) -> None:
        self.step = step
        self.rank, self.world, self.generation = step.rank, step.world, step.generation

    @property
    def backend(self) -> Backend:
        backend = self.step.peer._backend
        if backend is None or backend.generation != self.generation:
            raise GenerationChanged(f"generation {self.generation} of this step was retired")
        return backend

    @property
    def reductions(self) -> Any:
        return self.step.peer._backend.reductions if self.step.peer._backend is not None else None

    def all_reduce(self, buf: Any, op: str = "sum") -> Any:
        return self.step.all_reduce(buf, op=op)

    def broadcast(self, buf: Any, root: int) -> Any:
        return self.step.broadcast(buf, root=root)

    def all_gather(self, output: Any, input: Any) -> Any:
        return self.step.all_gather(output, input)

    def reduce_scatter(self, output: Any, input: Any, op: str = "sum") -> Any:
        return self.step.reduce_scatter(output, input, op=op)

    def all_to_all(self, output: Any, input: Any, output_splits: Any = None, input_splits: Any = None) -> Any:
        return self.step.all_to_all(output, input, output_splits, input_splits)

    def barrier(self) -> None:
        self.step.barrier()

    def monitored_barrier(self, timeout: float, wait_all_ranks: bool) -> None:
        self.step.collective("monitored_barrier", timeout, wait_all_ranks)

    def send(self, buf: Any, dst: int) -> None:
        self.backend.send(buf, dst)

    def recv(self, buf: Any, src: int) -> Any:
        return self.backend.recv(buf, src)

    def post_send(self, buf: Any, dst: int) -> Any:
        post = getattr(self.backend, "post_send", None)
        return post(buf, dst) if post is not None else None

    def recv_any(self, buf: Any) -> int:
        return self.backend.recv_any(buf)

    def subgroup(self, ranks: Sequence[int]) -> Any:
        return self.backend.subgroup(ranks)


class Alone:
    """The communicator of a Peer's default group before the process's first step: this process alone, rank 0
    of a world of one (what `dist.get_rank()`/`get_world_size()` report until then). Every collective is the
    world-of-one collective: reductions and broadcasts leave the tensor as it is, gathers and all-to-alls copy
    the input to the output.

    Why alone and not with the others: a process joins a running job at a step boundary, while the members
    are mid-training, so there is nobody to meet before its first step; what makes the members' states equal
    is the state pull before that step (PCCL style), not a broadcast. That is what lets an ordinary script's
    setup run unchanged: torch's DDP checks parameter shapes and broadcasts rank 0's parameters when it is
    built (trivially true in a world of one), and the pull then gives the joiner the job's parameters."""

    rank, world, generation = 0, 1, None
    reductions = REDUCTIONS

    def all_reduce(self, buf: Any, op: Any = "sum") -> Any:
        return buf                         # SUM, AVG, MIN, MAX, PRODUCT, BAND/BOR/BXOR of one value: itself

    def broadcast(self, buf: Any, root: int) -> Any:
        return buf

    def all_gather(self, output: Any, input: Any) -> Any:
        return _copy_whole(output, input)

    def reduce_scatter(self, output: Any, input: Any, op: Any = "sum") -> Any:
        return _copy_whole(output, input)

    def all_to_all(self, output: Any, input: Any, output_splits: Any = None, input_splits: Any = None) -> Any:
        return _copy_whole(output, input)

    def barrier(self) -> None:
        return None

    def monitored_barrier(self, timeout: float, wait_all_ranks: bool = False) -> None:
        return None


ALONE = Alone()


def _copy_whole(output: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        output.view(-1).copy_(input.reshape(-1))
    return output


def following(source: Any) -> Resolve:
    """The resolver of a group that follows the generation: `source` is a Peer (its current step; `ALONE`
    before its first one), a Backend (always that one) or a callable returning the communicator (or None
    before the first generation)."""
    if isinstance(source, Peer):
        def comm() -> Any:
            step = source._current_step
            if step is not None:
                return StepComm(step)
            return ALONE if source.stats["generations"] == 0 else None
        return comm
    if isinstance(source, Backend):
        return lambda: source
    if callable(source):
        return source
    raise TypeError(f"a p2pgen process group needs a Peer, a Backend or a callable returning one, "
                    f"not {type(source).__name__}")


def bound_to(resolve: Resolve, generation: int) -> Resolve:
    """The resolver of a group bound to `generation`: its communicator while it is current, then an error."""
    def comm() -> Any:
        current = resolve()
        if current is None or current.generation != generation:
            now = "no generation" if current is None else f"generation {current.generation}"
            raise GenerationChanged(f"this process group belongs to generation {generation}, which was retired "
                                    f"({now} is current): build the group of the current generation")
        return current
    return comm


def subgroup_of(resolve: Resolve, ranks: Sequence[int]) -> Resolve:
    """The resolver of a subgroup: the parent communicator's subgroup of `ranks`, made once per generation."""
    ranks = tuple(ranks)
    made: dict[str, Any] = {}

    def comm() -> Any:
        parent = resolve()
        if parent is None:
            return None
        base = parent.backend if isinstance(parent, StepComm) else parent
        if made.get("base") is not base:
            make = getattr(parent, "subgroup", None)
            if make is None:
                raise NotImplementedError(f"{type(base).__name__} has no subgroups: subgroups (torch's "
                                          "new_group) run on the tcp backend")
            made.update(base=base, sub=make(ranks))
        return made["sub"]
    return comm


class Work(dist.Work):
    """A p2pgen operation as torch sees it. `wait()` raises the operation's p2pgen error, if any."""

    def __init__(self, future: Future) -> None:
        super().__init__()
        self._future = future
        self._done = threading.Event()
        self.source = -1                                  # recv from any source: who sent
        future.add_done_callback(lambda _: self._done.set())

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        if timeout and not self._done.wait(timeout.total_seconds()):
            raise TimeoutError(f"p2pgen operation still running after {timeout}; it was not cancelled")
        self._future.wait()          # raises the operation's exception, with its own type
        return True

    def get_future(self) -> Future:
        return self._future

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        return self.is_completed() and self.exception() is None

    def exception(self) -> BaseException | None:
        if not self._future.done():
            return None
        try:
            self._future.wait()
        except BaseException as e:
            return e
        return None

    def result(self) -> list[torch.Tensor]:
        self.wait()
        value = self._future.value()
        return value if isinstance(value, list) else [value]

    def synchronize(self) -> None:
        self.wait()

    def _source_rank(self) -> int:
        self.wait()
        return self.source


class _Worker:
    """The process's one worker thread: runs the operations of every p2pgen group in issue order.

    It also counts the queued operations that will still put frames on a link (`posting`: everything but
    receives and the completions of sends already posted), which tells a send whether it may be posted at
    once, from the caller's thread (`P2PGenProcessGroup.send`)."""

    QUIET = ("recv", "sent")            # kinds that put no frame on any link

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.posting = 0
        self._thread = threading.Thread(target=self._loop, name="p2pgen-torch", daemon=True)
        self._thread.start()

    def submit(self, run: Callable[[], Any], on_failure: Callable[[BaseException], None], kind: str = "") -> Work:
        future: Future = Future()
        work = Work(future)
        quiet = kind in self.QUIET
        if not quiet:
            with self._lock:
                self.posting += 1
        self._queue.put((run, future, on_failure, work, quiet))
        return work

    def _loop(self) -> None:
        while True:
            run, future, on_failure, work, quiet = self._queue.get()
            try:
                value = run()
            except BaseException as e:    # handed to whoever waits on the future
                on_failure(e)
                future.set_exception(e)
            else:
                if isinstance(value, _FromSource):
                    work.source, value = value.source, value.tensors
                future.set_result(value)
            finally:
                if not quiet:
                    with self._lock:
                        self.posting -= 1


class _FromSource:
    """A receive's result with the rank it came from (recv from any source)."""

    def __init__(self, source: int, tensors: list[torch.Tensor]) -> None:
        self.source, self.tensors = source, tensors


class _Failures:
    """Every failed operation of every p2pgen group of this process. It is what `unwrap_errors()` and `with
    step:` (p2pgen.peer.WrappedErrors) look at: a RuntimeError raised while an operation failed since `mark()`
    stands for that failure (torch's reducer re-raises a hook's error as a RuntimeError carrying its text only)."""

    def __init__(self) -> None:
        self.count = 0
        self.last: BaseException | None = None

    def record(self, error: BaseException) -> None:
        self.last = error
        self.count += 1

    def mark(self) -> int:
        return self.count

    def unwrap(self, error: BaseException, mark: int) -> BaseException | None:
        if isinstance(error, RuntimeError) and self.count != mark:
            return self.last
        return None


failures = _Failures()
recognize_wrapped_errors(failures)
_worker: _Worker | None = None
_worker_lock = threading.Lock()


def _forget_worker() -> None:
    """A forked child has no worker thread (only its parent's object): it starts its own on first use."""
    global _worker, _worker_lock
    _worker, _worker_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_worker)


def worker() -> _Worker:
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = _Worker()
        return _worker


class P2PGenProcessGroup(dist.ProcessGroup):
    """The `p2pgen` torch ProcessGroup (see the module docstring). Torch builds it through
    `dist.init_process_group("p2pgen", ...)` / `dist.new_group(...)`; see p2pgen.torch for the ways in."""

    def __init__(self, resolve: Resolve, rank: int, size: int, *, kind: str = "following",
                 on_shutdown: Callable[[], None] | None = None) -> None:
        super().__init__(rank, size)
        self._initial = (rank, size)                       # torch's values, before any generation
        self._comm = resolve
        self.kind = kind
        self.failures = 0                                  # operations that failed so far
        self.last_failure: BaseException | None = None
        self._on_shutdown = on_shutdown
        self._name: str | None = None
        self._desc = ""
        self._coalesced: list[Work] | None = None

    # --- identity: what torch asks of a group ------------------------------------------------------

    def getBackendName(self) -> str:
        return BACKEND

    def name(self) -> str:
        return BACKEND

    @property
    def group_name(self) -> str:
        if self._name is None:
            raise RuntimeError("this p2pgen process group has no name yet: build it through "
                               "dist.init_process_group / dist.new_group")
        return self._name

    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_desc(self) -> str:
        return self._desc

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    def rank(self) -> int:
        """This member's rank in the group's current generation (before the first one: torch's initial value)."""
        comm = self._peek()
        return comm.rank if comm is not None else self._initial[0]

    def size(self) -> int:
        """The group's size in its current generation (before the first one: torch's initial value)."""
        comm = self._peek()
        return comm.world if comm is not None else self._initial[1]

    def getRank(self) -> int:           # what torch's C++ side asks (functional collectives, DeviceMesh);
        return self.rank()              # C++'s own rank()/size() call these, so the Python ones never do

    def getSize(self) -> int:
        return self.size()

    @property
    def generation(self) -> int | None:
        """The generation the next operation would run in (None before the first one)."""
        comm = self._peek()
        return comm.generation if comm is not None else None

    def _peek(self) -> Any:
        try:
            return self._comm()
        except Exception:                  # retired or not a member now: report torch's initial values
            return None

    def _current(self) -> Any:
        comm = self._comm()
        if comm is None:
            raise RuntimeError("torch.distributed collectives on p2pgen run in a generation, and this group has "
                               "none now: under an agent, run them inside `for step in peer.steps(): with step: "
                               "...` (before its first step a process is a world of one; between steps it is in "
                               "no generation)")
        return comm

    def _submit(self, run: ops.Run, kind: str = "") -> Work:
        work = worker().submit(run, self._record_failure, kind)
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    def _record_failure(self, error: BaseException) -> None:
        self.last_failure = error
        self.failures += 1
        failures.record(error)

    def shutdown(self) -> None:
        if self._on_shutdown is not None:
            self._on_shutdown()
            self._on_shutdown = None

    def abort(self) -> None:
        self.shutdown()

    # --- collectives (the methods torch.distributed calls, from Python and from C++) -------------------

    def allreduce(self, tensors: Any, opts: Any = dist.ReduceOp.SUM) -> Work:
        return self._submit(ops.all_reduce(self._current(), _listed(tensors), opts))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = dist.ReduceOp.SUM) -> Work:
        return self._submit(ops.all_reduce(self._current(), tensors, opts, "all_reduce_coalesced"))

    def broadcast(self, tensors: Any, opts: Any = 0) -> Work:
        root = opts if isinstance(opts, int) else opts.rootRank
        return self._submit(ops.broadcast(self._current(), _listed(tensors), root))

    def reduce(self, tensors: Any, opts: Any = 0, op: Any = dist.ReduceOp.SUM) -> Work:
        root, op = (opts, op) if isinstance(opts, int) else (opts.rootRank, opts)
        return self._submit(ops.reduce(self._current(), _listed(tensors), op, root))

    def allgather(self, outputs: Any, inputs: Any, opts: Any = None) -> Work:
        if isinstance(inputs, torch.Tensor):                 # the (list of outputs, input) overload
            outputs, inputs = [outputs], [inputs]
        return self._submit(ops.all_gather(self._current(), outputs, inputs))

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> Work:
        """outputs[r][i] receives rank r's inputs[i] (torch's all_gather_coalesced layout)."""
        comm = self._current()
        if len(outputs) != comm.world or any(len(o) != len(inputs) for o in outputs):
            raise ValueError(f"all_gather_coalesced: expected {comm.world} output lists (one per rank) of "
                             f"{len(inputs)} tensors (one per input)")
        by_input = [[outputs[r][i] for r in range(comm.world)] for i in range(len(inputs))]
        return self._submit(ops.all_gather(comm, by_input, inputs))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:
        return self._submit(ops.all_gather_into_tensor(self._current(), [output], [input]))

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> Work:
        return self._submit(ops.all_gather_into_tensor(self._current(), outputs, inputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, outputs: Any, inputs: Any, opts: Any = dist.ReduceOp.SUM) -> Work:
        if isinstance(outputs, torch.Tensor):                # the (output, list of inputs) overload
            outputs, inputs = [outputs], [inputs]
        return self._submit(ops.reduce_scatter(self._current(), outputs, inputs, opts))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = dist.ReduceOp.SUM) -> Work:
        return self._submit(ops.reduce_scatter_tensor(self._current(), [output], [input], opts))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = dist.ReduceOp.SUM) -> Work:
        return self._submit(ops.reduce_scatter_tensor(self._current(), outputs, inputs, opts))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_splits: list[int],
                          input_splits: list[int], opts: Any = None) -> Work:
        return self._submit(ops.all_to_all_single(self._current(), output, input, output_splits, input_splits))

    alltoall_base = all_to_all_single

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> Work:
        return self._submit(ops.all_to_all(self._current(), outputs, inputs))

    def gather(self, outputs: list[list[torch.Tensor]], inputs: Any, opts: Any = 0) -> Work:
        root = opts if isinstance(opts, int) else opts.rootRank
        return self._submit(ops.gather(self._current(), outputs, _listed(inputs), root))

    def scatter(self, outputs: Any, inputs: list[list[torch.Tensor]], opts: Any = 0) -> Work:
        root = opts if isinstance(opts, int) else opts.rootRank
        return self._submit(ops.scatter(self._current(), _listed(outputs), inputs, root))

    def barrier(self, opts: Any = None) -> Work:
        return self._submit(ops.barrier(self._current()))

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """A barrier that raises on rank 0, naming the ranks that did not reach it within `timeout` (those
        ranks fail too); see p2pgen.torch.monitored_barrier."""
        comm = self._current()
        seconds = (timeout or timedelta(minutes=30)).total_seconds()
        monitored = getattr(comm, "monitored_barrier", None)
        if monitored is None:
            raise NotImplementedError(f"{type(comm).__name__} has no monitored barrier: it runs on the tcp backend")
        self._submit(lambda: (monitored(seconds, wait_all_ranks), [])[1]).wait()

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Work:
        """Posted at once when every operation queued before it only receives (so an isend after an irecv,
        as in batch_isend_irecv, never waits for that receive); otherwise run in issue order."""
        comm = self._current()
        run = ops.send(comm, tensors, dst)
        post = getattr(comm, "post_send", None)
        if post is not None and worker().posting == 0:
            sent = ops.post_send(comm, tensors, dst)
            if sent is not None:
                return self._submit(sent, kind="sent")
        return self._submit(run)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Work:
        return self._submit(ops.recv(self._current(), tensors, src), kind="recv")

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Work:
        comm = self._current()
        if getattr(comm, "recv_any", None) is None:
            raise NotImplementedError(f"{type(comm).__name__} receives from a named rank only: pass src=")
        run = ops.recv_any(comm, tensors)
        return self._submit(lambda: _FromSource(*run()), kind="recv")

    # --- coalescing (torch's _coalescing_manager with a device) ---------------------------------------

    def _start_coalescing(self, device: torch.device) -> None:
        if self._coalesced is not None:
            raise RuntimeError("p2pgen: coalescing is already in progress on this group")
        self._coalesced = []

    def _end_coalescing(self, device: torch.device) -> Work:
        """One Work for every operation issued since _start_coalescing: done when all are, failed with the
        first failure."""
        works, self._coalesced = self._coalesced or [], None

        def joined() -> list[torch.Tensor]:
            tensors: list[torch.Tensor] = []
            for w in works:                              # all ran before this (in issue order)
                tensors.extend(t for t in _flatten(w.get_future().value()))
            return tensors
        return worker().submit(joined, self._record_failure)

    # --- comm hook support --------------------------------------------------------------------------

    def all_reduce_future(self, tensor: torch.Tensor, op: str) -> Future:
        """all_reduce `tensor` in place; the future's value is `tensor` (what DDP's comm hooks return)."""
        run = ops.all_reduce(self._current(), [tensor], ReduceOp(op))
        return self._submit(lambda: run()[0]).get_future()

    def __repr__(self) -> str:
        return f"P2PGenProcessGroup({self.kind}, {self._peek()!r})"


def _listed(tensors: Any) -> list[torch.Tensor]:
    """torch's overloads take a tensor or a list of them."""
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _flatten(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flatten(v)]
    return []

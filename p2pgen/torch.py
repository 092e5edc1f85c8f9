"""torch.distributed on p2pgen: a `p2pgen` backend whose collectives run in the current generation, and DDP on it.

Owns: the torch `ProcessGroup` named `p2pgen` (`P2PGenProcessGroup`), its `Work` objects, the DDP comm
hook, and `DistributedDataParallel`, a DDP that keeps working across generation changes.

Design. torch fixes a ProcessGroup's rank and size when it is built; p2pgen's world changes with every
generation. One `P2PGenProcessGroup` lives as long as the process and asks its *source* for the
communicator at every call: the source is a `Peer` (the collectives of `peer.current_step`, so the first
one of each step also agrees on the step boundary, exactly as `step.all_reduce` does), a fixed `Backend`,
or a callable returning one. `rank()` and `size()` are read per call too. (The numbers torch stored when
the group was built are only the initial ones: code that reads them from C++ never sees a change, which
is why DDP reduces through a comm hook here and never through its own averaging, which divides by the
C++ size.) The alternative, one torch group per generation (destroy and re-init on every change), would
force the application to rebuild its DDP and every other holder of the group at each change; a group
that follows the generation keeps `dist.*` calls and the DDP object valid for the life of the process.

Usage (the step loop of p2pgen.peer, with torch.distributed collectives inside the step):
```python
peer = p2pgen.join(state=state)              # state holds the model's parameters (and optimizer state)
p2pgen.torch.init_process_group(peer)        # = dist.init_process_group("p2pgen", pg_options=peer, ...)
model = p2pgen.torch.DistributedDataParallel(module)
for step in peer.steps():
    with step, p2pgen.torch.unwrap_errors():
        optimizer.zero_grad()
        loss = model(x_shard).pow(2).sum() / GLOBAL_BATCH    # per-sample terms over the *global* batch
        loss.backward()                       # bucket all-reduces (SUM) run in this step's generation
        optimizer.step()
        step.commit()
```
Contract:
- Operations run in issue order on one worker thread per group; the communicator is chosen when the
  operation is *issued*, so an operation issued in generation G never runs in another one. With a Peer
  source, collectives go through the step (traced, and the step's first one agrees on the boundary);
  send/recv run on the step's generation directly (point-to-point is not a collective). A `recv` blocks
  the operations issued after it, as in MPI; do not block on another operation of the group inside a
  future's callback (callbacks run on the worker thread).
- In place, as in torch: `all_reduce`/`broadcast` write their tensor, the others their output tensors.
  Outputs are written only when the operation succeeded; when it fails every tensor passed in is as it
  was passed (p2pgen.collectives.tcp's guarantee, kept for list outputs by gathering into a scratch
  buffer first).
- Tensors: CPU, contiguous, float32/float64/bfloat16/int32/int64; ops SUM, AVG, MIN, MAX. Anything else
  raises TypeError/ValueError at the call, before anything is issued.
- A generation change in the middle of an operation: its `Work` is completed and failed. `work.wait()`
  and `work.get_future().wait()` raise the p2pgen error itself (`GenerationChanged` when this member's
  generation was retired, `PeerLost` when a member of it vanished first); `dist.all_reduce(...)` without
  `async_op` raises it from the call; every later operation issued in that generation fails the same way.
  Inside DDP's backward, torch's C++ reducer waits on the hook's future and turns the error into a
  `RuntimeError`: `unwrap_errors()` turns it back into the p2pgen error (raised `from` it) so that
  `with step:` discards the step and the loop retries it in the next generation.
- DDP: `DistributedDataParallel` never syncs at construction (p2pgen's state pull already makes every
  member hold the frontier state, and a joiner builds its DDP while the others are mid-training), reduces
  buckets with SUM (so the loss must be a sum of per-sample terms divided by the global batch size,
  the rule of p2pgen.peer), and never rebuilds its buckets, so that every member of a generation,
  joiners included, runs the same collectives in the same step.
Invariants kept: an operation runs only in the generation it was issued in, and with a Peer source only
through that generation's Step, so it never runs before the generation's certificate (I4); a step one of
whose operations failed raises (through `unwrap_errors` inside DDP's backward) and is discarded, never
committed (I5). DDP's collectives are a function of the model alone (no bucket rebuild), so members that
run the same model issue the same ones in every step, joiners included.
"""

# No `from __future__ import annotations` here: DDP checks a comm hook's annotations against the real types.
import contextlib
import queue
import threading
from datetime import timedelta
from typing import Any, Callable, Iterator, Protocol, Sequence

import torch
import torch.distributed as dist
from torch.futures import Future

from p2pgen.collectives import Backend
from p2pgen.errors import GenerationChanged, P2PGenError
from p2pgen.peer import Peer, Step

BACKEND = "p2pgen"
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64)
_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", dist.ReduceOp.MIN: "min", dist.ReduceOp.MAX: "max"}


class Comm(Protocol):
    """What an operation runs on: one generation's collectives (a TcpBackend, or a step's)."""

    rank: int
    world: int
    generation: int

    def all_reduce(self, buf: Any, op: str = "sum") -> Any: ...

    def broadcast(self, buf: Any, root: int) -> Any: ...

    def all_gather(self, output: Any, input: Any) -> Any: ...

    def reduce_scatter(self, output: Any, input: Any, op: str = "sum") -> Any: ...

    def barrier(self) -> None: ...

    def send(self, buf: Any, dst: int) -> None: ...

    def recv(self, buf: Any, src: int) -> Any: ...


Source = Peer | Backend | Callable[[], Comm]


class StepComm:
    """One step's collectives (through the Step, which agrees on the step boundary first) and
    point-to-point on the step's generation."""

    def __init__(self, step: Step) -> None:
        self.step = step
        self.rank, self.world, self.generation = step.rank, step.world, step.generation

    def all_reduce(self, buf: Any, op: str = "sum") -> Any:
        return self.step.all_reduce(buf, op=op)

    def broadcast(self, buf: Any, root: int) -> Any:
        return self.step.broadcast(buf, root=root)

    def all_gather(self, output: Any, input: Any) -> Any:
        return self.step.all_gather(output, input)

    def reduce_scatter(self, output: Any, input: Any, op: str = "sum") -> Any:
        return self.step.reduce_scatter(output, input, op=op)

    def barrier(self) -> None:
        self.step.barrier()

    def send(self, buf: Any, dst: int) -> None:
        self._backend().send(buf, dst)

    def recv(self, buf: Any, src: int) -> Any:
        return self._backend().recv(buf, src)

    def _backend(self) -> Backend:
        backend = self.step.peer.backend
        if backend is None or backend.generation != self.generation:
            raise GenerationChanged(f"generation {self.generation} of this step was retired")
        return backend


def resolve(source: Source) -> Callable[[], Comm | None]:
    """The function that names the communicator of the operation being issued now (None: no
    generation yet, e.g. a Peer before its first step)."""
    if isinstance(source, Peer):
        return lambda: StepComm(source.current_step) if source.current_step is not None else None
    if isinstance(source, Backend):
        return lambda: source
    if callable(source):
        return source
    raise TypeError(f"a p2pgen process group needs a Peer, a Backend or a callable returning one, "
                    f"not {type(source).__name__}")


class Work(dist.Work):
    """A p2pgen operation as torch sees it. `wait()` raises the operation's p2pgen error, if any."""

    def __init__(self, future: Future) -> None:
        super().__init__()
        self._future = future
        self._done = threading.Event()
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


class _Runner:
    """One worker thread running a group's operations in issue order (torch's async_op semantics)."""

    def __init__(self, on_failure: Callable[[BaseException], None]) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._on_failure = on_failure
        self._thread = threading.Thread(target=self._loop, name="p2pgen-torch", daemon=True)
        self._thread.start()

    def submit(self, run: Callable[[], Any]) -> Work:
        future: Future = Future()
        work = Work(future)
        self._queue.put((run, future))
        return work

    def close(self) -> None:
        self._queue.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            run, future = item
            try:
                value = run()
            except BaseException as e:    # handed to whoever waits on the future
                self._on_failure(e)
                future.set_exception(e)
            else:
                future.set_result(value)


class P2PGenProcessGroup(dist.ProcessGroup):
    """The `p2pgen` torch ProcessGroup: each operation runs on the communicator its source names when
    the operation is issued (see the module docstring). Build it with `init_process_group(source)`."""

    def __init__(self, source: Source, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self._comm = resolve(source)
        self.failures = 0                                  # operations that failed so far
        self.last_failure: BaseException | None = None
        self._runner = _Runner(self._record_failure)

    def getBackendName(self) -> str:
        return BACKEND

    def rank(self) -> int:
        """This member's rank in the current generation (before the first one: torch's initial value)."""
        comm = self._comm()
        return comm.rank if comm is not None else super().rank()

    def size(self) -> int:
        """The current generation's world size (before the first one: torch's initial value)."""
        comm = self._comm()
        return comm.world if comm is not None else super().size()

    @property
    def generation(self) -> int | None:
        """The generation the next operation would run in (None before the first one)."""
        comm = self._comm()
        return comm.generation if comm is not None else None

    def _current(self) -> Comm:
        comm = self._comm()
        if comm is None:
            raise RuntimeError("torch.distributed collectives on p2pgen run inside a step: "
                               "`for step in peer.steps(): with step: ...`")
        return comm

    def shutdown(self) -> None:
        self._runner.close()

    # --- collectives (the methods torch.distributed calls) -----------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Work:
        (tensor,) = _checked(tensors, "all_reduce")
        op, comm = _op(opts.reduceOp), self._current()
        return self._runner.submit(lambda: [comm.all_reduce(tensor, op=op)])

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Work:
        (tensor,) = _checked(tensors, "broadcast")
        comm = self._current()
        return self._runner.submit(lambda: [comm.broadcast(tensor, root=opts.rootRank)])

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> Work:
        (tensor,) = _checked(inputs, "all_gather input")
        (out_list,) = outputs
        comm = self._current()
        _check_list(out_list, tensor, comm.world, "all_gather")

        def run() -> list[list[torch.Tensor]]:
            gathered = comm.all_gather(torch.empty((comm.world, *tensor.shape), dtype=tensor.dtype), tensor)
            for out, part in zip(out_list, gathered):
                out.copy_(part)
            return outputs
        return self._runner.submit(run)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Work:
        output, input = _checked([output, input], "all_gather_single")
        comm = self._current()
        _check_pair(input, output, comm.world, "all_gather_single")
        return self._runner.submit(lambda: [comm.all_gather(output, input)])

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> Work:
        (output,) = _checked(outputs, "reduce_scatter output")
        (in_list,) = inputs
        op, comm = _op(opts.reduceOp), self._current()
        _check_list(in_list, output, comm.world, "reduce_scatter")
        return self._runner.submit(lambda: [comm.reduce_scatter(output, torch.stack(in_list), op=op)])

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Work:
        output, input = _checked([output, input], "reduce_scatter_single")
        op, comm = _op(opts.reduceOp), self._current()
        _check_pair(output, input, comm.world, "reduce_scatter_single")
        return self._runner.submit(lambda: [comm.reduce_scatter(output, input, op=op)])

    def barrier(self, opts: Any = None) -> Work:
        comm = self._current()
        return self._runner.submit(lambda: [comm.barrier()])

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Work:
        (tensor,) = _checked(tensors, "send")
        comm = self._current()
        return self._runner.submit(lambda: [comm.send(tensor, dst)])

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Work:
        (tensor,) = _checked(tensors, "recv")
        comm = self._current()
        return self._runner.submit(lambda: [comm.recv(tensor, src)])

    # --- comm hook support --------------------------------------------------------------------------

    def all_reduce_future(self, tensor: torch.Tensor, op: str) -> Future:
        """all_reduce `tensor` in place; the future's value is `tensor` (what DDP's comm hooks return)."""
        (tensor,) = _checked([tensor], "all_reduce")
        comm = self._current()
        return self._runner.submit(lambda: comm.all_reduce(tensor, op=op)).get_future()

    def _record_failure(self, error: BaseException) -> None:
        self.last_failure = error
        self.failures += 1

    def __repr__(self) -> str:
        return f"P2PGenProcessGroup({self._comm()!r})"


def _checked(tensors: Sequence[torch.Tensor], what: str) -> list[torch.Tensor]:
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cpu":
            raise ValueError(f"{what}: the p2pgen backend takes CPU tensors, not {t.device}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{what}: dtype {t.dtype} is not supported; use one of {[str(d) for d in DTYPES]}")
        if not t.is_contiguous():
            raise ValueError(f"{what}: the tensor is not contiguous: pass x.contiguous()")
    return list(tensors)


def _check_list(tensors: list[torch.Tensor], like: torch.Tensor, world: int, what: str) -> None:
    _checked(tensors, what)
    if len(tensors) != world:
        raise ValueError(f"{what}: {len(tensors)} tensors in the list, the generation has {world} members")
    for t in tensors:
        if t.shape != like.shape or t.dtype != like.dtype:
            raise ValueError(f"{what}: every tensor in the list must be {tuple(like.shape)} {like.dtype}, "
                             f"got {tuple(t.shape)} {t.dtype}")


def _check_pair(small: torch.Tensor, big: torch.Tensor, world: int, what: str) -> None:
    if small.dtype != big.dtype:
        raise TypeError(f"{what}: dtypes differ ({small.dtype} vs {big.dtype})")
    if big.numel() != small.numel() * world:
        raise ValueError(f"{what}: the larger tensor has {big.numel()} elements, expected world ({world}) "
                         f"x {small.numel()} = {small.numel() * world}")


def _op(op: Any) -> str:
    for known, name in _OPS.items():
        if op == known:
            return name
    raise ValueError(f"reduce op {op} is not supported by p2pgen; use SUM, AVG, MIN or MAX")


# --- registration and the default group ---------------------------------------------------------------

def _create(options: Any, source: Source) -> P2PGenProcessGroup:
    if source is None:
        raise ValueError('dist.init_process_group("p2pgen") needs pg_options=<Peer or Backend>: '
                         "use p2pgen.torch.init_process_group(peer)")
    return P2PGenProcessGroup(source, options.group_rank, options.group_size)


dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])


def init_process_group(source: Source) -> P2PGenProcessGroup:
    """`dist.init_process_group("p2pgen")` with `source` as the communicator provider; returns the group.

    No rendezvous store is involved (p2pgen's membership comes from Raft), so a process-local HashStore
    is passed; the rank and size given to torch are the source's current ones when known, else 0 and 1.
    """
    rank, size = _initial_position(source)
    dist.init_process_group(BACKEND, store=dist.HashStore(), rank=rank, world_size=size, pg_options=source)
    return default_group()


def _initial_position(source: Source) -> tuple[int, int]:
    comm = resolve(source)()
    return (comm.rank, comm.world) if comm is not None else (0, 1)


def default_group() -> P2PGenProcessGroup:
    group = dist.group.WORLD
    if not isinstance(group, P2PGenProcessGroup):
        raise RuntimeError(f"the default process group is {group!r}, not p2pgen's: "
                           "call p2pgen.torch.init_process_group(peer) first")
    return group


@contextlib.contextmanager
def unwrap_errors(group: P2PGenProcessGroup | None = None) -> Iterator[None]:
    """Re-raise a p2pgen error that torch wrapped in a RuntimeError (DDP's reducer does, in backward).

    Use it inside `with step:` (`with step, p2pgen.torch.unwrap_errors():`) so that the step sees
    GenerationChanged/PeerLost and discards itself. Only errors raised while an operation of `group`
    failed are translated; any other exception passes unchanged.
    """
    group = group or default_group()
    failures = group.failures
    try:
        yield
    except P2PGenError:
        raise
    except RuntimeError as e:
        if group.failures != failures and group.last_failure is not None:
            raise group.last_failure from e
        raise


# --- DDP ------------------------------------------------------------------------------------------------

def allreduce_hook(group: P2PGenProcessGroup, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """DDP comm hook: SUM the bucket in the generation current when the bucket is ready."""
    return group.all_reduce_future(bucket.buffer(), "sum")


class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    """torch DDP on a p2pgen group that survives generation changes (see the module docstring).

    Gradients are SUMMED over the members (no division by the world size): write the loss as a sum of
    per-sample terms divided by the global batch size. Keyword arguments go to torch's DDP, except
    `init_sync` (always False), `find_unused_parameters` (always True) and `static_graph` (always False).

    Why find_unused_parameters: torch's reducer otherwise *rebuilds* its buckets once, after the first
    backward of its life (two broadcasts, then a new bucket layout). A joiner's reducer would do that
    steps later than the survivors', so in between the members would all-reduce different bucket
    layouts. With find_unused_parameters=True torch never rebuilds: the layout is a function of the
    model alone, and every member, joiner or survivor, issues the same collectives in every step (the
    bucket all-reduces, then a small int32 all-reduce of the used-parameter map).
    """

    def __init__(self, module: torch.nn.Module, process_group: "P2PGenProcessGroup | None" = None,
                 **kwargs: Any) -> None:
        for name, allowed in (("init_sync", False), ("find_unused_parameters", True), ("static_graph", False)):
            if kwargs.pop(name, allowed) != allowed:
                raise ValueError(f"{name}={not allowed} is not supported on p2pgen (see "
                                 "p2pgen.torch.DistributedDataParallel's docstring)")
        group = process_group or default_group()
        super().__init__(module, process_group=group, init_sync=False, find_unused_parameters=True, **kwargs)
        self.register_comm_hook(group, allreduce_hook)

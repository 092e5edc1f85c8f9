"""The Peer inside the application: its agent link, its data plane, and the step loop.

Owns: one incarnation's participation in generations. `peer.steps()` yields one `Step` per training
step of the current generation; between generations it performs what its follower
(`p2pgen.core.follower`, pure) decides on the latest view of the job (`p2pgen.core.view.JobView`): quiesce
the old communicator, vote `ready` with its revision and digest, pull the frontier state if told to, report
`synced`, and build the next generation's communicator from the certificate's rank map. The Peer is the shell:
it gathers the snapshot, performs the action (I/O, clocks, threads) and reports the result back; a
`PeerObserver` may watch every action (the chaos benchmark's fault hooks and records).

Contract (in the style of torchft): the body of a step runs inside `with step:`.
```python
for step in peer.steps():          # waits for an active generation; syncs state if behind
    with step:                     # a generation change inside discards the step; the loop retries it
        loss = model(batch_for(step.revision, step.rank, step.world)); loss.backward()
        step.all_reduce(grads, op="sum")
        optimizer.step()
        step.commit()              # revision += 1
```
- Mutate shared state only after the step's last collective returned and before `commit()`: a step that
  raised `GenerationChanged`/`PeerLost` must leave the state as it was (the collective itself leaves
  its buffers untouched when it raises; see p2pgen.collectives.tcp).
- A step's global batch must not depend on the world size: split the batch of revision r into
  `world` contiguous shards and reduce with SUM of per-sample terms divided by the *global* batch size.
Invariants kept:
- I4: no collective of generation G runs before this peer saw G's certificate (which exists only once
  every member is synced); every collective is recorded in the trace with its generation.
- I2/I3: the communicator of G is bound to G and to this incarnation; a peer whose incarnation was
  evicted stops acting (`Evicted`) and its agent restarts it as a new incarnation.
- Joins take effect at a step boundary: the first collective of every step also reduces (MAX) the
  highest pending generation any member has seen, so all members leave G after the same committed step.
- What reaches the application from `steps()` and its steps: `GenerationChanged` / `PeerLost` inside
  `with step:` (swallowed there: the step is retried), and two fatal errors, after which the process
  must exit (its agent restarts it as a new incarnation): `Evicted` (this incarnation was removed from
  the job) and `AgentLost` (the local agent died or stopped answering). An agent that answers but
  cannot take a command now (no Raft quorum, its node restarting) is waited for, never raised.
- `encrypt=True` (`--encrypt`): every link this peer dials or accepts, data plane, state transfer and channels,
  is sealed (`p2pgen.transport.seal`); a member with the other setting is refused at the handshake.
- State that outlives this process (`p2pgen.state.keeper`): the local copy is restored before the first
  vote, snapshotted at commits (saved in the background) and saved whole at every activation that changed
  it; a generation held because its frontier would regress
  is asked to fall back only once its wait is over, and a regressed activation is logged loudly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import numpy as np

from p2pgen.agent.client import AgentClient
from p2pgen.agent.rpc import RpcError, split_addr
from p2pgen.auth import load_secret
from p2pgen.channel import Channel, ChannelConfig, ChannelListener, ChannelReceiver
from p2pgen.collectives import Backend, ReduceOp
from p2pgen.collectives.compress import ErrorFeedback, check_compression, compressed_all_reduce
from p2pgen.collectives.select import backend_factory, check_kind, offer_comm_id
from p2pgen.core import Command, Fallback, Ready, Reform, Synced
from p2pgen.core.follower import (
    CERTIFIED,
    REFORM_AFTER_S,
    Action,
    Activate,
    AskFallback,
    AskReform,
    Exit,
    Fetch,
    FetchShards,
    Follower,
    FollowerPolicy,
    Local,
    NoteHold,
    ReportSynced,
    Retire,
    RunStep,
    Stop,
    Vote,
    Wait,
)
from p2pgen.core.view import ActiveGeneration, JobView, cut_off
from p2pgen.errors import AgentLost, Evicted, GenerationChanged, P2PGenError, PeerLost
from p2pgen.progress import Progress
from p2pgen.stallreport import StallReporter
from p2pgen.state import (
    CheckpointError,
    ServerConfig,
    SharedState,
    Source,
    StateKeeper,
    StateKeeperConfig,
    StateServer,
    StateSyncError,
    pull_state,
)
from p2pgen.state.pull import PullConfig
from p2pgen.state.shardpull import pull_shards
from p2pgen.transport import Endpoint, Group, Transport, TransportConfig, seal

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

Buffer: TypeAlias = "np.ndarray | torch.Tensor"   # what a collective takes: a numpy array or a torch tensor

WATCH_POLL_S = 1.0
AGENT_SILENT_TRIES = 3           # consecutive unanswered calls after which the local agent counts as lost
VIEW_WAIT_S = 0.2                # longest wait for a new view when the follower has nothing to do now


class Trace:
    """Append-only JSON-lines record of what this peer did, for tests and post-mortems (None: off)."""

    def __init__(self, path: str | None, identity: tuple[str, int]) -> None:
        self._file = open(path, "a", buffering=1) if path else None
        self._identity = identity

    def record(self, event: str, **fields: Any) -> None:
        if self._file is not None:
            self._file.write(json.dumps({"t": time.time(), "peer": self._identity[0],
                                         "incarnation": self._identity[1], "event": event, **fields}) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class WrappedErrors(Protocol):
    """A library that re-raises a p2pgen error as an exception of its own (torch's DDP reducer turns it into a
    RuntimeError with the text only). `mark()` is taken when a step starts; `unwrap(error, mark)` returns the
    p2pgen error behind `error` if one was raised by that library's operations since the mark, else None."""

    def mark(self) -> Any: ...

    def unwrap(self, error: BaseException, mark: Any) -> BaseException | None: ...


_wrapped_errors: list[WrappedErrors] = []


def recognize_wrapped_errors(source: WrappedErrors) -> None:
    """Let `with step:` see through `source`'s wrapping (p2pgen.torch registers torch's on import), so that a
    generation change inside a library call discards the step like one raised directly."""
    if source not in _wrapped_errors:
        _wrapped_errors.append(source)


class PeerObserver:
    """Watches the follower's actions as the peer performs them (the chaos benchmark fires its transition-point
    faults and records activations here). `before` runs before an action is performed; `after` once it was,
    with its result: True done, False refused by the job, None not possible now. The default does nothing."""

    def before(self, peer: Peer, action: Action) -> None:
        pass

    def after(self, peer: Peer, action: Action, ok: bool | None) -> None:
        pass


class Step:
    """One training step of one generation. Use as a context manager (see the module docstring).

    Read-only for the application: `generation`, `rank`, `world` (this generation's), `revision` (the state's
    revision when the step started; `commit()` makes it revision + 1), `committed`, `discarded` (the error
    that discarded it, or None) and `peer`.

    Every collective below goes through the step: the first one of a step also agrees on the step boundary (a
    join waits for it), and each is recorded in the trace with its generation. They raise the same errors:

    Raises:
        GenerationChanged: the generation was retired during the call (a member left or was evicted, the peer
            was closed or cut off from the job); `with step:` discards the step and `peer.steps()` retries the
            same revision in the next generation. The buffers are as they were passed.
        PeerLost: a member of this generation stopped answering (for `monitored_barrier`, `BarrierTimeout`, a
            PeerLost); discarded and retried the same way.
        ProtocolError: a member sent a malformed or unexpected frame; not swallowed by `with step:`.
        TypeError: `op` is not defined on the buffer's dtype (the message lists what is), before anything is
            sent.
        ValueError: an unknown `op`, sizes that do not match the world, or a rank outside the generation,
            before anything is sent.
        RuntimeError: the step was already committed.
    """

    def __init__(self, peer: Peer, backend: Backend) -> None:
        self.peer, self._backend = peer, backend
        self.generation, self.rank, self.world = backend.generation, backend.rank, backend.world
        self.revision = peer.state.revision           # the revision this step will commit as revision + 1
        self.committed = False
        self.discarded: BaseException | None = None
        self._control_done = False
        self._marks = [(source, source.mark()) for source in _wrapped_errors]
        self._feedback: list[tuple[ErrorFeedback, Any]] = []     # adopted at commit
        self._wire_start = _wire_counters(backend)

    # --- collectives: the first one also agrees on the step boundary ------------------------------

    def all_reduce(self, buf: Buffer, op: ReduceOp | str = "sum", compress: str | None = None,
                   feedback: ErrorFeedback | None = None) -> Buffer:
        """Reduce `buf` over every member of the generation, in place; bit-identical on every member.

        Args:
            buf: the buffer, a numpy array or a torch tensor (on the CPU for tcp, on the GPU for nccl), the same
                shape and dtype on every member.
            op: a ReduceOp or its name: "sum" (the default), "avg", "product", "min", "max", "band", "bor",
                "bxor" (compressed: "sum" or "avg").
            compress: None (full precision), or "bf16" / "int8" on the wire
                (`p2pgen.collectives.compress`; float32/float64 buffers; the same bits on every member).
            feedback: with `compress`, an ErrorFeedback for this buffer: its residual joins this member's
                contribution, and the new one is adopted only if this step commits.

        Returns:
            `buf`, holding the result.

        Raises:
            GenerationChanged, PeerLost, ProtocolError, TypeError, RuntimeError: see `Step`.
            ValueError: an unknown `compress`, `feedback` without `compress`, or one ErrorFeedback used twice
                in one step (and the backend's refusals).
        """
        mode = check_compression(compress)
        if mode is None:
            if feedback is not None:
                raise ValueError("feedback= needs compress='bf16' or 'int8': a full-precision all_reduce leaves "
                                 "no error to feed back")
            return self._run("all_reduce", buf, op=op)
        if feedback is not None and any(fb is feedback for fb, _ in self._feedback):
            raise ValueError("this ErrorFeedback was already used in this step: give each buffer its own")
        residual = None if feedback is None else feedback.current(buf)
        self._begin("all_reduce", compress=mode)
        left = compressed_all_reduce(self._backend, buf, mode=mode, op=op, residual=residual)
        if feedback is not None:
            self._feedback.append((feedback, left))
        return buf

    def broadcast(self, buf: Buffer, root: int) -> Buffer:
        """Copy rank `root`'s `buf` into every member's `buf`, in place.

        Args:
            buf: the buffer (any dtype), the same shape and dtype on every member.
            root: the rank whose buffer is sent, in `range(step.world)`.

        Returns:
            `buf`, holding root's data.

        Raises:
            GenerationChanged, PeerLost, ProtocolError, ValueError, RuntimeError: see `Step`.
        """
        return self._run("broadcast", buf, root=root)

    def all_gather(self, output: Buffer, input: Buffer) -> Buffer:
        """Concatenate every member's `input`, in rank order, into every member's `output`.

        Args:
            output: `world` times the size of `input`, of its dtype.
            input: this member's part, the same size on every member.

        Returns:
            `output`.

        Raises:
            GenerationChanged, PeerLost, ProtocolError, ValueError, RuntimeError: see `Step`.
        """
        return self._run("all_gather", output, input)

    def reduce_scatter(self, output: Buffer, input: Buffer, op: ReduceOp | str = "sum") -> Buffer:
        """Reduce `input` over every member and give rank r the r-th of `world` equal parts of the result.

        Args:
            output: one part: `input`'s size divided by `world`, of its dtype.
            input: the whole buffer, the same size on every member.
            op: a ReduceOp or its name (see `all_reduce`).

        Returns:
            `output`, holding this member's part.

        Raises:
            GenerationChanged, PeerLost, ProtocolError, TypeError, ValueError, RuntimeError: see `Step`.
        """
        return self._run("reduce_scatter", output, input, op=op)

    def barrier(self) -> None:
        """Return once every member of the generation reached it.

        Raises:
            GenerationChanged, PeerLost, ProtocolError, RuntimeError: see `Step`.
        """
        self._run("barrier")

    def all_to_all(self, output: Buffer, input: Buffer, output_splits: Sequence[int] | None = None,
                   input_splits: Sequence[int] | None = None) -> Buffer:
        """Send part r of `input` to rank r and receive every rank's part for this member into `output`.

        Args:
            output: receives the parts, in rank order.
            input: holds the parts, in rank order.
            output_splits: elements received from each rank (default: `output` cut into `world` equal parts).
            input_splits: elements sent to each rank (default: `input` cut into `world` equal parts).

        Returns:
            `output`.

        Raises:
            GenerationChanged, PeerLost, ProtocolError, ValueError, RuntimeError: see `Step`.
        """
        return self._run("all_to_all", output, input, output_splits, input_splits)

    def collective(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Any collective of this generation's backend by name (e.g. tcp's `monitored_barrier`), through the
        step like the ones above: the step's first collective also agrees on the step boundary.

        Args:
            name: the backend method, e.g. "monitored_barrier", "send", "recv".
            *args: its positional arguments.
            **kwargs: its keyword arguments.

        Returns:
            What the backend's method returns.

        Raises:
            GenerationChanged, PeerLost, ProtocolError, TypeError, ValueError, RuntimeError: see `Step`;
            AttributeError when this backend has no collective `name`.
        """
        return self._run(name, *args, **kwargs)

    def record(self, event: str, **fields: Any) -> None:
        """Add an event of the application's own to this peer's trace (a no-op unless tracing is on:
        `P2PGEN_TRACE_DIR`), beside the runtime's events, with the peer, incarnation and time.

        Args:
            event: the event's name.
            **fields: JSON-serializable fields.
        """
        self.peer._trace.record(event, **fields)

    def wire_bytes(self) -> dict[str, int] | None:
        """Payload bytes and frames this member's links moved since this step began (its collectives and the
        boundary agreement: `bytes_sent`, `bytes_received`, `frames_sent`, `frames_received`; see
        `TcpBackend.counters`), or None on a backend that keeps no counters (nccl)."""
        now = _wire_counters(self._backend)
        if now is None or self._wire_start is None:
            return None
        return {key: now[key] - self._wire_start[key] for key in now}

    def _run(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self._begin(name)
        return getattr(self._backend, name)(*args, **kwargs)

    def _begin(self, name: str, **fields: Any) -> None:
        if self.committed:
            raise RuntimeError(f"{name} after commit(): a committed step runs no more collectives")
        if not self._control_done:
            self._agree_on_boundary()
        self.peer._trace.record("collective", generation=self.generation, op=name, seq=self._backend.op_seq,
                                revision=self.revision, **fields)

    def _agree_on_boundary(self) -> None:
        control = np.array([self.peer._pending_join_seen()], dtype=np.int64)
        self.peer._trace.record("collective", generation=self.generation, op="control", seq=self._backend.op_seq,
                               revision=self.revision)
        self._backend.all_reduce(control, op="max")
        self._control_done = True
        if control[0] > self.generation:
            self.peer._switch_after_step(int(control[0]))

    # --- commit and the context manager -------------------------------------------------------------

    def commit(self) -> int:
        """Record that the state now holds revision + 1: the only way to commit. Call after the optimizer step,
        once the step's last collective returned. It returns once the host's local copy (on by default; off with
        `join --no-local-state`) holds the new revision.

        Returns:
            The new revision.

        Raises:
            RuntimeError: the step was already committed.
            GenerationChanged, PeerLost: a step that ran no collective agrees on the boundary here (see `Step`).
        """
        if self.committed:
            raise RuntimeError("commit() called twice for one step")
        if not self._control_done:
            self._agree_on_boundary()      # a step with no collective still agrees on the boundary
        revision = self.peer.state._commit()
        self.committed = True
        for feedback, residual in self._feedback:
            feedback.adopt(residual)
        keeper = self.peer._keeper
        if keeper is not None:       # a snapshot for the local copy, saved while the next step computes
            assert self.peer.certificate is not None          # a step runs only in an activated generation
            keeper.committed(self.peer.certificate, self.rank)
        copy = {"snapshot": keeper.snapshotted} if keeper is not None else {}
        self.peer._trace.record("commit", generation=self.generation, revision=revision, **copy)
        return revision

    def __enter__(self) -> Step:
        return self

    def __exit__(self, kind: type | None, err: BaseException | None, tb: Any) -> bool:
        if err is not None and not isinstance(err, P2PGenError):
            err = self._unwrapped(err) or err
        if err is not None and isinstance(err, (GenerationChanged, PeerLost)) and not self.committed:
            self.discarded = err
            self.peer._trace.record("discard", generation=self.generation, revision=self.revision, reason=str(err))
            log.info("step %d discarded in generation %d: %s", self.revision, self.generation, err)
            return True
        return False

    def _unwrapped(self, err: BaseException) -> BaseException | None:
        for source, mark in self._marks:
            inner = source.unwrap(err, mark)
            if inner is not None:
                return inner
        return None


def _wire_counters(backend: Backend) -> dict[str, int] | None:
    counters = getattr(backend, "counters", None)
    return counters() if callable(counters) else None


class Peer:
    """One application process of the job. Create it with `p2pgen.join()`.

    What an application uses: `steps()`, `channel()`, `inbox()`, `close()`; `state` (the SharedState it joined
    with), `job`, `peer_id`, `incarnation`; `rank`, `world`, `generation` (of the generation it runs, None
    between generations); `certificate` (that generation's certificate, e.g. its shard ownership) and `stats`
    (generations, steps committed and discarded, seconds spent between generations). Everything whose name
    begins with `_` belongs to the runtime: the job secret, the agent link, the data plane, the follower.
    """

    def __init__(self, job: str, state: SharedState, agent_addr: str, peer_id: str, incarnation: int,
                 secret: bytes, data_addr: str, state_addr: str, trace_path: str | None = None,
                 reform_after: float = REFORM_AFTER_S, backend: str = "tcp", channel_addr: str | None = None,
                 channel_dir: str | None = None, keep: StateKeeperConfig | None = None,
                 policy: FollowerPolicy = CERTIFIED, observer: PeerObserver | None = None,
                 shard_pull_config: PullConfig = PullConfig(), encrypt: bool = False) -> None:
        self.job, self.state, self.peer_id, self.incarnation = job, state, peer_id, incarnation
        self._backend_kind = check_kind(backend)
        if encrypt and self._backend_kind != "tcp":
            raise P2PGenError(f"--encrypt seals the tcp backend's links, but this peer runs backend "
                              f"{backend!r}, whose tensors cross the network unencrypted: use P2PGEN_BACKEND=tcp "
                              "with --encrypt, or run without --encrypt on a network you trust")
        self._encrypt = encrypt
        self._identity = (peer_id, incarnation)
        self._keeper = StateKeeper(keep, state, job, self._identity) if keep is not None and keep.enabled else None
        self._lineage = 0                 # the generation this process's state belongs to (see core: lineage)
        self._secret = secret
        self._shard_pull_config = dataclasses.replace(shard_pull_config, encrypt=encrypt)
        self._trace = Trace(trace_path, self._identity)
        self._follower = Follower(self._identity, time.monotonic(), policy, reform_after)
        self._observer = observer or PeerObserver()
        self._agent = AgentClient(agent_addr, secret, job=job)
        if self._agent.attach(incarnation).get("agent_voted", False):
            self._follower.owe_reform("attached after the agent voted on its behalf")
        host, port = split_addr(data_addr)
        self._transport = Transport(job, secret, peer_id, incarnation, host=host, port=port,
                                   config=TransportConfig(encrypt=encrypt))
        shost, sport = split_addr(state_addr)
        self._state_server = StateServer(state, job=job, secret=secret, me=self._identity, authorize=self._authorize,
                                        host=shost, port=sport, config=ServerConfig(encrypt=encrypt))
        self._serving = contextlib.ExitStack()      # open while quiesced between generations
        self._channels: dict[str, Channel] = {}
        self._listener: ChannelListener | None = None
        if channel_addr and channel_dir:
            chost, cport = split_addr(channel_addr)
            self._listener = ChannelListener(job, secret, self._identity, channel_dir, host=chost, port=cport,
                                             config=ChannelConfig(encrypt=encrypt))
        self._backend: Backend | None = None
        self._current_step: Step | None = None      # the step last yielded by steps() (read by p2pgen.torch)
        self.certificate: ActiveGeneration | None = None   # the certificate of the generation this member runs
        self._switch_to: int | None = None
        self._fenced: tuple[Backend, str] | None = None   # (communicator, why) the fence aborted last (see _local)
        self._view = JobView.from_json(self._agent.show())    # the job as the local agent last showed it
        self._view_lock = threading.Condition()
        self._closed = threading.Event()
        self._drained = threading.Event()     # the agent drains (SIGTERM, a spot notice): stop at a step boundary
        self._lost: str | None = None             # why the local agent counts as lost (set by the watcher)
        self._watcher = threading.Thread(target=self._watch, args=(agent_addr,), name="p2pgen-watch", daemon=True)
        self._watcher.start()
        StallReporter(lambda: AgentClient(agent_addr, self._secret, job=job), self._stall_sample, incarnation,
                      self._closed)
        self.stats = {"generations": 0, "steps_committed": 0, "steps_discarded": 0, "seconds_between": 0.0}
        self._progress = Progress.from_env(self)    # committed steps for `join --local --chaos` and `p2pgen stress`
        global _current
        _current = self

    # --- the step loop -------------------------------------------------------------------------------

    def steps(self) -> Iterator[Step]:
        """Steps of the current generation, forever; crosses generation changes transparently.
        Ends when `close()` was called, or at the next step boundary once the agent drains (it was sent SIGTERM
        or read a spot notice: the process should then finish and exit, and the job goes on without it).

        Raises:
            Evicted: this incarnation was removed from the job; the process must exit (its agent restarts it).
            AgentLost: the local agent died or stopped answering; the process must exit.
        """
        while not isinstance(self._next_action(), Stop):
            assert self._backend is not None
            step = Step(self, self._backend)
            self._current_step = step
            yield step
            if step.committed:
                self.stats["steps_committed"] += 1
                self._progress.committed(step)
            else:
                self.stats["steps_discarded"] += 1
        if self._drained.is_set():
            self._report_stopped()
        if self._lost is not None:
            raise AgentLost(f"{self.peer_id}#{self.incarnation} lost its agent ({self._lost}): this process can no "
                            "longer know its generation and must exit; a live agent restarts it as a new incarnation")

    def _report_stopped(self) -> None:
        """Tell the draining agent that this process stopped at a step boundary: it records the leave at once,
        while this process finishes (and still serves its state), instead of waiting for it to exit."""
        try:
            self._agent._call("stopped", incarnation=self.incarnation, revision=self.state.revision)
        except (OSError, P2PGenError) as e:
            log.info("could not tell the agent this process stopped at revision %d (%s): it leaves once this "
                     "process exits", self.state.revision, e)

    @property
    def rank(self) -> int | None:
        """This member's rank in the generation it runs; None between generations."""
        return self._backend.rank if self._backend else None

    @property
    def world(self) -> int | None:
        """The number of members of the generation it runs; None between generations."""
        return self._backend.world if self._backend else None

    def wire_counters(self) -> dict[str, int]:
        """Payload bytes and frames this process's data plane moved, every generation together
        (`Transport.wire_counters`)."""
        return self._transport.wire_counters()

    @property
    def generation(self) -> int | None:
        """The generation it runs; None between generations."""
        return self._backend.generation if self._backend else None

    def _switch_after_step(self, generation: int) -> None:
        self._switch_to = generation

    def _pending_join_seen(self) -> int:
        """The pending generation if it only adds members to ours (a join waits for a step boundary)."""
        pending = self._view.pending
        if pending is None or self._backend is None:
            return 0
        return pending.generation if all(pending.has(m.identity) for m in self._backend.group.members) else 0

    # --- exactly-once channels ------------------------------------------------------------------------

    def channel(self, peer_id: str, mode: str = "exactly_once") -> Channel:
        """A point-to-point stream to `peer_id` that survives faults and generation changes: a message
        counts as delivered only once the receiver consumed it (its consumption log, I6).

        Args:
            peer_id: the receiving member.
            mode: "exactly_once" (the default: a message is done once consumed), "naive" or "batched" (done once
                delivered, per message or per batch; see `p2pgen.channel.sender`).

        Returns:
            The Channel (one per receiver; a second call returns the same one).

        Raises:
            P2PGenError: `peer_id` is not a member with a channel address (the message lists the members).
        """
        if peer_id not in self._channels:
            self._channels[peer_id] = Channel(self.job, self._secret, self._identity, self._channel_endpoint(peer_id),
                                              mode=mode, generation=self.generation or 0,
                                              config=ChannelConfig(encrypt=self._encrypt))
        return self._channels[peer_id]

    def inbox(self, sender: str) -> ChannelReceiver:
        """Messages from `sender`'s channel to this peer; call `message.consumed()` after using each.

        Args:
            sender: the sending member's peer id.

        Raises:
            P2PGenError: this peer has no channel listener (it was not started under an agent).
        """
        if self._listener is None:
            raise P2PGenError("this peer has no channel listener: start it under an agent (P2PGEN_CHANNEL_ADDR)")
        return self._listener.receiver(sender)

    def _channel_endpoint(self, peer_id: str) -> Endpoint:
        member = self._view.member(peer_id)
        addr = member.addr("channel") if member else None
        if member is None or addr is None:
            raise P2PGenError(f"{peer_id} is not a member with a channel address; known: "
                              f"{sorted(m.peer_id for m in self._view.members)}")
        host, port = split_addr(addr)
        return Endpoint(peer_id, member.incarnation, host, port)

    def _move_channels(self, generation: int) -> None:
        """Every channel follows the job into `generation` (reconnect, read the receiver's log, resend the
        missing numbers); a receiver that is not back yet is retried by the channel in the background."""
        if self._listener is not None:
            self._listener.on_generation(generation)
        for peer_id, ch in self._channels.items():
            try:
                remote = self._channel_endpoint(peer_id)
            except P2PGenError:
                continue                       # the receiver is gone for now; the channel keeps its target
            threading.Thread(target=self._move_channel, args=(ch, generation, remote), daemon=True).start()

    @staticmethod
    def _move_channel(ch: Channel, generation: int, remote: Endpoint) -> None:
        try:
            ch.on_generation(generation, remote)
        except (GenerationChanged, PeerLost) as e:
            log.info("channel to %s not yet moved to generation %d: %s", remote.peer_id, generation, e)

    def close(self) -> None:
        """Leave the step loop (`steps()` ends) and close the data plane, the state server, the channels and the
        agent link. Idempotent; the process may then exit."""
        global _current
        if _current is self:
            _current = None
        self._closed.set()
        if self._backend is not None:
            self._backend.abort("peer closed")
        self._serving.close()
        self._state_server.close()
        if self._keeper is not None:
            self._keeper.close()
        for ch in self._channels.values():
            ch.close()
        if self._listener is not None:
            self._listener.close()
        self._transport.close()
        self._agent.close()
        self._trace.close()
        self._progress.close()

    # --- between generations: the follower decides, the peer performs ----------------------------------------

    def _next_action(self) -> RunStep | Stop:
        """Perform the follower's decisions (core.follower) until it says to run a step of the current generation
        or to stop. Raises `Evicted` when it says this incarnation must exit."""
        while True:
            view = self._view
            action = self._follower.decide(view, self._local())
            if isinstance(action, (RunStep, Stop)):
                return action
            self._observer.before(self, action)
            ok = self._perform(action, view)
            self._observer.after(self, action, ok)
            if ok is not True:                 # nothing to do, refused, or not possible now: wait for a new view
                self._wait_view(view, VIEW_WAIT_S)

    def _local(self) -> Local:
        backend, fenced = self._backend, self._fenced
        return Local(now=time.time(), clock=time.monotonic(),
                     running=backend.generation if backend is not None else None,
                     failed=backend is not None and backend.failed is not None, switch_to=self._switch_to,
                     fenced=fenced[1] if fenced is not None and fenced[0] is backend else "",
                     closed=self._closed.is_set(),
                     at_stop=self._drained.is_set() or self.state.revision >= self._progress.stop_revision())

    def _perform(self, action: Action, view: JobView) -> bool | None:
        """Do `action` and report it to the follower; True done, False refused by the job, None not possible now."""
        match action:
            case Retire():
                return self._retire(action)
            case Exit(reason=reason):
                self.close()
                raise Evicted(f"{reason}: this process must exit; its agent restarts it as a new incarnation")
            case Activate(active=active):
                self.stats["seconds_between"] += time.monotonic() - self._follower.progress.since
                self._activate(active)
                ok: bool | None = True
            case Vote():
                ok = self._vote(action, view)
            case Fetch(pull=pull) if pull.checkpoint:
                ok = self._load_checkpoint(action, view)
            case Fetch():
                ok = self._fetch(action, view)
            case FetchShards():
                ok = self._fetch_shards(action, view)
            case ReportSynced():
                ok = self._report_synced(action)
            case NoteHold(generation=generation, hold=hold):
                log.warning("generation %d is HELD: %s", generation, hold.reason)
                self._trace.record("held", generation=generation, **asdict(hold))
                ok = True
            case AskFallback():
                ok = self._ask_fallback(action)
            case AskReform():
                ok = self._ask_reform(action)
            case Wait():
                ok = None
        self._follower.advance(action, ok, time.monotonic())
        return ok

    def _retire(self, action: Retire) -> bool:
        backend = self._backend
        assert backend is not None
        quiescence, seq = backend.abort(action.reason), backend.op_seq
        self._trace.record("retire", generation=backend.generation, quiescence=quiescence)
        self._backend, self._switch_to = None, None
        self._follower.advance(action, True, time.monotonic(), quiescence=quiescence, collective_seq=seq)
        return True

    def _submit(self, command: Command) -> dict[str, Any] | None:
        """Submit through our agent; None when it could not take the command now (no Raft quorum, its node
        restarting, a connection lost): the follower decides it again on a later view. Whether the agent itself
        is gone is the watcher's call (`AgentLost`)."""
        try:
            return self._agent.submit(command)
        except (OSError, P2PGenError) as e:
            log.info("agent could not take %s now: %s", type(command).__name__, e)
            self._trace.record("submit_failed", command=type(command).__name__,
                              generation=getattr(command, "generation", None), reason=str(e))
            return None

    def _vote(self, action: Vote, view: JobView) -> bool | None:
        """Serve the state frozen as it is (until the next step) and vote `ready` for the pending generation."""
        generation, pending = action.generation, view.pending
        assert pending is not None and pending.generation == generation
        extra: dict[str, Any] = {}
        if self._keeper is not None and action.report_state:
            restored = self._keeper.restore(view)                    # once, before anything is served
            if restored and self._keeper.lineage:
                self._lineage = self._keeper.lineage                  # the generation the copy was saved in
            if restored:
                self._trace.record("restore", generation=generation, revision=self.state.revision, note=restored)
            extra = self._keeper.vote_fields(view)
        self._serve(generation)
        revision, digest = (self.state.revision, self.state.digest()) if action.report_state else (0, "")
        if self.state.sharded and action.report_state:
            extra.update(layout=self.state._layout_text(), shards=self.state._shards_text())
        comm_id = offer_comm_id(self._backend_kind, pending, self._identity)   # rank 0 names the communicator
        sent = time.time()
        outcome = self._submit(Ready(generation, self.peer_id, self.incarnation, action.quiescence, revision, digest,
                                     action.collective_seq, comm_id=comm_id, at=sent,
                                     lineage=self._lineage if action.report_state else 0, **extra))
        if outcome is None:
            return None
        self._trace.record("ready", generation=generation, revision=revision, digest=digest, sent=sent,
                          quiescence=action.quiescence, ok=outcome["ok"], reason=outcome["reason"],
                          **{k: v for k, v in extra.items() if k != "layout"})
        return outcome["ok"]

    def _serve(self, generation: int) -> None:
        """Serve the state as it is now to the members of `generation` that must pull it."""
        self._serving.close()
        self._serving.enter_context(self._state_server.serving(generation))

    def _fetch(self, action: Fetch, view: JobView) -> bool | None:
        """Pull the elected frontier from its holders (verified against its digest)."""
        generation, pending = action.generation, view.pending
        assert pending is not None and pending.frontier is not None
        self._trace.record("pull", generation=generation, sources=list(action.pull.sources),
                          frontier=asdict(pending.frontier))
        try:
            report = pull_state(self.state, job=self.job, secret=self._secret, me=self._identity, generation=generation,
                                frontier=pending.frontier,
                                sources=list(self._sources(view, action.pull.sources).values()),
                                config=PullConfig(encrypt=self._encrypt),
                                stop=functools.partial(self._pull_moot, generation))
        except P2PGenError as e:
            log.warning("catch-up for generation %d failed: %s", generation, e)
            self._trace.record("pull_failed", generation=generation, reason=str(e))
            if isinstance(e, StateSyncError) and e.changed:
                self._recover_from_failed_pull(view, e)
            return None
        self._lineage = pending.parent      # the frontier was elected on the history of the active generation
        if self._keeper is not None:
            self._keeper.pulled(view)
        for obj in self.state.sharded.values():
            obj.keep_only([])              # shards of the revision it left: never claimed at the frontier's
        self._trace.record("pulled", generation=generation, revision=self.state.revision, report=str(report))
        return True

    def _pull_moot(self, generation: int) -> str | None:
        """Why a pull for `generation` is of no use any more (the watcher's latest view: that proposal is no
        longer pending, so its frontier may not be the next one), else None. A source cut off with its host
        would otherwise hold the pull, and this member's vote in the job's next proposal, for up to the
        connect timeout."""
        if self._closed.is_set():
            return "this process is closing"
        pending = self._view.pending
        if pending is None or pending.generation != generation:
            now = "nothing" if pending is None else f"generation {pending.generation}"
            return f"generation {generation} is no longer pending ({now} is): the job moved on"
        return None

    def _recover_from_failed_pull(self, view: JobView, error: StateSyncError) -> None:
        """The failed pull wrote tensors: the state is a mix of two revisions and must never be voted. Put
        it back to the local copy (then vote again, as after any failed pull), or restart (Evicted): the
        next incarnation starts from its local copy, or from scratch."""
        line = self._keeper.recover(view) if self._keeper is not None else ""
        if not line:
            self.close()
            raise Evicted(f"{error}: this process must not vote this state, and it has no local copy to go back "
                          "to; its agent restarts it") from error
        if self._keeper is not None and self._keeper.lineage:
            self._lineage = self._keeper.lineage
        self._trace.record("recovered", generation=view.pending.generation if view.pending else None,
                          revision=self.state.revision, note=line)

    def _load_checkpoint(self, action: Fetch, view: JobView) -> bool:
        """The election chose a checkpoint this process offered: load it and serve it."""
        generation, pending = action.generation, view.pending
        assert pending is not None and pending.frontier is not None
        if self._keeper is None:
            raise P2PGenError(f"generation {generation} tells {self.peer_id} to load a checkpoint, but this process "
                              "keeps none: it never offered one")
        try:
            line = self._keeper.load_frontier_checkpoint(view, pending.frontier)
        except CheckpointError as e:
            self._trace.record("checkpoint_failed", generation=generation, reason=str(e))
            self.close()
            raise Evicted(f"{e}: this process must not report synced; its agent restarts it") from e
        log.warning("generation %d: %s", generation, line)
        self._lineage = pending.parent      # the election chose this checkpoint on the active generation's history
        self._serve(generation)            # members without it pull from us
        self._trace.record("pulled", generation=generation, revision=self.state.revision, report=line)
        return True

    def _fetch_shards(self, action: FetchShards, view: JobView) -> bool | None:
        """Copy (or rebuild) the shards the election gave this member."""
        generation = action.generation
        sources = self._sources(view, sorted({p for sp in action.shard_pulls for p in sp.sources}))
        try:
            report = pull_shards(self.state, action.shard_pulls, sources, job=self.job, secret=self._secret,
                                 me=self._identity, generation=generation, frontier_revision=action.frontier_revision,
                                 config=self._shard_pull_config)
        except P2PGenError as e:
            log.warning("shard pulls for generation %d failed: %s", generation, e)
            self._trace.record("shard_pull_failed", generation=generation, reason=str(e))
            return None
        self._trace.record("shard_pull", generation=generation, shards=report.shards, rebuilt=report.rebuilt,
                          nbytes=report.bytes_total, failures=report.failures, seconds=report.seconds)
        return True

    def _sources(self, view: JobView, peer_ids: Sequence[str]) -> dict[str, Source]:
        sources = {}
        for peer_id in peer_ids:
            member = view.member(peer_id)
            addr = member.addr("state") if member else None
            if member is not None and addr is not None:
                host, port = split_addr(addr)
                sources[peer_id] = Source(peer_id, member.incarnation, host, port)
        return sources

    def _report_synced(self, action: ReportSynced) -> bool | None:
        outcome = self._submit(Synced(action.generation, self.peer_id, self.incarnation, self.state.digest(),
                                      at=time.time(), shards=self.state._shards_text()))
        if outcome is None:
            return None
        self._trace.record("synced", generation=action.generation, revision=self.state.revision, ok=outcome["ok"],
                          reason=outcome["reason"])
        return outcome["ok"]

    def _ask_fallback(self, action: AskFallback) -> bool | None:
        """The hold's wait is over: ask the job to resume from the best state left."""
        outcome = self._submit(Fallback(action.generation, self.peer_id, self.incarnation, at=time.time()))
        if outcome is None:
            return None
        self._trace.record("fallback", generation=action.generation, ok=outcome["ok"], reason=outcome["reason"])
        if not outcome["ok"] and action.first:
            log.error("generation %d cannot fall back: %s", action.generation, outcome["reason"])
        return outcome["ok"]

    def _ask_reform(self, action: AskReform) -> bool | None:
        outcome = self._submit(Reform(action.generation, self.peer_id, self.incarnation, action.reason,
                                      at=time.time()))
        if outcome is None:
            return None
        self._trace.record("reform", generation=action.generation, ok=outcome["ok"], reason=action.reason)
        return outcome["ok"]

    def _activate(self, active: ActiveGeneration) -> None:
        endpoints = []
        for m in active.members:
            host, port = split_addr(m.addr("data") or "")
            endpoints.append(Endpoint(m.peer_id, m.incarnation, host, port))
        rank = active.rank_of(self._identity)
        assert rank is not None
        group = Group(self.job, active.generation, endpoints, rank)
        self.certificate = active
        self._lineage = active.generation
        self._serving.close()
        self._keep_owned_shards(active)
        if active.recovery:
            (log.warning if active.regressed_from is not None else log.info)(
                "generation %d: %s", active.generation, active.recovery)
        if self._keeper is not None:
            self._keeper.activated(active)
        self._trace.record("active", generation=active.generation, rank=rank, world=len(endpoints),
                          revision=self.state.revision, frontier=asdict(active.frontier), raft_index=active.raft_index)
        self._backend = backend_factory(self._backend_kind, active, self._transport, group)
        self.stats["generations"] += 1
        self._move_channels(active.generation)
        try:
            self._backend.connect()
        except (GenerationChanged, PeerLost) as e:
            log.info("generation %d failed while connecting: %s", active.generation, e)
            return
        self._trace.record("connected", generation=active.generation)

    def _keep_owned_shards(self, active: ActiveGeneration) -> None:
        """Drop the shards the certificate gave to others: memory per member follows the ownership map."""
        if not self.state.sharded:
            return
        given = active.shards_owned(self._identity)
        for object_id, obj in self.state.sharded.items():
            indexes = given.get(object_id, [])
            missing = sorted(set(indexes) - set(obj.held))
            if missing:        # the activation waited for every shard pull: this would be a bug, never data loss
                raise P2PGenError(f"generation {active.generation} gives {self.peer_id}#{self.incarnation} shards "
                                  f"{object_id}{missing} it does not hold")
            obj.keep_only(indexes)
        self._trace.record("shards", generation=active.generation,
                          held={o: obj.owned() for o, obj in self.state.sharded.items()},
                          nbytes=sum(o.nbytes_held for o in self.state.sharded.values()))

    # --- watching the agent --------------------------------------------------------------------------

    def _stall_sample(self) -> tuple[int, float | None, int] | None:
        """What the stall reporter reads: the running generation, when its operation in flight began, and the
        bytes its links received (None before the first generation and on a backend that cannot tell: nccl)."""
        backend = self._backend
        if backend is None:
            return None
        activity = getattr(backend, "activity", None)
        seen = activity() if activity is not None else None
        return None if seen is None else (backend.generation, *seen)

    def _wait_view(self, seen: JobView, timeout: float) -> None:
        """Wait (at most `timeout`) for a view newer than `seen`; at once if one arrived since."""
        with self._view_lock:
            self._view_lock.wait_for(lambda: self._view is not seen, timeout)

    def _watch(self, agent_addr: str) -> None:
        """Follow the replicated state; abort the communicator as soon as a member of our generation is
        gone from the pending proposal (a death or a leave), or we were evicted."""
        client = AgentClient(agent_addr, self._secret, job=self.job)
        failures = 0
        while not self._closed.is_set():
            try:
                shown = client._call("wait", io_timeout=WATCH_POLL_S + 5, after_version=self._view.index,
                                     leader=self._view.leader, heard=self._view.heard, timeout=WATCH_POLL_S,
                                     stop_at_boundary=self._drained.is_set())
                view = JobView.from_json(shown)
                if ((shown.get("agent") or {}).get("draining") or {}).get("stop_at_boundary"):
                    self._drained.set()
                failures = 0
            except RpcError as e:            # it answered without a view (its Raft node restarting): wait for it
                log.info("agent at %s has no view now: %s", agent_addr, e)
                failures = 0
                time.sleep(0.1)
                continue
            except (OSError, P2PGenError) as e:
                failures += 1
                if failures >= AGENT_SILENT_TRIES:
                    log.error("lost the agent at %s (%s): stopping", agent_addr, e)
                    self._lost = f"{agent_addr}: {e}"
                    if self._backend is not None:
                        self._backend.abort("lost the local agent")
                    self._closed.set()
                time.sleep(0.1)
                continue
            with self._view_lock:
                self._view = view
                self._view_lock.notify_all()
            self._abort_if_membership_shrinks(view)
            self._abort_if_cut_off(view)
        client.close()

    def _abort_if_membership_shrinks(self, view: JobView) -> None:
        backend = self._backend
        if backend is None:
            return
        current = {m.identity for m in view.members}
        gone = [m for m in backend.group.members if m.identity not in current]
        if gone:
            backend.abort(f"{', '.join(f'{m.peer_id}#{m.incarnation}' for m in gone)} left generation "
                          f"{backend.generation}")

    def _abort_if_cut_off(self, view: JobView) -> None:
        """Fence (`p2pgen.core.view.cut_off`): a member whose agent hears no Raft leader, or is not proven heard
        by the job, may be cut off from it, and the job's majority will soon evict it and go on without it. It
        stops committing at once (its generation is retired; a reform or an eviction follows once the agent
        hears the job again and is heard): a member alone in its generation, cut off, would otherwise keep
        committing steps the job never sees."""
        backend = self._backend
        why = cut_off(view)
        if backend is None or why is None or backend.failed is not None:
            return
        self._fenced = (backend, why)       # the follower owes a reform once the fence lifts, however brief it was
        backend.abort(f"agent of {self.peer_id}#{self.incarnation} {why}: this member may be cut "
                      "off from the job and stops committing until it hears the job again")

    def _authorize(self, peer_id: str, incarnation: int, generation: int) -> bool:
        """A source serves only members of the pending generation it is serving."""
        pending = self._view.pending
        return pending is not None and pending.generation == generation and pending.has((peer_id, incarnation))


_current: Peer | None = None


def current_peer() -> Peer | None:
    """The Peer this process joined with and has not closed (p2pgen.torch's `init_process_group("p2pgen")`
    with no other argument runs on it), or None."""
    return _current


def join(job: str | None = None, state: SharedState | None = None, *, trace: str | None = None) -> Peer:
    """Join the job this process was started for by `p2pgen join ... -- COMMAND` (reads its environment).

    The backend is `$P2PGEN_BACKEND` (`tcp`, the default, or `nccl`; the same on every member). `$P2PGEN_ENCRYPT=1`
    (the agent's `--encrypt`) seals every data-plane, state-transfer and channel link (tcp backend only).
    `trace`: a JSON-lines file recording every ready (with `sent`, when the vote left)/pull/synced/active/connected/
    collective/commit of this peer
    (default: `$P2PGEN_TRACE_DIR/<peer>-<incarnation>.jsonl` when that variable is set).
    A warm standby (started by `p2pgen join --standby 1`, with `$P2PGEN_STANDBY` and no `$P2PGEN_INCARNATION`)
    waits here, after the application's imports and setup, until its agent promotes it to be the application's
    next incarnation; it then sets `$P2PGEN_INCARNATION` and goes on as a process started for it. Code that
    reads `$P2PGEN_INCARNATION` must do so after `join()` returns.

    Args:
        job: the job's name; default `$P2PGEN_JOB` (else "demo"), and it must be the job the agent runs.
        state: the SharedState the members keep in step; default an empty one.
        trace: the JSON-lines trace file (see above); default none, or one under `$P2PGEN_TRACE_DIR`.

    Returns:
        The Peer, attached to its agent (`p2pgen.current_peer()` returns it until `close()`).

    Raises:
        P2PGenError: the process was not started under an agent (the message names the variables missing and
            how to start it), or for another job; `$P2PGEN_ENCRYPT=1` without a secret file or with the nccl
            backend; a standby its agent no longer knows.
        AgentLost: a standby's agent stopped answering while it waited.
    """
    called = time.time()
    env = os.environ
    standby = env.get("P2PGEN_STANDBY") if "P2PGEN_INCARNATION" not in env else None
    needed = ("P2PGEN_AGENT", "P2PGEN_PEER_ID", "P2PGEN_DATA_ADDR", "P2PGEN_STATE_ADDR")
    missing = [k for k in needed + (() if standby else ("P2PGEN_INCARNATION",)) if k not in env]
    if missing:
        raise P2PGenError(f"{', '.join(missing)} not set: start this script under its agent, e.g. "
                          "`p2pgen join --local 3 -- python train.py` or `p2pgen join --job J --id ID "
                          "--listen HOST:PORT -- python train.py`")
    job = job or env.get("P2PGEN_JOB", "demo")
    if env.get("P2PGEN_JOB") and env["P2PGEN_JOB"] != job:
        raise P2PGenError(f"this process was started for job {env['P2PGEN_JOB']!r}, not {job!r}")
    encrypt = _encrypt_from_env(env)
    if encrypt and not env.get("P2PGEN_SECRET_FILE"):
        raise P2PGenError("$P2PGEN_ENCRYPT=1 needs a real job secret ($P2PGEN_SECRET_FILE): without one the secret "
                          "derives from the job name, and so would every key; start the agent with --secret-file")
    secret = load_secret(env.get("P2PGEN_SECRET_FILE"), job)
    promoted = None
    if standby:
        env["P2PGEN_INCARNATION"] = str(_await_promotion(env["P2PGEN_AGENT"], secret, job, standby))
        del env["P2PGEN_STANDBY"]
        promoted = time.time()
    peer_id, incarnation = env["P2PGEN_PEER_ID"], int(env["P2PGEN_INCARNATION"])
    if trace is None and env.get("P2PGEN_TRACE_DIR"):
        trace = os.path.join(env["P2PGEN_TRACE_DIR"], f"{peer_id.replace('/', '_')}-{incarnation}.jsonl")
    peer = Peer(job, state if state is not None else SharedState(), env["P2PGEN_AGENT"], peer_id, incarnation,
                secret, env["P2PGEN_DATA_ADDR"], env["P2PGEN_STATE_ADDR"], trace_path=trace,
                backend=env.get("P2PGEN_BACKEND", "tcp"), channel_addr=env.get("P2PGEN_CHANNEL_ADDR"),
                channel_dir=env.get("P2PGEN_CHANNEL_DIR"), keep=StateKeeperConfig.from_env(env),
                encrypt=encrypt)
    # where this incarnation's start went (p2pgen_lab.bench.heal): process start, imports done, promoted, attached
    peer._trace.record("joined", process_start=_process_start(), join_called=called, promoted=promoted,
                      standby=standby is not None)
    return peer


def _encrypt_from_env(env) -> bool:
    try:
        return seal.from_env(env)
    except ValueError as e:
        raise P2PGenError(str(e)) from None


def _await_promotion(agent_addr: str, secret: bytes, job: str, token: str) -> int:
    """A standby's wait in `join()`: long-poll the agent until it promotes this process; its incarnation.
    Raises AgentLost when the agent stops answering, P2PGenError when it no longer knows this standby."""
    client = AgentClient(agent_addr, secret, job=job)
    failures = 0
    try:
        while True:
            try:
                answer = client.standby(token)
            except RpcError as e:
                raise P2PGenError(f"standby of {os.environ.get('P2PGEN_PEER_ID')}: {e}") from e
            except OSError as e:
                failures += 1
                if failures >= AGENT_SILENT_TRIES:
                    raise AgentLost(f"standby lost its agent at {agent_addr} ({e})") from e
                time.sleep(0.1)
                continue
            failures = 0
            if answer.get("incarnation") is not None:
                return int(answer["incarnation"])
    finally:
        client.close()


def _process_start() -> float | None:
    """Wall-clock time this process started (Linux /proc: its age from the uptime, to 10 ms), or None."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None

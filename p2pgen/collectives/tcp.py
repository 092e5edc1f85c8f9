"""The `tcp` backend: ring collectives over one generation's Session of the CPU data plane.

Algorithms (N members, rank r, buffers cut into N near-equal chunks, chunks into frames of `chunk_bytes`,
larger for large chunks: `ring_frame_bytes`, at most 4 MiB, at least 4 frames per chunk): all_reduce
through shared memory when every member runs on this host (`shm`, 64 KiB and up, top-level group), else
reduce-scatter then all-gather around the ring; the reduce-scatter half for reduce_scatter; the all-gather
half for all_gather; a pipelined chain from the root for broadcast. Each received frame is reduced and
forwarded at once, so the sender thread streams frame k+1 while the caller reduces frame k. Frames are
checksummed when posted, right after the reduction wrote them (cache-hot); bytes forwarded verbatim
(all-gather, broadcast) carry the digest verified on receipt instead of being hashed again.

Invariants:
- Bit-identical results: each chunk is reduced in one fixed ring order and finalised (AVG divides) by
  exactly one member; everyone else receives those bytes verbatim.
- User buffers are written only at the end, from a private work buffer, after every frame arrived and
  verified; when a collective raises, every buffer passed in is exactly as it was passed.
- Inputs may alias outputs in any way (FSDP2 all-gathers from a view of the output; overlapping views):
  every input byte is read, into the wire or the work buffer, before the first output byte is written.
  (world 1 copies with `np.copyto`, which is overlap-safe.) The one
  explicit exception is `TcpBackend(..., in_place_all_reduce=True)`: all_reduce then reduces and
  gathers straight in the caller's buffer (as gloo does), which saves the work buffer and the final
  copy (one memory pass over the buffer per call), but **a raising all_reduce leaves that buffer
  partly reduced**: opt in only where a failed step's buffers are discarded (recomputed or reloaded).
  Every other collective keeps the guarantee either way.
- No member returns from a ring collective (all_reduce, reduce_scatter, all_gather) alone: once it has
  received every frame it needs it sends its predecessor a receipt (`FrameKind.RECEIPT`), and it returns
  only after its successor's receipt for every frame it sent. Its successor receives everything it needs
  from this member, so a member that returns knows another one holds the whole result too: a member cut
  off (or stopped) after its last receive, whose last frames never reach the ring, waits for a receipt
  and fails with the rest instead of completing, and committing, a step the others give up. What stays
  open is a loss that lands in the round trip of the receipts themselves (two members each lose the
  other's receipt); see docs/design/data-plane.md.
- Every collective (send/recv aside) advances `op_seq` by one on every member; frames are stamped with it.
- A subgroup (`subgroup(ranks)`: torch's `new_group`) is a TcpBackend over some members of the same
  generation: it shares the parent's session (so a generation change or abort fails it the same way, and one
  operation runs at a time across the parent and its subgroups), runs its rings over its members' links, and
  stamps its frames with its own sequence numbers tagged by its member list in the high bits of `op_seq`.
- Counters (`counters()`): every frame of the generation's links is counted with its payload length as it is
  posted and as it is delivered, per frame (`p2pgen.transport.stats.WireCounters`).
- `all_reduce_hook` (None, or set by `p2pgen.collectives.hierarchical.attach` for a zoned generation): an
  all_reduce it `takes` runs through it instead of the flat ring (it counts as one collective); a subgroup
  never has one.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from p2pgen.collectives.backend import REDUCTIONS, ReduceOp, as_op, check_reduction, splits
from p2pgen.collectives.buffers import Flat, combine, divide
from p2pgen.collectives.shm import ShmAllReduce
from p2pgen.errors import BarrierTimeout, PeerLost
from p2pgen.transport import PROVED, Connection, FrameKind, Group, RecvSlot, Transport


class TcpBackend:
    """Collectives of one generation. Cheap to construct: connections are made on first use."""

    reductions = REDUCTIONS          # the (op, dtype) pairs it reduces

    def __init__(self, transport: Transport, group: Group, *, in_place_all_reduce: bool = False) -> None:
        self.in_place_all_reduce = in_place_all_reduce
        self.all_reduce_hook: Any = None          # see the module docstring
        self.session = transport.open_session(group)
        self.group = group
        self.generation = group.generation
        self._chunk_bytes = transport.config.chunk_bytes
        self._large_frame_bytes = min(LARGE_FRAME_BYTES, transport.config.max_frame_bytes)
        buf = transport.config.socket_buffer_bytes
        self._inline_bytes = min(256 << 10, buf // 4) if buf else 64 << 10
        self._scratch: list[np.ndarray] = []
        self._join(tuple(range(group.world)), group.rank, seq_tag=0)
        self._shm: ShmAllReduce | None = ShmAllReduce(group.rank, group.world,
                                                      len({m.host for m in group.members}) == 1, self._links,
                                                      lambda: self.session.error)

    def _join(self, members: tuple[int, ...], rank: int, seq_tag: int) -> None:
        """Become the communicator of `members` (session ranks, in order), as member `rank` of them."""
        self.members, self.rank, self.world = members, rank, len(members)
        self._seq_base = seq_tag << 40
        self._op_seq = 0
        self._p2p_sent = [0] * self.world
        self._p2p_received = [0] * self.world
        self._work = np.empty(0, np.uint8)

    def subgroup(self, ranks: Sequence[int]) -> TcpBackend:
        """The communicator of members `ranks` (ranks of this backend, ascending) of this generation; this
        member must be one of them. Every member of the subgroup must create it with the same ranks."""
        ranks = tuple(int(r) for r in ranks)
        if not ranks or list(ranks) != sorted(set(ranks)) or not 0 <= ranks[0] <= ranks[-1] < self.world:
            raise ValueError(f"subgroup ranks {list(ranks)} must be distinct, ascending ranks of generation "
                             f"{self.generation} (0..{self.world - 1})")
        if self.rank not in ranks:
            raise ValueError(f"rank {self.rank} is not in subgroup {list(ranks)}: only members create it")
        sub = object.__new__(TcpBackend)
        sub.__dict__.update({k: v for k, v in self.__dict__.items() if not k.startswith("_work")})
        sub._shm = None                     # a subgroup's all_reduce takes the ring
        sub.all_reduce_hook = None
        members = tuple(self.members[r] for r in ranks)
        sub._join(members, ranks.index(self.rank), seq_tag=1 + zlib.crc32(repr(members).encode()) % 0xFFFF)
        return sub

    def __repr__(self) -> str:
        return f"TcpBackend(generation={self.generation}, rank={self.rank}, world={self.world})"

    @property
    def failed(self) -> str | None:
        """Why this generation's session is unusable (aborted or failed), or None."""
        error = self.session.error
        return None if error is None else str(error)

    @property
    def shm_active(self) -> bool:
        """Whether this generation's all_reduce runs through shared memory (every member on this host and
        the segment set up by an earlier call; see `p2pgen.collectives.shm`)."""
        return self._shm is not None and self._shm.active

    def takes_shared_memory(self, nbytes: int) -> bool:
        """Whether an all_reduce of `nbytes` now goes through shared memory (the segment is set up and the
        size takes that path) rather than the ring."""
        return self.shm_active and self._shm.takes(nbytes)

    @property
    def op_seq(self) -> int:
        """Collectives started in this generation (the same number on every member after each one)."""
        return self._op_seq

    def counters(self) -> dict[str, int]:
        """Payload bytes and frames this member's links of this generation sent and received so far, its
        subgroups' included (`bytes_sent`, `bytes_received`, `frames_sent`, `frames_received`). An all_reduce
        through shared memory moves its data in memory: only its small barrier frames are counted."""
        return self.session.wire.snapshot()

    def activity(self) -> tuple[float | None, int]:
        """When the operation in flight began (time.monotonic; None while none is) and the payload bytes this
        generation's links received so far: what `p2pgen.stallreport` reads. Any thread may ask."""
        return self.session.inflight_since(), self.session.wire.snapshot()["bytes_received"]

    # ---- collectives ---------------------------------------------------------------------------
    def all_reduce(self, buf: Any, op: ReduceOp | str = ReduceOp.SUM) -> Any:
        op, flat = as_op(op), Flat(buf, "all_reduce buffer")
        check_reduction("all_reduce", op, flat.dtype_name)
        hook = self.all_reduce_hook
        if hook is not None and hook.takes(flat.raw.nbytes):
            self._next_seq()
            hook.all_reduce(flat, op)
            return buf
        with self.session.operation("all_reduce"):
            seq = self._next_seq()
            shm = self._shm
            if shm is not None and shm.takes(flat.raw.nbytes) and shm.all_reduce(seq, op, flat):
                return buf
            if self.world > 1 and flat.size:
                # In place, `work` is the caller's buffer: safe for the ring, because a region is
                # overwritten only by a frame that causally follows every send of its old bytes.
                work = flat.elems if self.in_place_all_reduce else self._work_for(flat)
                pipe = self._ring_pipe(seq, flat.raw.nbytes)
                bounds = _split(flat.size, self.world)
                seg = self._ring_seg(work.itemsize, bounds)
                self._reduce_scatter(pipe, op, flat, flat.elems, work, bounds, seg, gather=True)
                self._all_gather(pipe, work, bounds, seg)
                pipe.finish()
                if work is not flat.elems:
                    np.copyto(flat.elems, work)
        return buf

    def reduce_scatter(self, output: Any, input: Any, op: ReduceOp | str = ReduceOp.SUM) -> Any:
        op, out, inp = as_op(op), Flat(output, "reduce_scatter output"), Flat(input, "reduce_scatter input")
        check_reduction("reduce_scatter", op, inp.dtype_name)
        self._check_pair(out, inp, "reduce_scatter")
        with self.session.operation("reduce_scatter"):
            seq = self._next_seq()
            if self.world == 1:
                np.copyto(out.elems, inp.elems)
            elif out.size:
                work = self._work_for(inp)
                pipe = self._ring_pipe(seq, inp.raw.nbytes)
                bounds = _blocks(out.size, self.world)
                seg = self._ring_seg(work.itemsize, bounds)
                self._reduce_scatter(pipe, op, inp, inp.elems, work, bounds, seg, gather=False)
                pipe.finish()
                lo, hi = bounds[self.rank]
                np.copyto(out.elems, work[lo:hi])
        return output

    def all_gather(self, output: Any, input: Any) -> Any:
        out, inp = Flat(output, "all_gather output"), Flat(input, "all_gather input")
        self._check_pair(inp, out, "all_gather")
        with self.session.operation("all_gather"):
            seq = self._next_seq()
            bounds = _blocks(inp.size, self.world)
            if self.world > 1 and inp.size:
                work = self._work_for(out)
                pipe = self._ring_pipe(seq, out.raw.nbytes)
                lo, hi = bounds[self.rank]
                seg = self._ring_seg(work.itemsize, bounds)
                for a, b in _segments(lo, hi, seg):
                    pipe.send(inp.elems[a - lo:b - lo])
                self._all_gather(pipe, work, bounds, seg)
                pipe.finish()
                np.copyto(work[lo:hi], inp.elems)    # read the input before any output write (it may alias)
                np.copyto(out.elems, work)
            else:
                np.copyto(out.elems[bounds[self.rank][0]:bounds[self.rank][1]], inp.elems)
        return output

    def broadcast(self, buf: Any, root: int) -> Any:
        flat = Flat(buf, "broadcast buffer")
        self._check_rank(root, "root")
        with self.session.operation("broadcast"):
            seq = self._next_seq()
            if self.world > 1 and flat.size:
                self._broadcast(seq, flat, root)
        return buf

    def all_to_all(self, output: Any, input: Any, output_splits: Sequence[int] | None = None,
                   input_splits: Sequence[int] | None = None) -> Any:
        """Rank r sends its input's segment j (`input_splits[j]` elements, in order) to rank j, which writes
        it as its output's segment r (`output_splits[r]` elements). No splits: equal segments. Gather and
        scatter are all_to_all with every segment but the root's empty."""
        out, inp = Flat(output, "all_to_all output"), Flat(input, "all_to_all input")
        if not out.same_kind(inp):
            raise TypeError(f"all_to_all: dtypes differ ({inp.dtype_name} vs {out.dtype_name})")
        sends = splits(input_splits, inp.size, self.world, "all_to_all input")
        gets = splits(output_splits, out.size, self.world, "all_to_all output")
        if sends[self.rank] != gets[self.rank]:
            raise ValueError(f"all_to_all: rank {self.rank} sends itself {sends[self.rank]} elements but expects "
                             f"{gets[self.rank]}")
        with self.session.operation("all_to_all"):
            seq = self._next_seq()
            starts_in, starts_out = _starts(sends), _starts(gets)
            work = self._work_for(out)
            if self.world > 1:
                self._exchange(seq, inp, work, sends, gets, starts_in, starts_out)
            mine = slice(starts_in[self.rank], starts_in[self.rank] + sends[self.rank])
            np.copyto(work[starts_out[self.rank]:starts_out[self.rank] + gets[self.rank]], inp.elems[mine])
            np.copyto(out.elems, work)      # every input byte was read (sent, flushed, or copied) first
        return output

    def barrier(self) -> None:
        """Returns once every member has entered the barrier."""
        self.all_reduce(np.zeros(1, np.int32))

    def monitored_barrier(self, timeout: float, wait_all_ranks: bool = False) -> None:
        """A barrier whose rank 0 waits at most `timeout` seconds for the others: every rank reports to rank 0,
        which releases them all. If a rank is late, rank 0 retires this generation (so the ranks waiting for
        its release fail at once with PeerLost) and raises BarrierTimeout (a PeerLost and a RuntimeError, worded
        as gloo words it) naming the first late rank (every late rank with `wait_all_ranks`)."""
        with self.session.operation("monitored_barrier"):
            seq = self._next_seq()
            if self.world == 1:
                return
            token = np.zeros(1, np.uint8)
            if self.rank:
                _Pipe(None, self._link(0), FrameKind.COLLECTIVE, seq, inline=False).send(token)
                self._link(0).flush()
                _Pipe(self._link(0), None, FrameKind.COLLECTIVE, seq, inline=False).recv(token)
                return
            deadline = time.monotonic() + timeout
            late: list[int] = []
            for r in range(1, self.world):
                if late and not wait_all_ranks:
                    break
                try:                                 # a member that is gone is as late as one that never comes
                    link = self._link(r)
                    if not link.readable(deadline - time.monotonic()):
                        late.append(r)
                        continue
                    _Pipe(link, None, FrameKind.COLLECTIVE, seq, inline=False).recv(token)
                except PeerLost:
                    late.append(r)
            if late:
                ms = int(timeout * 1000)
                who = f"Rank {late[0]}" if len(late) == 1 else f"Ranks {', '.join(map(str, late))}"
                error = BarrierTimeout(f"Rank 0 timed out in monitoredBarrier after {ms} ms: {who} failed to pass "
                                       f"monitoredBarrier in {ms} ms (generation {self.generation} is retired)")
                self.session.fail(error)
                raise error
            for r in range(1, self.world):
                _Pipe(None, self._link(r), FrameKind.COLLECTIVE, seq, inline=False).send(token)
            for r in range(1, self.world):
                self._link(r).flush()

    def send(self, buf: Any, dst: int) -> None:
        """Returns once the payload is handed to the kernel; pair it with `recv` on `dst` (blocking, as in MPI)."""
        with self.session.operation("send"):
            self.post_send(buf, dst)()

    def post_send(self, buf: Any, dst: int) -> Callable[[], None]:
        """Queue `buf` for `dst` on the link's sender thread and return at once, with the function that waits
        until it was handed to the kernel (`buf` must not change until that returned). It takes no operation
        slot: it may run while another thread is inside a receive of this generation (torch's isend after an
        irecv), never beside a collective (their frames share the links' order)."""
        flat = Flat(buf, "send buffer")
        self._check_peer(dst, "dst")
        error = self.session.error
        if error is not None:
            raise error
        conn = self._link(dst)
        pipe = _Pipe(None, conn, FrameKind.P2P, self._seq_base | self._p2p_sent[dst], inline=False)
        self._p2p_sent[dst] += 1
        for a, b in _segments(0, flat.size, self._seg(flat)):
            pipe.send(flat.elems[a:b])
        return pipe.flush

    def recv(self, buf: Any, src: int) -> Any:
        flat = Flat(buf, "recv buffer")
        self._check_peer(src, "src")
        with self.session.operation("recv"):
            self._receive(flat, src)
        return buf

    def recv_any(self, buf: Any) -> int:
        """Receive the next message any member sends this one (torch's recv without a source); returns the
        sender's rank. A member whose next frame on its link is that message is chosen, the lowest rank first."""
        flat = Flat(buf, "recv buffer")
        if self.world == 1:
            raise ValueError("recv from any source: this generation has no other member")
        with self.session.operation("recv"):
            for peer in range(self.world):          # the links this member dials; the others come to it
                if self.members[peer] > self.members[self.rank]:
                    self._link(peer)
            src = self._wait_for_sender()
            self._receive(flat, src)
        return src

    def _wait_for_sender(self) -> int:
        limit = self.session.config.op_timeout
        deadline = None if limit is None else time.monotonic() + limit
        ranks = {session_rank: rank for rank, session_rank in enumerate(self.members)}
        while deadline is None or time.monotonic() < deadline:
            for conn in sorted(self.session.open_links(), key=lambda c: c.rank):
                src = ranks.get(conn.rank)
                if src is None or src == self.rank:
                    continue
                h = conn.peek_header()
                if h is not None and h.kind == FrameKind.P2P and h.op_seq == self._seq_base | self._p2p_received[src]:
                    return src
            error = self.session.error
            if error is not None:
                raise error
            time.sleep(0.001)
        raise PeerLost(f"no member sent to rank {self.rank} within {limit:g} s (recv from any source)")

    def _receive(self, flat: Flat, src: int) -> None:
        conn = self._link(src)
        pipe = _Pipe(conn, None, FrameKind.P2P, self._seq_base | self._p2p_received[src], inline=False)
        self._p2p_received[src] += 1
        work = self._work_for(flat)
        for a, b in _segments(0, flat.size, self._seg(flat)):
            pipe.recv(work[a:b])
        np.copyto(flat.elems, work)

    # ---- lifecycle -----------------------------------------------------------------------------
    def connect(self) -> None:
        """Make the ring's connections now rather than in the first collective."""
        with self.session.operation("connect"):
            if self.world > 1:
                self._ring_links()

    def abort(self, reason: str) -> str:
        """Retire this generation; in-flight collectives raise GenerationChanged. Returns the quiescence."""
        quiescence = self.session.abort(reason)
        if quiescence == PROVED and self._shm is not None:
            self._shm.release()          # no worker can touch the segment any more: unmap it now
        return quiescence

    def close(self) -> None:
        self.abort("communicator closed by its owner")

    # ---- ring algorithms -----------------------------------------------------------------------
    def _reduce_scatter(self, pipe: _Pipe, op: ReduceOp, flat: Flat, src: np.ndarray, work: np.ndarray,
                        bounds: list[tuple[int, int]], seg: int, gather: bool) -> None:
        """After N-1 steps rank r holds the reduction of chunk r in `work` (forwarded on if `gather`).

        A partial reduction that is only forwarded (every step but the last) is computed in place in the
        receive slot it arrived in, still in cache, and sent from there. Slots rotate; a slot whose frame
        the sender thread has not sent yet is not waited for (a ring of members each waiting for its own
        sender would deadlock): that frame is reduced into `work` and sent from there instead, as the final
        reduction of chunk r always is, from a spare slot that is never sent from (`work` may be `src`)."""
        n, r = self.world, self.rank
        spare, *slots = (s.view(src.dtype) for s in self._scratch_for(seg * src.itemsize))
        tickets = [0] * len(slots)
        k = 0
        for a, b in _segments(*bounds[(r - 1) % n], seg):
            pipe.send(src[a:b])
        for step in range(n - 1):
            last = step == n - 2
            for a, b in _segments(*bounds[(r - step - 2) % n], seg):
                if not last and pipe.is_sent(tickets[k]):
                    got = slots[k][:b - a]
                    pipe.recv(got)
                    combine(op, flat.bf16, got, src[a:b], got)
                    tickets[k] = pipe.send(got)
                    k = (k + 1) % len(slots)
                    continue
                got = spare[:b - a]
                pipe.recv(got)
                combine(op, flat.bf16, work[a:b], src[a:b], got)
                if last and op is ReduceOp.AVG:
                    divide(flat.bf16, work[a:b], n)
                if gather or not last:
                    pipe.send(work[a:b])

    def _all_gather(self, pipe: _Pipe, work: np.ndarray, bounds: list[tuple[int, int]], seg: int) -> None:
        """Rank r's chunk r is on its way to r+1 already; receive and forward the others."""
        n, r = self.world, self.rank
        for step in range(n - 1):
            for a, b in _segments(*bounds[(r - step - 1) % n], seg):
                digest = pipe.recv(work[a:b])
                if step < n - 2:
                    pipe.send(work[a:b], digest)

    def _broadcast(self, seq: int, flat: Flat, root: int) -> None:
        n, r = self.world, self.rank
        pos = (r - root) % n
        prev = self._link((r - 1) % n) if pos else None
        nxt = self._link((r + 1) % n) if pos < n - 1 else None
        pipe = _Pipe(prev, nxt, FrameKind.COLLECTIVE, seq, inline=flat.raw.nbytes <= self._inline_bytes)
        segs = _segments(0, flat.size, self._seg(flat))
        if pos == 0:
            for a, b in segs:
                pipe.send(flat.elems[a:b])
            pipe.flush()
            return
        work = self._work_for(flat)
        for a, b in segs:
            digest = pipe.recv(work[a:b])
            if nxt is not None:
                pipe.send(work[a:b], digest)
        pipe.flush()
        np.copyto(flat.elems, work)

    def _exchange(self, seq: int, inp: Flat, work: np.ndarray, sends: list[int], gets: list[int],
                  starts_in: list[int], starts_out: list[int]) -> None:
        """all_to_all's traffic: queue every outgoing segment, receive every incoming one, flush."""
        n, r, seg = self.world, self.rank, self._seg(inp)
        links = self._links([p for p in range(n) if p != r])
        outgoing = []
        for k in range(1, n):
            dst = (r + k) % n
            pipe = _Pipe(None, links[dst], FrameKind.COLLECTIVE, seq, inline=False)
            for a, b in _segments(starts_in[dst], starts_in[dst] + sends[dst], seg):
                pipe.send(inp.elems[a:b])
            outgoing.append(pipe)
        for k in range(1, n):
            src = (r - k) % n
            pipe = _Pipe(links[src], None, FrameKind.COLLECTIVE, seq, inline=False)
            for a, b in _segments(starts_out[src], starts_out[src] + gets[src], seg):
                pipe.recv(work[a:b])
        for pipe in outgoing:
            pipe.flush()

    # ---- helpers -------------------------------------------------------------------------------
    def _link(self, rank: int) -> Connection:
        return self.session.link(self.members[rank])

    def _links(self, ranks: list[int]) -> dict[int, Connection]:
        """Connections to `ranks`: the ones this member dials (higher session ranks) first, then the ones it
        waits for, so that no two members wait for each other."""
        me = self.members[self.rank]
        for peer in sorted(ranks, key=lambda p: (self.members[p] < me, self.members[p])):
            self._link(peer)
        return {peer: self._link(peer) for peer in ranks}

    def _ring_links(self) -> tuple[Connection, Connection]:
        prev, nxt = (self.rank - 1) % self.world, (self.rank + 1) % self.world
        links = self._links(sorted({prev, nxt}))
        return links[prev], links[nxt]

    def _ring_pipe(self, seq: int, nbytes: int) -> _Pipe:
        prev, nxt = self._ring_links()
        return _Pipe(prev, nxt, FrameKind.COLLECTIVE, seq, inline=nbytes <= self._inline_bytes)

    def _next_seq(self) -> int:
        seq = self._seq_base | self._op_seq
        self._op_seq += 1
        return seq

    def _seg(self, flat: Flat) -> int:
        return max(1, self._chunk_bytes // flat.elems.itemsize)

    def _ring_seg(self, itemsize: int, bounds: list[tuple[int, int]]) -> int:
        longest = max(hi - lo for lo, hi in bounds) * itemsize
        return ring_frame_bytes(longest, self._chunk_bytes, self._large_frame_bytes) // itemsize or 1

    def _scratch_for(self, nbytes: int) -> list[np.ndarray]:
        """The reduce-scatter's receive slots, `nbytes` each (grown in place: subgroups share them, and one
        operation runs at a time across a generation's communicators)."""
        if not self._scratch or self._scratch[0].nbytes < nbytes:
            self._scratch[:] = [np.empty(nbytes, np.uint8) for _ in range(_SCRATCH_SLOTS)]
        return [s[:nbytes] for s in self._scratch]

    def _work_for(self, flat: Flat) -> np.ndarray:
        nbytes = flat.raw.nbytes
        if self._work.nbytes < nbytes:
            self._work = np.empty(nbytes, np.uint8)
        return self._work[:nbytes].view(flat.elems.dtype)

    def _check_pair(self, small: Flat, big: Flat, name: str) -> None:
        if not small.same_kind(big):
            raise TypeError(f"{name}: dtypes differ ({small.dtype_name} vs {big.dtype_name})")
        if big.size != small.size * self.world:
            raise ValueError(f"{name}: the larger buffer has {big.size} elements, expected world "
                             f"({self.world}) x {small.size} = {small.size * self.world}")

    def _check_rank(self, rank: int, what: str) -> None:
        if not isinstance(rank, int) or not 0 <= rank < self.world:
            raise ValueError(f"{what}={rank!r} is not a rank of generation {self.generation} "
                             f"(0..{self.world - 1})")

    def _check_peer(self, rank: int, what: str) -> None:
        self._check_rank(rank, what)
        if rank == self.rank:
            raise ValueError(f"{what}={rank} is this member itself: send/recv need another rank")


class _Pipe:
    """One operation's frame streams: receive from `src`, send to `dst`, with per-op frame counters."""

    def __init__(self, src: Connection | None, dst: Connection | None, kind: int, seq: int,
                 inline: bool) -> None:
        self.src, self.dst, self.kind, self.seq, self.inline = src, dst, kind, seq, inline
        self.sent = 0
        self.received = 0

    def send(self, arr: np.ndarray, digest: int | None = None) -> int:
        """Post `arr` as the next frame; returns its ticket (see `Connection.is_sent`)."""
        ticket = self.dst.post(self.kind, self.seq, self.sent, arr.view(np.uint8), self.inline, digest)
        self.sent += 1
        return ticket

    def is_sent(self, ticket: int) -> bool:
        return self.dst.is_sent(ticket)

    def recv(self, arr: np.ndarray) -> int:
        """Fill `arr` with the next frame; returns its verified payload digest."""
        stamp = (self.kind, self.seq, self.received)
        slot = RecvSlot(memoryview(arr.view(np.uint8)))
        digest = self.src.recv_into(slot, *stamp)
        slot.take(stamp)
        self.received += 1
        return digest

    def flush(self) -> None:
        if self.dst is not None and not self.inline:
            self.dst.flush()

    def finish(self) -> None:
        """A ring collective's last exchange (see the module docstring), once every frame from the predecessor
        has arrived: say so to it, flush, then wait for the successor's receipt for every frame this member
        sent. A receipt has no payload; its chunk field counts the frames received. It goes on the sender thread
        while that has frames queued for its link (a ring of two members shares one link both ways), else at
        once."""
        self.src.post(FrameKind.RECEIPT, self.seq, self.received, _NO_PAYLOAD, inline=self.src.idle)
        self.flush()
        stamp = (FrameKind.RECEIPT, self.seq, self.sent)
        slot = RecvSlot(memoryview(_NO_PAYLOAD))
        self.dst.recv_into(slot, *stamp)
        slot.take(stamp)


_NO_PAYLOAD = np.zeros(0, np.uint8)
LARGE_FRAME_BYTES = 4 << 20     # the largest ring frame (see `ring_frame_bytes`), if max_frame_bytes allows
PIPELINE_FRAMES = 4             # frames per member's chunk, at least, before frames grow past chunk_bytes
_SCRATCH_SLOTS = 3       # receive slots of a reduce-scatter: one spare, two it rotates through (see `_reduce_scatter`)


def ring_frame_bytes(chunk: int, chunk_bytes: int, large_frame_bytes: int) -> int:
    """Payload bytes per frame of a ring whose longest member chunk is `chunk` bytes: `chunk_bytes`, or for
    a chunk of more than PIPELINE_FRAMES of those, a PIPELINE_FRAMES-th of it, up to `large_frame_bytes`
    (never below `chunk_bytes`). Costs per frame (syscalls, wake-ups, Python) fall with fewer frames; the
    PIPELINE_FRAMES frames per chunk keep a member forwarding frame k while frame k+1 is on the wire. Every
    member computes the same from the same configuration."""
    return max(chunk_bytes, min(large_frame_bytes, chunk // PIPELINE_FRAMES))


def _starts(counts: list[int]) -> list[int]:
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return out


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    """`parts` near-equal contiguous ranges covering 0..n."""
    base, extra = divmod(n, parts)
    out, lo = [], 0
    for i in range(parts):
        hi = lo + base + (i < extra)
        out.append((lo, hi))
        lo = hi
    return out


def _blocks(m: int, parts: int) -> list[tuple[int, int]]:
    return [(i * m, (i + 1) * m) for i in range(parts)]


def _segments(lo: int, hi: int, seg: int) -> list[tuple[int, int]]:
    return [(a, min(hi, a + seg)) for a in range(lo, hi, seg)]

"""all_reduce through shared memory, for a generation whose members all run on one host.

Owns: one generation's shared segment (made by rank 0, mapped by every member, unlinked as soon as all of
them mapped it or gave up) and the algorithm over it. The buffer is cut into pieces of at most `PIECE_BYTES`
per member; for each piece every member copies its input into its own input slot, a barrier passes, and every
member reduces
its own share of the piece (1/world of it) from all inputs, in rank order, into the segment's output region.
After the last piece a final barrier passes and every member copies the whole output region into its buffer.
Per member and call that is one copy in, one read of 1/world of everyone's input, one copy out: no kernel
socket copies and no payload hashing, which is what a 64 MiB ring all_reduce on loopback spends most of its
CPU on (see the README's data-plane section). A call of at most `SMALL_BYTES` needs one barrier: every member
copies its input in, the barrier passes, and every member reduces all inputs, in rank order, straight into
its own buffer (a second barrier would cost more than reducing the whole call does).

Barriers are small stamped, checksummed frames over the generation's TCP links, in a star around rank 0:
every member sends rank 0 an `arrive` frame naming the piece and the call's size, dtype and op; rank 0 checks
them and answers each with a `go` frame; after the last barrier of a call every other member also sends rank 0
a `done`, and rank 0 completes only once one of them confirmed. So a peer that dies, stops or is aborted fails
the call exactly as it fails a ring (the links carry the failure), and no member polls.

Invariants:
- Bit-identical results: each element is reduced in rank order by one member, whose output every member
  copies, or (small calls) by every member from the same inputs with the same element-wise kernels.
- No member completes a call alone: a member other than rank 0 completes once it got the `go` of the last
  barrier and confirmed it with a `done`, rank 0 once at least one other member confirmed. (Without that, a
  rank 0 stopped before its `go`s completed the call alone after the others gave it up.)
- The caller's buffer is written only after the final barrier, that is after every member's share of every
  piece is in the output region; a call that raises leaves it as it was passed.
- A slot is overwritten only after every member has finished reading it: slots are used in turn, one use
  per piece, counted across calls; a member writes use u's input after the barrier of use u-1, which every
  member reaches only after reading use u-2 (two slots); the output region is written only after the first
  barrier of a call, which every member reaches only after copying out the previous call's result.
- Whether a call takes this path is decided the same way on every member: from the call's size, constants
  of this module, and the outcome of the setup exchange, which rank 0 announces to everyone. A member that
  cannot map the segment (another host, a private /dev/shm, P2PGEN_SHM=0) makes the whole generation use
  the ring instead, and so does a segment that would take more than half of the free space of /dev/shm.
- The segment is a new file per generation (and per growth), created exclusively, mode 0600, under a name
  with 128 random bits, and carries that token in its header, which every member checks after mapping it;
  segments a killed rank 0 could not unlink are removed by the next rank 0 of the same user on the host.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import secrets
import struct
import zlib
from collections.abc import Callable

import numpy as np

from p2pgen.collectives.backend import ReduceOp
from p2pgen.collectives.buffers import Flat, combine, divide
from p2pgen.errors import GenerationChanged, PeerLost, ProtocolError
from p2pgen.transport import Connection, FrameKind, RecvSlot

SHM_DIR = "/dev/shm"
ENV = "P2PGEN_SHM"                # "0": never use shared memory (every member then uses the ring)
MIN_BYTES = 64 << 10              # world 2: smaller calls take the ring (latency-bound: its two hops win)
WIDE_WORLD = 3                    # from this world on, every call: the ring's 2(world-1) hops lose to one barrier
MAX_BYTES = 1 << 30               # larger calls take the ring rather than a segment this large
PIECE_BYTES = 4 << 20             # per member and piece (measured: 1 MiB pieces, 4x the barriers, cost 20-40 %)
SMALL_BYTES = 1 << 20             # calls up to this size take one barrier and are reduced whole by every member
_HEADER_BYTES = 4096
_MAGIC = b"P2Dshm01"
_NAME = re.compile(r"^p2pgen-(\d+)-(\d+)-[0-9a-f]{32}$")

# Control messages: seven u64 words (kind, piece, nbytes, tag, value, token_hi, token_lo); `tag` names the call's
# dtype and op (a barrier) or the segment's capacity (a set-up).
_ARRIVE, _GO, _SETUP, _MAPPED, _DECIDED, _DONE = 1, 2, 3, 4, 5, 6
_KINDS = {_ARRIVE: "arrive", _GO: "go", _SETUP: "set-up", _MAPPED: "mapped", _DECIDED: "decided", _DONE: "done"}
_WORDS = 7
_SET_UP_PIECE = (1 << 64) - 1     # the piece number of the barrier that precedes a set-up


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


class ShmAllReduce:
    """The shared-memory all_reduce of one generation's communicator (its top-level group only).

    `links(ranks)` returns this member's connections to those ranks (made if need be, in an order that
    cannot deadlock); rank 0 of the group coordinates.
    """

    def __init__(self, rank: int, world: int, same_host: bool,
                 links: Callable[[list[int]], dict[int, Connection]],
                 failed: Callable[[], Exception | None] = lambda: None) -> None:
        self.rank, self.world = rank, world
        self._links = links
        self._failed = failed                           # the error the generation was retired with, if any
        self._refused = not same_host or world < 2      # the generation decided (or must) use the ring
        self.enabled = enabled()                        # this member offers shared memory (P2PGEN_SHM)
        self._too_big = MAX_BYTES + 1                   # the smallest size a segment could not be made for
        self._segment: _Segment | None = None
        self._uses = 0                                  # slot uses in this generation: use u is slot u % 2
        self._conns: dict[int, Connection] = {}        # this call's links: rank 0's to everyone, the others' to 0
        self._sent: dict[int, int] = {}
        self._received: dict[int, int] = {}
        self._msg = np.zeros(_WORDS, np.uint64)

    @property
    def active(self) -> bool:
        return self._segment is not None

    def release(self) -> None:
        """Drop the segment (unmapped once no view of it is left); only once no call can be running, as
        after an abort that proved quiescence. The generation is retired then, so no call comes."""
        self._segment = None
        self._refused = True

    def takes(self, nbytes: int) -> bool:
        """Whether an all_reduce of `nbytes` tries this path (the same answer on every member)."""
        least = 1 if self.world >= WIDE_WORLD else MIN_BYTES
        return not self._refused and least <= nbytes < self._too_big

    def all_reduce(self, seq: int, op: ReduceOp, flat: Flat) -> bool:
        """Reduce `flat` in place; False (nothing written, every member told) if the ring must do it."""
        self._conns = self._links([0] if self.rank else list(range(1, self.world)))
        self._sent, self._received = {}, {}
        nbytes, tag = flat.raw.nbytes, _call_tag(flat, op)
        if self._segment is None or self._segment.capacity < nbytes:
            # Agree on the call before setting up: members always send to rank 0 first, so calls that
            # disagree (one member needing a set-up, another not) fail here instead of waiting on each other.
            self._barrier(seq, _SET_UP_PIECE, nbytes, tag)
            if not self._set_up(seq, nbytes):
                return False
        seg = self._segment
        if nbytes <= SMALL_BYTES:
            slot = self._next_slot()
            np.copyto(seg.input(self.rank, slot, flat.elems.dtype, flat.size), flat.elems)
            self._barrier(seq, 0, nbytes, tag, last=True)
            self._reduce(seg, slot, op, flat, 0, flat.size, flat.elems)
            return True
        pe = seg.piece_bytes // flat.elems.itemsize
        pieces = range(0, flat.size, pe)
        out = seg.output(flat.elems.dtype, flat.size)
        for k, lo in enumerate(pieces):
            hi = min(flat.size, lo + pe)
            slot = self._next_slot()
            np.copyto(seg.input(self.rank, slot, flat.elems.dtype, hi - lo), flat.elems[lo:hi])
            self._barrier(seq, k, nbytes, tag)
            n = hi - lo
            share = slice(n * self.rank // self.world, n * (self.rank + 1) // self.world)
            self._reduce(seg, slot, op, flat, share.start, share.stop, out[lo:hi][share])
        self._barrier(seq, len(pieces), nbytes, tag, last=True)
        np.copyto(flat.elems, out)
        return True

    def _next_slot(self) -> int:
        self._uses += 1
        return self._uses % 2

    def _reduce(self, seg: _Segment, slot: int, op: ReduceOp, flat: Flat, lo: int, hi: int,
                dest: np.ndarray) -> None:
        """dest = the reduction, in rank order, of elements lo..hi of every member's input in `slot`."""
        if lo == hi:
            return
        dtype = flat.elems.dtype
        inputs = [seg.input(r, slot, dtype, hi)[lo:hi] for r in range(self.world)]
        combine(op, flat.bf16, dest, inputs[0], inputs[1])
        for more in inputs[2:]:
            combine(op, flat.bf16, dest, dest, more)
        if op is ReduceOp.AVG:
            divide(flat.bf16, dest, self.world)

    # ---- barriers ------------------------------------------------------------------------------
    def _barrier(self, seq: int, piece: int, nbytes: int, tag: int, last: bool = False) -> None:
        """Returns once every member has called it for `piece` of the same call (size, dtype and op); the
        `last` barrier of a call (after it, members complete the call) also confirms it (`_confirm`)."""
        if self.rank:
            self._send(0, seq, _ARRIVE, piece, nbytes, tag)
            self._expect(0, seq, _GO, piece, nbytes, tag)
            if last:
                self._send(0, seq, _DONE, piece, nbytes, tag)
            return
        others = range(1, self.world)
        for r in others:
            self._expect(r, seq, _ARRIVE, piece, nbytes, tag)
        for r in others:
            self._send(r, seq, _GO, piece, nbytes, tag)
        if last:
            self._confirm(seq, piece, nbytes, tag)

    def _confirm(self, seq: int, piece: int, nbytes: int, tag: int) -> None:
        """Rank 0 at a call's last barrier, its `go`s sent: the others' `done`s (each sends one as soon as its
        `go` arrived); rank 0 completes only once at least one of them confirmed.

        Rank 0 needs only the `arrive`s to complete. Without a confirmation, a rank 0 stopped (SIGSTOP) before
        its `go`s resumed after the others had given the call up, completed it alone and committed a step
        the others took again, in the next generation, with another result (seen in `p2pgen stress`). A
        member whose link failed instead of confirming (it died after its `arrive`) does not stop rank 0:
        the members that got their `go` complete, so rank 0 does too, as it did before. Confirmations do
        not count once this generation was aborted here (the agent's fence, a new generation). A `go`
        that cannot be sent fails the call (the transport retires the generation on a send error)."""
        confirmed, lost = 0, None
        for r in range(1, self.world):
            try:
                self._expect(r, seq, _DONE, piece, nbytes, tag)
                confirmed += 1
            except PeerLost as e:
                lost = lost or e
        if lost is not None and (not confirmed or isinstance(self._failed(), GenerationChanged)):
            raise lost

    def _send(self, rank: int, seq: int, kind: int, piece: int, nbytes: int, tag: int, value: int = 0,
              token: tuple[int, int] = (0, 0)) -> None:
        conn = self._conns[rank]
        msg = np.array([kind, piece, nbytes, tag, value, *token], np.uint64)
        chunk = self._sent.get(rank, 0)
        self._sent[rank] = chunk + 1
        conn.post(FrameKind.COLLECTIVE, seq, chunk, msg.view(np.uint8), inline=conn.idle)

    def _receive(self, rank: int, seq: int) -> np.ndarray:
        conn = self._conns[rank]
        chunk = self._received.get(rank, 0)
        self._received[rank] = chunk + 1
        stamp = (FrameKind.COLLECTIVE, seq, chunk)
        slot = RecvSlot(memoryview(self._msg.view(np.uint8)))
        conn.recv_into(slot, *stamp)
        slot.take(stamp)
        return self._msg

    def _expect(self, rank: int, seq: int, kind: int, piece: int, nbytes: int, tag: int) -> np.ndarray:
        msg = self._receive(rank, seq)
        got = tuple(int(w) for w in msg[:4])
        if got != (kind, piece, nbytes, tag):
            raise ProtocolError(f"all_reduce through shared memory: rank {rank} sent {_KINDS.get(got[0], got[0])!r} "
                                f"for piece {got[1]} of a {got[2]}-byte call (tag {got[3]:#x}); this member expected "
                                f"{_KINDS[kind]!r} for piece {piece} of a {nbytes}-byte call (tag {tag:#x}): do all "
                                "members call the same collectives, in the same order, with the same shapes, "
                                "dtypes and ops?")
        return msg

    # ---- the segment ---------------------------------------------------------------------------
    def _set_up(self, seq: int, nbytes: int) -> bool:
        """Make (rank 0) and map (everyone) a segment with room for `nbytes` of output; False if some member
        could not, and then every member uses the ring for this call (and, at this size, for good)."""
        capacity = 1 << (nbytes - 1).bit_length()
        size = _Segment.size_for(self.world, capacity)
        if self.rank == 0:
            ok = self._create_and_share(seq, nbytes, capacity, size)
        else:
            ok = self._map_shared(seq, nbytes, capacity, size)
        if not ok:
            if self._segment is None:
                self._refused = True
            self._too_big = min(self._too_big, nbytes)
        return ok

    def _create_and_share(self, seq: int, nbytes: int, capacity: int, size: int) -> bool:
        token = secrets.token_bytes(16)
        hi, lo = struct.unpack(">QQ", token)
        path = _segment_path(os.getpid(), token)
        segment = _Segment.create(path, token, size, capacity, self.world) if self.enabled else None
        try:
            for r in range(1, self.world):       # value: the maker's pid (part of the name), 0 if it has none
                self._send(r, seq, _SETUP, 0, nbytes, capacity, value=os.getpid() if segment else 0, token=(hi, lo))
            mapped = [int(self._expect(r, seq, _MAPPED, 0, nbytes, capacity)[4]) for r in range(1, self.world)]
        finally:
            _unlink(path)
        ok = segment is not None and all(mapped)
        for r in range(1, self.world):
            self._send(r, seq, _DECIDED, 0, nbytes, capacity, value=int(ok))
        if ok:
            self._segment = segment
        return ok

    def _map_shared(self, seq: int, nbytes: int, capacity: int, size: int) -> bool:
        msg = self._expect(0, seq, _SETUP, 0, nbytes, capacity)
        maker, token = int(msg[4]), struct.pack(">QQ", int(msg[5]), int(msg[6]))
        segment = None
        if maker and self.enabled:
            segment = _Segment.attach(_segment_path(maker, token), token, size, capacity, self.world)
        self._send(0, seq, _MAPPED, 0, nbytes, capacity, value=int(segment is not None))
        ok = bool(int(self._expect(0, seq, _DECIDED, 0, nbytes, capacity)[4]))
        if ok:
            self._segment = segment
        return ok


class _Segment:
    """A mapped segment: header, `world` x 2 input slots of `piece_bytes`, then `capacity` bytes of output."""

    def __init__(self, mm: mmap.mmap, capacity: int, world: int) -> None:
        self.capacity = capacity
        self.piece_bytes = min(PIECE_BYTES, capacity)
        self._buf = np.frombuffer(mm, np.uint8)
        self._inputs = _HEADER_BYTES
        self._output = _HEADER_BYTES + world * 2 * self.piece_bytes

    @staticmethod
    def size_for(world: int, capacity: int) -> int:
        return _HEADER_BYTES + world * 2 * min(PIECE_BYTES, capacity) + capacity

    @classmethod
    def create(cls, path: str, token: bytes, size: int, capacity: int, world: int) -> _Segment | None:
        """A new segment at `path` with `size` bytes reserved (so a full /dev/shm fails here, not as a SIGBUS
        later); None if it cannot be made, or if it would take more than half of the space left (the
        host's other users of /dev/shm, such as the local copy of the state, keep the rest)."""
        _remove_orphans()
        if _free_bytes() < 2 * size:
            return None
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            return None
        try:
            os.posix_fallocate(fd, 0, size)
            mm = mmap.mmap(fd, size)
        except OSError:
            _unlink(path)
            return None
        finally:
            os.close(fd)
        mm[:len(_MAGIC) + len(token)] = _MAGIC + token
        return cls(mm, capacity, world)

    @classmethod
    def attach(cls, path: str, token: bytes, size: int, capacity: int, world: int) -> _Segment | None:
        """The segment rank 0 made, if it is at `path` on this host, has `size` bytes and carries `token`."""
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_size != size:
                return None
            mm = mmap.mmap(fd, size)
        except OSError:
            return None
        finally:
            os.close(fd)
        if mm[:len(_MAGIC) + len(token)] != _MAGIC + token:
            mm.close()
            return None
        return cls(mm, capacity, world)

    def input(self, rank: int, slot: int, dtype: np.dtype, count: int) -> np.ndarray:
        at = self._inputs + (rank * 2 + slot) * self.piece_bytes
        return self._buf[at:at + count * dtype.itemsize].view(dtype)

    def output(self, dtype: np.dtype, count: int) -> np.ndarray:
        return self._buf[self._output:self._output + count * dtype.itemsize].view(dtype)


def _call_tag(flat: Flat, op: ReduceOp) -> int:
    return zlib.crc32(f"{flat.dtype_name}/{op.value}".encode())


def _segment_path(maker_pid: int, token: bytes) -> str:
    return os.path.join(SHM_DIR, f"p2pgen-{os.getuid()}-{maker_pid}-{token.hex()}")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _free_bytes() -> int:
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def _remove_orphans() -> None:
    """Unlink this user's segments whose maker is gone (killed between making and unlinking one)."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return
    uid = str(os.getuid())
    for name in names:
        m = _NAME.match(name)
        if m is None or m.group(1) != uid or _alive(int(m.group(2))):
            continue
        _unlink(os.path.join(SHM_DIR, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as e:
        return e.errno == errno.EPERM
    return True

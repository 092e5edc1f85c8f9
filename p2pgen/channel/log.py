"""The receiver's consumption log: which sequence numbers of one channel the application consumed.

One append-only file per (job, sender peer_id, receiver peer_id) channel, under the receiver host's log
directory. It belongs to the channel, not to a process: a restarted receiver (a new incarnation, I3)
reopens it and keeps deduplicating; the sender's recovery reads it (through the receiver) to resend exactly
the missing numbers (I6).

Records are 32 bytes: magic "P2CL" | kind u8 | pad | a u64 | b u64 | xxh3_64 of the 24 bytes before it.
    CONSUMED(a=seq)  OWNER(a=sender incarnation, b=generation)  BASE(a=watermark, b=repeats)

Durability: each record is one write() on an O_APPEND descriptor, so once `append` returns the record is
in the kernel and survives the death of the receiver process (the fault I6 is about). `fsync=True`
also survives a host crash, at about a millisecond per record: worth it only when the consumed effect is
itself durable on that host.

Invariants:
- A record is appended only after the application consumed the message; a torn or corrupt tail (a crash
  in mid-write) is detected by its checksum and cut off on reopen, never read as a record.
- One process at a time holds a channel's log (an exclusive flock on a sibling lock file); a dead holder
  releases it with its process.
- Compaction (BASE + the numbers above it + OWNER, written aside then renamed) keeps the consumed set, the
  owner and the count of repeated records, so the log answers the same questions before and after.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
from dataclasses import dataclass
from urllib.parse import quote

import xxhash

log = logging.getLogger(__name__)

MAGIC = b"P2CL"
_BODY = struct.Struct("<4sB3xQQ")
_SUM = struct.Struct("<Q")
RECORD_BYTES = _BODY.size + _SUM.size
CONSUMED, OWNER, BASE = 1, 2, 3


class LogBusy(RuntimeError):
    """Another live process holds this channel's consumption log."""


class ConsumedSet:
    """Consumed sequence numbers as a watermark (every number below it) plus the numbers above it.

    Invariant: `watermark` not in `above`, and every element of `above` is greater than `watermark`.
    """

    __slots__ = ("watermark", "above")

    def __init__(self, watermark: int = 0, above: set[int] | None = None) -> None:
        self.watermark = watermark
        self.above: set[int] = set()
        for seq in above or ():
            self.add(seq)

    def __contains__(self, seq: int) -> bool:
        return seq < self.watermark or seq in self.above

    def __len__(self) -> int:
        return self.watermark + len(self.above)

    def add(self, seq: int) -> bool:
        """Record `seq`; False if it was already there."""
        if seq in self:
            return False
        if seq != self.watermark:
            self.above.add(seq)
            return True
        self.watermark += 1
        while self.watermark in self.above:
            self.above.remove(self.watermark)
            self.watermark += 1
        return True

    def snapshot(self) -> tuple[int, list[int]]:
        return self.watermark, sorted(self.above)


@dataclass
class LogState:
    consumed: ConsumedSet
    owner: tuple[int, int]     # (sender incarnation, generation) of the last sender that took over
    repeats: int               # CONSUMED records of a number already consumed (a duplicate consumption)
    records: int               # records in the file
    good_bytes: int            # bytes before the first torn or corrupt record


def channel_path(log_dir: str, job: str, sender: str, receiver: str) -> str:
    """The log file of the channel sender -> receiver of `job` (peer ids may hold '/')."""
    return os.path.join(log_dir, quote(job, safe=""), f"{quote(sender, safe='')}--{quote(receiver, safe='')}.chlog")


def pack(kind: int, a: int, b: int = 0) -> bytes:
    body = _BODY.pack(MAGIC, kind, a, b)
    return body + _SUM.pack(xxhash.xxh3_64_intdigest(body))


def parse(data: bytes) -> LogState:
    """Replay records up to the first torn or corrupt one."""
    state = LogState(ConsumedSet(), (-1, -1), 0, 0, 0)
    for off in range(0, len(data) - RECORD_BYTES + 1, RECORD_BYTES):
        rec = data[off:off + RECORD_BYTES]
        magic, kind, a, b = _BODY.unpack_from(rec)
        if magic != MAGIC or _SUM.unpack_from(rec, _BODY.size)[0] != xxhash.xxh3_64_intdigest(rec[:_BODY.size]):
            break
        _apply(state, kind, a, b)
        state.records += 1
        state.good_bytes = off + RECORD_BYTES
    return state


def _apply(state: LogState, kind: int, a: int, b: int) -> None:
    if kind == CONSUMED:
        state.repeats += not state.consumed.add(a)
    elif kind == OWNER:
        state.owner = (a, b)
    elif kind == BASE:
        state.consumed = ConsumedSet(a, state.consumed.above)
        state.repeats += b


def scan(path: str) -> LogState:
    """Read a log without opening it for writing (the benchmark's ground truth); empty if absent."""
    try:
        with open(path, "rb") as f:
            return parse(f.read())
    except FileNotFoundError:
        return parse(b"")


class ConsumptionLog:
    """The open, locked, appendable log of one channel. Not thread-safe: the receiver serialises calls."""

    def __init__(self, path: str, fsync: bool = False, compact_records: int = 1 << 20) -> None:
        self.path = path
        self._fsync = fsync
        self._compact_at = compact_records
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._lock_fd = _lock(path + ".lock")
        try:
            self.state = self._recover()
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except BaseException:
            os.close(self._lock_fd)
            raise

    def _recover(self) -> LogState:
        data = _read(self.path)
        state = parse(data)
        if state.good_bytes < len(data):
            log.warning("consumption log %s: cut %d bytes of torn or corrupt tail after %d records",
                        self.path, len(data) - state.good_bytes, state.records)
            os.truncate(self.path, state.good_bytes)
        return state

    @property
    def consumed(self) -> ConsumedSet:
        return self.state.consumed

    @property
    def owner(self) -> tuple[int, int]:
        return self.state.owner

    def consume(self, seq: int) -> bool:
        """Append CONSUMED(seq); False if `seq` had been consumed before (the record is still written)."""
        fresh = self.state.consumed.add(seq)
        self.state.repeats += not fresh
        self._append(pack(CONSUMED, seq))
        return fresh

    def set_owner(self, incarnation: int, generation: int) -> None:
        self.state.owner = (incarnation, generation)
        self._append(pack(OWNER, incarnation, generation))

    def _append(self, record: bytes) -> None:
        os.write(self._fd, record)
        if self._fsync:
            os.fsync(self._fd)
        self.state.records += 1
        if self.state.records >= self._compact_at:
            self.compact()

    def compact(self) -> None:
        """Rewrite the log as BASE + the numbers above the watermark + OWNER (atomic rename)."""
        w, above = self.state.consumed.snapshot()
        records = [pack(BASE, w, self.state.repeats)] + [pack(CONSUMED, s) for s in above]
        if self.state.owner != (-1, -1):
            records.append(pack(OWNER, *self.state.owner))
        tmp = self.path + ".compact"
        with open(tmp, "wb") as f:
            f.write(b"".join(records))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        _fsync_dir(os.path.dirname(self.path))
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self.state.records = len(records)

    def close(self) -> None:
        for fd in (self._fd, self._lock_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def _lock(path: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LogBusy(f"consumption log {path[:-5]} is held by another live process: only one receiver "
                      "process per channel may run; stop the old one first") from None
    return fd


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

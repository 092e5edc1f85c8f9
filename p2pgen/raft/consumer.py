"""The replicated state of a job inside pysyncobj: one SyncObjConsumer that feeds commands to core.

Owns: the `GenerationMachine` of the job, a bounded table of request results, and the running hash of the
Raft log (`log_hash`: every applied entry folded in, so two nodes that applied index i hold the same hash at i;
kept here so that a joiner bootstrapped from a snapshot continues it). Everything reachable from this object is
picklable (pysyncobj snapshots it for joiners; pitfall 2 in docs/design/pysyncobj.md).
Invariants kept:
- the replicated method `submit` never raises (pitfall 3): any failure becomes a refused Outcome;
- it is deterministic: no clock, no randomness, no environment; times arrive inside the commands;
- a command is applied at most once per request id: a retried request returns the first result.
"""

from __future__ import annotations

import logging
import struct
from collections import OrderedDict

import xxhash
from pysyncobj import SyncObjConsumer, replicated

from p2pgen.core import Command, GenerationMachine, LogPosition, Outcome

log = logging.getLogger(__name__)

RESULTS_KEPT = 2048


class JobState(SyncObjConsumer):
    def __init__(self, job: str) -> None:
        super().__init__()
        self.machine = GenerationMachine(job)
        self.results: OrderedDict[str, Outcome] = OrderedDict()
        self.log_hash = bytes(16)
        self.last_was_duplicate = False    # the entry just applied repeated a request already applied

    def fold_entry(self, index: int, term: int, command: bytes) -> str:
        """Fold one applied log entry into the running hash; returns the new hash (hex). Called by the node for
        every entry it applies, in log order (not a replicated method: the entry itself is what is replicated)."""
        self.log_hash = xxhash.xxh3_128_digest(self.log_hash + struct.pack("<qq", index, term) + command)
        return self.log_hash.hex()

    @replicated
    def submit(self, request_id: str, command: Command) -> Outcome:
        cached = self.results.get(request_id)
        self.last_was_duplicate = cached is not None
        if cached is not None:               # a resent request appended twice: answered, not applied again
            return cached
        try:
            outcome = self.machine.apply(command, self._log_position())
        except Exception as e:  # a bug in core must not stall every node (pitfall 3)
            log.exception("core failed on %r", command)
            outcome = Outcome.refused(f"internal error applying {type(command).__name__}: {e!r}")
        self.results[request_id] = outcome
        while len(self.results) > RESULTS_KEPT:
            self.results.popitem(last=False)
        return outcome

    def _log_position(self) -> LogPosition:
        """Index and term of the entry being applied: the same on every node."""
        so = self._syncObj
        index = so.raftLastApplied + 1
        entries = so._SyncObj__getEntries(index, 1)   # pinned pysyncobj 0.3.17 internals
        term = entries[0][2] if entries else 0
        return LogPosition(term, index)

"""The Raft safety trace of one agent process: JSON lines that `p2pgen.raft.checker` reads.

Owns: the file `DIR/<peer_id>-<instance>.jsonl` (peer_id with '/' replaced by '_'), appended to and flushed at
least every `FLUSH_S` seconds and on close, so a SIGKILLed agent loses at most that much (and may leave a
truncated last line, which readers skip). Every record carries `t` (wall time), `kind`, `agent` (control
address), `instance` (this agent process's nonce) and `node` (the Raft node id in use, or null). Kinds: `node`
(a Raft node started: voter or not), `applied` (running log hash at index i: every index divisible by
`CHECKPOINT_EVERY`, and the last one when a node stops), `leader` (this node became leader in a term, with its
configuration and last log entry), `leader_commit` (that leader applied the first entry of its term),
`hasten` (told its leader is dead, this node set its campaign), `vote` (this node granted its vote in a
term), `config` (a voter applied the membership change at index i; its configuration after it), `register`
(a successful Register applied at index i), `activated` (the entry at index i activated generation g).
Invariant kept: records are written in the order this process observed them; nothing is rewritten.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

FLUSH_S = 0.2
CHECKPOINT_EVERY = 16
ENV_DIR = "P2PGEN_TRACE_DIR"


class Trace:
    """A trace file, or nothing when `directory` is empty (every method is then a no-op)."""

    def __init__(self, directory: str | None, peer_id: str, agent: str, instance: str) -> None:
        self.agent, self.instance = agent, instance
        self.path = (os.path.join(directory, f"{peer_id.replace('/', '_')}-{instance}.jsonl")
                     if directory else None)
        self._lines: list[str] = []
        self._last_flush = time.monotonic()
        self._lock = threading.Lock()
        if self.path:
            os.makedirs(directory, exist_ok=True)

    def record(self, kind: str, node: str | None, **fields: Any) -> None:
        if not self.path:
            return
        line = json.dumps({"t": time.time(), "kind": kind, "agent": self.agent, "instance": self.instance,
                           "node": node, **fields}, separators=(",", ":"))
        with self._lock:
            self._lines.append(line)
        self.maybe_flush()

    def maybe_flush(self) -> None:
        if self.path and time.monotonic() - self._last_flush >= FLUSH_S:
            self.flush()

    def flush(self) -> None:
        if not self.path:
            return
        with self._lock:
            lines, self._lines = self._lines, []
            self._last_flush = time.monotonic()
            if lines:
                with open(self.path, "a") as f:
                    f.write("\n".join(lines) + "\n")

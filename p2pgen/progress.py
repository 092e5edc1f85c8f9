"""Committed-step reports from a training application to the harness that started it, and back a stop.

Owns the file protocol between them, both sides (the runtime's step loop writes it, `join --local --chaos`
and the `p2pgen stress` harness read it), under `$P2PGEN_PROGRESS_DIR` (set by the harness; without it
every call here is a no-op, so an application that reports progress runs unchanged elsewhere):
- the application appends one JSON line per committed step to `DIR/<peer>-<incarnation>.jsonl`:
  `{"t", "peer", "incarnation", "generation", "revision", "digest"}` (`revision` is the revision the
  step committed, `digest` the state's digest right after it); one `write()` per line, so a SIGKILL
  leaves at most one cut line, which the reader skips;
- the harness ends the run by writing a revision into `DIR/stop` (atomically); an application stops
  once its state reached it. The harness picks a revision ahead of every member, so all of them stop
  at the same revision and their final digests are comparable.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV = "P2PGEN_PROGRESS_DIR"
STOP = "stop"


class Progress:
    """The application side, owned by the Peer (one per Peer): it reports every committed step of
    `peer.steps()` and ends the loop once the state reached `stop_revision()`, so any application, an
    ordinary torch script included, is counted by `join --local --chaos` and `p2pgen stress` unchanged."""

    def __init__(self, directory: str | None, peer_id: str, incarnation: int) -> None:
        self._dir = directory
        self._fd: int | None = None
        self._who = {"peer": peer_id, "incarnation": incarnation}
        if directory:
            name = f"{peer_id.replace('/', '_')}-{incarnation}.jsonl"
            self._fd = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    @classmethod
    def from_env(cls, peer: Any) -> Progress:
        return cls(os.environ.get(ENV), peer.peer_id, peer.incarnation)

    def committed(self, step: Any) -> None:
        if self._fd is None:
            return
        state = step.peer.state
        line = json.dumps({"t": time.time(), **self._who, "generation": step.generation,
                           "revision": state.revision, "digest": state.digest()})
        os.write(self._fd, (line + "\n").encode())

    def stop_revision(self) -> float:
        """The revision the harness asked to end at; infinity until it asks (or without a harness)."""
        if self._dir is None:
            return float("inf")
        try:
            return int(Path(self._dir, STOP).read_text())
        except (FileNotFoundError, ValueError):
            return float("inf")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass(frozen=True)
class Commit:
    t: float
    peer: str
    incarnation: int
    generation: int
    revision: int
    digest: str


class CommitLog:
    """The harness side: every committed step reported under `directory`, read incrementally.

    `poll()` reads the lines appended since the last call (a line not yet ended is left for the next
    call; a line cut by SIGKILL is skipped) and returns them; `commits` holds all of them so far."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.commits: list[Commit] = []
        self._offsets: dict[Path, int] = {}

    def poll(self) -> list[Commit]:
        new: list[Commit] = []
        for path in sorted(self.directory.glob("*.jsonl")):
            with open(path, "rb") as f:
                f.seek(self._offsets.get(path, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1
            self._offsets[path] = self._offsets.get(path, 0) + end
            new += [c for c in map(_parse, data[:end].decode(errors="replace").splitlines()) if c is not None]
        new.sort(key=lambda c: c.t)
        self.commits += new
        return new


def _parse(line: str) -> Commit | None:
    try:
        c = json.loads(line)
        return Commit(float(c["t"]), str(c["peer"]), int(c["incarnation"]), int(c["generation"]),
                      int(c["revision"]), str(c["digest"]))
    except (ValueError, KeyError, TypeError):
        return None                             # a line cut by SIGKILL mid-write, then appended to


def write_stop(directory: str | Path, revision: int) -> None:
    tmp = Path(directory, STOP + ".tmp")
    tmp.write_text(str(revision))
    os.replace(tmp, Path(directory, STOP))

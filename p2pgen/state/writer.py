"""BackgroundWriter: the thread that finishes local-copy saves while the next steps compute.

Owns one daemon thread per local copy. The step that commits takes the snapshot (`LocalCopy.snapshot`)
and hands it over with `submit`; the thread hashes it and moves the pointer (`LocalCopy.finish`). The
caller collects what finished with `take` (a save's CopyInfo or the error that stopped it), in its own
thread, so nothing the writer computes touches the state from another thread.

Invariants:
- At most one save is in flight: `submit` refuses a second one while `busy` (the save policy checks it
  first, so the step never waits for the writer).
- The thread reads only the snapshot's slot, never the application's tensors, so the next step may
  write them as soon as the snapshot was taken.
- `close` lets the save in flight finish (the copy then holds the last snapshot) and joins the thread.
"""

from __future__ import annotations

import threading
import time

from p2pgen.state.localcopy import CopyInfo, LocalCopy, Snapshot


class BackgroundWriter:
    """Finishes the snapshots of one LocalCopy on a thread of its own."""

    def __init__(self, copy: LocalCopy) -> None:
        self.copy = copy
        self._lock = threading.Condition()
        self._job: Snapshot | None = None
        self._done: list[tuple[Snapshot, CopyInfo | Exception]] = []
        self._stop = False
        self.seconds = 0.0        # how long the writer worked on the last save
        self._thread = threading.Thread(target=self._run, name="p2pgen-local-copy", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        with self._lock:
            return self._job is not None

    def submit(self, snap: Snapshot) -> None:
        """Finish `snap` in the background.

        Raises RuntimeError when a save is still in flight or the writer was closed."""
        with self._lock:
            if self._job is not None or self._stop:
                raise RuntimeError("the local copy's writer is busy or closed: check `busy` before a snapshot")
            self._job = snap
            self._lock.notify_all()

    def wait(self) -> None:
        """Return once no save is in flight."""
        with self._lock:
            self._lock.wait_for(lambda: self._job is None)

    def take(self) -> list[tuple[Snapshot, CopyInfo | Exception]]:
        """The saves finished since the last call, oldest first: (snapshot, its CopyInfo or the error)."""
        with self._lock:
            done, self._done = self._done, []
            return done

    def close(self) -> None:
        """Let the save in flight finish, then stop the thread."""
        with self._lock:
            self._stop = True
            self._lock.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._job is not None or self._stop)
                snap = self._job
                if snap is None:
                    return
            started = time.monotonic()
            try:
                outcome: CopyInfo | Exception = self.copy.finish(snap)
            except Exception as e:      # any failure is the caller's to report: take() hands it over
                outcome = e
            with self._lock:
                self.seconds = time.monotonic() - started
                self._done.append((snap, outcome))
                self._job = None
                self._lock.notify_all()

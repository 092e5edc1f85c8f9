"""Progress of long command-line work (`chaos`, `bench recovery`, `stress`) on a terminal.

Owns: one status line on a stream (stderr by default) showing done / total, elapsed time and an estimate
of the time left, redrawn in place (carriage return + erase to end of line), and the printing of ordinary
lines without garbling it (`write` clears the status line, prints, redraws).
Invariant kept: nothing but the lines given to `write` ever reaches a stream that is not a terminal, or
any stream when the progress is disabled (`--json`): logs and machine-readable output stay clean.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

CLEAR = "\r\x1b[K"


def format_duration(seconds: float) -> str:
    """`42 s`, `3:07`, `1:02:03`."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}:{secs:02d}"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


class TermProgress:
    """`update(done, note)` as work completes (or `tick(done_fn)` for work measured by a function, e.g. of
    time), `write(line)` for ordinary lines, `close()` at the end. `total` is in the caller's units
    (runs, sections, seconds); the estimate assumes the remaining units take as long as the finished ones."""

    def __init__(self, total: float, label: str, stream: TextIO | None = None, enabled: bool = True,
                 clock: Callable[[], float] = time.monotonic, unit: str = "") -> None:
        if total <= 0:
            raise ValueError(f"progress total must be positive, got {total}")
        self.total, self.label, self.unit = total, label, unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and _is_terminal(self.stream)
        self.clock = clock
        self.started = clock()
        self.done: float = 0
        self.note = ""
        self._lock = threading.Lock()
        self._shown = False
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()

    def status(self) -> str:
        """The status line (without control characters)."""
        elapsed = self.clock() - self.started
        done = min(self.done, self.total)
        text = f"{self.label}: {_number(done)}/{_number(self.total)}{self.unit} · {format_duration(elapsed)} elapsed"
        if 0 < done < self.total:
            text += f" · about {format_duration(elapsed / done * (self.total - done))} left"
        return text + (f" · {self.note}" if self.note else "")

    def update(self, done: float, note: str | None = None) -> None:
        with self._lock:
            self.done = done
            if note is not None:
                self.note = note
            self._draw()

    def write(self, line: str) -> None:
        """Print an ordinary line (on the progress stream) above the status line."""
        with self._lock:
            if self._shown:
                self.stream.write(CLEAR)
            self.stream.write(line + "\n")
            self._shown = False
            self._draw()

    def tick(self, done_fn: Callable[[], float], interval: float = 0.5) -> None:
        """Redraw every `interval` seconds from `done_fn()` until `close()` (no thread when disabled)."""
        if not self.enabled:
            return

        def loop() -> None:
            while not self._stop.wait(interval):
                self.update(done_fn())
        self._ticker = threading.Thread(target=loop, name="progress", daemon=True)
        self._ticker.start()

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            if self._shown:
                self.stream.write(CLEAR)
                self.stream.flush()
                self._shown = False

    def _draw(self) -> None:
        if not self.enabled:
            self.stream.flush()
            return
        self.stream.write(CLEAR + self.status())
        self.stream.flush()
        self._shown = True


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.0f}"

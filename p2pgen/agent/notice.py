"""Spot notices: a provider's warning that this machine is about to be taken, read from a file or an HTTP endpoint.

Owns: reading what the operator named (`--notice-file PATH`, `--notice-url URL`; nothing is read or polled when
neither is given: there is no default source), the parsing of what the source says (`parse`, pure), and the
watcher thread that polls it and hands the first notice to the agent, which then drains.

What counts as a notice (`parse`): an answer naming a termination time (a JSON object with a "time" field, as one
cloud's spot `instance-action` document has; an Azure-style scheduled event of type Preempt or Terminate with
its "NotBefore"; a bare ISO-8601 time; seconds since the epoch), or a bare "TRUE" (as one cloud's
`preempted` flag reads; no time: the drain takes its own timeout). No notice: a missing file, HTTP 404, an empty
HTTP body, "FALSE". Anything else is a problem of one kind (unreachable, slow, an unexpected status, garbage),
logged once per kind, and changes nothing.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path

log = logging.getLogger("p2pgen.agent.notice")

POLL_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Notice:
    """The machine goes at `at` (wall time, seconds since the epoch), or at an unknown time soon (None)."""

    at: float | None
    text: str                       # what the source said, for the log


@dataclass(frozen=True)
class Problem:
    """The source could not be read or said something that is not a notice; `kind` groups the log lines."""

    kind: str
    text: str


def parse(status: int | None, body: str) -> Notice | Problem | None:
    """What one reading of a notice source says.

    Args:
        status: the HTTP status (None for a file that exists).
        body: what it held.
    Returns:
        a Notice, None when it says nothing is coming, or a Problem (garbage, an unexpected status).
    """
    if status is not None and status == 404:
        return None
    if status is not None and not 200 <= status < 300:
        return Problem("status", f"HTTP status {status}")
    text = body.strip()
    if not text:
        return None if status is not None else Notice(None, "(an empty notice file)")
    if text.upper() in ("TRUE", "FALSE"):
        return Notice(None, text) if text.upper() == "TRUE" else None
    at = _time_of(text)
    if at is not None:
        return Notice(at, text[:200])
    return Problem("garbage", f"not a notice: {text[:80]!r} (expected a termination time, or TRUE/FALSE)")


def _time_of(text: str) -> float | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return _timestamp(text)
    if isinstance(doc, (int, float)) and not isinstance(doc, bool):
        return float(doc)
    if isinstance(doc, str):
        return _timestamp(doc)
    if isinstance(doc, dict):
        if isinstance(doc.get("time"), str):
            return _timestamp(doc["time"])
        events = doc.get("Events")
        if isinstance(events, list):
            times = [_timestamp(e.get("NotBefore", "")) or time.time() for e in events
                     if isinstance(e, dict) and e.get("EventType") in ("Preempt", "Terminate")]
            return min(times) if times else None
    return None


def _timestamp(text: str) -> float | None:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        try:
            moment = parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def read_file(path: str) -> Notice | Problem | None:
    """One reading of a notice file: absent means no notice."""
    try:
        body = Path(path).read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        return Problem("unreadable", f"cannot read {path}: {e}")
    return parse(None, body)


def read_url(url: str, timeout: float = POLL_TIMEOUT_S) -> Notice | Problem | None:
    """One GET of a notice endpoint."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return parse(answer.status, answer.read(65536).decode("utf-8", "replace"))
    except urllib.error.HTTPError as e:
        return parse(e.code, "")
    except TimeoutError:
        return Problem("slow", f"no answer within {timeout:.0f} s")
    except (urllib.error.URLError, OSError) as e:
        if time.monotonic() - started >= timeout:
            return Problem("slow", f"no answer within {timeout:.0f} s")
        return Problem("unreachable", str(getattr(e, "reason", e)))


class NoticeWatcher:
    """Polls one source every `interval` seconds until it gives a notice, then calls `on_notice` once."""

    def __init__(self, source: str, read: Callable[[], Notice | Problem | None], interval: float,
                 on_notice: Callable[[Notice], None]) -> None:
        self.source, self._read, self.interval, self._on_notice = source, read, interval, on_notice
        self._stop = threading.Event()
        self._said: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="notice-watch", daemon=True)

    def start(self) -> None:
        log.info("watching %s for a termination notice every %.1f s", self.source, self.interval)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            reading = self._read()
            if isinstance(reading, Notice):
                self._on_notice(reading)
                return
            if isinstance(reading, Problem) and reading.kind not in self._said:
                self._said.add(reading.kind)
                log.warning("notice source %s: %s (said once; it is still polled, and this changes nothing)",
                            self.source, reading.text)
            self._stop.wait(self.interval)


def watcher(file: str | None, url: str | None, interval: float,
            on_notice: Callable[[Notice], None]) -> NoticeWatcher | None:
    """The watcher of the source the operator named (None when none is: nothing is polled by default).

    Raises:
        ValueError: both a file and a URL, an URL that is not http(s), or a non-positive interval.
    """
    if file and url:
        raise ValueError("give --notice-file or --notice-url, not both")
    if interval <= 0:
        raise ValueError(f"--notice-interval {interval}: give a positive number of seconds")
    if url:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--notice-url {url!r}: give an http:// or https:// address")
        return NoticeWatcher(url, lambda: read_url(url, min(POLL_TIMEOUT_S, max(interval, 0.5))), interval,
                             on_notice)
    if file:
        return NoticeWatcher(file, lambda: read_file(file), interval, on_notice)
    return None

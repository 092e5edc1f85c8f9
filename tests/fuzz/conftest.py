"""Shared pieces of the listener fuzz tests: ports in this suite's range, a leak check, Hypothesis
settings, and waiting on counters.

Every test here starts a real listener in-process, attacks it over loopback and then checks three
things: the refusal was counted under a reason, an honest peer is still served, and once the listener
is closed no thread or file descriptor it made is left behind.
"""

from __future__ import annotations

import errno
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

PORT_RANGE = (25000, 27000)      # this suite's ports (other suites use other ranges)
SETTLE_S = 5.0                   # how long a leak check waits for threads and fds to go away

# One listener serves every example of a test (a fixture), so the fixture health check is off on purpose.
FUZZ = settings(max_examples=40, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

T = TypeVar("T")


# integers msgpack can encode (a larger one makes the test's own packb raise OverflowError, not the code under test)
MSGPACK_INTEGERS = st.integers(min_value=-(2**63), max_value=2**64 - 1)


def bind_free_port(make: Callable[[int], T], attempts: int = 200) -> T:
    """`make(port)` on a random port of PORT_RANGE, retried while the port is taken."""
    rng = random.Random()
    for _ in range(attempts):
        try:
            return make(rng.randrange(*PORT_RANGE))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
    raise OSError(errno.EADDRINUSE, f"no free port in {PORT_RANGE} after {attempts} attempts")


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    """Poll `predicate` until it holds; AssertionError naming `what` after `timeout` seconds."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"{what} did not hold within {timeout} s")
        time.sleep(0.01)


def total(counts: dict[str, int], reasons: tuple[str, ...] | None = None) -> int:
    return sum(v for k, v in counts.items() if reasons is None or k in reasons)


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


class LeakCheck:
    """Threads and fds at the start of a test; `check()` waits for both to come back to that."""

    def __init__(self) -> None:
        self.threads = set(threading.enumerate())
        self.fds = open_fds()

    def leaked(self) -> tuple[list[str], list[str]]:
        threads = [t.name for t in threading.enumerate() if t not in self.threads and t.is_alive()]
        fds = []
        for fd in sorted(open_fds() - self.fds):
            try:
                fds.append(f"{fd} -> {os.readlink(f'/proc/self/fd/{fd}')}")
            except OSError:     # the fd of listdir itself, closed by now
                pass
        return threads, fds

    def check(self) -> None:
        end = time.monotonic() + SETTLE_S
        while any(self.leaked()) and time.monotonic() < end:
            time.sleep(0.05)
        threads, fds = self.leaked()
        assert not threads, f"threads left behind: {threads}"
        assert not fds, f"file descriptors left behind: {fds}"


@pytest.fixture
def no_leaks():
    """Request it before the listener's fixture: it checks after that fixture has closed the listener."""
    check = LeakCheck()
    yield check
    check.check()


def raw_connect(port: int, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def send_and_close(port: int, data: bytes, read_first: int = 0) -> bytes:
    """Connect, read `read_first` bytes (a greeting) if asked, send `data`, half-close, and read what
    the listener says until it hangs up. Returns what was read after sending."""
    with raw_connect(port) as s:
        if read_first:
            s.recv(read_first)
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:        # the listener may hang up before it read everything
            return b""
        out = bytearray()
        try:
            while chunk := s.recv(65536):
                out += chunk
        except OSError:
            pass
        return bytes(out)

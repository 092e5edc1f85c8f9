"""Supervision of the application process of one peer.

Owns: starting the application (one process per incarnation), learning at once from the OS when it
exits, stops or continues (a blocking `waitpid` with WUNTRACED | WCONTINUED in a thread: no polling,
no timeout), and killing it by pid. A warm standby (`p2pgen join --standby 1`) is the same kind of
process started without an incarnation: it did its imports and waits inside `p2pgen.join()` until the agent
promotes it (`promote`), from then on it is the application's incarnation, watched by the same waiter.
Invariant kept: the application, and its standby, never outlive their agent (PR_SET_PDEATHSIG): an
application that lost its agent can no longer know its generation.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> None:
    """In a child process, before exec: get `sig` when the thread that started it dies, even by SIGKILL (so the
    caller must start it from a thread that lives as long as it does); with `parent` (the starter's pid, read
    before the fork), exit at once if the starter already died between the fork and here."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """SIGTERM ends this process the way Ctrl-C does (KeyboardInterrupt), so its `finally` blocks stop what it
    started; without it SIGTERM ends Python at once and the children are left running."""
    signal.signal(signal.SIGTERM, _interrupt)


def describe_status(status: int) -> tuple[str, bool]:
    """Human description of a wait status, and whether it was a clean exit (code 0)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return f"killed by {signal.Signals(sig).name}", False
    code = os.WEXITSTATUS(status)
    return f"exited with code {code}", code == 0


class Application:
    """One running incarnation of the application, or a warm standby (`incarnation` None, `standby` its token)
    until `promote` gives it one. Events are reported through the callbacks, from the waiter thread:
    `on_stop(app)`, `on_continue(app)`, `on_exit(app, description, clean)`. `env` values of None are removed
    from the inherited environment."""

    def __init__(self, command: list[str], incarnation: int | None, env: dict[str, str | None],
                 on_stop: Callable[[Application], None], on_continue: Callable[[Application], None],
                 on_exit: Callable[[Application, str, bool], None], standby: str | None = None) -> None:
        self.incarnation = incarnation
        self.standby = standby                 # the token a standby names itself by (its RPC), else None
        self.promoted = threading.Event()      # a standby was given its incarnation (set at once for an application)
        if standby is None:
            self.promoted.set()
        self.waiting = False                   # a standby that called in: its imports and setup are done
        self.started = time.monotonic()
        self.exited = threading.Event()
        self.stopped = False
        merged = {**os.environ, **env}
        # Must be called from a thread that lives as long as the agent: PDEATHSIG follows the forking thread.
        self._proc = subprocess.Popen(command, env={k: v for k, v in merged.items() if v is not None},
                                      preexec_fn=die_with_parent)
        self.pid = self._proc.pid
        self._callbacks = (on_stop, on_continue, on_exit)
        threading.Thread(target=self._wait, name=f"waitpid-{self.pid}", daemon=True).start()

    def _wait(self) -> None:
        on_stop, on_continue, on_exit = self._callbacks
        while True:
            try:
                _, status = os.waitpid(self.pid, os.WUNTRACED | os.WCONTINUED)
            except ChildProcessError:
                status = 0
            if os.WIFSTOPPED(status):
                self.stopped = True
                on_stop(self)
            elif os.WIFCONTINUED(status):
                self.stopped = False
                on_continue(self)
            else:
                self._proc.returncode = os.waitstatus_to_exitcode(status)
                self.exited.set()
                description, clean = describe_status(status)
                on_exit(self, description, clean)
                return

    def promote(self, incarnation: int) -> None:
        """The standby becomes the application's incarnation `incarnation`: its `p2pgen.join()`, waiting on the
        agent's `standby` RPC, learns it now. `started` restarts (the attach grace counts from here)."""
        self.incarnation = incarnation
        self.started = time.monotonic()
        self.promoted.set()

    def kill(self) -> None:
        if not self.exited.is_set():
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def terminate(self, grace: float) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds; returns once the process is gone."""
        if self.exited.is_set():
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
            if self.stopped:
                os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            return
        if not self.exited.wait(grace):
            self.kill()
            self.exited.wait(5)

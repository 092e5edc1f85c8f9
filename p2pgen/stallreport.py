"""The application's side of a stalled job: it tells its agent while its collective waits with nothing arriving.

Owns one thread per `Peer` (started with it, ended by its close): every CHECK_S it samples the operation in
flight and the bytes received in the current generation (`core.stall.StallWatch`); stalled for REPORT_AFTER_S or
more, it calls the agent's `stalled` RPC, at most once per CHECK_S, and the agent's detector judges the silent
agents of that generation from its stalled floor while the reports go on (`p2pgen.detect.config`). Invariant:
it only reads the backend (never blocks or changes it), and a call that fails is logged at debug level and
dropped: a report can only make a suspicion earlier, never cause one by itself, and without it the detector
waits for its usual floor.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from p2pgen.agent.client import AgentClient
from p2pgen.core.stall import StallWatch
from p2pgen.errors import P2PGenError

log = logging.getLogger(__name__)

CHECK_S = 0.05
REPORT_AFTER_S = 0.15
Sample = tuple[int, float | None, int]          # (generation, its operation in flight since, bytes received)


class StallReporter:
    """Reports this member's stalled collectives to its agent (see the module docstring)."""

    def __init__(self, client: Callable[[], AgentClient], sample: Callable[[], Sample | None], incarnation: int,
                 closed: threading.Event) -> None:
        """Args:
            client: a new client of the local agent (the thread's own connection).
            sample: the current generation, when its operation in flight began (None: none is) and the bytes
                its links received so far; None while no generation runs.
            incarnation: this member's incarnation (the agent answers only its current application).
            closed: set when the peer closes; the thread ends at its next check.
        """
        self._client_factory, self._sample, self._incarnation, self._closed = client, sample, incarnation, closed
        self._thread = threading.Thread(target=self._run, name="p2pgen-stall", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        watch, client = StallWatch(), None
        while not self._closed.wait(CHECK_S):
            sample, now = self._sample(), time.monotonic()
            generation, since, received = sample if sample is not None else (0, None, 0)
            stalled = watch.sample(now, since, received)
            if stalled < REPORT_AFTER_S:
                continue
            try:
                client = client or self._client_factory()
                client.stalled(self._incarnation, generation, round(stalled, 3))
            except (OSError, P2PGenError, ValueError) as e:
                log.debug("stall report to the agent failed: %s", e)
                if client is not None:
                    client.close()
                client = None
        if client is not None:
            client.close()

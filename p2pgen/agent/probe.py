"""Link probes: how fast this agent's host reaches the other hosts of the job, measured briefly and reported.

Owns: `measure` (Mbit/s to one agent: the fastest of a few `probe` requests of 64 KiB-8 MiB, as large as the
link needs for a request to last MIN_ROUND_S, over the authenticated control connection, which runs between the
hosts' own addresses, the data plane's too) and `LinkProber`, the
agent's thread that, whenever a generation is active, measures every host of it this host has no rate to yet
(core.topology.unmeasured) and submits the rates as one `Links` command, so that every agent holds the same
matrix from the Raft log and the next rank maps follow it.
Invariants: a probe never holds up the driver (its own thread) and is bounded (`timeout` per host); one that fails
or times out reports nothing (the job keeps the order it has), is logged once per host, and is tried again only
after RETRY_S; an agent probes only from its own host, and never its own host (I8: only agents that proved the
job secret answer, through the control RPC).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from p2pgen.agent.rpc import RpcClient, split_addr
from p2pgen.core import Links
from p2pgen.core.generation import GenerationMachine
from p2pgen.core.topology import rates_text, unmeasured
from p2pgen.errors import P2PGenError

log = logging.getLogger(__name__)

PROBE_BYTES = 64 << 10         # a request's first payload; doubled while one takes under MIN_ROUND_S
MAX_PROBE_BYTES = 8 << 20      # ... up to this (the control RPC's frames stop at 16 MiB)
MIN_ROUND_S = 0.02             # a shorter request says more about the hosts' CPUs than about the link
ROUNDS = 5                     # the fastest of these counts: contention only ever slows a request down
TIMEOUT_S = 5.0                # per host, the whole probe
RETRY_S = 60.0                 # a host whose probe failed is left alone this long
TICK_S = 1.0


def measure(addr: str, secret: bytes | None, job: str, nbytes: int = PROBE_BYTES, rounds: int = ROUNDS,
            timeout: float = TIMEOUT_S) -> float:
    """Mbit/s from here to the agent at `addr`: the fastest of `rounds` `probe` requests (each timed from sending
    to the agent's answer), after a warm-up request that doubles the payload from `nbytes` while one takes under
    MIN_ROUND_S, up to MAX_PROBE_BYTES (so a fast link is timed over a long enough transfer too).

    Args:
        addr: the other agent's control address, HOST:PORT.
        secret: the job secret (None: the insecure default one).
        job: the job name the agent must serve.
    Raises:
        OSError, P2PGenError: it could not be reached or answered wrongly; TimeoutError past `timeout`;
        ValueError: nbytes or rounds below 1.
    """
    if nbytes < 1 or rounds < 1:
        raise ValueError(f"a probe needs nbytes >= 1 and rounds >= 1, got {nbytes} and {rounds}")
    deadline = time.monotonic() + timeout
    with RpcClient(addr, secret, timeout=timeout, expect_job=job) as client:
        size = min(nbytes, MAX_PROBE_BYTES)
        while _probe(client, bytes(size), deadline) < MIN_ROUND_S and size < MAX_PROBE_BYTES:
            size = min(2 * size, MAX_PROBE_BYTES)
        payload = bytes(size)
        best = min(_probe(client, payload, deadline) for _ in range(rounds))
    return size * 8 / best / 1e6


def _probe(client: RpcClient, payload: bytes, deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the probe took longer than its time limit")
    client.settimeout(left)
    start = time.perf_counter()
    got = client.call("probe", payload=payload)
    elapsed = time.perf_counter() - start
    if got != len(payload):
        raise P2PGenError(f"probe answered {got!r} for {len(payload)} bytes")
    return max(elapsed, 1e-9)


def serve_probe(params: dict) -> int:
    """The `probe` RPC: the payload's length (the request itself is what is timed)."""
    payload = params.get("payload")
    if not isinstance(payload, bytes):
        raise ValueError("probe: 'payload' must be bytes")
    return len(payload)


class LinkProber:
    """The agent's probing thread (see the module docstring). `machine()` is the latest replicated state (None
    before the agent joined); `submit(command)` records a command through Raft (raising a P2PGenError such as
    RaftUnavailable when it cannot: the rates are kept and submitted at the next round)."""

    def __init__(self, addr: str, secret: bytes | None, job: str, machine: Callable[[], GenerationMachine | None],
                 submit: Callable[[Links], object], nbytes: int = PROBE_BYTES,
                 measure_fn: Callable[..., float] = measure) -> None:
        self.host = split_addr(addr)[0]
        self.secret, self.job, self.nbytes = secret, job, nbytes
        self._machine, self._submit, self._measure = machine, submit, measure_fn
        self._failed: dict[str, float] = {}       # host -> monotonic time it may be probed again
        self._said: set[str] = set()              # hosts whose failure was logged
        self._unsent: dict[str, float] = {}       # measured, not yet recorded through Raft
        self._stop = threading.Event()
        self._poked = threading.Event()
        self._thread = threading.Thread(target=self._run, name="link-prober", daemon=True)

    def start(self) -> None:
        if self.nbytes > 0:
            self._thread.start()

    def poke(self) -> None:
        """A new view: look for hosts to measure now."""
        self._poked.set()

    def stop(self) -> None:
        self._stop.set()
        self._poked.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=TIMEOUT_S + 1)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._poked.wait(TICK_S)
            self._poked.clear()
            try:
                self.round()
            except P2PGenError as e:           # RaftUnavailable: no quorum answered; the rates are kept
                log.info("link rates not recorded yet (%s); retrying", e)

    def round(self) -> None:
        """Measure the hosts of the active generation not measured from this host yet, then submit the rates."""
        machine = self._machine()
        if machine is None or machine.active is None:
            return
        now = time.monotonic()
        for host, agent in unmeasured(machine.active.members, machine.links, self.host):
            if self._stop.is_set():
                return
            if host in self._unsent or self._failed.get(host, 0.0) > now:
                continue
            try:
                self._unsent[host] = self._measure(agent, self.secret, self.job, self.nbytes)
            except (OSError, P2PGenError, ValueError) as e:
                self._failed[host] = time.monotonic() + RETRY_S
                (log.debug if host in self._said else log.warning)(
                    "link probe from %s to %s (agent %s) failed: %s; the rank order stays as it is, and the probe "
                    "is tried again in %.0f s", self.host, host, agent, e, RETRY_S)
                self._said.add(host)
        if self._unsent:
            outcome = self._submit(Links(self.host, rates_text(self._unsent), at=time.time()))
            log.info("link rates from %s: %s (%s)", self.host, rates_text(self._unsent),
                     getattr(outcome, "reason", outcome))
            self._unsent.clear()

"""Link probes: how fast this agent's host reaches the other hosts of the job, measured briefly and reported.

Owns: `measure` (Mbit/s to one agent: the fastest of a few `probe` requests of 64 KiB-8 MiB, as large as the
link needs for a request to last MIN_ROUND_S, over the authenticated control connection, which runs between
the hosts' own addresses, the data plane's too) and `LinkProber`, the
agent's thread that, whenever a generation is active, measures every host of it this host has no rate to yet
(core.topology.unmeasured) and submits the rates as one `Links` command, so that every agent holds the same
matrix from the Raft log and the next rank maps follow it.

A measurement errs two ways, and each is bounded: contention (the job's own traffic, or the other agents
probing the same host when a generation forms) only slows a request down, so the fastest round counts and
the rounds and hosts are spread by random pauses; a request short against the link's buffers (a shaper's
token bucket, a NIC's queue) goes faster than the link, so a payload is doubled until even the fastest
request lasts MIN_ROUND_S / 2. The matrix keeps each direction; `core.topology.rate` takes the faster of a
pair's two (measured by two agents at different moments), so one contended probe does not make a link slow.
A rate off by either error can split a job of equal links into "slow" groups and cost it a generation.
Invariants: a probe never holds up the driver (its own thread) and is bounded (`timeout` per host); one that fails
or times out reports nothing (the job keeps the order it has), is logged once per host, and is tried again only
after RETRY_S; an agent probes only from its own host, and never its own host (I8: only agents that proved the
job secret answer, through the control RPC).
"""

from __future__ import annotations

import logging
import random
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
ROUNDS = 3                     # the fastest of these counts: contention only ever slows a request down
TIMEOUT_S = 5.0                # per host, the whole probe
RETRY_S = 60.0                 # a host whose probe failed is left alone this long
TICK_S = 1.0
ROUND_PAUSE_S = 0.03           # up to this (random) between two rounds to one host
SPREAD_S = 0.5                 # up to this (random) before each host's probe: agents that start together
                               # do not all probe one host at the same moment


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
        return fastest_rate(lambda size: _probe(client, bytes(size), deadline), nbytes, rounds,
                            lambda: time.sleep(min(random.uniform(0, ROUND_PAUSE_S),
                                                   max(0.0, deadline - time.monotonic()))))


def fastest_rate(request: Callable[[int], float], nbytes: int, rounds: int,
                 pause: Callable[[], None] = lambda: None) -> float:
    """Mbit/s from the fastest of `rounds` timed requests, at a payload doubled from `nbytes` (up to
    MAX_PROBE_BYTES) until one request lasts MIN_ROUND_S in the warm-up, and doubled again while the fastest
    round lasts under MIN_ROUND_S / 2 (a contended warm-up stops the doubling early, and a short request
    lets a buffer's burst inflate the rate).

    Args:
        request: times one request of that many bytes (seconds, > 0); raises to abandon the probe.
        nbytes: the first payload.
        rounds: timed requests per payload size; the fastest counts.
        pause: called before each timed round (a random pause spreads them over the link's contention, and
            lets a shaper's bucket refill).
    """
    size = min(nbytes, MAX_PROBE_BYTES)
    while request(size) < MIN_ROUND_S and size < MAX_PROBE_BYTES:
        size = min(2 * size, MAX_PROBE_BYTES)
    while True:
        best = float("inf")
        for _ in range(rounds):
            pause()
            best = min(best, request(size))
        if best >= MIN_ROUND_S / 2 or size >= MAX_PROBE_BYTES:
            return size * 8 / best / 1e6
        size = min(2 * size, MAX_PROBE_BYTES)


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
                 measure_fn: Callable[..., float] = measure, spread_s: float = SPREAD_S) -> None:
        self.host = split_addr(addr)[0]
        self.secret, self.job, self.nbytes, self.spread_s = secret, job, nbytes, spread_s
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
            if self._stop.wait(random.uniform(0, self.spread_s)):
                return
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

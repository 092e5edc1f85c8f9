"""Link probes (p2pgen.agent.probe): `measure` against a real RPC listener (and a refusing one); the prober
measures each other host of the active generation once, from its own host only, submits one Links command, keeps
the rates when Raft is unavailable, and logs a failed probe once, reporting nothing for it."""

from __future__ import annotations

import logging

import pytest

from p2pgen.agent.probe import MAX_PROBE_BYTES, MIN_ROUND_S, LinkProber, fastest_rate, measure, serve_probe
from p2pgen.agent.rpc import RpcServer
from p2pgen.core import GenerationMachine, Links, Ready, Register
from p2pgen.errors import AuthenticationError, P2PGenError
from tests.fuzz.conftest import bind_free_port

pytestmark = pytest.mark.timeout(30)

JOB, SECRET = "probe-job", b"probe-secret-0123456789abcdef"


def test_measure_times_probe_requests_and_needs_the_job_secret():
    server = bind_free_port(lambda port: RpcServer("127.0.0.1", port, JOB, SECRET, {"probe": serve_probe}))
    server.start()
    try:
        addr = f"127.0.0.1:{server.port}"
        assert measure(addr, SECRET, JOB, nbytes=256 << 10, rounds=2) > 0
        with pytest.raises(AuthenticationError):
            measure(addr, b"not-the-secret-0123456789abcdef", JOB, nbytes=1024)
        with pytest.raises(ValueError, match="nbytes >= 1"):
            measure(addr, SECRET, JOB, nbytes=0)
    finally:
        server.stop()
    with pytest.raises(ValueError, match="must be bytes"):
        serve_probe({"payload": "text"})


def active_machine() -> GenerationMachine:
    m = GenerationMachine(JOB)
    hosts = {"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3", "d": "10.0.0.1"}   # d shares a's host
    for peer, host in hosts.items():
        assert m.apply(Register(peer, 1, (("agent", f"{host}:7000"), ("data", f"{host}:7002")))).ok
    for peer in hosts:
        assert m.apply(Ready(m.pending.generation, peer, 1, "proved", 0, "")).ok
    assert m.active is not None
    return m


class Raft:
    """A fake Raft: applies submitted commands to the machine, or raises while `down`."""

    def __init__(self, machine: GenerationMachine) -> None:
        self.machine, self.down, self.submitted = machine, False, []

    def submit(self, command: Links):
        if self.down:
            raise P2PGenError("no Raft quorum")
        self.submitted.append(command)
        return self.machine.apply(command)


def test_the_prober_measures_every_other_host_once_and_submits_one_report(caplog):
    raft = Raft(active_machine())
    calls = []

    def fake_measure(addr, secret, job, nbytes):
        calls.append(addr)
        if addr.startswith("10.0.0.3"):
            raise OSError("connection refused")
        return 9400.0

    prober = LinkProber("10.0.0.1:7000", SECRET, JOB, lambda: raft.machine, raft.submit, measure_fn=fake_measure,
                        spread_s=0.0)
    raft.down = True
    with caplog.at_level(logging.INFO, logger="p2pgen.agent.probe"):
        with pytest.raises(P2PGenError):
            prober.round()
        raft.down = False
        prober.round()                     # the kept rate is submitted; the failed host waits for RETRY_S
        prober.round()
    assert calls == ["10.0.0.2:7000", "10.0.0.3:7000"]
    assert raft.submitted == [Links("10.0.0.1", "10.0.0.2=9400", at=raft.submitted[0].at)]
    assert raft.machine.links == {("10.0.0.1", "10.0.0.2"): 9400.0}
    failures = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failures) == 1 and "the rank order stays as it is" in failures[0].getMessage()


def test_no_probe_without_an_active_generation_or_when_disabled():
    machine = GenerationMachine(JOB)
    prober = LinkProber("10.0.0.1:7000", SECRET, JOB, lambda: machine, lambda c: pytest.fail("submitted"),
                        measure_fn=lambda *a: pytest.fail("measured"))
    prober.round()
    off = LinkProber("10.0.0.1:7000", SECRET, JOB, lambda: machine, lambda c: None, nbytes=0)
    off.start()
    assert not off._thread.is_alive()


class Shaped:
    """A link of `mbit` Mbit/s behind a token bucket of 1 ms of its traffic (refilled between requests) and
    `rtt_s` of latency; the first `contended` requests get a third of the link (two other probes share it)."""

    def __init__(self, mbit: float, rtt_s: float = 2e-4, contended: int = 0) -> None:
        self.bps, self.rtt_s, self.contended, self.sizes = mbit * 1e6 / 8, rtt_s, contended, []
        self.burst = int(self.bps * 1e-3)

    def __call__(self, size: int) -> float:
        self.sizes.append(size)
        share = 3 if len(self.sizes) <= self.contended else 1
        return self.rtt_s + max(0, size - self.burst) * share / self.bps


@pytest.mark.parametrize("mbit", [100.0, 1000.0, 10000.0])
@pytest.mark.parametrize("contended", [0, 1, 3])
def test_a_rate_is_within_ten_percent_of_the_link_behind_a_burst_and_contention(mbit, contended):
    link = Shaped(mbit, contended=contended)
    measured = fastest_rate(link, 64 << 10, rounds=5)
    if max(link.sizes) < MAX_PROBE_BYTES:
        assert 0.9 * mbit <= measured <= 1.1 * mbit, (measured, link.sizes)
    else:                                             # a link too fast for the largest payload: never slower
        assert measured >= 0.9 * mbit


def test_a_contended_warm_up_that_stops_early_is_resumed_by_the_rounds():
    link = Shaped(1000.0, contended=3)                # 64 KiB, 128 KiB, 256 KiB contended: the warm-up stops
    fastest_rate(link, 64 << 10, rounds=5)
    warm_up_stop = link.sizes.index(max(link.sizes[:4]))
    assert link.sizes[warm_up_stop] < max(link.sizes)
    assert Shaped(1000.0)(max(link.sizes)) >= MIN_ROUND_S / 2     # the fastest round lasted half MIN_ROUND_S


def test_every_timed_request_after_the_warm_up_is_paused_before():
    pauses, link = [], Shaped(100.0)
    fastest_rate(link, 1 << 20, rounds=4, pause=lambda: pauses.append(len(link.sizes)))
    assert pauses == list(range(1, 5))                # one warm-up request (1 MiB lasts 73 ms), then 4 rounds

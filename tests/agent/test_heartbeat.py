"""The heartbeat runner with real UDP sockets on 127.0.0.1: suspicion survives this agent's own stall; beyond the
fanout an agent judges only the agents it watches."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import pytest

from p2pgen import faults
from p2pgen.agent.heartbeat import Announcement, HeartbeatRunner, _Bell
from p2pgen.core.heartbeats import WATCH_FANOUT, watched
from p2pgen.detect import DetectorConfig

KEY = b"k" * 32
CONFIG = DetectorConfig(kind="fixed", timeout=0.5, floor=0.2, heartbeat_interval=0.05, window=10)


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.02)


def runner(addr: str, targets, on_suspect) -> HeartbeatRunner:
    host, _, port = addr.rpartition(":")
    return HeartbeatRunner(host, int(port), KEY, "job", addr, CONFIG, targets, on_suspect,
                           announce=lambda: Announcement("i-" + addr, "", False))


@contextmanager
def running(*runners: HeartbeatRunner):
    """Start the runners; stop every one of them, whatever the test does."""
    for r in runners:
        r.start()
    try:
        yield
    finally:
        for r in runners:
            r.stop()


@pytest.mark.timeout(30)
def test_a_peer_suspected_before_our_own_stall_stays_suspected_after_it():
    a_addr, b_addr = (f"127.0.0.1:{free_udp_port()}" for _ in range(2))
    stall = threading.Event()
    stalled = threading.Event()
    suspected: list[str] = []

    def targets_of_a() -> set[str]:
        if stall.is_set() and not stalled.is_set():
            time.sleep(1.0)                          # this agent's thread starved for 5 floors
            stalled.set()
        return {b_addr}

    a = runner(a_addr, targets_of_a, lambda peer, instance, why: suspected.append(peer))
    b = runner(b_addr, lambda: {a_addr}, lambda *args: None)
    with running(a, b):
        wait_for(lambda: b_addr in a.heard())
        b.stop()
        wait_for(lambda: b_addr in a.suspected())
        assert suspected == [b_addr] and b_addr not in a.heard()
        stall.set()
        wait_for(stalled.is_set)
        time.sleep(3 * CONFIG.heartbeat_interval)    # a few rounds after the stall, well within the timeout
        assert b_addr in a.suspected() and b_addr not in a.heard()
        assert suspected == [b_addr]                 # reported once, not forgiven and reported again


@pytest.mark.timeout(60)
def test_an_agent_that_keeps_stalling_still_convicts_a_dead_peer():
    """Every other round of A stalls for longer than the floor; B's silence between the stalls adds up."""
    a_addr, b_addr = (f"127.0.0.1:{free_udp_port()}" for _ in range(2))
    stalling = threading.Event()
    rounds = [0]
    suspected: list[str] = []

    def targets_of_a() -> set[str]:
        rounds[0] += 1
        if stalling.is_set() and rounds[0] % 2:
            time.sleep(0.3)                              # longer than the floor, shorter than the timeout
        return {b_addr}

    a = runner(a_addr, targets_of_a, lambda peer, instance, why: suspected.append(peer))
    b = runner(b_addr, lambda: {a_addr}, lambda *args: None)
    with running(a, b):
        wait_for(lambda: b_addr in a.heard())
        stalling.set()
        time.sleep(2.0)                                  # stalls while B is alive: B is never blamed for them
        assert suspected == []
        b.stop()
        wait_for(lambda: suspected == [b_addr], timeout=40)


@pytest.mark.timeout(30)
def test_a_target_never_heard_is_suspected_only_by_an_agent_that_hears_others():
    """C died before its first heartbeat arrived (SIGKILLed right after its member registered): A, which
    hears B, suspects it as a never-heard agent; D, which hears no one, blames no one for a silence it cannot
    tell from its own deafness."""
    a_addr, b_addr, c_addr, d_addr = (f"127.0.0.1:{free_udp_port()}" for _ in range(4))
    by_a: list[tuple[str, str, str]] = []
    by_d: list[str] = []
    a = runner(a_addr, lambda: {b_addr, c_addr}, lambda peer, instance, why: by_a.append((peer, instance, why)))
    b = runner(b_addr, lambda: {a_addr}, lambda *args: None)
    d = runner(d_addr, lambda: {c_addr}, lambda peer, instance, why: by_d.append(peer))
    with running(a, b, d):
        wait_for(lambda: c_addr in a.suspected())
        [(peer, instance, why)] = by_a
        assert (peer, instance) == (c_addr, "") and why.startswith("never heard from")
        assert b_addr in a.heard() and b_addr not in a.suspected()
        time.sleep(3 * CONFIG.timeout)
        assert by_d == [] and d.suspected() == set()


@pytest.mark.timeout(30)
def test_a_peer_that_speaks_but_cannot_hear_us_is_reported_though_we_hear_it(tmp_path):
    """What A sends to M is lost (one way): M suspects A and says so in its heartbeats; A, which hears M, reports
    M as deaf to it once M has said so for the floor, and stops counting it as heard. The link heals: M hears A
    again, says so, and A counts M as heard again."""
    a_port = m_port = free_udp_port()
    while abs(a_port - m_port) < faults.AGENT_PORT_SPAN:     # the rules tell agents apart by port block
        m_port = free_udp_port()
    a_addr, m_addr = f"127.0.0.1:{a_port}", f"127.0.0.1:{m_port}"
    rules = tmp_path / "faults.json"
    faults.heal(rules)
    faults.watch(str(rules))
    by_a: list[tuple[str, str]] = []
    a = runner(a_addr, lambda: {m_addr}, lambda peer, instance, why: by_a.append((peer, why)))
    m = runner(m_addr, lambda: {a_addr}, lambda *args: None)
    try:
        with running(a, m):
            wait_for(lambda: m_addr in a.heard() and a_addr in m.heard())
            faults.write_partition(rules, [[a_addr], [m_addr]], one_way=True)
            wait_for(lambda: by_a)
            [(peer, why)] = by_a
            assert peer == m_addr and "cannot listen" in why
            assert a_addr in m.suspected() and m_addr not in a.heard() and m_addr not in a.suspected()
            faults.heal(rules)
            wait_for(lambda: m_addr in a.heard())
            assert a_addr not in m.suspected() and len(by_a) == 1
    finally:
        faults.watch(None)


@pytest.mark.timeout(30)
def test_an_agent_whose_sends_are_dropped_loses_its_lease_within_the_stalled_floor_though_it_hears_all(tmp_path):
    """What A sends is lost (one way) while A hears B and C: only round trips renew the lease, so the job is no
    longer proven to hear A once the lease (the stalled floor, at most the floor) runs out; it hears them all
    along. The link heals: their echoes come back and A is heard again."""
    a, b, c = addrs = spread_ports(3)
    rules = tmp_path / "faults.json"
    faults.heal(rules)
    faults.watch(str(rules))
    changes: list[bool] = []
    host, _, port = a.rpartition(":")
    runner_a = HeartbeatRunner(host, int(port), KEY, "job", a, CONFIG, lambda: {b, c}, lambda *args: None,
                               announce=lambda: Announcement("i-" + a, "", False),
                               on_heard=changes.append)
    others = [runner(x, lambda x=x: set(addrs) - {x}, lambda *args: None) for x in (b, c)]
    try:
        with running(runner_a, *others):
            wait_for(lambda: {b, c} <= set(runner_a.heard()) and runner_a.heard_by_job())
            faults.write_partition(rules, [[a], [b, c]], one_way=True)
            wait_for(lambda: not runner_a.heard_by_job())
            assert {b, c} <= set(runner_a.heard())                   # it hears everyone all along
            faults.heal(rules)
            wait_for(runner_a.heard_by_job)
            assert changes == [False, True]
    finally:
        faults.watch(None)


@pytest.mark.timeout(30)
def test_our_own_stall_does_not_cost_the_lease():
    """A's thread starves for longer than the lease (and the floor): no echo could reach it meanwhile, which is
    not the job's doing, so the lease is judged from the end of the stall and never lost."""
    a_addr, b_addr = spread_ports(2)
    stall, stalled = threading.Event(), threading.Event()
    changes: list[bool] = []

    def targets_of_a() -> set[str]:
        if stall.is_set() and not stalled.is_set():
            time.sleep(0.5)
            stalled.set()
        return {b_addr}

    host, _, port = a_addr.rpartition(":")
    a = HeartbeatRunner(host, int(port), KEY, "job", a_addr, CONFIG, targets_of_a, lambda *args: None,
                        announce=lambda: Announcement("i-" + a_addr, "", False), on_heard=changes.append)
    b = runner(b_addr, lambda: {a_addr}, lambda *args: None)
    with running(a, b):
        wait_for(lambda: b_addr in a.heard() and a.heard_by_job())
        stall.set()
        wait_for(stalled.is_set)
        time.sleep(10 * CONFIG.heartbeat_interval)
        assert changes == [] and a.heard_by_job()


REFUSAL_CONFIG = DetectorConfig(kind="fixed", timeout=60.0, floor=0.2, heartbeat_interval=0.05, window=10)


@pytest.mark.timeout(30)
def test_a_dead_agent_whose_host_refuses_its_port_is_reported_without_waiting_for_the_timeout():
    """B's process is gone but its host lives: the host refuses the probes (ICMP port unreachable), which is
    proof, so A reports B long before its 60 s timeout; C, stopped (its port still held), is not reported."""
    a_addr, b_addr, c_addr = (f"127.0.0.1:{free_udp_port()}" for _ in range(3))
    suspected: list[tuple[str, str]] = []
    a = runner(a_addr, lambda: {b_addr, c_addr}, lambda peer, instance, why: suspected.append((peer, why)))
    a.config = REFUSAL_CONFIG
    b = runner(b_addr, lambda: {a_addr}, lambda *args: None)
    c_host, _, c_port = c_addr.rpartition(":")
    stopped = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)       # C: holds its port, says nothing
    stopped.bind((c_host, int(c_port)))
    try:
        with running(a, b):
            wait_for(lambda: b_addr in a.heard())
            b.stop()
            wait_for(lambda: b_addr in a.suspected())
            assert [peer for peer, _ in suspected] == [b_addr] and "refused our heartbeat" in suspected[0][1]
            time.sleep(20 * REFUSAL_CONFIG.heartbeat_interval)      # C is probed all along, never refused
            assert c_addr not in a.suspected() and len(suspected) == 1
    finally:
        stopped.close()


HINT_CONFIG = DetectorConfig(kind="fixed", timeout=60.0, floor=1.0, heartbeat_interval=0.5, window=10)


@pytest.mark.timeout(30)
def test_a_hint_probes_a_dead_agent_at_once_and_its_refusal_reports_it():
    """B's process dies and A is told (its Raft link closed): A probes B then, not after two silent rounds, and
    the refusal reports B as proven, naming the hint."""
    a_addr, b_addr = (f"127.0.0.1:{free_udp_port()}" for _ in range(2))
    suspected: list[tuple[str, str]] = []
    a = runner(a_addr, lambda: {b_addr}, lambda peer, instance, why: suspected.append((peer, why)))
    a.config = HINT_CONFIG
    b = runner(b_addr, lambda: {a_addr}, lambda *args: None)
    b.config = HINT_CONFIG
    with running(a, b):
        wait_for(lambda: b_addr in a.heard())
        b.stop()
        a.hint(b_addr, "its Raft link to this agent closed")
        wait_for(lambda: b_addr in a.suspected())
    assert [peer for peer, _ in suspected] == [b_addr]
    assert "refused our heartbeat" in suspected[0][1] and "probed at once: its Raft link" in suspected[0][1]


@pytest.mark.timeout(30)
def test_a_hint_about_a_target_added_since_the_last_round_is_judged_without_a_fault():
    """D becomes a target between two rounds and is hinted at once (a replaced agent's Raft link closes): the
    hint turn tracks it before judging, so D's refusal reports it (never heard, while A hears B) and A's
    heartbeat thread keeps running."""
    a_addr, b_addr, d_addr = (f"127.0.0.1:{free_udp_port()}" for _ in range(3))
    targets = {b_addr}
    suspected: list[tuple[str, str]] = []
    a = runner(a_addr, lambda: set(targets), lambda peer, instance, why: suspected.append((peer, why)))
    a.config = HINT_CONFIG
    b = runner(b_addr, lambda: {a_addr}, lambda *args: None)
    b.config = HINT_CONFIG
    with running(a, b):
        wait_for(lambda: b_addr in a.heard())
        targets.add(d_addr)
        a.hint(d_addr, "its Raft link to this agent closed")
        wait_for(lambda: d_addr in a.suspected())
        assert a._thread.is_alive()
        time.sleep(2 * HINT_CONFIG.heartbeat_interval)
        assert b_addr in a.heard() and b_addr not in a.suspected()
    assert [peer for peer, _ in suspected] == [d_addr]
    assert "never heard from" in suspected[0][1] and "probed at once" in suspected[0][1]


STALL_CONFIG = DetectorConfig(kind="phi", timeout=5.0, floor=1.5, stalled_floor=0.3, heartbeat_interval=0.1)


def hold_port(addr: str) -> socket.socket:
    """A socket on `addr` that never answers: a stopped agent's port (no refusal comes back)."""
    host, _, port = addr.rpartition(":")
    held = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    held.bind((host, int(port)))
    return held


@pytest.mark.timeout(30)
def test_a_stall_report_judges_the_silent_agent_it_names_from_the_stalled_floor_only():
    """B and D are heard, then both fall silent with their ports held (stopped). The application reports a
    stall naming B: B is suspected from the 0.3 s stalled floor, saying so, while D, as silent, waits for the
    1.5 s floor."""
    a_addr, b_addr, d_addr = (f"127.0.0.1:{free_udp_port()}" for _ in range(3))
    suspected: dict[str, str] = {}
    a = runner(a_addr, lambda: {b_addr, d_addr}, lambda peer, instance, why: suspected.setdefault(peer, why))
    a.config = STALL_CONFIG
    b, d = (runner(addr, lambda: {a_addr}, lambda *args: None) for addr in (b_addr, d_addr))
    held: list[socket.socket] = []
    try:
        with running(a):
            with running(b, d):
                wait_for(lambda: {b_addr, d_addr} <= set(a.heard()))
                time.sleep(1.0)                                  # a history of regular intervals
            held += [hold_port(b_addr), hold_port(d_addr)]
            a.stalled([b_addr], lease=5.0)
            wait_for(lambda: b_addr in a.suspected(), timeout=5.0)
            assert d_addr not in a.suspected()
            wait_for(lambda: d_addr in a.suspected(), timeout=5.0)
    finally:
        for sock in held:
            sock.close()
    assert suspected[b_addr].endswith("(the job waits for it)")
    assert "phi" in suspected[d_addr] and "collective" not in suspected[d_addr]


SLOW_ROUNDS = DetectorConfig(kind="phi", timeout=60.0, floor=30.0, stalled_floor=0.3, heartbeat_interval=10.0)


@pytest.mark.timeout(60)
def test_a_stalled_silence_is_judged_when_its_floor_runs_out_not_at_the_next_round():
    """A's rounds are 10 s apart; B beats every 0.1 s, then stops (its port held). A stall report naming B makes A
    plan its wake-up for B's verdict: B is suspected 0.3 s after its last heartbeat, long before A's next round
    would have judged it (with the wake-up removed, this waits for that round)."""
    a_addr, b_addr = (f"127.0.0.1:{free_udp_port()}" for _ in range(2))
    suspected = threading.Event()
    reasons: list[str] = []
    a = runner(a_addr, lambda: {b_addr}, lambda peer, instance, why: (reasons.append(why), suspected.set()))
    a.config = SLOW_ROUNDS
    b = runner(b_addr, lambda: {a_addr}, lambda *args: None)
    b.config = STALL_CONFIG
    held: list[socket.socket] = []
    try:
        with running(a):
            with running(b):
                time.sleep(1.0)                                  # a history of regular intervals
            held.append(hold_port(b_addr))
            a.stalled([b_addr], lease=30.0)                      # wakes A, which takes B's arrivals since its round
            assert suspected.wait(timeout=5.0), "B was not judged before A's next round"
    finally:
        for sock in held:
            sock.close()
    assert reasons == [reasons[0]] and reasons[0].endswith("(the job waits for it)")


@pytest.mark.timeout(60)
def test_an_agent_the_pending_generation_waits_for_is_judged_from_the_stalled_floor_and_no_other_is():
    """No collective runs while a generation is pending, so nothing reports a stall: the agents whose members it
    waits for are judged from the stalled floor without one. B and D both stop (ports held); the pending
    generation waits for B only: B is suspected long before A's next round (10 s), D, as silent, is left to
    A's 30 s floor."""
    a_addr, b_addr, d_addr = (f"127.0.0.1:{free_udp_port()}" for _ in range(3))
    suspected: dict[str, str] = {}
    b_judged = threading.Event()
    a = runner(a_addr, lambda: {b_addr, d_addr},
               lambda peer, instance, why: (suspected.setdefault(peer, why), b_judged.set()))
    a.config = SLOW_ROUNDS
    b, d = (runner(addr, lambda: {a_addr}, lambda *args: None) for addr in (b_addr, d_addr))
    b.config = d.config = STALL_CONFIG
    held: list[socket.socket] = []
    try:
        with running(a):
            with running(b, d):
                time.sleep(1.0)                                  # a history of regular intervals
            held += [hold_port(b_addr), hold_port(d_addr)]
            a.awaited({b_addr, a_addr})                          # its own address is ignored
            assert b_judged.wait(timeout=5.0), "B was not judged before A's next round"
            a.awaited(set())
            time.sleep(1.0)
    finally:
        for sock in held:
            sock.close()
    assert set(suspected) == {b_addr} and suspected[b_addr].endswith("(the job waits for it)")


@pytest.mark.timeout(30)
def test_a_hint_about_a_live_or_stopped_agent_reports_nothing():
    """A hint is not a suspicion: B, alive, is heard again (and counts no replay); C, stopped (its port held),
    refuses nothing. Neither is reported while their hints are open or after."""
    a_addr, b_addr, c_addr = (f"127.0.0.1:{free_udp_port()}" for _ in range(3))
    suspected: list[str] = []
    a = runner(a_addr, lambda: {b_addr, c_addr}, lambda peer, instance, why: suspected.append(peer))
    a.config = HINT_CONFIG
    b = runner(b_addr, lambda: {a_addr}, lambda *args: None)
    b.config = HINT_CONFIG
    c_host, _, c_port = c_addr.rpartition(":")
    stopped = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stopped.bind((c_host, int(c_port)))
    try:
        with running(a, b):
            wait_for(lambda: b_addr in a.heard())
            a.hint(b_addr, "a test")
            a.hint(c_addr, "a test")
            time.sleep(4 * HINT_CONFIG.heartbeat_interval)           # both hints opened and closed
            assert suspected == [] and a.suspected() == set()
            assert b.refusals()["replayed"] == 0 and a_addr in b.heard()
    finally:
        stopped.close()


@pytest.mark.timeout(30)
def test_a_refusal_for_a_process_replaced_at_the_same_address_does_not_report_the_new_one():
    """B dies; before A judges the refusal, a new process at B's address is heard: nothing is reported."""
    a_addr, b_addr = (f"127.0.0.1:{free_udp_port()}" for _ in range(2))
    suspected: list[str] = []
    a = runner(a_addr, lambda: {b_addr}, lambda peer, instance, why: suspected.append(peer))
    a.config = REFUSAL_CONFIG
    with running(a):
        b = runner(b_addr, lambda: {a_addr}, lambda *args: None)
        with running(b):
            wait_for(lambda: b_addr in a.heard())
        b2 = runner(b_addr, lambda: {a_addr}, lambda *args: None)    # the same address, at once
        with running(b2):
            time.sleep(20 * REFUSAL_CONFIG.heartbeat_interval)
            assert b_addr not in a.suspected() and suspected == []


@pytest.mark.timeout(30)
def test_a_silent_peer_that_is_alive_gets_one_heartbeat_a_round_and_is_not_reported(tmp_path):
    """What M sends to A is lost (one way), so A probes M: M gets A's heartbeats on the probe socket instead
    of the shared one, not both (a second copy of the same heartbeat counts as a replay at M), and M's port,
    held, refuses nothing, so A reports nothing before its 60 s timeout."""
    a_port = m_port = free_udp_port()
    while abs(a_port - m_port) < faults.AGENT_PORT_SPAN:
        m_port = free_udp_port()
    a_addr, m_addr = f"127.0.0.1:{a_port}", f"127.0.0.1:{m_port}"
    rules = tmp_path / "faults.json"
    faults.heal(rules)
    faults.watch(str(rules))
    by_a: list[str] = []
    a = runner(a_addr, lambda: {m_addr}, lambda peer, instance, why: by_a.append(peer))
    a.config = REFUSAL_CONFIG
    m = runner(m_addr, lambda: {a_addr}, lambda *args: None)
    try:
        with running(a, m):
            wait_for(lambda: m_addr in a.heard() and a_addr in m.heard())
            faults.write_partition(rules, [[m_addr], [a_addr]], one_way=True)
            time.sleep(40 * REFUSAL_CONFIG.heartbeat_interval)     # A has long been probing M
            assert a_addr in m.heard() and m.refusals()["replayed"] == 0
            assert by_a == [] and m_addr not in a.suspected()
    finally:
        faults.watch(None)


def spread_ports(n: int) -> list[str]:
    """n agent addresses in different port blocks (the fault rules tell agents apart by port block)."""
    ports: list[int] = []
    while len(ports) < n:
        p = free_udp_port()
        if all(abs(p - q) >= faults.AGENT_PORT_SPAN for q in ports):
            ports.append(p)
    return [f"127.0.0.1:{p}" for p in ports]


@pytest.mark.timeout(30)
def test_an_agent_that_suddenly_hears_none_of_its_peers_blames_none_of_them(tmp_path):
    """What B and C send to A is lost; A still speaks. A hears neither and, with two peers silent at once,
    blames its own deafness, not them: it reports no one (before, it had both evicted). Its heartbeats still
    say it cannot hear them, so B and C, which hear A, report A once it said so for the floor."""
    a_addr, b_addr, c_addr = spread_ports(3)
    rules = tmp_path / "faults.json"
    faults.heal(rules)
    faults.watch(str(rules))
    by_a: list[str] = []
    by_b: list[tuple[str, str]] = []
    a = runner(a_addr, lambda: {b_addr, c_addr}, lambda peer, instance, why: by_a.append(peer))
    b = runner(b_addr, lambda: {a_addr, c_addr}, lambda peer, instance, why: by_b.append((peer, why)))
    c = runner(c_addr, lambda: {a_addr, b_addr}, lambda *args: None)
    try:
        with running(a, b, c):
            wait_for(lambda: {b_addr, c_addr} <= set(a.heard()) and a_addr in b.heard())
            faults.write_partition(rules, [[b_addr, c_addr], [a_addr]], one_way=True)
            wait_for(lambda: by_b)
            [(peer, why)] = by_b
            assert peer == a_addr and "cannot listen" in why
            time.sleep(2 * CONFIG.timeout)                    # well past the timeout of B's and C's silence
            assert by_a == [] and a.suspected() == set()
    finally:
        faults.watch(None)


@pytest.mark.timeout(30)
def test_a_reset_forgets_suspicions_and_a_peer_still_silent_is_reported_again():
    """After a (re)join the agent judges afresh: a suspicion from before is dropped (its report may not have
    been acted on), and a peer that is really gone is reported again once silent for the timeout."""
    a_addr, b_addr = (f"127.0.0.1:{free_udp_port()}" for _ in range(2))
    suspected: list[str] = []
    a = runner(a_addr, lambda: {b_addr}, lambda peer, instance, why: suspected.append(peer))
    b = runner(b_addr, lambda: {a_addr}, lambda *args: None)
    with running(a, b):
        wait_for(lambda: b_addr in a.heard())
        b.stop()
        wait_for(lambda: suspected == [b_addr])
        a.reset()
        wait_for(lambda: b_addr not in a.suspected())
        wait_for(lambda: suspected == [b_addr, b_addr])


@pytest.mark.timeout(60)
def test_beyond_the_fanout_a_dead_agent_is_judged_by_its_watchers_and_by_whoever_waits_for_it():
    """11 agents, every one sending to every other: each judges its 8 ring neighbours and the voter's agent, and
    drops the others' heartbeats unread. A stopped agent is reported by each of its watchers and by a non-watcher
    whose application waits for it (a stall report); the other non-watchers never judge it."""
    addrs = spread_ports(WATCH_FANOUT + 3)
    voter = addrs[0]
    plan = (frozenset(addrs), frozenset({voter}))
    reports: dict[str, list[str]] = {a: [] for a in addrs}
    runners = {a: HeartbeatRunner("127.0.0.1", int(a.rpartition(":")[2]), KEY, "job", a, CONFIG,
                                  lambda a=a: set(addrs) - {a}, lambda peer, i, why, a=a: reports[a].append(peer),
                                  announce=lambda a=a: Announcement("i-" + a, "", False), watch=lambda: plan)
               for a in addrs}
    judges = {a: watched(a, addrs, {voter}) for a in addrs}
    victim = next(a for a in addrs[1:] if sum(a not in judges[b] for b in addrs if b != a) >= 2)
    bystanders = [b for b in addrs if b != victim and victim not in judges[b]]
    waiting, idle = bystanders[0], bystanders[1:]
    held: list[socket.socket] = []
    try:
        with running(*runners.values()):
            wait_for(lambda: all(judges[a] <= set(runners[a].heard()) for a in addrs))
            assert all(set(runners[a].heard()) <= judges[a] for a in addrs)       # nobody else is judged
            assert all(voter in runners[a].heard() for a in addrs[1:])
            runners[victim].stop()
            held.append(hold_port(victim))                                          # stopped: no refusal
            runners[waiting].stalled([victim], lease=30.0)
            wait_for(lambda: all(victim in reports[a] for a in addrs if victim in judges[a] or a == waiting))
            time.sleep(2 * CONFIG.timeout)
            assert not any(victim in reports[a] for a in idle)
    finally:
        for sock in held:
            sock.close()


@pytest.mark.timeout(10)
def test_a_ring_ends_a_sleep_whether_it_comes_before_or_during_it_and_rings_together_wake_once():
    bell = _Bell()
    assert not bell.sleep(0.0)                          # nobody rang
    bell.ring()
    bell.ring()
    assert bell.sleep(60.0)                             # rung before the sleep: at once
    assert not bell.sleep(0.0)                          # the second ring was served by the same wake-up
    ringer = threading.Timer(0.05, bell.ring)
    ringer.start()
    assert bell.sleep(60.0)                             # rung during it
    ringer.join()


def test_an_idle_round_reuses_its_plan_and_new_targets_or_a_stall_report_remake_it():
    """Beyond the fanout: the plan of a round is reused while the targets and the watch plan are the very same
    objects and no stall report stands; a stall report adds the agent it names to those judged, new targets
    are planned afresh."""
    me = f"127.0.0.1:{free_udp_port()}"
    others = [f"127.0.0.1:{40000 + i}" for i in range(WATCH_FANOUT + 2)]
    targets = {"now": frozenset(others) | {me}}
    plan = (targets["now"], frozenset({others[0]}))
    r = HeartbeatRunner("127.0.0.1", int(me.rpartition(":")[2]), KEY, "job", me, CONFIG, lambda: targets["now"],
                        lambda *report: None, announce=lambda: Announcement("i", "", False), watch=lambda: plan)
    try:
        send_to, judged = r._plan()
        assert send_to == set(others) and judged == watched(me, plan[0], plan[1])
        again = r._plan()
        assert again[0] is send_to and again[1] is judged
        unwatched = min(set(others) - judged)
        r.stalled([unwatched], lease=60.0)
        assert r._plan()[1] == judged | {unwatched}
        r._stalled_now(time.monotonic() + 61.0)                             # the report ends, as a round finds
        newcomer = "127.0.0.1:39999"
        targets["now"] = targets["now"] | {newcomer}
        send_to, judged = r._plan()
        assert send_to == set(others) | {newcomer} and newcomer in judged   # not in the watch plan: judged
        assert r._plan()[1] is judged
    finally:
        r.stop()

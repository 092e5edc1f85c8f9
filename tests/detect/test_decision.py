"""Properties of the detector decision (`p2pgen.detect.suspects`), checked with Hypothesis."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pgen.detect import DetectorConfig, HeartbeatHistory, judge, judged_at, suspects


@st.composite
def configs(draw: st.DrawFn) -> DetectorConfig:
    timeout = draw(st.floats(0.05, 30.0))
    return DetectorConfig(
        kind=draw(st.sampled_from(["fixed", "phi"])),
        timeout=timeout,
        floor=draw(st.floats(0.01, 1.0)) * timeout,
        phi_threshold=draw(st.floats(0.1, 20.0)),
        heartbeat_interval=draw(st.floats(0.01, 2.0)),
        window=draw(st.integers(2, 50)),
        stalled_floor=draw(st.floats(0.01, 1.5)) * timeout,
    )


@st.composite
def histories(draw: st.DrawFn, peers: int = 3) -> HeartbeatHistory:
    """Up to `peers` peers, each with 1..60 arrivals at positive (possibly very irregular) intervals."""
    history = HeartbeatHistory(window=draw(st.integers(2, 50)))
    for p in range(draw(st.integers(1, peers))):
        t = draw(st.floats(0.0, 100.0))
        history.record(f"p{p}", t)
        for gap in draw(st.lists(st.floats(1e-3, 10.0), max_size=60)):
            t += gap
            history.record(f"p{p}", t)
    return history


@settings(max_examples=300, deadline=None)
@given(histories(), configs(), st.floats(0.0, 1.0))
def test_never_suspects_a_peer_heard_within_the_floor(history, config, fraction):
    for peer in history.peers():
        last = history.stats(peer).last
        now = last + fraction * config.floor
        while now - last > config.floor:  # last + floor can round to a time just past the floor
            now = math.nextafter(now, -math.inf)
        assert peer not in suspects(now, history, config)


@settings(max_examples=300, deadline=None)
@given(histories(), configs(), st.floats(0.0, 1.0), st.floats(0.0, 200.0))
def test_a_stalled_job_judges_its_silent_peers_from_the_stalled_floor_and_the_others_as_before(
        history, config, fraction, now):
    """Under a stall: never within min(stalled_floor, floor), always past the timeout, monotone in time, and a
    stalled peer is suspected no later than when not stalled; the peers not in `stalled` are judged as if no
    stall were reported."""
    stalled = frozenset(history.peers()[:1])
    floor = min(config.stalled_floor, config.floor)
    for peer in history.peers():
        last = history.stats(peer).last
        early = last + fraction * floor
        while early - last > floor:
            early = math.nextafter(early, -math.inf)
        if peer in stalled:
            assert peer not in suspects(early, history, config, stalled)
            assert peer in suspects(last + config.timeout + 1e-3, history, config, stalled)
    plain, under_stall = suspects(now, history, config), suspects(now, history, config, stalled)
    assert set(plain) <= set(under_stall) and set(under_stall) - set(plain) <= stalled
    assert {p: r for p, r in under_stall.items() if p not in stalled} == {p: r for p, r in plain.items()
                                                                           if p not in stalled}
    later = suspects(now + 0.5, history, config, stalled)
    assert set(under_stall) <= set(later)


def test_a_stall_lowers_the_floor_to_the_stalled_floor_and_says_why():
    """Heartbeats every 0.1 s; floor 0.8 s, stalled floor 0.3 s: after 0.35 s of silence only the peer the
    stalled collective waits for is suspected."""
    config = DetectorConfig(kind="phi", timeout=1.5, floor=0.8, stalled_floor=0.3)
    history = HeartbeatHistory(config.window)
    for i in range(101):
        history.record("a", i * 0.1)
        history.record("b", i * 0.1)
    assert suspects(10.35, history, config) == {}
    found = suspects(10.35, history, config, frozenset({"a"}))
    assert set(found) == {"a"} and found["a"].endswith("after 0.35 s (the job waits for it)")
    assert suspects(10.25, history, config, frozenset({"a"})) == {}


@settings(max_examples=300, deadline=None)
@given(histories(), configs(), st.floats(1e-6, 1000.0))
def test_always_suspects_a_peer_silent_beyond_the_timeout(history, config, extra):
    for peer in history.peers():
        now = history.stats(peer).last + config.timeout + extra
        reason = suspects(now, history, config).get(peer)
        assert reason is not None and reason.startswith("silent for")


@settings(max_examples=300, deadline=None)
@given(histories(), configs(), st.lists(st.floats(0.0, 50.0), min_size=2, max_size=20))
def test_suspicion_is_monotone_in_time(history, config, offsets):
    """Once suspected, still suspected later: the simulator's bisection relies on this."""
    start = max(history.stats(p).last for p in history.peers())
    seen: set[str] = set()
    for now in sorted(start + o for o in offsets):
        current = set(suspects(now, history, config))
        assert seen <= current
        seen = current


@settings(max_examples=200, deadline=None)
@given(histories(peers=4), configs(), st.floats(0.0, 20.0))
def test_verdict_on_a_peer_depends_only_on_its_own_history(history, config, after):
    now = max(history.stats(p).last for p in history.peers()) + after
    together = suspects(now, history, config)
    for peer in history.peers():
        assert together.get(peer) == judge(now, history.stats(peer), config)


@settings(max_examples=200, deadline=None)
@given(histories(), configs(), st.floats(0.0, 20.0))
def test_suspects_is_pure(history, config, after):
    now = max(history.stats(p).last for p in history.peers()) + after
    before = {p: history.stats(p) for p in history.peers()}
    assert suspects(now, history, config) == suspects(now, history, config)
    assert {p: history.stats(p) for p in history.peers()} == before


@settings(max_examples=200, deadline=None)
@given(histories(), configs(), st.floats(0.0, 60.0))
def test_fixed_kind_suspects_exactly_the_peers_silent_beyond_the_timeout(history, config, after):
    fixed = DetectorConfig(kind="fixed", timeout=config.timeout, floor=config.floor)
    now = max(history.stats(p).last for p in history.peers()) + after
    expected = {p for p in history.peers() if now - history.stats(p).last > fixed.timeout}
    assert set(suspects(now, history, fixed)) == expected


@settings(max_examples=100, deadline=None)
@given(configs(), st.floats(0.0, 100.0), st.floats(0.0, 40.0))
def test_a_peer_recorded_once_is_judged_by_the_fixed_rule(config, at, after):
    history = HeartbeatHistory(config.window)
    history.record("solo", at)
    now = at + after
    assert ("solo" in suspects(now, history, config)) == (now - at > config.timeout)


@settings(max_examples=300, deadline=None)
@given(histories(), configs(), st.booleans())
def test_judged_at_is_the_instant_a_silent_peer_becomes_suspected(history, config, stalled):
    """`judge` says nothing just before `judged_at` and suspects just after it: the agent can sleep until then."""
    for peer in history.peers():
        stats = history.stats(peer)
        at = judged_at(stats, config, stalled)
        margin = 1e-7 * max(1.0, abs(at))
        assert judge(at - margin, stats, config, stalled) is None
        assert judge(at + margin, stats, config, stalled) is not None


def test_judged_at_a_regular_peer_under_a_stall_is_the_stalled_floor():
    history = HeartbeatHistory()
    for i in range(50):
        history.record("p", i * 0.1)
    stats, config = history.stats("p"), DetectorConfig()
    assert judged_at(stats, config, stalled=True) == pytest.approx(4.9 + config.stalled_floor)
    assert judged_at(stats, config) == pytest.approx(4.9 + config.floor)
    assert judged_at(stats, DetectorConfig(kind="fixed")) == pytest.approx(4.9 + config.timeout)


def test_phi_suspects_a_regular_peer_soon_after_the_floor_and_says_why():
    config = DetectorConfig(kind="phi", timeout=5.0, floor=0.3, phi_threshold=8.0, heartbeat_interval=0.1)
    history = HeartbeatHistory(config.window)
    for i in range(101):
        history.record("a", i * 0.1)
    assert suspects(10.0 + 0.29, history, config) == {}
    reason = suspects(10.0 + 0.31, history, config)["a"]
    assert reason.startswith("phi ") and reason.endswith("> 8.0 after 0.31 s")


def test_phi_waits_longer_for_an_irregular_peer():
    config = DetectorConfig(kind="phi", timeout=5.0, floor=0.3, phi_threshold=8.0, heartbeat_interval=0.1)
    regular, irregular = HeartbeatHistory(), HeartbeatHistory()
    t = 0.0
    for i in range(100):
        regular.record("a", i * 0.1)
        irregular.record("a", t)
        t += 0.1 if i % 10 else 1.2
    silence = 0.8
    assert "a" in suspects(regular.stats("a").last + silence, regular, config)
    assert "a" not in suspects(irregular.stats("a").last + silence, irregular, config)


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 30), st.lists(st.floats(0.0, 50.0), min_size=1, max_size=80))
def test_history_keeps_exactly_the_last_window_intervals(window, times):
    history = HeartbeatHistory(window)
    kept: list[float] = []
    last = times[0]
    for t in times:
        history.record("a", t)
        if t > last:
            kept.append(t - last)
            last = t
    stats = history.stats("a")
    tail = kept[-window:]
    assert stats.last == last and stats.samples == len(tail)
    if tail:
        assert math.isclose(stats.mean, float(np.mean(tail)), rel_tol=1e-9, abs_tol=1e-9)
        assert math.isclose(stats.std, float(np.std(tail)), rel_tol=1e-6, abs_tol=1e-6)


def test_forget_removes_a_peer():
    history = HeartbeatHistory()
    history.record("a", 0.0)
    history.record("b", 0.0)
    history.forget("a")
    history.forget("never-seen")
    assert history.peers() == ["b"]
    assert set(suspects(100.0, history, DetectorConfig())) == {"b"}


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"floor": 2.0, "timeout": 1.0}, "lower the floor or raise the timeout"),
        ({"kind": "gossip"}, "unknown detector kind 'gossip'"),
        ({"timeout": 0.0}, "timeout must be a positive"),
        ({"phi_threshold": -1.0}, "phi_threshold must be a positive"),
        ({"heartbeat_interval": math.nan}, "heartbeat_interval must be a positive"),
        ({"window": 1}, "window must be an integer >= 2"),
    ],
)
def test_invalid_configs_say_what_to_fix(kwargs, words):
    with pytest.raises(ValueError, match=words):
        DetectorConfig(**kwargs)


class StatsUnread(HeartbeatHistory):
    """A history whose peers' statistics must not be computed."""

    def stats(self, peer: str):
        raise AssertionError(f"the statistics of {peer} were computed")


def test_no_peer_is_looked_at_while_every_one_was_heard_within_the_lower_floor():
    config = DetectorConfig(kind="phi", timeout=1.5, floor=0.8, stalled_floor=0.3, heartbeat_interval=0.1)
    history = StatsUnread(window=10)
    for peer, last in (("a", 10.0), ("b", 10.2)):
        history.record(peer, last - 0.1)
        history.record(peer, last)
    assert suspects(10.25, history, config, frozenset({"a"})) == {}
    with pytest.raises(AssertionError, match="statistics of a"):
        suspects(10.31, history, config, frozenset({"a"}))          # past the stalled floor: a is judged

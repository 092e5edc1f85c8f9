"""core.topology.ring_order against a naive reference: the fewest slow crossings any ring of the members can make
(brute force over every order, N <= 6), for declared zones and for measured matrices built from hidden zones
with noise; determinism; the join order whenever nothing is known; the hierarchy rule."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pgen.core.model import Member
from p2pgen.core.topology import SLOW_FACTOR, crossings, parse_rates, rate, rates_text, ring_order

pytestmark = pytest.mark.timeout(60)


def brute_force_min(members: tuple[Member, ...], slow) -> int:
    """The fewest slow crossings of any ring of `members` (the first member fixed: rings are rotations)."""
    if len(members) < 2:
        return 0
    first, rest = members[0], members[1:]
    return min(crossings((first, *perm), slow) for perm in itertools.permutations(rest))


def zone_slow(a: Member, b: Member) -> bool:
    return (a.zone or "-") != (b.zone or "-")


@st.composite
def zoned(draw, max_n: int = 6) -> tuple[Member, ...]:
    """Members in join order, some zones declared, a few sharing a host."""
    n = draw(st.integers(1, max_n))
    zones = draw(st.lists(st.sampled_from(["", "a", "b", "c"]), min_size=n, max_size=n))
    hosts = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    peers = draw(st.permutations([f"p{i}" for i in range(n)]))
    return tuple(Member(p, 1, (("data", f"10.0.0.{h}:7002"),), z) for p, z, h in zip(peers, zones, hosts))


@st.composite
def measured(draw, max_n: int = 6) -> tuple[tuple[Member, ...], dict]:
    """Members on distinct hosts, each in a hidden zone; rates ~10 Gbit/s inside a zone and ~200 Mbit/s between,
    each direction with its own noise (within 2x), some pairs measured one way only."""
    n = draw(st.integers(2, max_n))
    hidden = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    peers = draw(st.permutations([f"p{i}" for i in range(n)]))
    members = tuple(Member(p, 1, (("data", f"10.0.{z}.{i}:7002"),)) for i, (p, z) in enumerate(zip(peers, hidden)))
    links = {}
    for a, b in itertools.permutations(range(n), 2):
        if draw(st.booleans()) or (b, a) not in links and a > b:
            base = 10_000 if hidden[a] == hidden[b] else 200
            links[(members[a].host, members[b].host)] = base * draw(st.floats(0.5, 1.0))
    return members, links


def measured_slow(links: dict):
    fastest = max(rate(links, a, b) for a, b in links)

    def slow(x: Member, y: Member) -> bool:
        return x.host != y.host and rate(links, x.host, y.host) < fastest / SLOW_FACTOR
    return slow


@settings(max_examples=200, deadline=None)
@given(zoned())
def test_zones_reach_the_fewest_crossings_and_keep_each_zone_contiguous(members):
    order, topology = ring_order(members, {})
    assert sorted(order) == sorted(members)
    assert crossings(order, zone_slow) == brute_force_min(members, zone_slow)
    if topology is None:
        assert order == members and not any(m.zone for m in members)
        return
    assert topology.crossings == crossings(order, zone_slow)
    assert topology.join_crossings == crossings(members, zone_slow)
    seen = [m.zone or "-" for m in order]
    changes = sum(seen[i] != seen[i - 1] for i in range(1, len(seen)))
    assert changes == len(set(seen)) - 1, f"a zone is split: {seen}"
    if len(set(seen)) < 2:
        assert order == members, "one zone: the join order is kept"


@settings(max_examples=200, deadline=None)
@given(measured())
def test_measured_matrix_reaches_the_fewest_slow_crossings(case):
    members, links = case
    order, topology = ring_order(members, links)
    slow = measured_slow(links)
    assert sorted(order) == sorted(members)
    assert topology is not None and topology.source == "measured"
    assert crossings(order, slow) == brute_force_min(members, slow) == topology.crossings
    if topology.crossings == 0:
        assert order == members


@settings(max_examples=100, deadline=None)
@given(measured(), st.randoms(use_true_random=False))
def test_the_same_inputs_give_the_same_order_whatever_the_matrix_order(case, rnd):
    members, links = case
    shuffled = list(links.items())
    rnd.shuffle(shuffled)
    assert ring_order(members, dict(shuffled)) == ring_order(members, links)


@settings(max_examples=100, deadline=None)
@given(measured(), st.data())
def test_an_incomplete_matrix_keeps_the_join_order(case, data):
    members, links = case
    hosts = sorted({m.host for m in members})
    a, b = data.draw(st.sampled_from([(x, y) for x in hosts for y in hosts if x < y]))
    links = {k: v for k, v in links.items() if set(k) != {a, b}}
    order, topology = ring_order(members, links)
    assert order == members
    assert topology is None or (topology.source == "join" and not topology.hierarchical)


@settings(max_examples=100, deadline=None)
@given(measured())
def test_hierarchical_only_with_two_groups_of_two_behind_slow_links(case):
    members, links = case
    _, topology = ring_order(members, links)
    sizes = [len(p) for _, p in topology.groups]
    if topology.hierarchical:
        assert len(sizes) >= 2 and min(sizes) >= 2
        group = {p: name for name, peers in topology.groups for p in peers}
        inside = [rate(links, x.host, y.host) for x, y in itertools.combinations(members, 2)
                  if group[x.peer_id] == group[y.peer_id]]
        between = [rate(links, x.host, y.host) for x, y in itertools.combinations(members, 2)
                   if group[x.peer_id] != group[y.peer_id]]
        assert max(between) * SLOW_FACTOR <= min(inside)
    elif len(sizes) >= 2 and min(sizes) >= 2:
        assert "is not" in topology.reason


def test_nothing_known_is_the_join_order_without_a_topology():
    members = tuple(Member(p, 1, (("data", f"10.0.0.{i}:7002"),)) for i, p in enumerate("dcba"))
    assert ring_order(members, {}) == (members, None)


def test_two_zones_alternating_become_contiguous_with_the_reason():
    members = tuple(Member(p, 1, (("data", f"10.0.{z}.{i}:7002"),), zone)
                    for i, (p, z, zone) in enumerate([("a1", 1, "east"), ("b1", 2, "west"),
                                                      ("a2", 1, "east"), ("b2", 2, "west")]))
    order, topology = ring_order(members, {})
    assert [m.peer_id for m in order] == ["a1", "a2", "b1", "b2"]
    assert topology.groups == (("east", ("a1", "a2")), ("west", ("b1", "b2")))
    assert (topology.crossings, topology.join_crossings, topology.hierarchical) == (2, 4, True)
    assert "crosses slow links 2 time(s) (join order: 4)" in topology.reason


def test_members_on_one_host_take_shared_memory_not_the_hierarchy():
    members = tuple(Member(f"p{i}", 1, (("data", f"127.0.0.1:{7002 + 5 * i}"),), "ab"[i % 2]) for i in range(4))
    _, topology = ring_order(members, {})
    assert not topology.hierarchical and "one host" in topology.reason


def test_rates_round_trip_and_bad_rates_say_what_is_wrong():
    assert parse_rates(rates_text({"10.0.0.2": 9400.5, "10.0.0.1": 200.0})) == {"10.0.0.1": 200.0, "10.0.0.2": 9400.5}
    for bad, why in (("h", "not HOST=MBITS"), ("h=x", "not a number"), ("h=0", "within"), ("h=inf", "within"),
                     ("h=1 h=2", "twice")):
        with pytest.raises(ValueError, match=why):
            parse_rates(bad)

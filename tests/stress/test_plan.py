"""The stress fault plan: seeded, a fixed number of draws per action, bounded timings, and the minority rule."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pgen_lab.stress import plan
from p2pgen_lab.stress.plan import Agent, World, choose, quorum_safe

pytestmark = pytest.mark.timeout(60)


def world(up=5, voters=5, down_voters=0, non_voters=0, max_agents=7, min_agents=3, can_join=True) -> World:
    agents = [Agent(f"p{i}", True, True) for i in range(up)]
    agents += [Agent(f"d{i}", False, True) for i in range(down_voters)]
    agents += [Agent(f"n{i}", True, False) for i in range(non_voters)]
    return World(tuple(agents), voters, down_voters, max_agents, min_agents, can_join)


def actions(seed: int, w: World, n: int = 50) -> list[plan.Action]:
    rng = random.Random(seed)
    return [choose(rng, w, new_peer="p9") for _ in range(n)]


def takes_down(a: plan.Action) -> bool:
    return a.kind in plan.TAKES_DOWN


def test_one_seed_replays_one_plan_and_another_seed_another():
    w = world()
    assert actions(7, w) == actions(7, w) and actions(7, w) != actions(8, w)


def test_every_action_draws_the_same_number_of_values_whatever_the_world():
    a, b = random.Random(3), random.Random(3)
    choose(a, world(), "p9")
    choose(b, world(up=2, voters=3, down_voters=1, can_join=False), "p9")
    assert a.random() == b.random()


def test_a_mean_rescales_the_same_draws():
    """`--fault-every 15` waits 15 / 1.75 times longer between the same actions."""
    plain, scaled = random.Random(3), random.Random(3)
    for _ in range(20):
        d = plan.next_delay(plain)
        assert plan.next_delay(scaled, 15.0) == pytest.approx(d * 15.0 / 1.75)
    assert plain.random() == scaled.random()


def test_timings_stay_in_their_ranges():
    rng = random.Random(1)
    delays = [plan.next_delay(rng) for _ in range(500)]
    assert 0.5 <= min(delays) and max(delays) <= 3.0
    acts = actions(2, world(), 2000)
    pauses = [a.seconds for a in acts if a.kind == "pause"]
    gaps = [a.seconds for a in acts if a.kind == "kill_two"]
    assert pauses and 0.3 <= min(pauses) and max(pauses) <= 3.0
    assert gaps and 0.0 <= min(gaps) and max(gaps) <= 0.3
    assert all(a.replace_after == (plan.REPLACE_AFTER_S,) for a in acts if a.kind == "kill_agent")
    assert {a.scope for a in acts if a.kind == "pause"} == {"agent", "host"}
    on_hosts = actions(3, replace(world(), hosts=True), 2000)
    cuts = [a.seconds for a in on_hosts if a.kind == "host_cut"]
    zones = [a for a in on_hosts if a.kind == "zone_partition"]
    assert cuts and 0.5 <= min(cuts) and max(cuts) <= 4.0
    assert zones and all(len(a.targets) == 2 and 1.0 <= a.seconds <= 10.0 for a in zones)   # 2 of 5 hosts


def test_host_faults_keep_the_minority_rule_and_one_network_fault_at_a_time():
    assert not {a.kind for a in actions(4, replace(world(), hosts=True, can_partition=False), 400)} & {
        "host_cut", "zone_partition", "partition"}
    three = replace(world(up=3, voters=3), hosts=True)      # a zone of two would take a majority down
    assert "zone_partition" not in {a.kind for a in actions(5, three, 400)}


def test_every_kind_is_chosen_on_a_world_that_allows_them_all():
    kinds = Counter(a.kind for a in actions(4, world(up=5, non_voters=1), 600))
    assert set(kinds) == set(plan.KINDS) - set(plan.HOST_KINDS)          # host faults need emulated hosts
    on_hosts = Counter(a.kind for a in actions(4, replace(world(up=5, non_voters=1), hosts=True), 900))
    assert set(on_hosts) == set(plan.KINDS)
    assert kinds["kill_app"] > kinds["kill_two"]             # weights: 3 vs 1


def test_the_minority_rule_counts_voters_already_down():
    five = world(up=3, voters=5, down_voters=2)              # two of five voters down: nothing more may go
    assert not quorum_safe(five, [five.agents[0]])
    acts = actions(5, five, 300)
    assert acts and not any(takes_down(a) for a in acts)
    assert {a.kind for a in acts} <= {"kill_app", "join"}


def test_non_voters_may_go_down_when_no_voter_may():
    w = world(up=3, voters=5, down_voters=2, non_voters=2)
    down = [a for a in actions(6, w, 300) if takes_down(a)]
    assert down and all(t.startswith("n") for a in down for t in a.targets)


def test_two_agents_go_down_together_only_when_a_majority_stays_up():
    assert any(a.kind == "kill_two" for a in actions(1, world(), 300))                        # 2 of 5 voters
    assert not any(a.kind == "kill_two" for a in actions(1, world(up=4, voters=4), 300))      # 2 of 4 is half
    pairs = [a for a in actions(1, world(up=4, voters=5, down_voters=1, non_voters=1), 300) if a.kind == "kill_two"]
    assert pairs and all(any(t.startswith("n") for t in a.targets) for a in pairs)


def test_joins_and_leaves_keep_the_agent_count_in_bounds():
    assert not any(a.kind == "join" for a in actions(2, world(up=7), 300))
    assert not any(a.kind == "join" for a in actions(2, world(can_join=False), 300))
    assert not any(a.kind == "leave" for a in actions(2, world(up=3, voters=3, min_agents=3), 300))


def test_a_world_with_no_possible_action_gets_none_with_the_reason():
    a = choose(random.Random(0), World((Agent("p0", False, True),), 1, 1, 1, 1, False), "p1")
    assert a.kind == "none" and "majority" in a.describe()


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 7), st.integers(0, 3), st.lists(st.tuples(st.booleans(), st.booleans()), max_size=8),
       st.integers(0, 2 ** 32))
def test_no_chosen_action_leaves_a_majority_of_the_voters_down(voters, down, agents, seed):
    down = min(down, (voters - 1) // 2)
    w = World(tuple(Agent(f"p{i}", up, voter) for i, (up, voter) in enumerate(agents)), voters, down, 9, 2)
    a = choose(random.Random(seed), w, "p99")
    if takes_down(a):
        by_peer = {x.peer: x for x in w.agents}
        newly = sum(1 for t in a.targets if by_peer[t].up and by_peer[t].voter)
        assert down + newly <= (voters - 1) // 2
        assert all(by_peer[t].up for t in a.targets)


def test_the_timeline_keeps_the_stretches_with_a_majority_up():
    t = plan.Timeline()
    for when, ok in [(0, True), (1, True), (2, False), (3, False), (4, True)]:
        t.sample(when, ok)
    assert t.close(6) == [(0, 2), (4, 6)]
    assert plan.majority_up(5, 2) and not plan.majority_up(5, 3) and not plan.majority_up(4, 2)


def test_a_replaced_agent_is_a_new_node_so_the_voter_it_replaced_stays_down():
    slots = [("p0", "up", "a:1/x"), ("p1", "up", "b:1/y2"), ("p2", "stopped", "c:1/z"), ("p3", "up", "d:1/w")]
    voters = [("a:1/x", "a:0"), ("b:1/y", "b:0"), ("c:1/z", "c:0")]   # p1 was replaced: its old node still votes
    assert plan.voter_status(slots, voters) == (3, 2, {"p0"})
    assert not plan.majority_up(3, 2)


def test_before_any_observation_every_agent_not_gone_is_a_voter():
    slots = [("p0", "up", None), ("p1", "down", None), ("p2", "left", None), ("p3", "stopped", None)]
    assert plan.voter_status(slots, None) == (3, 2, {"p0", "p1", "p3"})


def test_partitions_cut_off_only_a_minority_both_ways_or_one_way_and_heal_within_1_to_10_s():
    w = world(up=5, voters=5)
    parts = [a for a in actions(4, w, 3000) if a.kind == "partition"]
    assert parts and {a.scope for a in parts} == {"both", "one_way"}
    assert {len(a.targets) for a in parts} == {1, 2}
    assert all(1.0 <= a.seconds <= 10.0 for a in parts)
    by_peer = {x.peer: x for x in w.agents}
    assert all(quorum_safe(w, [by_peer[p] for p in a.targets]) for a in parts)
    assert "partition" in parts[0].describe() and "healed in" in parts[0].describe()


def test_no_partition_while_one_is_in_place_or_when_a_cut_would_leave_no_majority():
    busy = World(world().agents, 5, 0, 7, 3, can_partition=False)
    assert not any(a.kind == "partition" for a in actions(5, busy, 500))
    tight = world(up=3, voters=5, down_voters=2)
    assert not any(a.kind == "partition" for a in actions(6, tight, 500))


def test_a_kinds_filter_keeps_to_those_kinds_and_draws_as_many_values():
    a, b = random.Random(9), random.Random(9)
    assert {choose(a, world(), "p9", kinds=("partition",)).kind for _ in range(50)} == {"partition"}
    for _ in range(50):
        choose(b, world(), "p9")
    assert a.random() == b.random()

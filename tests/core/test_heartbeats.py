"""The heartbeat verdicts (p2pgen.core.heartbeats), as tables: which lost agents are acted on, when an agent
that hears none of its peers blames none of them, whose heartbeats an agent judges, and when the job is proven
to hear an agent (only round trips count), with the fence the application applies to its view. The shells calling them:
tests/agent/test_agent_lost.py and tests/agent/test_heartbeat.py."""

from __future__ import annotations

import pytest

from p2pgen.core.heartbeats import (
    WATCH_FANOUT,
    acts_on_loss,
    heard_by_quorum,
    hears_no_one,
    lease_quorum,
    lease_runs_out,
    watched,
)
from p2pgen.core.view import JobView, cut_off


@pytest.mark.parametrize(("has_node", "proven", "acted_on"), [
    (True, False, True),       # a silence, judged with the job's state at hand
    (True, True, True),        # a refusal or a new process at the address
    (False, True, True),       # a proof counts whenever it comes (kept until the node is back)
    (False, False, False),     # a silence judged while joining or re-joining says more about this agent
])
def test_a_silence_judged_without_a_raft_node_is_not_acted_on(has_node: bool, proven: bool, acted_on: bool):
    assert acts_on_loss(has_node, proven) is acted_on


FLOOR = 1.0


@pytest.mark.parametrize(("others", "quiet_for", "deaf"), [
    (0, 10.0, False),          # nobody to hear
    (1, 10.0, False),          # one silent peer is judged as usual: it may well be the one that failed
    (2, 0.4, False),           # heard within half the floor
    (2, 0.5, False),           # exactly half the floor: still heard
    (2, 0.51, True),           # two peers silent at once: this agent's deafness is likelier
    (5, 3.0, True),
])
def test_an_agent_that_suddenly_hears_none_of_its_peers_blames_none_of_them(others: int, quiet_for: float,
                                                                             deaf: bool):
    assert hears_no_one(others, quiet_for, FLOOR) is deaf


FIVE = [f"10.0.0.{i}:27000" for i in range(1, 6)]     # ring order (address hashes): .2 .1 .5 .4 .3


@pytest.mark.parametrize(("me", "ring", "always", "fanout", "expected"), [
    ("10.0.0.1:27000", FIVE, [], 2, {"10.0.0.2:27000", "10.0.0.5:27000"}),   # its two ring neighbours
    ("10.0.0.3:27000", FIVE, [], 2, {"10.0.0.4:27000", "10.0.0.2:27000"}),   # the ring wraps around
    ("10.0.0.3:27000", FIVE, ["10.0.0.5:27000"], 2,                           # a voter's agent: watched always
     {"10.0.0.4:27000", "10.0.0.2:27000", "10.0.0.5:27000"}),
    ("10.0.0.3:27000", FIVE, ["10.0.0.3:27000"], 2, {"10.0.0.4:27000", "10.0.0.2:27000"}),   # never itself
    ("10.0.0.1:27000", FIVE, [], 4, set(FIVE) - {"10.0.0.1:27000"}),          # 4 others, fanout 4: everyone
    ("10.0.0.1:27000", FIVE[1:], [], 2, {"10.0.0.2:27000", "10.0.0.5:27000"}),   # not in the ring (a joiner):
    ("10.0.0.9:27000", [], ["10.0.0.5:27000"], 2, {"10.0.0.5:27000"}),          # placed where it would be
])
def test_an_agent_watches_its_ring_neighbours_and_the_voters_agents(me: str, ring: list[str], always: list[str],
                                                                    fanout: int, expected: set[str]):
    assert watched(me, ring, always, fanout) == expected
    assert watched(me, list(reversed(ring)), always, fanout) == expected     # the order given does not matter


@pytest.mark.parametrize("agents", [4, 9, 10, 16, 32, 33])
def test_watching_is_symmetric_and_every_agent_has_the_same_number_of_watchers(agents: int):
    ring = [f"127.0.0.1:{27000 + 5 * i}" for i in range(agents)]
    plans = {a: watched(a, ring, []) for a in ring}
    for a in ring:
        assert all(a in plans[b] for b in plans[a])                          # a watches b <=> b watches a
        assert len(plans[a]) == min(agents - 1, WATCH_FANOUT)
        assert sum(a in plans[b] for b in ring) == min(agents - 1, WATCH_FANOUT)


@pytest.mark.parametrize("fanout", [0, 1, 3, 7])
def test_an_odd_or_too_small_fanout_is_refused(fanout: int):
    with pytest.raises(ValueError, match="even number of at least 2"):
        watched("10.0.0.1:27000", FIVE, [], fanout)


LEASE, NOW = 0.3, 100.0
FIVE = ("b", "c", "d", "e")       # the agents a member's agent watches in a job of five


@pytest.mark.parametrize(("echo_ages", "heard"), [
    ({}, False),                                                  # a one-way cut: it hears all, none echoes it
    ({"b": 0.1}, False),                                          # cut off with one other agent (2 of 5)
    ({"b": 0.1, "c": 0.2}, True),                                 # 3 of 5, itself counted: a majority
    ({"b": 0.1, "c": 0.3}, True),                                 # an echo exactly one lease old still counts
    ({"b": 0.1, "c": 0.31}, False),                               # one just older: 2 of 5
    ({"b": 0.0, "c": 0.0, "d": 0.0, "e": 0.0}, True),
])
def test_the_job_hears_an_agent_only_while_a_majority_echoed_its_heartbeats_within_the_lease(echo_ages, heard):
    echoed = {agent: NOW - age for agent, age in echo_ages.items()}
    assert heard_by_quorum(echoed, FIVE, True, NOW, LEASE) is heard


@pytest.mark.parametrize(("quorum", "counts_itself", "echoed", "heard"), [
    ((), True, {}, True),                          # alone in the job: it hears itself
    (("b",), True, {}, False),                     # two agents: the other must answer
    (("b",), True, {"b": NOW}, True),
    (("b", "c", "d"), True, {"b": NOW}, False),    # 2 of 4 is no majority
    (("b", "c", "d"), True, {"b": NOW, "x": NOW}, False),   # an echo from outside the quorum counts for nothing
    (("v1", "v2", "v3"), False, {"v1": NOW}, False),        # no vote of its own: 2 of 3 voters must echo
    (("v1", "v2", "v3"), False, {"v1": NOW, "v2": NOW}, True),
    (("v2", "v3"), True, {"v2": NOW}, True),       # a voter's agent: itself and one of the two others
])
def test_a_quorum_is_more_than_half_of_the_voters_agents_counting_itself_when_it_runs_one(quorum, counts_itself,
                                                                                       echoed, heard):
    assert heard_by_quorum(echoed, quorum, counts_itself, NOW, LEASE) is heard


def test_the_lease_runs_out_a_lease_after_the_echo_that_completes_the_newest_majority():
    echoed = {"b": 99.9, "c": 99.5, "d": 99.0}
    assert lease_runs_out(echoed, FIVE, True, LEASE) == 99.5 + LEASE        # itself, b and c: 3 of 5
    assert lease_runs_out(echoed, ("v1", "v2", "v3"), False, LEASE) == float("-inf")   # no voter echoed
    assert lease_runs_out({}, (), True, LEASE) == float("inf")             # alone: never runs out


def test_the_lease_quorum_is_the_voters_agents_that_read_this_agents_heartbeats():
    small = ["a", "b", "c", "d", "e"]
    assert lease_quorum("a", {"b", "c", "d", "e"}, small, {"a", "b", "c"}) == (frozenset({"b", "c"}), True)
    assert lease_quorum("d", {"a", "b", "c", "e"}, small, {"a", "b", "c"}) == (frozenset({"a", "b", "c"}), False)
    assert lease_quorum("a", {"b", "c"}, None, None) == (frozenset({"b", "c"}), True)     # no view yet
    big = [f"n{i}" for i in range(40)]
    me = next(a for a in big[3:] if not {"n0", "n1", "n2"} & watched(a, big, ()))   # no voter near it
    judged = watched(me, big, {"n0", "n1", "n2"})
    assert lease_quorum(me, judged, big, {"n0", "n1", "n2"}) == (judged, True)
    near = sorted(watched(me, big, ()))[0]              # make a neighbour a voter: it alone reads our heartbeats
    assert lease_quorum(me, judged, big, {"n0", near}) == (frozenset({near}), False)


def view(leader: str | None, heard: bool) -> JobView:
    return JobView(job="j", instance="i", index=1, leader=leader, agents=5, members=(), active=None, pending=None,
                   tombstones=frozenset(), state_epoch=0, forks=(), heard=heard)


@pytest.mark.parametrize(("leader", "heard", "fenced"), [
    ("n1", True, None),
    (None, True, "hears no Raft leader"),
    (None, False, "hears no Raft leader"),
    ("n1", False, "is not heard by the job"),    # one-way cut: it hears the leader, nobody hears it
])
def test_a_member_stops_committing_when_its_agent_hears_no_leader_or_is_not_heard(leader, heard, fenced):
    why = cut_off(view(leader, heard))
    assert (why is None) if fenced is None else (why is not None and why.startswith(fenced))

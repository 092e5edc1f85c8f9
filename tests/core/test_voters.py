"""The voter plan (`p2pgen.core.voters`): named cases, then properties over random situations."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from p2pgen.core.voters import MAX_VOTERS, AgentStatus, Voter, majority_up, plan_voters, target_voters


def voter(i: int, nonce: str = "a") -> Voter:
    return Voter(f"h:{10 * i + 1}/{nonce}", f"h:{10 * i}")


def agent(i: int, node: str = "", eligible: bool = False) -> AgentStatus:
    return AgentStatus(f"h:{10 * i}", node, eligible)


def test_target_is_the_largest_odd_count_up_to_five():
    assert [target_voters(n) for n in range(0, 10)] == [1, 1, 1, 3, 3, 5, 5, 5, 5, 5]


def test_a_quorum_is_a_strict_majority_up():
    assert [majority_up(5, d) for d in range(6)] == [True, True, True, False, False, False]
    assert [majority_up(4, d) for d in range(5)] == [True, True, False, False, False]
    assert majority_up(1, 0) and not majority_up(1, 1) and not majority_up(0, 0)


def test_a_dead_voter_is_removed_first_by_its_exact_id():
    voters = (voter(0), voter(1), voter(2))
    live = (agent(0, voter(0).node), agent(2, voter(2).node), agent(3, eligible=True))
    d = plan_voters(voters, voter(0).node, live, frozenset(v.node for v in voters))
    assert (d.action, d.target) == ("remove", voter(1).node)
    assert "unreachable" in d.reason


def test_a_voter_whose_address_now_runs_another_process_is_removed():
    voters = (voter(0), voter(1), voter(2))
    replaced = voter(1, nonce="b").node                      # a new process at agent 1's address
    live = (agent(0, voter(0).node), agent(1, replaced), agent(2, voter(2).node))
    d = plan_voters(voters, voter(0).node, live, frozenset(v.node for v in voters))
    assert (d.action, d.target) == ("remove", voter(1).node) and "now runs voter" in d.reason


def test_the_leader_and_unjudged_voters_are_never_removed():
    voters = (voter(0), voter(1))
    d = plan_voters(voters, voter(0).node, (), frozenset({voter(0).node}))   # voter 1 just added
    assert d.action != "remove"


def test_a_dead_voter_is_not_removed_while_the_voters_left_would_lack_a_live_majority():
    """Schedule #2 of `p2pgen chaos --seed 1 --injections 6`: voter 2 died (its agent killed just after its
    promotion), voter 1 was cut off for 2.5 s, and right after the heal its heartbeats were not heard yet (its
    Raft vote was). The leader removed voter 1, the first unheard voter by id, leaving {leader, dead voter 2}: the
    removal never committed, nothing else could, and the job stalled for good."""
    voters = (voter(0), voter(1), voter(2))
    judged = frozenset(v.node for v in voters)
    back_soon = plan_voters(voters, voter(0).node, (agent(0, voter(0).node), agent(3, eligible=True)), judged)
    assert back_soon.action == "keep" and "lack a live majority" in back_soon.reason
    heard = plan_voters(voters, voter(0).node, (agent(0, voter(0).node), agent(1, voter(1).node)), judged)
    assert (heard.action, heard.target) == ("remove", voter(2).node)
    alone = plan_voters((voter(0), voter(1)), voter(0).node, (), frozenset({voter(1).node}))
    assert (alone.action, alone.target) == ("remove", voter(1).node)        # one voter left: the leader


def test_a_live_member_is_promoted_below_target_and_not_at_it():
    voters = (voter(0),)
    live = (agent(0, voter(0).node), agent(2, eligible=True), agent(1, eligible=True))
    d = plan_voters(voters, voter(0).node, live, frozenset({voter(0).node}))
    assert (d.action, d.target) == ("promote", "h:10")           # deterministic: the smallest address
    held = plan_voters(voters, voter(0).node, live, frozenset({voter(0).node}), frozenset({"h:10"}))
    assert held.target == "h:20"
    full = (voter(0), voter(1), voter(2))
    live3 = (agent(0, voter(0).node), agent(1, voter(1).node), agent(2, voter(2).node), agent(3, eligible=True))
    assert plan_voters(full, voter(0).node, live3, frozenset(v.node for v in full)).action == "keep"


def test_a_leaving_last_voter_promotes_its_successor_and_removes_nothing():
    """A job of two agents has one voter; when its agent leaves, the other must become a voter first, or it is
    left with no Raft group. While leaving, the plan counts without the leader and never removes a voter."""
    alone = (voter(0),)
    two = (agent(0, voter(0).node), agent(1, eligible=True))
    assert plan_voters(alone, voter(0).node, two, frozenset({voter(0).node})).action == "keep"   # 1 for 2: at target
    d = plan_voters(alone, voter(0).node, two, frozenset({voter(0).node}), leaving=True)
    assert (d.action, d.target) == ("promote", "h:10") and "leaves" in d.reason
    dead = (voter(0), voter(1), voter(2))
    live = (agent(0, voter(0).node), agent(1, voter(1).node), agent(3, eligible=True))
    judged = frozenset(v.node for v in dead)
    assert plan_voters(dead, voter(0).node, live, judged).action == "remove"
    assert plan_voters(dead, voter(0).node, live, judged, leaving=True).action != "remove"


def test_a_member_that_is_not_caught_up_is_not_promoted():
    voters = (voter(0),)
    live = (agent(0, voter(0).node), agent(1, eligible=False), agent(2, eligible=False))
    d = plan_voters(voters, voter(0).node, live, frozenset({voter(0).node}))
    assert d.action == "keep" and "no eligible" in d.reason


@st.composite
def situations(draw):
    n = draw(st.integers(1, 9))
    voter_ids = draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=min(n, MAX_VOTERS)))
    voters = tuple(voter(i) for i in sorted(voter_ids))
    leader = draw(st.sampled_from(voters))
    live = [AgentStatus(leader.agent, leader.node, False)]
    for i in range(n):
        if f"h:{10 * i}" == leader.agent or not draw(st.booleans()):
            continue
        runs = voter(i).node if i in voter_ids and draw(st.booleans()) else \
            draw(st.sampled_from(["", voter(i, nonce="z").node]))
        live.append(AgentStatus(f"h:{10 * i}", runs, draw(st.booleans()) and not runs))
    judged = frozenset(v.node for v in voters if draw(st.booleans()))
    return voters, leader.node, tuple(live), judged


@given(situations())
def test_properties_of_every_decision(situation):
    voters, leader, live, judged = situation
    d = plan_voters(voters, leader, live, judged)
    by_addr = {a.addr: a for a in live}
    ids = {v.node for v in voters}
    if d.action == "remove":
        assert d.target in ids and d.target != leader and d.target in judged
        gone = next(v for v in voters if v.node == d.target)
        assert gone.agent not in by_addr or by_addr[gone.agent].node != gone.node   # never a live, announced voter
    elif d.action == "promote":
        cand = by_addr[d.target]
        assert cand.eligible and not cand.node and d.target not in {v.agent for v in voters}
        assert len(voters) < target_voters(len(live)) <= MAX_VOTERS
    else:
        assert d.action == "keep" and d.target == ""
    # a dead, judged voter is removed before any promotion, as long as the voters left keep a live majority
    def down(v):
        return v.node != leader and (v.agent not in by_addr or by_addr[v.agent].node != v.node)
    dead = [v for v in voters if v.node in judged and down(v)]
    removable = [v for v in dead if majority_up(len(voters) - 1, sum(down(o) for o in voters if o != v))]
    assert (d.action == "remove") == bool(removable)
    if d.action == "remove":
        assert d.target in {v.node for v in removable}
    if dead:
        assert d.action != "promote"

"""Partition rules (`p2pgen.faults`): which agent's traffic to which is dropped, their file, and the watcher."""

from __future__ import annotations

import json

import pytest

from p2pgen import faults
from p2pgen.agent.agent import PORT_OFFSETS, PORTS_PER_AGENT
from p2pgen.cli import main

pytestmark = pytest.mark.timeout(30)

A, B, C = "10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.1:7005"


def test_the_port_span_is_the_agents_own():
    assert faults.AGENT_PORT_SPAN == PORTS_PER_AGENT == max(PORT_OFFSETS.values()) + 1


def test_every_port_of_an_agent_maps_back_to_it_and_nothing_else_does():
    rules = faults.partition([[A], [B, C]])
    assert [rules.agent_of(f"10.0.0.1:{7000 + k}") for k in range(5)] == [A] * 5
    assert rules.agent_of("10.0.0.1:7005") == C
    assert rules.agent_of("10.0.0.1:6999") is None and rules.agent_of("10.0.0.3:7000") is None
    assert rules.agent_of("not-an-address") is None


def test_symmetric_partition_drops_both_ways_between_sides_only():
    rules = faults.partition([[A], [B, C]])
    assert rules.drop == {(A, B), (A, C), (B, A), (C, A)}
    assert rules.blocked("10.0.0.1:7001", "10.0.0.2:7001")          # A's Raft port to B's
    assert rules.blocked("10.0.0.2:7002", "10.0.0.1:7002")          # B's data port to A's
    assert not rules.blocked(B, C) and not rules.blocked(A, "10.0.0.1:7003")   # same side; same agent
    assert not rules.blocked(None, B) and not rules.blocked("10.9.9.9:1", A)   # unknown: never dropped


def test_one_way_partition_drops_only_what_the_first_side_sends():
    rules = faults.partition([[A], [B, C]], one_way=True)
    assert rules.drop == {(A, B), (A, C)}
    assert rules.blocked(A, B) and not rules.blocked(B, A)


def test_three_sides_are_cut_from_each_other():
    rules = faults.partition([[A], [B], [C]])
    assert len(rules.drop) == 6


@pytest.mark.parametrize("sides, why", [([[A]], "at least two"), ([[A], []], "at least two"),
                                        ([[A], [A, B]], "two sides")])
def test_bad_sides_are_refused_with_the_reason(sides, why):
    with pytest.raises(ValueError, match=why):
        faults.partition(sides)


def test_agents_whose_port_blocks_overlap_are_refused():
    with pytest.raises(ValueError, match="closer than 5 ports"):
        faults.partition([["h:7000"], ["h:7003"]])


@pytest.mark.parametrize("data", [[], {"drop": "x"}, {"drop": [["a:1"]]}, {"drop": [[1, 2]]}])
def test_a_malformed_rules_document_says_what_a_rule_is(data):
    with pytest.raises(ValueError, match="FROM"):
        faults.Rules.from_json(data)


def test_rules_round_trip_through_the_file_and_a_missing_file_drops_nothing(tmp_path):
    path = tmp_path / "faults.json"
    assert faults.read_rules(path).drop == frozenset()
    rules = faults.write_partition(path, [[A], [B]], one_way=True)
    assert faults.read_rules(path) == rules
    faults.heal(path)
    assert json.loads(path.read_text()) == {"drop": []}
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        faults.read_rules(path)


def test_the_watcher_sees_a_new_partition_and_the_heal_and_keeps_rules_over_a_broken_file(tmp_path):
    path = tmp_path / "faults.json"
    w = faults.Watcher(str(path), interval=0.0)
    assert not w.rules().blocked(A, B)
    faults.write_partition(path, [[A], [B]])
    assert w.rules().blocked(A, B)
    path.write_text("{half a fi")
    assert w.rules().blocked(A, B)              # a half-written file keeps the last rules
    faults.heal(path)
    assert not w.rules().blocked(A, B)


def test_process_rules_use_the_local_agent_for_an_address_the_hook_does_not_know(tmp_path):
    path = tmp_path / "faults.json"
    faults.write_partition(path, [[A], [B]])
    try:
        faults.watch(str(path))
        faults.set_local_agent(A)
        assert faults.blocked(None, B) and faults.cut(B, None)
        with pytest.raises(ConnectionRefusedError, match="partitioned from"):
            faults.refuse_connect(B)
        faults.refuse_connect("10.0.0.1:7004")      # this agent's own ports: never cut
        faults.watch(None)
        assert not faults.blocked(None, B)           # no rules file: nothing is dropped
    finally:
        faults.watch(None)
        faults.set_local_agent(None)


def test_the_cli_writes_and_heals_the_rules(tmp_path, capsys):
    path = tmp_path / "faults.json"
    assert main(["fault", "partition", str(path), "--side", A, "--side", f"{B},{C}", "--one-way"]) == 0
    assert faults.read_rules(path).drop == {(A, B), (A, C)}
    assert main(["fault", "heal", str(path)]) == 0
    assert faults.read_rules(path).drop == frozenset()
    with pytest.raises(SystemExit, match="at least two"):
        main(["fault", "partition", str(path), "--side", A])


def test_minority_progress_inside_a_window_is_evidence_and_outside_it_is_not():
    w = faults.Window(100.0, 110.0, frozenset({A}), frozenset({"p3"}))
    commits = [(100.2, "p3"), (101.0, "p0"), (105.0, "p3"), (111.0, "p3")]
    leaders = [(99.0, A), (104.0, B), (106.0, A)]
    found = faults.minority_violations([w], commits, leaders)
    assert found == ["minority peer p3 committed a step 5.00 s into a symmetric partition",
                     f"minority agent {A} became Raft leader 6.00 s into a symmetric partition"]
    assert faults.minority_violations([w], commits[:2] + commits[3:], leaders[:2]) == []

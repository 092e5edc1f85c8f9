"""p2pgen_lab.bench.breakdown on synthetic traces: the phases of a survivor add up to its fault -> first-commit
time, a fault is split on the survivor that committed last, a trace missing an event is not split, and the
agents' Raft marks split the wait for a new leader without changing the sum."""

from __future__ import annotations

import pytest

from p2pgen_lab.bench.breakdown import PHASES, fault_phases, format_phases, summarize_phases, survivor_phases

T0 = 1000.0


def _survivor(peer: str, offsets: list[float], generation: int = 7) -> list[dict]:
    """retire, ready (sent, back), active, connected, commit at T0 + the offsets."""
    retire, sent, back, active, connected, commit = (T0 + o for o in offsets)
    return [
        {"t": retire, "peer": peer, "event": "retire", "generation": generation - 1},
        {"t": back, "peer": peer, "event": "ready", "generation": generation, "sent": sent},
        {"t": active, "peer": peer, "event": "active", "generation": generation},
        {"t": connected, "peer": peer, "event": "connected", "generation": generation},
        {"t": commit, "peer": peer, "event": "commit", "generation": generation, "revision": 11},
    ]


def _events(*survivors: list[dict]) -> list[dict]:
    before = [{"t": T0 - 0.05, "peer": "p1", "event": "commit", "generation": 6, "revision": 10}]
    return sorted(before + [e for s in survivors for e in s], key=lambda e: e["t"])


def test_the_phases_of_a_survivor_add_up_to_its_first_commit():
    events = _events(_survivor("p1", [0.02, 0.025, 0.031, 0.040, 0.043, 0.080]))
    phases = survivor_phases(events, "p1", T0)
    assert phases is not None and list(phases) == list(PHASES)
    assert phases["detect"] == pytest.approx(0.02) and phases["vote_commit"] == pytest.approx(0.006)
    assert phases["first_step"] == pytest.approx(0.037)
    assert sum(phases.values()) == pytest.approx(0.080)


def test_raft_marks_split_the_wait_for_a_new_leader_and_keep_the_sum():
    """The leader died with the host: proof, election and the new leader's first commit come from the agents'
    Raft traces; a mark before the survivor retired, or after its vote left, adds nothing."""
    events = _events(_survivor("p1", [0.02, 0.300, 0.306, 0.310, 0.312, 0.350]))
    raft = [{"t": T0 + 0.010, "kind": "leader"},                  # before the retirement: another matter
            {"t": T0 + 0.100, "kind": "hasten"}, {"t": T0 + 0.180, "kind": "leader"},
            {"t": T0 + 0.190, "kind": "leader_commit"}, {"t": T0 + 0.400, "kind": "hasten"}]
    phases = survivor_phases(events, "p1", T0, raft)
    assert phases is not None and sum(phases.values()) == pytest.approx(0.350)
    assert phases["proof"] == pytest.approx(0.080) and phases["election"] == pytest.approx(0.080)
    assert phases["leader_commit"] == pytest.approx(0.010) and phases["proposal"] == pytest.approx(0.110)
    without = survivor_phases(events, "p1", T0)
    assert without is not None and without["proposal"] == pytest.approx(0.280)
    assert without["proof"] == without["election"] == without["leader_commit"] == 0.0


def test_a_vote_for_a_proposal_abandoned_meanwhile_is_part_of_the_wait_for_the_one_that_activated():
    """Seen in `bench recovery` after a leader-host kill: the survivors asked for a reform while the leader was
    replaced, voted for it, and the suspicion of the dead member abandoned it; the split used to stop at that
    first vote and skip the fault. It follows the vote for the generation of the next commit."""
    survivor = _survivor("p1", [0.02, 0.060, 0.066, 0.070, 0.073, 0.110], generation=8)
    abandoned = {"t": T0 + 0.030, "peer": "p1", "event": "ready", "generation": 7, "sent": T0 + 0.025}
    phases = survivor_phases(_events(survivor + [abandoned]), "p1", T0)
    assert phases is not None and sum(phases.values()) == pytest.approx(0.110)
    assert phases["proposal"] == pytest.approx(0.040) and phases["vote_commit"] == pytest.approx(0.006)


def test_a_fault_is_split_on_the_survivor_that_committed_last():
    events = _events(_survivor("p1", [0.02, 0.025, 0.031, 0.040, 0.043, 0.080]),
                     _survivor("p2", [0.01, 0.012, 0.150, 0.151, 0.152, 0.190]))
    phases = fault_phases(events, ["p1", "p2"], T0)
    assert phases is not None and sum(phases.values()) == pytest.approx(0.190)
    assert phases["vote_commit"] == pytest.approx(0.138)


def test_a_trace_without_the_new_events_is_not_split():
    events = [e for e in _events(_survivor("p1", [0.02, 0.025, 0.031, 0.040, 0.043, 0.080]))
              if e["event"] != "connected"]
    assert survivor_phases(events, "p1", T0) is None
    assert fault_phases(events, ["p1"], T0) is None
    assert "no fault could be split" in format_phases("split", summarize_phases([]))[0]


def test_the_summary_gives_each_phase_its_median_max_and_share():
    faults = [dict(zip(PHASES, (0.02, 0.0, 0.0, 0.0, 0.003, 0.006, 0.001, 0.002, 0.040))),
              dict(zip(PHASES, (0.03, 0.001, 0.002, 0.003, 0.005, 0.010, 0.003, 0.004, 0.050)))]
    summary = summarize_phases(faults)
    assert summary["detect"]["p50"] == pytest.approx(0.025) and summary["detect"]["max"] == pytest.approx(0.03)
    assert sum(s["share"] for s in summary.values()) == pytest.approx(1.0)
    table = format_phases("app SIGKILL", summary)
    assert table[0].split()[:2] == ["app", "SIGKILL"] and len(table) == 1 + len(PHASES)

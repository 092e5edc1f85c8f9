"""p2pgen_lab.bench.breakdown on synthetic traces: the phases of a survivor add up to its fault -> first-commit
time, a fault is split on the survivor that committed last, and a trace missing an event is not split."""

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
    faults = [dict(zip(PHASES, (0.02, 0.003, 0.006, 0.001, 0.002, 0.040))),
              dict(zip(PHASES, (0.03, 0.005, 0.010, 0.003, 0.004, 0.050)))]
    summary = summarize_phases(faults)
    assert summary["detect"]["p50"] == pytest.approx(0.025) and summary["detect"]["max"] == pytest.approx(0.03)
    assert sum(s["share"] for s in summary.values()) == pytest.approx(1.0)
    table = format_phases("app SIGKILL", summary)
    assert table[0].split()[:2] == ["app", "SIGKILL"] and len(table) == 1 + len(PHASES)

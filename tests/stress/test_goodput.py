"""The goodput of a stress run and its lost time by fault kind, on hand-written transcripts with exact figures:
a job committing 10 steps a second, a stall of known length after one fault, a reform whose every mark is
placed by hand."""

from __future__ import annotations

import pytest

from p2pgen.progress import Commit
from p2pgen_lab.stress import goodput

STEP = 0.1


def steady(start: float, end: float, first_revision: int, generation: int = 2,
           peers: tuple[str, ...] = ("p0", "p1", "p2")) -> list[Commit]:
    """Every peer commits one revision every STEP seconds in [start, end), in the middle of each step."""
    out, revision, t = [], first_revision, start + STEP / 2
    while t < end - 1e-9:
        out += [Commit(round(t, 6), p, 1, generation, revision, "d") for p in peers]
        revision, t = revision + 1, t + STEP
    return out


def test_goodput_is_the_progress_rate_with_faults_over_the_calm_rate_and_the_loss_sums_exactly():
    """Calm [0, 10): 10 steps/s. A kill at 12 stalls the job 1.5 s (no commit in [12, 13.55)); a pause at 16
    costs nothing. Faults window [10, 20): 85 steps, goodput 0.85; the kill owns 1.5 s, the pause 0."""
    commits = steady(0.0, 12.0, 0) + steady(13.5, 20.0, 120)
    faults = [goodput.FaultAt(12.0, "kill_app", ("p1",)), goodput.FaultAt(16.0, "pause", ("p2",))]
    g = goodput.measure(commits, faults, (0.0, 10.0), (10.0, 20.0))
    assert g.calm_rate == pytest.approx(10.0)
    assert g.ratio == pytest.approx(0.85)
    assert g.losses["kill_app"].lost_s == pytest.approx(1.5)
    assert g.losses["pause"].lost_s == pytest.approx(0.0, abs=1e-9)
    assert g.losses["before the first fault"].lost_s == pytest.approx(0.0, abs=1e-9)
    total = sum(v.lost_s for v in g.losses.values())
    assert total == pytest.approx(g.fault_s * (1 - g.ratio))


def test_a_redone_step_is_not_progress_twice():
    """A regression re-commits revisions 50-59 in (6, 7): the highest revision does not move, so that second
    of commits is a lost second."""
    commits = steady(0.0, 6.0, 0) + steady(6.0, 7.0, 50) + steady(7.0, 10.0, 60)
    progress = goodput.Progress(commits)
    assert progress.rate(6.0, 7.0) == pytest.approx(0.0)
    assert goodput.measure(commits, [goodput.FaultAt(6.0, "kill_app", ("p0",))], (0.0, 5.0),
                           (5.5, 10.0)).losses["kill_app"].lost_s == pytest.approx(1.0)


def event(peer: str, kind: str, generation: int, t: float, **fields) -> dict:
    return {"peer": peer, "incarnation": 1, "event": kind, "generation": generation, "t": t, **fields}


def activated(generation: int, members: list[str], t: float) -> dict:
    return {"kind": "activated", "generation": generation, "members": [[p, 1] for p in members], "t": t}


def test_a_reform_is_split_at_its_members_marks_and_owned_by_the_fault_that_removed_a_member():
    """p1's agent (the Raft leader's host) dies at 12.0 after the last commit at 11.95 (revision 119): p0 retires
    at 12.02, p2 at 12.03; a campaign is hastened at 12.04, a leader elected at 12.06 and commits at 12.07;
    votes leave at 12.08 / 12.09 and commit at 12.10 / 12.12; generation 3 activates at 12.13 and reaches p0 and
    p2 at 12.14 / 12.15; they commit revision 120 at 12.30. Phases: detection 0.07, election 0.05, proposal
    0.05, pull 0.01, activation 0.02, first step 0.15 less one calm step (0.1). The kill_app at 15.0 (no
    reform) owns none."""
    commits = steady(0.0, 12.0, 0) + steady(12.25, 20.0, 120, 3, ("p0", "p2"))
    events = [*(event(c.peer, "commit", c.generation, c.t) for c in commits),
              event("p0", "retire", 2, 12.02), event("p2", "retire", 2, 12.03),
              event("p0", "ready", 3, 12.10, sent=12.08), event("p2", "ready", 3, 12.12, sent=12.09),
              event("p0", "active", 3, 12.14), event("p2", "active", 3, 12.15)]
    raft = [activated(2, ["p0", "p1", "p2"], 1.0), activated(3, ["p0", "p2"], 12.13),
            {"kind": "hasten", "t": 12.04}, {"kind": "leader", "t": 12.06, "term": 2},
            {"kind": "leader_commit", "t": 12.07}]
    faults = [goodput.FaultAt(12.0, "kill_agent", ("p1",)), goodput.FaultAt(15.0, "kill_app", ("p0",))]
    g = goodput.measure(commits, faults, (0.0, 10.0), (11.0, 20.0), events, raft)
    kill = g.losses["kill_agent"]
    assert g.losses["kill_app"].reforms == [] and len(kill.reforms) == 1
    assert kill.reforms[0] == pytest.approx({"detection": 0.07, "election": 0.05, "proposal": 0.05, "pull": 0.01,
                                             "activation": 0.02, "first_step": 0.05})
    assert kill.outside_reforms() == pytest.approx(kill.lost_s - 0.25)


def test_a_reform_no_fault_explains_is_other_and_one_with_a_missing_mark_is_left_out():
    commits = steady(0.0, 12.0, 0) + steady(12.5, 14.0, 120, 3)
    events = [*(event(c.peer, "commit", c.generation, c.t) for c in commits),
              *(event(p, "retire", 2, 12.1) for p in ("p0", "p1", "p2")),
              *(event(p, "ready", 3, 12.2, sent=12.15) for p in ("p0", "p1", "p2")),
              *(event(p, "active", 3, 12.3) for p in ("p0", "p1", "p2"))]
    raft = [activated(2, ["p0", "p1"], 1.0), activated(3, ["p0", "p1", "p2"], 12.25)]
    faults = [goodput.FaultAt(11.0, "pause", ("p0",))]
    g = goodput.measure(commits, faults, (0.0, 10.0), (10.5, 14.0), events, raft)
    assert len(g.losses["other"].reforms) == 1                  # p2 joined; no fault targeted p2
    without_active = [e for e in events if not (e["event"] == "active" and e["peer"] == "p1")]
    g = goodput.measure(commits, faults, (0.0, 10.0), (10.5, 14.0), without_active, raft)
    assert "other" not in g.losses


def test_windows_without_a_reference_rate_are_refused():
    with pytest.raises(ValueError, match="empty window"):
        goodput.measure([], [], (5.0, 5.0), (6.0, 7.0))
    with pytest.raises(ValueError, match="no step committed"):
        goodput.measure(steady(8.0, 9.0, 0), [], (0.0, 5.0), (6.0, 9.0))


def test_the_table_has_a_row_per_kind_with_its_phases():
    commits = steady(0.0, 12.0, 0) + steady(13.5, 20.0, 120)
    g = goodput.measure(commits, [goodput.FaultAt(12.0, "kill_app", ("p1",))], (0.0, 10.0), (10.0, 20.0))
    lines = goodput.format_losses(g)
    assert lines[0].split()[:3] == ["fault", "kind", "faults"] and "first_step" in lines[0]
    assert lines[1].split()[:5] == ["kill_app", "1", "1.50", "100", "%"]

"""The checker on hand-written event logs: a serial history passes; each semantic failure gets its name."""

from __future__ import annotations

import pytest

from p2pgen_lab.chaos.checker import CONFUSION, DIVERGENT, DUPLICATED, LOST, check
from p2pgen_lab.chaos.model import reference_digests

pytestmark = pytest.mark.timeout(30)

STEPS = 4
D = reference_digests(STEPS + 2)
MEMBERS = [["a", 1], ["b", 1]]


def ev(t: float, event: str, peer: str, inc: int = 1, **kw) -> dict:
    return {"t": t, "event": event, "peer": peer, "incarnation": inc, **kw}


def serial(peers=("a", "b"), steps=STEPS, t0=0.0) -> list[dict]:
    out = [ev(t0, "start", p, source="initial", revision=0) for p in peers]
    out += [ev(t0 + 0.1, "activate", p, generation=1, revision=0, members=MEMBERS) for p in peers]
    for r in range(steps):
        for p in peers:
            out.append(ev(t0 + 1 + r, "contribute", p, generation=1, attempt=r, revision=r))
            out.append(ev(t0 + 1.5 + r, "apply", p, generation=1, attempt=r, revision=r, before=D[r], after=D[r + 1]))
    return out


def finals(revision: int = STEPS, digests=(None, None)) -> list[dict]:
    return [ev(100, "final", p, revision=revision, digest=d or D[revision]) for p, d in zip("ab", digests)]


def test_a_serial_history_passes_and_reports_its_throughput():
    v = check(serial() + finals(), [], STEPS)
    assert v.passed and v.failures == [] and v.final_revision == STEPS and v.steps_per_s > 0


def test_members_at_different_revisions_in_one_collective_is_a_duplicated_step():
    events = serial(steps=2)
    events += [ev(10, "contribute", "a", generation=1, attempt=2, revision=2),
               ev(10, "contribute", "b", generation=1, attempt=2, revision=1),
               ev(11, "apply", "a", generation=1, attempt=2, revision=2, before=D[2], after="x")]
    v = check(events + finals(3, ("x", "y")), [], STEPS)
    assert v.failures[0] == DUPLICATED and DIVERGENT in v.failures


def test_a_lagging_member_resumed_from_its_predecessors_snapshot_is_incarnation_confusion():
    events = serial(steps=2) + [ev(9, "start", "b", 2, source="snapshot", revision=1)]
    events += [ev(10, "contribute", "a", generation=2, attempt=0, revision=2),
               ev(10, "contribute", "b", 2, generation=2, attempt=0, revision=1),
               ev(11, "apply", "a", generation=2, attempt=0, revision=2, before=D[2], after="x")]
    assert check(events, [], STEPS).failures[0] == CONFUSION


def test_a_contributor_outside_the_certificate_is_incarnation_confusion():
    events = serial(steps=1) + [ev(5, "contribute", "b", 7, generation=1, attempt=1, revision=1)]
    assert CONFUSION in check(events + finals(1), [], STEPS).failures


def test_entering_a_generation_below_an_own_committed_revision_is_a_lost_committed_step():
    events = serial(steps=3) + [ev(20, "activate", "a", generation=2, revision=1, members=MEMBERS)]
    assert LOST in check(events + finals(3), [], STEPS).failures


def test_members_ending_apart_are_divergent_and_a_consequence_is_not_a_new_cause():
    events = serial(steps=2) + [ev(9, "apply", "b", generation=1, attempt=2, revision=2, before="z", after="w")]
    v = check(events + finals(2, (None, "w")), [], STEPS)
    assert v.failures == [DIVERGENT]


def test_no_member_finishing_is_divergent_unless_the_run_stalled():
    assert check(serial(), [], STEPS).failures == [DIVERGENT]
    stalled = check(serial(), [], STEPS, stalled=True)
    assert stalled.failures == [] and not stalled.passed


def test_recovery_latency_and_rollback_are_measured_from_each_injection():
    events = serial(steps=2)
    events += [ev(4.0, "inject", "a", kind="kill_app", point="after_commit", revision=2),
               ev(5.0, "activate", "b", generation=2, revision=1, members=MEMBERS),
               ev(6.0, "apply", "b", generation=2, attempt=0, revision=1, before=D[1], after=D[2])]
    v = check(events, [], STEPS)
    assert v.latencies == [2.0] and v.rollbacks == [1]

"""`bench recovery --only drain`: its figures from synthetic traces (no speed is asserted)."""

from __future__ import annotations

import pytest

from p2pgen_lab.bench.drain import KINDS, format_drain, step_time, summarize_drain, survivor_stall

pytestmark = pytest.mark.timeout(30)


def commit(peer: str, revision: int, t: float) -> dict:
    return {"event": "commit", "peer": peer, "revision": revision, "t": t, "generation": 1, "incarnation": 1}


def test_the_stall_is_the_longest_gap_of_a_survivor_around_the_fault():
    events = [commit("p0", r, r * 0.1) for r in range(1, 11)] + [commit("p1", r, r * 0.1 + 0.01) for r in range(1, 11)]
    events += [commit("p0", 11, 1.6), commit("p0", 12, 1.7), commit("p1", 11, 1.9), commit("p1", 12, 2.0)]
    assert survivor_stall(events, ["p0", "p1"], t0=1.05, revision=10) == pytest.approx(0.89)    # p1: 1.01 -> 1.9
    assert survivor_stall(events, ["p0"], t0=1.05, revision=10) == pytest.approx(0.6)
    assert step_time(events, before=1.05) == pytest.approx(0.1)


def test_the_table_puts_the_drain_beside_the_kill():
    records = [{"kind": k, "stall_s": s, "step_s": 0.1, "lost_s": s - 0.1, "to_first_commit_s": 0.3,
                "rollback_steps": 0, "gone_s": g}
               for k, s, g in (("drain", 0.2, 4.8), ("sigkill_host", 0.45, 0.02))]
    table = format_drain(summarize_drain(records), 1.0)
    assert list(summarize_drain(records)) == list(KINDS)
    assert "drain p50/max  sigkill_host p50/max" in table and "200/200" in table and "450/450" in table
    assert "time lost: that gap minus one step (ms)        1        100/100               350/350" in table

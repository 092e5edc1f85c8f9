"""p2pgen_lab.bench.heal: the heal of one kill and its phases, from synthetic traces, history and agent log."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from p2pgen_lab.bench.heal import PHASES, _launches, analyze, format_heal


def _cert(generation: int, members: list[tuple[str, int]], proposed: float, activated: float) -> dict:
    return {"generation": generation, "proposed_at": proposed, "activated_at": activated,
            "members": [{"peer_id": p, "incarnation": i} for p, i in members]}


def test_a_standby_heal_adds_up_phase_by_phase(tmp_path: Path) -> None:
    t0 = 1000.0
    events = [{"t": t0 + 0.05, "event": "joined", "process_start": t0 - 30, "join_called": t0 - 29,
               "promoted": t0 + 0.03, "standby": True},
              {"t": t0 + 0.07, "event": "ready"}, {"t": t0 + 0.09, "event": "pull"},
              {"t": t0 + 0.10, "event": "pulled"}, {"t": t0 + 0.12, "event": "active"},
              {"t": t0 + 0.17, "event": "commit"}]
    (tmp_path / "p0-2.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    history = [{"outcome": "activated", "certificate": _cert(2, [("p0", 1), ("p1", 1)], t0 - 9, t0 - 8)},
               {"outcome": "activated", "certificate": _cert(3, [("p1", 1)], t0, t0 + 0.01)},
               {"outcome": "activated", "certificate": _cert(4, [("p1", 1), ("p0", 2)], t0 + 0.06, t0 + 0.12)}]
    record = analyze({"mode": "standby", "peer": "p0", "incarnation": 1, "new_incarnation": 2, "t": t0},
                     tmp_path, history, {("p0", 2): (t0 + 0.02, 42)})
    assert abs(record["heal"] - 0.17) < 1e-9 and record["standby_used"] and record["process_started_before_kill"]
    assert abs(sum(record["phases"].values()) - record["heal"]) < 1e-9
    assert abs(record["phases"]["retire"] - 0.01) < 1e-9 and abs(record["phases"]["launch"] - 0.01) < 1e-9
    assert record["generation"] == 4
    result = {"modes": {m: {"heal": {"n": 1, "p50": 0.17, "max": 0.17}, "phases": record["phases"]}
                        for m in ("standby", "plain")}, "target_s": 0.5, "step_delay": 0.02}
    table = format_heal(result)
    assert all(p in table for p in PHASES) and "--standby 1" in table


def test_the_agent_log_gives_when_each_incarnation_was_started_or_promoted(tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    log.write_text("2026-01-02 03:04:05,250 p2pgen.agent.agent INFO started application pid 11 as p0#1\n"
                   "2026-01-02 03:04:09,500 p2pgen.agent.agent INFO promoted standby pid 12 to p0#2\n"
                   "2026-01-02 03:04:09,600 p2pgen.agent.agent INFO registered p0#2\n")
    launches = _launches(log)
    assert launches[("p0", 2)] == (datetime(2026, 1, 2, 3, 4, 9, 500000).timestamp(), 12)
    assert launches[("p0", 1)][1] == 11 and len(launches) == 2

"""CI smoke run of `p2pgen chaos --smoke`: two fixed schedules on real agents, certified and comm-only.

Certified recovery must have no semantic failure; comm-only (no frontier agreement) must have at least
one, otherwise the benchmark does not discriminate. No run of either policy may show a Raft safety
violation in the agents' traces. Runs the real CLI entry point.
"""

from __future__ import annotations

import json

import pytest

from p2pgen.cli import main

pytestmark = pytest.mark.timeout(170)


def test_smoke_certified_passes_and_comm_only_fails(capsys, tmp_path):
    code = main(["chaos", "--smoke", "--json", "--keep", str(tmp_path)])
    out = json.loads(capsys.readouterr().out)
    rows = {r["policy"]: r for r in out["summary"]}
    failed = [r for r in out["runs"] if r["policy"] == "certified" and not r["passed"]]
    assert code == 0 and rows["certified"]["semantic_failures"] == 0, failed
    assert rows["certified"]["injections"] == 4 and rows["certified"]["stalled"] == 0
    unsafe = [(r["policy"], r["raft"]["examples"]) for r in out["runs"] if not r["raft"]["passed"]]
    assert not unsafe and all(sum(row["raft_violations"].values()) == 0 for row in rows.values()), unsafe
    assert rows["comm-only"]["semantic_failures"] >= 1, out["runs"]
    assert set(rows["comm-only"]["failure_names"]) <= {"duplicated step", "incarnation confusion",
                                                        "lost committed step", "divergent state"}

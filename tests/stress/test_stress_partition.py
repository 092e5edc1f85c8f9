"""`p2pgen stress --kinds partition`: 5 agents training examples/train_spot.py while minorities of 1 or 2 agents
are cut off (both ways or one way) and healed after 1-10 s. Passes only under the usual pass rule of `p2pgen
stress` plus the partition rule: no minority committed a step or elected a Raft leader while cut off."""

from __future__ import annotations

import json

import pytest

from p2pgen.cli import main

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def test_partitions_of_a_minority_are_survived_and_the_minority_makes_no_progress_alone(capsys, tmp_path):
    code = main(["stress", "--agents", "5", "--duration", "15", "--seed", "3", "--kinds", "partition", "--json",
                 "--settle-timeout", "150",
                 "--keep", str(tmp_path)])
    report = json.loads(capsys.readouterr().out)
    kinds = [a["kind"] for a in report["actions"]]
    assert "partition" in kinds and set(kinds) <= {"partition", "none"}
    assert code == 0 and report["passed"], "\n".join(report["failures"]) + f"\nrun directory: {tmp_path}"
    assert sum(report["violations"].values()) == 0
    assert len(set(report["final_digests"].values())) == 1

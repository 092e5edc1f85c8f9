"""The partition fault kinds of `p2pgen chaos`: `partition`, `partition_one_way` and `partition_majority`.

Unit level: generated schedules inject all three kinds with a heal time of 1-10 s. Integration: one schedule of the
three kinds under the certified policy on real agents: 0 semantic failures, no progress of a cut-off minority, 0
Raft-checker violations.
"""

from __future__ import annotations

from collections import Counter

import pytest

from p2pgen.raft import checker as raft_checker
from p2pgen_lab.chaos import checker, runner
from p2pgen_lab.chaos.schedule import PARTITIONS, Injection, Schedule, generate

pytestmark = pytest.mark.timeout(60)


def test_generated_schedules_inject_every_partition_kind_healed_after_1_to_10_s():
    injections = [i for s in generate(2, 40, 6) for i in s.injections]
    kinds = Counter(i.kind for i in injections)
    assert all(kinds[k] > 0 for k in PARTITIONS)
    assert all(1.0 <= i.heal_s <= 10.0 for i in injections if i.kind in PARTITIONS)
    assert all(i.heal_s == 0.0 for i in injections if i.kind not in PARTITIONS)


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_partitions_on_either_side_and_one_way_are_survived_and_the_minority_makes_no_progress(tmp_path):
    schedule = Schedule(0, 0, 4, 160, (Injection("partition", "before_allreduce", "p1", 4, heal_s=2.0),
                                       Injection("partition_one_way", "after_commit", "p2", 60, heal_s=2.0),
                                       Injection("partition_majority", "between_buckets", "p3", 120, heal_s=2.0)))
    result = runner.run(schedule, "certified", tmp_path, runner.RunConfig(step_delay=0.03, timeout=200.0))
    verdict = checker.check(result.events, result.history, schedule.steps, result.stalled)
    raft = raft_checker.check_dir(tmp_path / "traces")
    assert verdict.injections == 3, result.harness
    assert verdict.passed, (verdict.failures, verdict.evidence[:5], result.harness, str(tmp_path))
    assert len(result.windows) >= 2, result.harness        # a request while one is open is dropped (noted)
    assert {w.one_way for w in result.windows} <= {False, True}
    assert runner.partition_findings(result) == [], str(tmp_path)
    assert raft.passed and raft.evidence, raft.render()

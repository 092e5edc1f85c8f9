"""CI smoke run of `p2pgen chaos --smoke --sharded`: the sharded mini-training on real agents under the
repartition faults (a source killed mid-shard, a stale replica, a reused rank starting from another rank's
shards). Certified must have no semantic failure and no Raft violation; the faults must have fired; and the
same run's real logs, doctored so that one member exposes a shard of the previous revision after an
activation, must be named `mismatched shard version` (the checker can fail on real traces)."""

from __future__ import annotations

import json

import pytest

from p2pgen.cli import main
from p2pgen_lab.chaos.checker import MISMATCHED_SHARD, check
from p2pgen_lab.chaos.model import SHARDED, reference_shard_digests
from p2pgen_lab.chaos.runner import read_events

pytestmark = [pytest.mark.timeout(200), pytest.mark.slow]


def test_sharded_smoke_certified_passes_and_a_doctored_shard_is_named(capsys, tmp_path):
    code = main(["chaos", "--smoke", "--sharded", "--json", "--keep", str(tmp_path)])
    out = json.loads(capsys.readouterr().out)
    row = {r["policy"]: r for r in out["summary"]}["certified"]
    failed = [r for r in out["runs"] if not r["passed"]]
    assert code == 0 and row["semantic_failures"] == 0 and row["stalled"] == 0, failed
    assert not [r["raft"]["examples"] for r in out["runs"] if not r["raft"]["passed"]]
    fired = {i["kind"] for r in out["runs"] for i in r["schedule"]["injections"]}
    assert {"kill_shard_source", "stale_replica", "reuse_rank"} <= fired and row["injections"] >= 4, out["runs"]

    run_dir = tmp_path / "certified-0000"
    events = read_events(run_dir / "logs")
    later = [e for e in events if e["event"] == "activate" and e["revision"] > 0 and e["shards"][SHARDED]]
    assert later, "no activation after a repartition was logged"
    doctored = later[-1]
    index = next(iter(doctored["shards"][SHARDED]))
    doctored["shards"][SHARDED][index] = reference_shard_digests(doctored["revision"])[doctored["revision"] - 1][
        int(index)]
    verdict = check(events, [], out["runs"][0]["schedule"]["steps"])
    assert MISMATCHED_SHARD in verdict.failures
    assert f"it is shard {index} of revision {doctored['revision'] - 1}" in " ".join(verdict.evidence)

"""catchup_throughput: a real pull beside raw TCP of the same bytes, from as many source processes."""

from __future__ import annotations

import pytest

from p2pgen_lab.bench.catchup import catchup_throughput


@pytest.mark.timeout(60)
def test_catchup_throughput_pulls_every_byte_from_every_source():
    r = catchup_throughput(4 << 20, sources=2, chunk_bytes=256 << 10, rounds=2)
    assert sum(r["bytes_by_source"].values()) == 4 << 20 and set(r["bytes_by_source"]) <= {"src0", "src1"}
    assert r["pull_GBps"] > 0 and r["raw_GBps"] > 0 and r["rounds"] == 2
    assert 0 < r["ratio_min"] <= r["pull_over_raw"] <= r["ratio_max"]     # the median of the per-round ratios


def test_catchup_throughput_refuses_no_source_or_no_round():
    with pytest.raises(ValueError, match="must be >= 1"):
        catchup_throughput(1 << 20, sources=0)
    with pytest.raises(ValueError, match="must be >= 1"):
        catchup_throughput(1 << 20, rounds=0)

"""The device check's arithmetic and table (the GPU runs themselves are in tests/gpu)."""

from __future__ import annotations

import pytest

from p2pgen_lab.bench import gpu_check

pytestmark = pytest.mark.timeout(10)


def test_rows_take_the_slowest_member_and_compare_busbw_to_raw_nccl():
    members = [{"rows": [{"size": 1 << 30, "raw_s": 0.010, "staged_s": 0.012, "direct_s": 0.0102}]},
               {"rows": [{"size": 1 << 30, "raw_s": 0.011, "staged_s": 0.013, "direct_s": 0.0101}]}]
    (row,) = gpu_check._rows(4, members)
    assert row["raw_s"] == 0.011 and row["staged_s"] == 0.013 and row["direct_s"] == 0.0102
    assert row["raw_busbw"] == pytest.approx((1 << 30) / 0.011 / 1e9 * 1.5)
    assert row["ratio_direct"] == pytest.approx(0.011 / 0.0102)
    table = gpu_check.format_table(4, [row])
    assert "raw nccl" in table and "p2pgen staged" in table
    assert table.splitlines()[-1].split()[-1] == f"{0.011 / 0.0102:.3f}"
    assert gpu_check.busbw(1, 10**9, 1.0) == pytest.approx(1.0)


def test_without_cupy_nccl_the_check_says_it_skipped_and_why(monkeypatch, capsys):
    def unavailable():
        raise gpu_check.NcclUnavailable("CuPy is not importable (No module named 'cupy')")

    monkeypatch.setattr(gpu_check, "_load", unavailable)
    assert gpu_check.main(["--json"]) == 0
    said = capsys.readouterr().out
    assert '"skipped"' in said and "No module named 'cupy'" in said
    assert gpu_check.main([]) == 0
    assert capsys.readouterr().out.startswith("# GPU part skipped: no CuPy NCCL on this machine: CuPy is not")

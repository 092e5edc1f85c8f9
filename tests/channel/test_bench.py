"""`p2pgen bench channel`: argument checks and the tables' arithmetic (no speed figure is asserted;
the real runs are exercised by test_faults.py through the same harness)."""

from __future__ import annotations

import pytest

from p2pgen import cli
from p2pgen_lab.bench.channel import Throughput, format_faults, format_throughput
from p2pgen_lab.rigs.channels import Cell


def test_fault_table_divides_by_recoveries_and_sums_per_mode():
    cells = [Cell("naive", "F1", 16, 10, triggers=8, sent=900, losses=16, duplicates=4),
             Cell("exactly_once", "F1", 16, 10, triggers=10, sent=800),
             Cell("exactly_once", "F3", 16, 10, triggers=3, sent=700)]
    table = format_faults(cells, window=32)
    f1 = next(line for line in table.splitlines() if line.split()[:2] == ["F1", "16"])
    assert f1.split()[2:8] == ["10", "8", "4", "16", "0.50", "2.00"]
    assert "# exactly_once: 20 injected faults, 13 recoveries, 0 duplicates, 0 losses" in table


def test_dedup_overhead_is_the_ratio_of_medians():
    row = Throughput(16, 1000, naive=[100.0, 300.0, 200.0], exactly_once=[196.0, 99.0, 294.0])
    assert row.ratio == pytest.approx(0.98)
    assert "0.980" in format_throughput([row])


@pytest.mark.parametrize("argv", [["--sizes", "12"], ["--window", "8"], ["--injections", "-1"]])
def test_cli_refuses_bad_arguments(argv):
    with pytest.raises(SystemExit, match="p2pgen bench channel"):
        cli.main(["bench", "channel", *argv])

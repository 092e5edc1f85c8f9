"""I6 on real processes: receiver SIGKILLed and restarted (F1), sender aborting itself (F2), receiver
SIGSTOPped (F3). Exactly-once mode must end with 0 losses and 0 duplicates per the receiver's
consumption log; naive and batched modes must show errors under the same faults, proving the harness
sees them. The benchmark (`p2pgen bench channel`) runs the full number of injections."""

from __future__ import annotations

import pytest

from p2pgen_lab.rigs.channels import run_cell


@pytest.mark.parametrize("fault, size, injections", [("F1", 16, 3), ("F2", 65536, 6)])
def test_exactly_once_has_no_loss_and_no_duplicate(fault, size, injections):
    cell = run_cell("exactly_once", fault, size, injections, seed=1)
    assert cell.triggers == injections
    assert (cell.losses, cell.duplicates, cell.corrupt_consumed) == (0, 0, 0)
    assert cell.sent > 0


def test_exactly_once_survives_receiver_pauses_past_the_stall_timeout():
    cell = run_cell("exactly_once", "F3", 16, 2, seed=2, pause=(0.7, 0.8))
    assert cell.triggers >= 1
    assert (cell.losses, cell.duplicates, cell.corrupt_consumed) == (0, 0, 0)


@pytest.mark.parametrize("mode", ["naive", "batched"])
def test_trusting_completion_loses_or_duplicates(mode):
    cell = run_cell(mode, "F2", 16, 6, seed=3)
    assert cell.triggers == 6
    assert cell.losses + cell.duplicates > 0
    assert cell.corrupt_consumed == 0

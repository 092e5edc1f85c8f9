"""The consumption log: replay after reopen, torn tails, repeats, compaction, one holder (I6)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pgen.channel.log import RECORD_BYTES, ConsumedSet, ConsumptionLog, LogBusy, channel_path, scan


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=60), max_size=80))
def test_consumed_set_agrees_with_a_plain_set(numbers):
    fast, plain = ConsumedSet(), set()
    for n in numbers:
        assert fast.add(n) == (n not in plain)
        plain.add(n)
    assert len(fast) == len(plain)
    assert all((n in fast) == (n in plain) for n in range(70))
    w, above = fast.snapshot()
    assert set(range(w)) | set(above) == plain and w not in plain


def _path(tmp_path):
    return channel_path(str(tmp_path), "job/x", "node1/gpu0", "node2/gpu1")


def test_log_survives_reopen_with_owner_and_numbers(tmp_path):
    path = _path(tmp_path)
    log = ConsumptionLog(path)
    log.set_owner(3, 7)
    for seq in (0, 1, 2, 5):
        assert log.consume(seq)
    log.close()
    again = ConsumptionLog(path)
    assert again.consumed.snapshot() == (3, [5])
    assert again.owner == (3, 7)
    again.close()


def test_torn_tail_is_cut_never_read_as_a_record(tmp_path):
    path = _path(tmp_path)
    log = ConsumptionLog(path)
    for seq in range(4):
        log.consume(seq)
    log.close()
    with open(path, "r+b") as f:      # the last record's checksum no longer matches, and half a record follows
        f.seek(3 * RECORD_BYTES + 8)
        f.write(b"\xff")
        f.seek(0, os.SEEK_END)
        f.write(b"P2CL" + b"\x01" * 10)
    again = ConsumptionLog(path)
    assert again.consumed.snapshot() == (3, [])
    assert os.path.getsize(path) == 3 * RECORD_BYTES
    again.consume(3)
    again.close()
    assert scan(path).consumed.snapshot() == (4, [])


def test_repeated_consumption_is_recorded_and_counted(tmp_path):
    path = _path(tmp_path)
    log = ConsumptionLog(path)
    assert log.consume(0) and log.consume(1)
    assert not log.consume(0)
    log.close()
    state = scan(path)
    assert (state.repeats, len(state.consumed)) == (1, 2)


def test_compaction_keeps_numbers_owner_and_repeats(tmp_path):
    path = _path(tmp_path)
    log = ConsumptionLog(path, compact_records=8)
    log.set_owner(2, 9)
    for seq in list(range(12)) + [30, 31, 4]:
        log.consume(seq)
    log.close()
    state = scan(path)
    assert state.consumed.snapshot() == (12, [30, 31])
    assert (state.owner, state.repeats) == ((2, 9), 1)
    assert state.records < 8


def test_one_process_holds_a_channel_log(tmp_path):
    path = _path(tmp_path)
    first = ConsumptionLog(path)
    with pytest.raises(LogBusy):
        ConsumptionLog(path)
    first.close()
    ConsumptionLog(path).close()

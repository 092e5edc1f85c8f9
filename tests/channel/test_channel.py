"""Channels on loopback, in one process: order, window, takeover by generation and by incarnation,
dedup, torn and stale frames, admission. Faults on real processes are in test_faults.py."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from p2pgen.channel import ChannelConfig, scan
from p2pgen.errors import Evicted, PeerLost, ProtocolError


def _take(rx, n: int, timeout: float = 5.0) -> list[int]:
    seqs = []
    for _ in range(n):
        msg = rx.receive(timeout)
        assert msg is not None, f"only {seqs} arrived"
        seqs.append(msg.seq)
        msg.consumed()
    return seqs


def _wait(predicate, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.005)


def _log(rig):
    return scan(rig.rx._log.path)


def test_messages_arrive_in_order_once_and_are_logged(rig):
    ch = rig.channel()
    sender = threading.Thread(target=lambda: [ch.send(i.to_bytes(8, "little")) for i in range(100)])
    sender.start()
    got = []
    for _ in range(100):
        msg = rig.rx.receive(5)
        got.append((msg.seq, int.from_bytes(msg.payload, "little")))
        msg.consumed()
    sender.join(5)
    assert got == [(i, i) for i in range(100)]
    assert ch.flush(5)
    assert rig.rx.consumed_numbers() == (100, [])
    assert _log(rig).repeats == 0


def test_arrays_keep_dtype_and_shape(rig):
    ch = rig.channel()
    sent = np.arange(24, dtype=np.float16).reshape(2, 3, 4)
    ch.send(sent)
    msg = rig.rx.receive(5)
    assert msg.array().dtype == np.float16 and np.array_equal(msg.array(), sent)
    msg.consumed()


def test_window_bounds_what_the_sender_holds(rig):
    ch = rig.channel()
    for _ in range(32):
        ch.send(b"x")
    with pytest.raises(TimeoutError):
        ch.send(b"x", timeout=0.3)        # nothing consumed: exactly_once completion never came
    assert ch.stats()["in_flight"] == 32
    _take(rig.rx, 1)
    ch.send(b"x", timeout=5)


def test_one_message_in_hand_at_a_time(rig):
    ch = rig.channel()
    ch.send(b"a")
    ch.send(b"b")
    msg = rig.rx.receive(5)
    with pytest.raises(ProtocolError):
        rig.rx.receive(1)
    msg.consumed()
    with pytest.raises(ProtocolError):
        msg.consumed()


def test_generation_change_resends_exactly_the_numbers_the_log_lacks(rig):
    ch = rig.channel()
    for i in range(10):
        ch.send(bytes([i]))
    assert _take(rig.rx, 4) == [0, 1, 2, 3]
    _wait(lambda: rig.listener.stats()["delivered"] == 10)      # 4..9 delivered, not consumed
    ch.on_generation(1)
    assert ch.stats()["resent"] == 6
    assert _take(rig.rx, 6) == [4, 5, 6, 7, 8, 9]
    assert ch.flush(5)
    assert rig.listener.stats()["purged"] == 6
    state = _log(rig)
    assert state.consumed.snapshot() == (10, []) and state.repeats == 0
    assert state.owner == (1, 1)


def test_naive_mode_loses_what_was_delivered_but_not_consumed(rig):
    ch = rig.channel(mode="naive")
    for i in range(10):
        ch.send(bytes([i]))
    assert _take(rig.rx, 4) == [0, 1, 2, 3]
    _wait(lambda: ch.stats()["in_flight"] == 0)          # naive completion: all 10 delivered
    ch.on_generation(1)
    assert ch.stats()["resent"] == 0
    assert rig.rx.receive(0.3) is None
    assert rig.rx.consumed_numbers() == (4, [])              # 4..9 are lost


def test_batched_mode_completes_sixteen_at_a_time(rig):
    ch = rig.channel(mode="batched")
    for i in range(20):
        ch.send(bytes([i]))
    _wait(lambda: ch.stats()["completed"] == 16)
    time.sleep(0.1)
    assert ch.stats()["in_flight"] == 4                       # the open batch waits for its end
    assert ch.flush(5) and ch.stats()["completed"] == 20


def test_new_sender_incarnation_takes_over_after_the_message_in_hand(rig):
    old = rig.channel(incarnation=1)
    for i in range(10):
        old.send(bytes([i]))
    assert _take(rig.rx, 3) == [0, 1, 2]
    in_hand = rig.rx.receive(5)                              # number 3, stamped by incarnation 1
    new = rig.channel(incarnation=2, generation=1)
    resume = []
    t = threading.Thread(target=lambda: resume.append(new.resume_seq))
    t.start()
    time.sleep(0.2)
    assert not resume                                        # the takeover waits for the message in hand
    in_hand.consumed()
    t.join(5)
    assert resume == [4]
    for i in range(resume[0], 8):
        new.send(bytes([i]))
    msg = rig.rx.receive(5)
    assert (msg.seq, msg.incarnation) == (4, 2)              # incarnation 1's queued 4..9 were purged
    msg.consumed()
    assert _take(rig.rx, 3) == [5, 6, 7]
    with pytest.raises(Evicted):                             # the old incarnation is fenced off for good
        for _ in range(40):
            old.send(b"late", timeout=5)
    assert rig.listener.stats()["superseded"] >= 1
    state = _log(rig)
    assert state.consumed.snapshot() == (8, []) and state.repeats == 0


def test_restarted_sender_skips_numbers_the_log_holds(rig):
    ch = rig.channel(incarnation=1)
    for i in range(5):
        ch.send(bytes([i]))
    _take(rig.rx, 5)
    ch.close()
    again = rig.channel(incarnation=2, generation=1)
    assert again.resume_seq == 5


def test_old_generation_dialer_is_refused(rig):
    _ = rig.channel(incarnation=1, generation=5).resume_seq
    stale = rig.channel(incarnation=1, generation=3, config=ChannelConfig(connect_timeout=0.5))
    with pytest.raises(PeerLost):
        _ = stale.resume_seq
    assert rig.listener.stats()["stale_generation"] >= 1


def test_wrong_secret_never_connects(rig):
    ch = rig.channel(secret=b"not-the-secret-0123456789abcdef!", config=ChannelConfig(connect_timeout=0.5))
    with pytest.raises(PeerLost):
        _ = ch.resume_seq
    assert rig.listener.stats()["auth_failed"] >= 1


@pytest.mark.parametrize("mode, handed_out", [("exactly_once", 1), ("naive", 2)])
def test_a_resend_of_a_consumed_number(rig, mode, handed_out):
    rogue = rig.rogue(mode=mode)
    rogue.send(rogue.frame(0, b"once"))
    rogue.send(rogue.frame(0, b"once"))
    fresh = []
    while (msg := rig.rx.receive(0.3)) is not None:
        fresh.append(msg.consumed())
    assert fresh == [True, False][:handed_out]
    assert rig.listener.stats()["duplicates_dropped"] == 2 - handed_out


def test_torn_frame_is_detected_and_never_consumed(rig):
    rogue = rig.rogue()
    new, old = rogue.frame(0, b"N" * 4096), rogue.frame(0, b"O" * 4096)
    rogue.send(new[:len(new) // 2] + old[len(old) // 2:])    # header and first half new, second half old
    assert rig.rx.receive(0.3) is None
    assert rig.listener.stats()["bad_checksum"] == 1
    ch = rig.channel(incarnation=1, generation=1)            # the slot it used is empty and reusable
    ch.send(b"whole")
    msg = rig.rx.receive(5)
    assert bytes(msg.payload) == b"whole"
    msg.consumed()


def test_truncated_frame_is_never_consumed(rig):
    rogue = rig.rogue()
    data = rogue.frame(0, b"z" * 4096)
    rogue.send(data[:len(data) - 100])
    rogue.sock.close()
    _wait(lambda: rig.listener.stats()["truncated"] == 1)
    assert rig.rx.receive(0.2) is None


def test_frame_with_another_generation_is_dropped_and_counted(rig):
    rogue = rig.rogue(generation=2)
    rogue.send(rogue.frame(0, b"old", generation=1))
    rogue.send(rogue.frame(1, b"new"))
    msg = rig.rx.receive(5)
    assert (msg.seq, bytes(msg.payload)) == (1, b"new")
    msg.consumed()
    assert rig.listener.stats()["stale_generation"] == 1

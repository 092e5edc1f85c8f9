"""Fuzzing the agent's UDP heartbeat listener (p2pgen.agent.heartbeat.HeartbeatRunner).

Two real runners hear each other on loopback; an attacker sends the target Hypothesis bytes, signed
garbage, truncated and oversized packets, a heartbeat of another job, and replays: genuine packets of
the honest peer (captured on a tap it also beats to), an older heartbeat of a process, a heartbeat of a
process already replaced at its address, and the target's own heartbeat. Each packet is dropped and
counted once under a reason; no replay changes what the target believes; the honest peer's next
announcement is still taken; stopping both runners leaves no thread or fd behind.
"""

from __future__ import annotations

import itertools
import socket

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2pgen.agent.heartbeat import MAX_PACKET, REASONS, Announcement, HeartbeatRunner
from p2pgen.auth import derive_key, prove
from p2pgen.detect import DetectorConfig
from tests.fuzz.conftest import FUZZ, MSGPACK_INTEGERS, bind_free_port, total, wait_until

pytestmark = pytest.mark.timeout(60)

JOB, SECRET = "fuzz-heartbeat", b"fuzz-heartbeat-secret-0123456789"
KEY = derive_key(SECRET, JOB, "heartbeat")
# A patient detector: on a loaded machine the honest peer must never be suspected during a test.
CONFIG = DetectorConfig(kind="fixed", timeout=10.0, floor=5.0, heartbeat_interval=0.01)


def signed(body: bytes, key: bytes = KEY) -> bytes:
    return body + prove(key, body)


def heartbeat(sender: str, seq: int, instance: str, job: str = JOB, key: bytes = KEY) -> bytes:
    return signed(msgpack.packb([job, sender, seq, instance, "", False, [], []]), key)


class Rig:
    def __init__(self) -> None:
        self.tap = bind_free_port(self._udp)
        self.tap.settimeout(5.0)
        self.marks = itertools.count()
        self.mark = "n0"
        self.replaced: list[tuple[str, str, str]] = []
        self.suspects: list[str] = []
        self.target = bind_free_port(lambda port: self._runner(port, lambda: {self.peer_addr},
                                                               lambda: Announcement("target", "", False)))
        self.peer_addr = ""
        self.peer = bind_free_port(lambda port: self._runner(port, lambda: {self.target.self_addr, self.tap_addr},
                                                             lambda: Announcement("peer", self.mark, False)))
        self.peer_addr = self.peer.self_addr
        self.tap_addr = f"127.0.0.1:{self.tap.getsockname()[1]}"
        self.out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.target.start()
        self.peer.start()
        self.honest_served()

    @staticmethod
    def _udp(port: int) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.close()
            raise
        return s

    def _runner(self, port: int, targets, announce) -> HeartbeatRunner:
        return HeartbeatRunner("127.0.0.1", port, KEY, JOB, f"127.0.0.1:{port}", CONFIG, targets,
                               lambda peer, inst, why: self.suspects.append(peer), announce,
                               lambda addr, old, new: self.replaced.append((addr, old, new)))

    def send(self, packet: bytes) -> None:
        self.out.sendto(packet, ("127.0.0.1", int(self.target.self_addr.rpartition(":")[2])))

    def refused(self) -> int:
        return total(self.target.refusals())

    def attack(self, packet: bytes, reasons: tuple[str, ...] = REASONS) -> str:
        """Send one packet; it must be dropped and counted once, under one of `reasons`. Returns the reason."""
        before = self.target.refusals()
        self.send(packet)
        wait_until(lambda: self.refused() == total(before) + 1, what="the dropped heartbeat to be counted")
        after = self.target.refusals()
        (reason,) = [r for r in after if after[r] != before[r]]
        assert reason in reasons, (reason, reasons)
        return reason

    def honest_served(self) -> None:
        """The honest peer announces something new; the target must take it."""
        self.mark = f"n{next(self.marks)}"
        wait_until(lambda: self.target.heard().get(self.peer_addr, Announcement("", "", False)).node == self.mark,
                   what=f"the honest peer's announcement {self.mark} to be heard")
        assert self.peer_addr not in self.target.suspected()

    def close(self) -> None:
        self.peer.stop()
        self.target.stop()
        self.tap.close()
        self.out.close()


@pytest.fixture
def rig(no_leaks):
    r = Rig()
    try:
        yield r
    finally:
        r.close()


@FUZZ
@given(data=st.binary(max_size=300))
def test_random_bytes_are_dropped_as_forged(rig, data):
    rig.attack(data, ("forged",))
    rig.honest_served()


@FUZZ
@given(body=st.binary(min_size=1, max_size=200))
def test_signed_garbage_is_dropped_as_malformed(rig, body):
    rig.attack(signed(body), ("malformed",))
    rig.honest_served()


@FUZZ
@given(job=st.one_of(st.none(), st.integers(-2**63, 2**64 - 1), st.text(max_size=10)), sender=st.one_of(
    st.none(), st.booleans(), st.binary(max_size=8), st.text(max_size=20)), seq=st.one_of(
    st.none(), st.text(max_size=3), st.floats(allow_nan=True)), instance=st.one_of(
    st.none(), st.integers(-2**63, 2**64 - 1), st.lists(st.booleans())))
def test_signed_heartbeats_with_wrong_field_types_are_dropped(rig, job, sender, seq, instance):
    rig.attack(signed(msgpack.packb([job, sender, seq, instance, None, 3, [], []])), ("malformed", "wrong_job"))
    rig.honest_served()


def test_truncated_oversized_and_other_job_heartbeats_are_dropped(rig):
    good = heartbeat("127.0.0.1:1", 1, "x")
    for cut in (0, 1, 31, 32, 33, len(good) - 1):
        if cut:
            rig.attack(good[:cut], ("forged",))
    rig.attack(good + b"\0" * (MAX_PACKET + 1 - len(good)), ("oversized",))
    rig.attack(heartbeat("127.0.0.1:1", 1, "x", job="other-job"), ("wrong_job",))     # signed with our key
    other_key = derive_key(SECRET, "other-job", "heartbeat")
    rig.attack(heartbeat("127.0.0.1:1", 1, "x", job="other-job", key=other_key), ("forged",))
    rig.honest_served()
    assert not rig.replaced


def test_captured_heartbeats_of_the_honest_peer_replayed_change_nothing(rig):
    captured = [rig.tap.recvfrom(MAX_PACKET)[0] for _ in range(3)]
    rig.honest_served()            # the peer moved on: every captured packet is older than its last one
    for packet in captured:
        rig.attack(packet, ("replayed",))
    assert rig.target.heard()[rig.peer_addr].node == rig.mark
    rig.honest_served()


def test_a_replayed_heartbeat_of_a_replaced_process_does_not_report_the_new_one_replaced(rig):
    stand_in = bind_free_port(rig._udp)      # holds the sender's port, as a live agent would, and says nothing: an
    addr = f"127.0.0.1:{stand_in.getsockname()[1]}"   # unheld port would refuse the target's probes (reported)
    try:
        _replaced_process_replayed(rig, addr)
    finally:
        stand_in.close()


def _replaced_process_replayed(rig: Rig, addr: str) -> None:
    old = [heartbeat(addr, seq, "old") for seq in (1, 2, 3)]
    for packet in old:
        rig.send(packet)
    wait_until(lambda: addr in rig.target.heard(), what="the old process to be heard")
    rig.attack(old[1], ("replayed",))                  # an older heartbeat of the same process
    rig.send(heartbeat(addr, 1, "new"))                # the host restarts: a new process at that address
    wait_until(lambda: rig.replaced == [(addr, "old", "new")], what="the replacement to be reported once")
    for packet in old + [heartbeat(addr, 99, "old")]:  # the old process's heartbeats, however numbered
        rig.attack(packet, ("replayed",))
    assert rig.target.heard()[addr].instance == "new"
    assert rig.replaced == [(addr, "old", "new")]
    rig.attack(heartbeat(rig.target.self_addr, 10**6, "target"), ("replayed",))   # our own, reflected
    rig.honest_served()


@FUZZ
@given(unheard=st.one_of(st.none(), MSGPACK_INTEGERS, st.text(max_size=5),
                         st.dictionaries(st.text(max_size=3), MSGPACK_INTEGERS, max_size=2),
                         st.lists(st.one_of(MSGPACK_INTEGERS, st.none(), st.binary(max_size=3)), min_size=1,
                                  max_size=3)))
def test_a_heartbeat_whose_unheard_list_is_not_a_list_of_addresses_is_dropped(rig, unheard):
    rig.attack(signed(msgpack.packb([JOB, "127.0.0.1:1", 1, "x", "", False, unheard, []])), ("malformed",))
    rig.honest_served()


@FUZZ
@given(echo=st.one_of(st.none(), MSGPACK_INTEGERS, st.text(max_size=5),
                      st.lists(st.one_of(MSGPACK_INTEGERS, st.none(), st.text(max_size=3),
                                         st.lists(st.one_of(MSGPACK_INTEGERS, st.text(max_size=3)), max_size=3)
                                         .filter(lambda pair: not (len(pair) == 2 and isinstance(pair[0], str)
                                                                   and isinstance(pair[1], int)))),
                               min_size=1, max_size=3)))
def test_a_heartbeat_whose_echo_is_not_a_list_of_address_seq_pairs_is_dropped(rig, echo):
    rig.attack(signed(msgpack.packb([JOB, "127.0.0.1:1", 1, "x", "", False, [], echo])), ("malformed",))
    rig.honest_served()

"""Sealed channels (`ChannelConfig(encrypt=True)`): messages arrive through sealed frames, and a sealed frame that
was changed, replayed or dropped on the way is counted and never handed out; the channel recovers on a new link."""

from __future__ import annotations

import dataclasses

import pytest

from tests.channel.conftest import FAST, Rig

pytestmark = pytest.mark.timeout(30)

SEALED = dataclasses.replace(FAST, encrypt=True)


@pytest.fixture
def sealed_rig(tmp_path):
    r = Rig(tmp_path, SEALED)
    try:
        yield r
    finally:
        r.close()


PAYLOAD_AT = 56 + 8 + 5          # header, counter, then the payload


@pytest.mark.parametrize("tamper, reason, delivered", [
    (lambda a, b: a[:-1] + bytes([a[-1] ^ 1]), "bad_seal", 0),                              # the tag
    (lambda a, b: a[:PAYLOAD_AT] + bytes([a[PAYLOAD_AT] ^ 1]) + a[PAYLOAD_AT + 1:], "bad_seal", 0),
    (lambda a, b: a[:20] + bytes([a[20] ^ 1]) + a[21:], "bad_seal", 0),                     # the stamp
    (lambda a, b: b, "replayed", 0),                                                        # frame 0 lost
    (lambda a, b: a + a, "replayed", 1),                                     # sent twice: at most once handed out
], ids=["tag", "payload", "stamp", "dropped", "replayed"])
def test_a_tampered_sealed_frame_is_counted_and_never_consumed(sealed_rig, tamper, reason, delivered):
    rogue = sealed_rig.rogue(encrypt=True)
    first, second = rogue.frame(0, b"a" * 100), rogue.frame(1, b"b" * 100)
    rogue.send(tamper(first, second))
    got = []
    while (msg := sealed_rig.rx.receive(0.3)) is not None:
        got.append(bytes(msg.payload))
        msg.consumed()
    assert got == [b"a" * 100] * len(got) and len(got) <= delivered    # the good copy may be purged with its link
    assert sealed_rig.listener.stats()[reason] == 1
    ch = sealed_rig.channel(incarnation=1, generation=1, config=SEALED)    # a new sealed link works
    ch.send(b"whole")
    msg = sealed_rig.rx.receive(5)
    assert bytes(msg.payload) == b"whole"
    msg.consumed()

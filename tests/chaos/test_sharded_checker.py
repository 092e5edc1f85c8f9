"""The checker on hand-written sharded event logs: a serial sharded history passes; a shard of the wrong revision
or index becoming visible is named `mismatched shard version`; shards held against the certificate are named
`misowned shard`; the sharded schedules and the CLI's guard."""

from __future__ import annotations

import pytest

from p2pgen.cli import main
from p2pgen_lab.chaos import schedule
from p2pgen_lab.chaos.checker import DIVERGENT, MISMATCHED_SHARD, MISOWNED, check
from p2pgen_lab.chaos.model import SHARDED, SHARDS, reference_digests, reference_shard_digests

pytestmark = pytest.mark.timeout(30)

STEPS = 4
D = reference_digests(STEPS + 2)
S = reference_shard_digests(STEPS + 2)
MEMBERS = [["a", 1], ["b", 1], ["c", 1]]
OWNERS = {0: ("a", "b"), 1: ("b", "c"), 2: ("a", "c"), 3: ("a", "b")}
OWNERSHIP = [[SHARDED, i, [f"{p}#1" for p in owners]] for i, owners in OWNERS.items()]


def ev(t: float, event: str, peer: str, inc: int = 1, **kw) -> dict:
    return {"t": t, "event": event, "peer": peer, "incarnation": inc, **kw}


def owned(peer: str) -> list[int]:
    return [i for i, owners in OWNERS.items() if peer in owners]


def shards(peer: str, revision: int) -> dict:
    return {SHARDED: {str(i): S[revision][i] for i in owned(peer)}}


def activate(t: float, peer: str, generation: int, revision: int, **kw) -> dict:
    fields = dict(generation=generation, revision=revision, digest=D[revision], members=MEMBERS,
                  shards=shards(peer, revision), assigned={SHARDED: owned(peer)}, ownership=OWNERSHIP)
    return ev(t, "activate", peer, **{**fields, **kw})


def serial(steps: int = STEPS) -> list[dict]:
    out = [ev(0, "start", p, source="initial", revision=0) for p in "abc"]
    out += [activate(0.1, p, 1, 0) for p in "abc"]
    for r in range(steps):
        for p in "abc":
            out.append(ev(1 + r, "contribute", p, generation=1, attempt=r, revision=r))
            out.append(ev(1.5 + r, "apply", p, generation=1, attempt=r, revision=r, before=D[r], after=D[r + 1],
                          shards=shards(p, r + 1)))
    return out


def finals(revision: int = STEPS) -> list[dict]:
    return [ev(100, "final", p, revision=revision, digest=D[revision], shards=shards(p, revision)) for p in "abc"]


def test_a_serial_sharded_history_passes():
    v = check(serial() + finals(), [], STEPS)
    assert v.passed and v.failures == [], v.evidence


def test_a_shard_of_an_older_revision_visible_after_an_activation_is_a_mismatched_shard_version():
    events = serial(steps=3) + [activate(20, "c", 2, 3)]
    events[-1]["shards"][SHARDED]["1"] = S[2][1]          # a stale replica's copy of shard 1 was installed
    v = check(events + finals(3), [], STEPS)
    assert v.failures == [MISMATCHED_SHARD]
    assert "c#1 exposes shard s[1] after activating g2 at revision 3: it is shard 1 of revision 2" in v.evidence[0]


def test_another_index_s_shard_after_a_step_is_a_mismatched_shard_version():
    events = serial()
    last_a = max(i for i, e in enumerate(events) if e["event"] == "apply" and e["peer"] == "a")
    events[last_a]["shards"][SHARDED]["0"] = S[STEPS][2]    # shard 2's bytes held as shard 0
    v = check(events + finals(), [], STEPS)
    assert MISMATCHED_SHARD in v.failures and f"it is shard 2 of revision {STEPS}" in v.evidence[0]


def test_a_shard_that_is_no_revision_s_at_the_end_is_named_too():
    ends = finals()
    ends[1]["shards"][SHARDED]["1"] = "0" * 32
    v = check(serial() + ends, [], STEPS)
    assert v.failures == [MISMATCHED_SHARD] and "at its end" in v.evidence[0] and "no revision's shard" in v.evidence[0]


def test_a_shard_mismatch_in_a_state_that_is_already_not_serial_is_a_consequence():
    events = serial(steps=2) + [ev(9, "apply", "b", generation=1, attempt=2, revision=2, before="z", after="w",
                                   shards={SHARDED: {"0": "junk"}})]
    assert check(events + finals(2), [], STEPS).failures == []          # the apply's state before was not serial
    events[-1]["before"] = D[2]
    assert DIVERGENT in check(events + finals(2), [], STEPS).failures
    assert MISMATCHED_SHARD not in check(events + finals(2), [], STEPS).failures


def test_holding_a_shard_the_certificate_did_not_give_is_a_misowned_shard():
    events = serial(steps=1) + [activate(10, "c", 2, 1)]
    events[-1]["shards"][SHARDED]["0"] = S[1][0]           # another rank's shard, of the right revision
    v = check(events + finals(1), [], STEPS)
    assert v.failures == [MISOWNED] and "c#1 holds shards [0, 1, 2]" in v.evidence[0]


def test_a_certificate_leaving_a_shard_under_replicated_is_a_misowned_shard():
    thin = [[SHARDED, 0, ["a#1"]]] + OWNERSHIP[1:]
    events = serial(steps=1) + [activate(10, p, 2, 1, ownership=thin) for p in "abc"]
    v = check(events + finals(1), [], STEPS)
    assert MISOWNED in v.failures and any("g2 gives s[0] to ['a#1']" in line for line in v.evidence)


def test_sharded_schedules_have_a_repartition_fault_every_other_injection_and_replay_exactly():
    schedules = schedule.generate(3, 6, 4, sharded=True)
    assert schedules == schedule.generate(3, 6, 4, sharded=True)
    for s in schedules:
        kinds = [i.kind for i in s.injections]
        assert all(k in schedule.SHARD_KINDS for k in kinds[1::2]), kinds
        assert all(i.peer == schedule.ANY_PEER for i in s.injections if i.kind == "kill_shard_source")
    plain = [i.kind for s in schedule.generate(3, 6, 4) for i in s.injections]
    assert not set(plain) & set(schedule.SHARD_KINDS)


def test_sharded_chaos_refuses_the_policies_without_sharded_state(capsys):
    assert main(["chaos", "--sharded", "--policy", "comm-only", "--schedules", "1"]) == 2
    assert "only --policy certified" in capsys.readouterr().err


def test_the_shards_of_the_serial_object_differ_across_revisions_and_indexes():
    seen = [d for row in S[1:] for d in row]
    assert len(set(seen)) == len(seen) == (STEPS + 2) * SHARDS

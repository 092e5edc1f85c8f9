"""`Reformed`: the first entry of a new Raft epoch adopts the seed agent's state, drops the lost agents' members
and proposes the survivors; numbers keep going up; it is refused anywhere but at the start of a new log."""

from __future__ import annotations

import copy

from p2pgen.core import GenerationMachine, Ready, Reformed, Register, Synced


def addrs(i: int) -> tuple[tuple[str, str], ...]:
    return (("agent", f"h:{i}0"),)


def trained_job() -> GenerationMachine:
    """Five members active in generation 5 at revision 30 (every member holds it)."""
    m = GenerationMachine("j")
    for i in range(5):
        assert m.apply(Register(f"p{i}", 1, addrs(i), at=1.0)).ok
    g = m.pending.generation
    for i in range(5):
        assert m.apply(Ready(g, f"p{i}", 1, "proved", 30, "d30", at=2.0)).ok
    assert m.active is not None and m.active.generation == g
    return m


def test_a_new_epoch_continues_from_the_seed_without_the_lost_agents():
    seed = trained_job()
    fresh = GenerationMachine("j")
    out = fresh.apply(Reformed(2, "h:00", ("h:20", "h:30", "h:40"), copy.deepcopy(seed), at=10.0))
    assert out.ok and "re-formed in Raft epoch 2 from seed agent h:00" in out.reason
    assert fresh.raft_epoch == 2
    assert [m.peer_id for m in fresh.members] == ["p0", "p1"]
    assert {(t.peer_id, t.incarnation) for t in fresh.tombstones} >= {("p2", 1), ("p3", 1), ("p4", 1)}
    pending = fresh.pending
    assert pending.generation == seed.last_generation + 1 and pending.parent == seed.active.generation
    for p in ("p0", "p1"):
        assert fresh.apply(Ready(pending.generation, p, 1, "proved", 30, "d30", at=11.0)).ok
    cert = fresh.active
    assert cert.generation == pending.generation and cert.raft_epoch == 2 and cert.frontier.revision == 30
    assert cert.reformed.startswith("re-formed in Raft epoch 2") and "h:20, h:30, h:40" in cert.reformed
    # incarnations continue: a lost peer coming back registers above anything the seed had seen
    assert not fresh.apply(Register("p2", 1, addrs(2), at=12.0)).ok
    assert fresh.apply(Register("p2", 2, addrs(2), at=12.0)).ok
    assert fresh.pending.generation == cert.generation + 1
    later = fresh.pending.generation
    for p, inc in (("p0", 1), ("p1", 1), ("p2", 2)):
        fresh.apply(Ready(later, p, inc, "proved", 30 if p != "p2" else 0, "d30" if p != "p2" else "", at=13.0))
    fresh.apply(Synced(later, "p2", 2, "d30", at=14.0))
    assert fresh.active.generation == later and fresh.active.reformed == ""   # said once


def test_reformed_is_refused_on_a_log_that_already_holds_the_job():
    seed = trained_job()
    used = trained_job()
    before = (used.last_generation, list(used.members))
    out = used.apply(Reformed(2, "h:00", (), copy.deepcopy(seed), at=10.0))
    assert not out.ok and "first entry of a new Raft log" in out.reason
    assert (used.last_generation, list(used.members)) == before


def test_reformed_needs_a_higher_epoch_and_a_base_of_this_job():
    seed = trained_job()
    seed.raft_epoch = 3
    assert not GenerationMachine("j").apply(Reformed(3, "h:00", (), copy.deepcopy(seed))).ok
    assert not GenerationMachine("other").apply(Reformed(4, "h:00", (), copy.deepcopy(seed))).ok
    assert not GenerationMachine("j").apply(Reformed(4, "h:00", (), "not a machine")).ok
    replayed = GenerationMachine("j")
    assert replayed.apply(Reformed(4, "h:00", (), copy.deepcopy(seed))).ok
    assert "replay" in replayed.apply(Reformed(4, "h:00", (), copy.deepcopy(seed))).reason

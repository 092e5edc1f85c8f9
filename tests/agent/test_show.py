"""`p2pgen show` says loudly when a generation is held for missing state and when one regressed, and why the
ranks are in their order (zones, measured links)."""

from __future__ import annotations

import pytest

from p2pgen.agent.cli import format_hold, format_show
from p2pgen.core import Configure, Fallback, GenerationMachine, Links, Ready, Register, Suspect, Synced
from p2pgen.core.render import state_json

pytestmark = pytest.mark.timeout(20)

NODE = "127.0.0.1:20001/4be1c09a7a3e"
RAFT = {"term": 1, "index": 9, "leader": NODE, "leader_agent": "127.0.0.1:20000", "nodes": [NODE], "self": NODE,
        "voter": True, "voters": [{"node": NODE, "agent": "127.0.0.1:20000"}], "nonvoters": []}
AGENT = {"addr": "127.0.0.1:20000", "waiting": None}


def machine_with_lost_state() -> GenerationMachine:
    m = GenerationMachine("job")
    for command in (Configure(1, regress_wait=10.0), Register("a", 1), Ready(1, "a", 1, "proved", 50, "f50"),
                    Suspect("b", "a", 1, "host lost", at=100.0), Register("b", 1, at=100.0),
                    Ready(2, "b", 1, "proved", 0, "b0", at=100.0, ckpt_revision=40, ckpt_digest="k40")):
        assert m.apply(command).ok, command
    return m


def test_a_held_generation_is_shown_with_what_is_missing_and_how_long_it_waits():
    m = machine_with_lost_state()
    text = format_show({"state": state_json(m), "raft": RAFT, "agent": AGENT})
    assert "HELD:     certified revision 50 is missing; best available revision 40" in text
    assert ("a#1, the last member of generation 1, was lost with its agent; the steps it committed after "
            "revision 50 exist only on its host" in text)
    assert "waiting until 110.000 for it" in text
    assert "over since" in format_hold(state_json(m)["pending"]["hold"], now=111.0)


def test_a_regressed_generation_is_shown_with_its_recovery_line():
    m = machine_with_lost_state()
    assert m.apply(Fallback(2, "b", 1, at=110.0)).ok
    assert m.apply(Synced(2, "b", 1, "k40", at=110.5)).ok
    text = format_show({"state": state_json(m), "raft": RAFT, "agent": AGENT})
    assert "state:    epoch 2, from checkpoint; if it would regress: wait 10 s, then refuse a fresh start" in text
    assert "RECOVERY: REGRESSED from certified revision 50 to revision 40 (10 committed step(s) lost)" in text
    assert "checkpoint" in text.split("RECOVERY")[1]


def test_refusals_of_the_agents_listeners_are_shown_by_reason_only_when_there_are_some():
    m = machine_with_lost_state()
    quiet = {**AGENT, "refusals": {"rpc": {"auth_failed": 0}, "heartbeat": {"forged": 0}}}
    assert "refused:" not in format_show({"state": state_json(m), "raft": RAFT, "agent": quiet})
    noisy = {**AGENT, "refusals": {"rpc": {"auth_failed": 1, "truncated": 0},
                                   "heartbeat": {"replayed": 2, "forged": 3}}}
    text = format_show({"state": state_json(m), "raft": RAFT, "agent": noisy})
    assert "refused:    heartbeat forged=3 replayed=2; rpc auth_failed=1" in text


def test_show_prints_the_ownership_map_and_what_moved_at_the_last_change():
    m = GenerationMachine("job")
    layout, whole = "adam:8:4:4:2", "adam:0:z0,adam:1:z1,adam:2:z2,adam:3:z3"
    for command in (Configure(3), Register("a", 1), Register("b", 1), Register("c", 1),
                    *(Ready(1, p, 1, "proved", 0, "s0", layout=layout, shards=whole) for p in "abc")):
        assert m.apply(command).ok, command
    owned = {p: ",".join(f"adam:{e['shard']}:x{e['shard']}" for e in state_json(m)["active"]["ownership"]
                         if f"{p}#1" in e["owners"]) for p in "abc"}
    for command in (Suspect("a", "c", 1, "host lost"),
                    *(Ready(2, p, 1, "proved", 5, "s5", layout=layout, shards=owned[p]) for p in "ab")):
        assert m.apply(command).ok, command
    for pull in state_json(m)["pending"]["shard_pulls"]:
        p = pull["peer_id"]
        owned[p] += f",adam:{pull['shard']}:{pull['digest']}"
    for p in {x["peer_id"] for x in state_json(m)["pending"]["shard_pulls"]}:
        assert m.apply(Synced(2, p, 1, "s5", shards=",".join(sorted(owned[p].strip(",").split(","))))).ok
    text = format_show({"state": state_json(m), "raft": RAFT, "agent": AGENT})
    assert "sharded objects (ownership v2):" in text
    table = text.split("sharded objects")[1]
    assert all(f"adam    {i}      a#1, b#1  8" in table for i in range(4)), table
    assert "bytes owned per member: a#1 32, b#1 32" in text
    moved = state_json(m)["active"]["moved"]
    assert f"moved at the last change (generation 2): {len(moved)} shard(s), {8 * len(moved)} bytes" in text
    assert "reconstruction source replica" in text


def test_show_prints_the_zones_the_measured_matrix_and_why_the_ranks_are_in_that_order():
    m = GenerationMachine("job")
    hosts = {"a1": "10.0.1.1", "b1": "10.0.2.1", "a2": "10.0.1.2", "b2": "10.0.2.2"}
    for peer, host in hosts.items():
        assert m.apply(Register(peer, 1, (("agent", f"{host}:7000"),), zone=f"z{peer[0]}")).ok
    for peer in ("a1", "a2", "b1", "b2"):
        assert m.apply(Ready(m.pending.generation, peer, 1, "proved", 0, "d0")).ok
    for src in hosts.values():          # the agents probe once the generation is active; nothing to reorder
        rates = " ".join(f"{dst}={9400 if dst[:7] == src[:7] else 200}" for dst in hosts.values() if dst != src)
        assert m.apply(Links(src, rates)).ok and m.pending is None
    text = format_show({"state": state_json(m), "raft": RAFT, "agent": AGENT})
    assert [line.split()[1] for line in text.splitlines() if line.split()[:1] in (["0"], ["1"], ["2"], ["3"])] \
        == ["a1", "a2", "b1", "b2"]
    assert "rank order (zones): declared zones; 2 group(s) za(2) zb(2): the ring crosses slow links 2 time(s) " \
           "(join order: 4); all_reduce: hierarchical (declared zones" in text
    assert "groups:   za: a1 a2; zb: b1 b2; all_reduce hierarchical" in text
    matrix = text.split("measured links:\n")[1].splitlines()
    assert matrix[0].split() == ["Mbit/s", "10.0.1.1", "10.0.1.2", "10.0.2.1", "10.0.2.2"]
    assert matrix[1].split() == ["10.0.1.1", "-", "9400", "200", "200"]

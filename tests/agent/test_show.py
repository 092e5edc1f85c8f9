"""`p2pgen show` says loudly when a generation is held for missing state and when one regressed."""

from __future__ import annotations

import pytest

from p2pgen.agent.cli import format_hold, format_show
from p2pgen.core import Configure, Fallback, GenerationMachine, Ready, Register, Suspect, Synced
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
    assert "waiting until 110.000 for a holder, a local copy or a checkpoint" in text
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
    noisy = {**AGENT, "refusals": {"rpc": {"auth_failed": 1, "truncated": 0}, "heartbeat": {"replayed": 2, "forged": 3}}}
    text = format_show({"state": state_json(m), "raft": RAFT, "agent": noisy})
    assert "refused:    heartbeat forged=3 replayed=2; rpc auth_failed=1" in text

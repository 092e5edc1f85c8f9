"""The heartbeat verdicts (p2pgen.core.heartbeats), as tables: which lost agents are acted on, and when an agent
that hears none of its peers blames none of them. The shells calling them: tests/agent/test_agent_lost.py and
tests/agent/test_heartbeat.py."""

from __future__ import annotations

import pytest

from p2pgen.core.heartbeats import acts_on_loss, hears_no_one


@pytest.mark.parametrize(("has_node", "proven", "acted_on"), [
    (True, False, True),       # a silence, judged with the job's state at hand
    (True, True, True),        # a refusal or a new process at the address
    (False, True, True),       # a proof counts whenever it comes (kept until the node is back)
    (False, False, False),     # a silence judged while joining or re-joining says more about this agent
])
def test_a_silence_judged_without_a_raft_node_is_not_acted_on(has_node: bool, proven: bool, acted_on: bool):
    assert acts_on_loss(has_node, proven) is acted_on


FLOOR = 1.0


@pytest.mark.parametrize(("others", "quiet_for", "deaf"), [
    (0, 10.0, False),          # nobody to hear
    (1, 10.0, False),          # one silent peer is judged as usual: it may well be the one that failed
    (2, 0.4, False),           # heard within half the floor
    (2, 0.5, False),           # exactly half the floor: still heard
    (2, 0.51, True),           # two peers silent at once: this agent's deafness is likelier
    (5, 3.0, True),
])
def test_an_agent_that_suddenly_hears_none_of_its_peers_blames_none_of_them(others: int, quiet_for: float,
                                                                             deaf: bool):
    assert hears_no_one(others, quiet_for, FLOOR) is deaf

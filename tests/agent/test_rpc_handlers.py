"""The agent's control RPC serves every `_rpc_*` handler it defines (one defined and not served is dead code
that a caller, such as the application's "stopped at a boundary" report, calls in vain); an application's command
outlives a switch of the agent's Raft node."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from p2pgen.agent.agent import Agent
from p2pgen.agent.probe import serve_probe
from p2pgen.agent.wire import command_to_wire
from p2pgen.core import Leave
from p2pgen.core.model import Outcome
from p2pgen.raft.node import RaftUnavailable

pytestmark = pytest.mark.timeout(30)


def test_every_rpc_method_of_the_agent_is_served_under_its_name():
    served = Agent.__new__(Agent)._handlers()          # bound methods only: no agent needs to run
    defined = {name.removeprefix("_rpc_") for name in dir(Agent) if name.startswith("_rpc_")}
    assert {name for name, handler in served.items() if handler is not serve_probe} == defined
    assert served["stopped"].__func__ is Agent._rpc_stopped


class _Node:
    """A Raft node that answers a command, or, stopped, fails it as RaftNode does (and its agent moves on)."""

    def __init__(self, agent: SimpleNamespace | None = None, replacement: _Node | None = None) -> None:
        self.agent, self.replacement, self.given = agent, replacement, []

    def submit(self, command, timeout: float) -> Outcome:
        self.given.append(command)
        if self.replacement is not None:
            self.agent.node = self.replacement            # the agent switched to its promoted voter meanwhile
            raise RaftUnavailable("raft node stopped")
        return Outcome(True, "p1 ready for generation 7")


def test_an_application_command_caught_by_a_node_switch_goes_through_the_node_that_replaced_it():
    """Seen in a stress run: the agent switched to its promoted voter while the application's vote was in flight;
    the vote hung until its deadline and every generation after it waited. The agent now resubmits through the new
    node (a repeated command is answered as a replay), and fails as before when no other node took over."""
    agent = SimpleNamespace(_require_view=lambda: None, addr="127.0.0.1:23790")
    voter = _Node()
    agent.node = _Node(agent, replacement=voter)
    wire = command_to_wire(Leave("p1", 3))
    assert Agent._rpc_submit(agent, {"command": wire}) == {"ok": True, "reason": "p1 ready for generation 7"}
    assert voter.given == [Leave("p1", 3)]
    stuck = SimpleNamespace(_require_view=lambda: None, addr="127.0.0.1:23790")
    stuck.node = _Node(stuck, replacement=None)
    stuck.node.replacement = stuck.node                 # stopped, and nothing replaced it
    with pytest.raises(RaftUnavailable):
        Agent._rpc_submit(stuck, {"command": wire})

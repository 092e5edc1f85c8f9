"""The agent's control RPC serves every `_rpc_*` handler it defines (one defined and not served is dead code
that a caller, such as the application's "stopped at a boundary" report, calls in vain)."""

from __future__ import annotations

import pytest

from p2pgen.agent.agent import Agent
from p2pgen.agent.probe import serve_probe

pytestmark = pytest.mark.timeout(30)


def test_every_rpc_method_of_the_agent_is_served_under_its_name():
    served = Agent.__new__(Agent)._handlers()          # bound methods only: no agent needs to run
    defined = {name.removeprefix("_rpc_") for name in dir(Agent) if name.startswith("_rpc_")}
    assert {name for name, handler in served.items() if handler is not serve_probe} == defined
    assert served["stopped"].__func__ is Agent._rpc_stopped

"""The heartbeat verdicts an agent's shells act on, as pure functions: whether a lost agent is acted on, and
whether an agent that hears none of its peers may blame any of them.

Owns no state: the heartbeat runner (`p2pgen.agent.heartbeat`) and the agent's heartbeat callback
(`p2pgen.agent.agent.Agent._agent_lost`) gather the facts and call these. Invariants kept:
- a silence judged while this agent has no Raft node is never acted on (it could not know the job then, and what
  it heard says more about itself than about the others); a proof (a refusal, a new process at the address) is;
- an agent that suddenly hears none of at least two peers blames none of them: its own deafness is likelier than
  their failing together.
"""

from __future__ import annotations

__all__ = ["acts_on_loss", "hears_no_one"]


def acts_on_loss(has_node: bool, proven: bool) -> bool:
    """Whether a lost agent reported by the heartbeats is acted on (queued for the driver, the voter manager
    poked).

    Args:
        has_node: this agent has a Raft node now (not joining, nor re-joining after a stop or a removal).
        proven: the loss is a proof (its host refused our heartbeats, or a new process announced itself at its
            address), not a silence.
    """
    return has_node or proven


def hears_no_one(others: int, quiet_for: float, floor: float) -> bool:
    """Whether this agent hears none of its peers: at least two others (not suspected) are there to hear and
    none was heard for half the detector's floor. It then blames none of them.

    Args:
        others: the heartbeat targets not suspected already.
        quiet_for: seconds since the newest heartbeat taken from any agent.
        floor: the detector's floor (seconds).
    """
    return others >= 2 and quiet_for > floor / 2

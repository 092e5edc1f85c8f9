"""What a leaving agent does, as a pure plan its shell (`p2pgen.agent.agent.Agent._leave`) performs: stop the
application, record the leave, hand leadership over, remove its voter, and what it says when no quorum answers.

Owns no state and does no I/O: the shell gathers the facts (its application, its Raft node and view, the agents
heard, what a live member answers) and logs the sentence chosen here. Invariants kept:
- the leave of a registered member is recorded before the Raft voter goes, so the others go on at once;
- an agent whose application runs but never registered records a leave too (of that incarnation), after the
  application is stopped and the local copy deleted: a note of the copy an earlier incarnation left on this host
  (exact, or the last holder's inexact one) would otherwise hold the job's next generation for the whole
  regression wait, for steps that can no longer come back;
- a node that leads hands leadership over before it removes its own voter, and the last voter never removes
  itself: while other agents are heard, it first waits for one of them to become a voter (its voter manager
  promotes a successor, `p2pgen.core.voters.plan_voters(leaving=True)`), and then goes like any other voter;
- a voter never removes itself while the voters left after it would lack a live majority (another voter is down):
  Raft applies a configuration change when it is appended, so the job would then need the down voter to commit
  anything, its removal included. It waits instead (bounded), its node still acking, while the leader removes
  the down one; one that hears no other voter tries the removal, and its failure is what it says;
- a job every member of which has left records nothing more (the agents leaving last would wait in vain for a
  quorum of agents already gone).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CONFIRMED_OUT", "FINISHED", "FINISHED_MEANWHILE", "LEFT_LAST", "NO_QUORUM", "NO_SUCCESSOR", "VOTERS_DOWN",
    "LeavePlan", "Said",
    "Shrink",
    "leave_plan", "said_after_asking", "said_without_quorum", "shrink_plan",
]


@dataclass(frozen=True)
class Said:
    """A sentence for the log: `level` a logging level name, `text` a %-format with one `%s` (the Raft error)
    where it names one."""

    level: str
    text: str


@dataclass(frozen=True)
class LeavePlan:
    """The first steps of a leave, in order."""

    stop_app: bool        # stop the application (and delete its local copy) first
    raft: bool            # go on with the Raft steps (this agent has a node)
    record: bool          # record the leave of this peer's member (or of its unregistered application's incarnation)
    await_app: bool       # after recording it, wait for the application stopping by itself (a drain), then stop it


@dataclass(frozen=True)
class Shrink:
    """The Raft configuration's steps once the leave is recorded (`said`: nothing to do, and why)."""

    transfer_leadership: bool = False
    remove_voter: bool = False
    wait_for_voters: bool = False   # not yet: the voters left after this one would lack a live majority
    wait_for_successor: bool = False   # the last voter, with other agents live: not before one of them is a voter
    said: Said | None = None


FINISHED = Said("info", "left: every member of the job has left, so no Raft configuration is left to shrink")
FINISHED_MEANWHILE = Said("info", "left: every member of the job has left meanwhile (%s); nothing is left to record")
LEFT_LAST = Said("info", "left last: no other agent is heard any more, so no quorum is left to record it (%s)")
CONFIRMED_OUT = Said("info", "left: a live member confirms this agent's voter is out of the Raft configuration (a "
                             "removed node never hears the commit of its own removal: %s)")
VOTERS_DOWN = Said("warning", "left without removing this agent's Raft voter: %s; removing it would leave the job "
                              "a configuration without a live majority, so it waits for them (or `p2pgen recover`)")
NO_SUCCESSOR = Said("warning", "left as the job's last Raft voter, no other agent having become one (%s): the agents "
                                "left cannot commit to the job's Raft log; `p2pgen recover` re-forms it from them")
NO_QUORUM = Said("warning", "left without a Raft quorum to record it (%s): the others will detect this agent's "
                            "absence and replace it as a voter; nothing to do unless no agent is left running")


def leave_plan(has_app: bool, app_stopping: bool, has_node: bool, registered: bool) -> LeavePlan:
    """The first steps of a leave.

    Args:
        has_app: an application process runs.
        app_stopping: it stopped at a step boundary (a drain) and exits by itself: it keeps serving its state
            until the drain's deadline, and the leave is recorded first.
        has_node: this agent has a Raft node.
        registered: this peer's member is registered (an incarnation to record the leave of; else the running
            application's, once it is stopped and its local copy deleted).
    """
    stop_app = has_app and not app_stopping
    return LeavePlan(stop_app=stop_app, raft=has_node, record=has_node and (registered or stop_app),
                     await_app=has_node and has_app and app_stopping)


def shrink_plan(finished: bool, voter: bool, nodes: int, leader: bool, live_others: int,
                others_heard: int = 0) -> Shrink:
    """The Raft steps after the leave is recorded.

    Args:
        finished: every member of the job has left.
        voter: this agent's node is a voter.
        nodes: the voters in the configuration.
        leader: this agent's node leads.
        live_others: the other voters whose agents are heard.
        others_heard: the other agents (voters or not) whose heartbeats are heard. The last voter of a job that
            goes on (a job of two agents has one voter) waits for one of them to become a voter before it goes:
            gone without a successor, it would leave them no Raft group to commit to.
    """
    if finished:
        return Shrink(said=FINISHED)
    if not voter:
        return Shrink()
    if nodes <= 1:
        return Shrink(wait_for_successor=others_heard > 0)
    if 0 < live_others < (nodes - 1) // 2 + 1:     # none heard: the removal is tried and its failure said
        return Shrink(transfer_leadership=leader, wait_for_voters=True)
    return Shrink(transfer_leadership=leader, remove_voter=True)


def said_without_quorum(finished: bool, others_heard: bool, recorded: bool) -> Said | None:
    """What a leave that found no Raft quorum says; None: ask a live member whether this agent's voter is out
    first (`said_after_asking`).

    Args:
        finished: every member of the job has left meanwhile.
        others_heard: the heartbeats hear another agent.
        recorded: the member's leave was recorded (or there was none to record).
    """
    if finished:
        return FINISHED_MEANWHILE
    if not others_heard:
        return LEFT_LAST
    return None if recorded else NO_QUORUM


def said_after_asking(confirmed_out: bool | None) -> Said:
    """What the leave says once a live member answered (True: this voter is out; None: no answer).

    Args:
        confirmed_out: the live members' answer.
    """
    return CONFIRMED_OUT if confirmed_out is True else NO_QUORUM

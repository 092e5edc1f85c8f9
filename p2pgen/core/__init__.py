"""The pure core: the generation state machine, its values, the frontier election and renderings.

Nothing here does I/O, reads a clock, starts a thread or imports another p2pgen layer: commands in,
state and effects out. Raft, sockets, processes and clocks live in the shells around it.
"""

from p2pgen.core.frontier import elect_frontier
from p2pgen.core.generation import GenerationMachine, Proposal
from p2pgen.core.model import (
    COMMAND_TYPES, QUIESCENCE_VALUES, Activated, Certificate, Command, Configure, Effect, Election, Frontier,
    FrontierElected, HistoryEntry, Leave, LogPosition, Member, MemberEvicted, Outcome, ProposalAbandoned,
    ProposalOpened, Pull, Ready, ReadyVote, Reform, Register, RestartRequired, Suspect, Synced, Tombstone,
    retirement_reason,
)

__all__ = [
    "COMMAND_TYPES", "QUIESCENCE_VALUES", "Activated", "Certificate", "Command", "Configure", "Effect", "Election",
    "Frontier", "FrontierElected", "GenerationMachine", "HistoryEntry", "Leave", "LogPosition", "Member",
    "MemberEvicted", "Outcome", "Proposal", "ProposalAbandoned", "ProposalOpened", "Pull", "Ready",
    "ReadyVote", "Reform", "Register", "RestartRequired", "Suspect", "Synced", "Tombstone",
    "elect_frontier", "retirement_reason",
]

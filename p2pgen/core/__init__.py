"""The pure core: the generation state machine, its values, the frontier election and renderings.

Nothing here does I/O, reads a clock, starts a thread or imports another p2pgen layer: commands in,
state and effects out. Raft, sockets, processes and clocks live in the shells around it.
"""

from p2pgen.core.frontier import elect_frontier
from p2pgen.core.generation import GenerationMachine, Proposal
from p2pgen.core.model import (
    COMMAND_TYPES,
    DEFAULT_REGRESS_WAIT,
    HOLD_FLOOR_S,
    QUIESCENCE_VALUES,
    Activated,
    ActivationHeld,
    Certificate,
    CheckpointRef,
    Command,
    Configure,
    Effect,
    Election,
    Fallback,
    Frontier,
    FrontierElected,
    HistoryEntry,
    Hold,
    Kept,
    Leave,
    Links,
    LogPosition,
    Member,
    MemberEvicted,
    ObjectRecord,
    Outcome,
    ProposalAbandoned,
    ProposalOpened,
    Pull,
    Ready,
    ReadyVote,
    Reform,
    Reformed,
    Register,
    RestartRequired,
    ShardPull,
    Suspect,
    Synced,
    Tombstone,
    Topology,
    retirement_reason,
)
from p2pgen.core.ownership import OwnershipPlan, Partition, plan_ownership

__all__ = [
    "COMMAND_TYPES", "DEFAULT_REGRESS_WAIT", "HOLD_FLOOR_S", "QUIESCENCE_VALUES", "ActivationHeld", "Activated",
    "Certificate",
    "CheckpointRef", "Command", "Configure", "Effect", "Election", "Fallback", "Frontier", "FrontierElected",
    "GenerationMachine", "Hold", "HistoryEntry", "Kept", "Leave", "Links", "LogPosition", "Member", "MemberEvicted",
    "Outcome", "Proposal", "ProposalAbandoned", "ProposalOpened", "Pull", "Ready", "ReadyVote", "Reform", "Reformed",
    "Register",
    "RestartRequired", "ShardPull", "ObjectRecord", "OwnershipPlan", "Partition", "plan_ownership", "Suspect", "Synced",
    "Tombstone",
    "Topology", "elect_frontier", "retirement_reason",
]

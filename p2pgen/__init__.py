"""p2pgen: collectives that survive peers dying and joining, agreed through Raft generations.

Layers (see README, "Design"): `core` (pure generation state machine) <- `raft` (pysyncobj adapter)
<- `agent` (per-host sidecar); `transport` + `collectives` (the data plane); `state` (SharedState and
catch-up); `peer` (the step loop inside the application). The public API is re-exported here only.
"""

from p2pgen.collectives import Backend, ReduceOp, TcpBackend
from p2pgen.core import Certificate, Frontier, GenerationMachine, Member
from p2pgen.errors import (
    AgentLost, AuthenticationError, BarrierTimeout, Evicted, GenerationChanged, P2PGenError, PeerLost,
    ProtocolError,
)
from p2pgen.peer import Peer, Step, current_peer, join
from p2pgen.core.ownership import Partition, plan_ownership
from p2pgen.state import ShardedObject, SharedState

__all__ = [
    "AgentLost", "AuthenticationError", "Backend", "BarrierTimeout", "Certificate", "Evicted", "Frontier",
    "GenerationChanged", "GenerationMachine", "Member", "P2PGenError", "Peer", "PeerLost", "ProtocolError", "Partition", "ReduceOp", "ShardedObject", "SharedState",
    "Step", "TcpBackend", "current_peer", "join", "plan_ownership",
]

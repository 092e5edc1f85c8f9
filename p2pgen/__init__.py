"""p2pgen: collectives that survive peers dying and joining, agreed through Raft generations.

Layers (see README, "Design"): `core` (pure generation state machine) <- `raft` (pysyncobj adapter)
<- `agent` (per-host sidecar); `transport` + `collectives` (the data plane); `state` (SharedState and
catch-up); `peer` (the step loop inside the application). The public API is re-exported here only, lazily
(PEP 562): `import p2pgen.core` or `p2pgen.detect` loads neither numpy nor the transport, and a name is
imported from its module the first time it is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "Backend": "p2pgen.collectives", "ReduceOp": "p2pgen.collectives", "TcpBackend": "p2pgen.collectives",
    "Certificate": "p2pgen.core", "Frontier": "p2pgen.core", "GenerationMachine": "p2pgen.core",
    "Member": "p2pgen.core",
    "AgentLost": "p2pgen.errors", "AuthenticationError": "p2pgen.errors", "BarrierTimeout": "p2pgen.errors",
    "Evicted": "p2pgen.errors", "GenerationChanged": "p2pgen.errors", "P2PGenError": "p2pgen.errors",
    "PeerLost": "p2pgen.errors", "ProtocolError": "p2pgen.errors",
    "Peer": "p2pgen.peer", "Step": "p2pgen.peer", "current_peer": "p2pgen.peer", "join": "p2pgen.peer",
    "Partition": "p2pgen.core.ownership", "plan_ownership": "p2pgen.core.ownership",
    "ShardedObject": "p2pgen.state", "SharedState": "p2pgen.state",
    "ElasticLoader": "p2pgen.data", "ElasticSampler": "p2pgen.data",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from p2pgen.collectives import Backend, ReduceOp, TcpBackend
    from p2pgen.core import Certificate, Frontier, GenerationMachine, Member
    from p2pgen.core.ownership import Partition, plan_ownership
    from p2pgen.data import ElasticLoader, ElasticSampler
    from p2pgen.errors import (
        AgentLost,
        AuthenticationError,
        BarrierTimeout,
        Evicted,
        GenerationChanged,
        P2PGenError,
        PeerLost,
        ProtocolError,
    )
    from p2pgen.peer import Peer, Step, current_peer, join
    from p2pgen.state import ShardedObject, SharedState


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'p2pgen' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value               # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

"""p2pgen: collectives that survive peers dying and joining, agreed through Raft generations.

Layers (see docs/design/design.md): `core` (pure generation state machine) <- `raft` (pysyncobj adapter)
<- `agent` (per-host sidecar); `transport` + `collectives` (the data plane); `state` (SharedState and
catch-up); `peer` (the step loop inside the application). What an application uses is re-exported here
(`__all__`, listed in docs/reference/api.md), lazily (PEP 562): `import p2pgen.core` or `p2pgen.detect` loads
neither numpy nor the transport, and a name is imported from its module the first time it is used. Everything
else (GenerationMachine, plan_ownership, Backend, TcpBackend, ...) is imported from its own module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "ReduceOp": "p2pgen.collectives",
    "AgentLost": "p2pgen.errors", "AuthenticationError": "p2pgen.errors", "BarrierTimeout": "p2pgen.errors",
    "EncryptionMismatch": "p2pgen.errors", "Evicted": "p2pgen.errors", "GenerationChanged": "p2pgen.errors",
    "P2PGenError": "p2pgen.errors", "PeerLost": "p2pgen.errors", "ProtocolError": "p2pgen.errors",
    "Buffer": "p2pgen.peer", "Peer": "p2pgen.peer", "Step": "p2pgen.peer", "current_peer": "p2pgen.peer",
    "join": "p2pgen.peer",
    "ShardedObject": "p2pgen.state", "SharedState": "p2pgen.state",
    "ElasticLoader": "p2pgen.data", "ElasticSampler": "p2pgen.data",
}

__all__ = [
    "AgentLost", "AuthenticationError", "BarrierTimeout", "Buffer", "ElasticLoader", "ElasticSampler",
    "EncryptionMismatch", "Evicted", "GenerationChanged", "P2PGenError", "Peer", "PeerLost", "ProtocolError",
    "ReduceOp", "ShardedObject", "SharedState", "Step", "current_peer", "join",
]

if TYPE_CHECKING:
    from p2pgen.collectives import ReduceOp
    from p2pgen.data import ElasticLoader, ElasticSampler
    from p2pgen.errors import (
        AgentLost,
        AuthenticationError,
        BarrierTimeout,
        EncryptionMismatch,
        Evicted,
        GenerationChanged,
        P2PGenError,
        PeerLost,
        ProtocolError,
    )
    from p2pgen.peer import Buffer, Peer, Step, current_peer, join
    from p2pgen.state import ShardedObject, SharedState


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'p2pgen' has no attribute {name!r}; internals are imported from their own "
                             "module (e.g. `from p2pgen.core import GenerationMachine`)")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value               # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

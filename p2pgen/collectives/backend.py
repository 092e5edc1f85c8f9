"""The Backend protocol every collective implementation (tcp now, nccl later) provides.

Contract for callers:
- A backend is bound to exactly one generation. Every member calls the same collectives in the same
  order with buffers of the same shape and dtype; ranks are positions in that generation's member list.
- Collectives are in place (`all_reduce`, `broadcast`) or write an output buffer; all are synchronous.
- Results are bit-identical on every member.
- Failure: a collective raises GenerationChanged (the generation was aborted) or PeerLost /
  ProtocolError (a member died or misbehaved); the backend is then unusable, and every later call
  raises too. **A buffer you passed is exactly as you passed it when a collective raises**: outputs are
  written only after every frame they need arrived and verified. The collective may still have
  completed on other members.
- `abort(reason)` and `close()` are idempotent and thread-safe; `abort` returns the quiescence
  ("proved" once every worker of this generation stopped, else "unknown").
"""

from __future__ import annotations

import enum
from typing import Any, Protocol, runtime_checkable


class ReduceOp(str, enum.Enum):
    SUM = "sum"
    AVG = "avg"
    MIN = "min"
    MAX = "max"


@runtime_checkable
class Backend(Protocol):
    rank: int
    world: int
    generation: int

    def all_reduce(self, buf: Any, op: ReduceOp | str = ReduceOp.SUM) -> Any: ...

    def broadcast(self, buf: Any, root: int) -> Any: ...

    def all_gather(self, output: Any, input: Any) -> Any: ...

    def reduce_scatter(self, output: Any, input: Any, op: ReduceOp | str = ReduceOp.SUM) -> Any: ...

    def send(self, buf: Any, dst: int) -> None: ...

    def recv(self, buf: Any, src: int) -> Any: ...

    def barrier(self) -> None: ...

    def abort(self, reason: str) -> str: ...

    def close(self) -> None: ...

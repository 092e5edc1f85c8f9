"""Per-frame hooks of the data plane: a process can watch every frame it moves, to inject faults at a precise
point of an operation (the chaos benchmark kills a member after the k-th frame of an all-reduce, or a shard's
source after its first chunk arrived) or to trace.

Owns: the process-wide list of frame hooks and `FrameEvent`, what they are told.
Invariant: with no hook registered the data plane pays one check of an empty list per frame. A hook runs on the
thread that moved the frame, after the frame was handed to the transport (`posted`: queued or sent) or received
and verified (`received`), so whatever it does happens at that exact point of the operation. A hook that raises
fails the operation like any error of that thread would; hooks are for tests and benchmarks, not for production
logic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

COLLECTIVE, STATE, SHARD = "collective", "state", "shard"    # the planes: collectives, state pulls, shard pulls


@dataclass(frozen=True)
class FrameEvent:
    plane: str                     # COLLECTIVE (p2pgen.transport), STATE or SHARD (p2pgen.state pulls)
    direction: str                 # "posted" or "received"
    kind: int                      # the frame kind (transport.FrameKind, or state.wire's kinds)
    op_seq: int
    chunk: int                     # the frame's index within its operation (0, 1, ...)
    nbytes: int
    peer: tuple[str, int]          # the other end: (peer_id, incarnation)


FrameHook = Callable[[FrameEvent], None]
_hooks: list[FrameHook] = []


def add_frame_hook(hook: FrameHook) -> Callable[[], None]:
    """Call `hook` for every frame this process moves from now on; returns the function that removes it."""
    _hooks.append(hook)
    return lambda: _hooks.remove(hook) if hook in _hooks else None


def frame_moved(plane: str, direction: str, kind: int, op_seq: int, chunk: int, nbytes: int,
                peer: tuple[str, int]) -> None:
    """Called by the data plane for every frame (cheap when no hook is registered)."""
    if _hooks:
        event = FrameEvent(plane, direction, kind, op_seq, chunk, nbytes, peer)
        for hook in tuple(_hooks):
            hook(event)

"""Channel configuration and the three recovery modes.

Modes (the sender chooses; it tells the receiver in its OPEN message):
- `exactly_once`: completion is the receiver's consumption ack; after any fault the sender asks the
  receiver's consumption log and resends exactly the missing numbers; the receiver deduplicates (I6).
- `naive`: completion is the receiver's *delivery* ack (the bytes reached a receive slot); after a fault the
  sender resends what it did not see complete; the receiver does not deduplicate.
- `batched`: like `naive`, but the sender observes one completion per batch of `batch` messages (a CUDA
  graph of `batch` sends has one completion event).

`naive` and `batched` exist so `p2pgen bench channel` can show what trusting completion costs.

Invariant: `window` bounds the messages a sender holds without a completion, so its memory is bounded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

EXACTLY_ONCE = "exactly_once"
NAIVE = "naive"
BATCHED = "batched"
MODES = (EXACTLY_ONCE, NAIVE, BATCHED)


@dataclass(frozen=True)
class ChannelConfig:
    window: int = 32                     # messages sent and not yet complete, per channel
    batch: int = 16                      # messages per completion in `batched` mode
    slots: int = 32                      # receive slots per channel (delivered, not yet consumed)
    max_message_bytes: int = 16 << 20    # a longer frame closes its connection (reason "oversized")
    connect_timeout: float = 10.0        # on_generation waits this long for the new link
    handshake_timeout: float = 5.0       # one handshake plus the OPEN/LOG exchange
    stall_timeout: float = 0.5           # no completion for this long while messages wait: a fault
    retry_interval: float = 0.02         # first pause between dial attempts (doubles up to 0.5 s)
    takeover_timeout: float = 10.0       # a new connection waits this long for the message in hand
    fsync: bool = False                  # fsync each log record (host-crash durability; ~ms per record)
    compact_records: int = 1 << 20       # rewrite the log once it holds this many records
    socket_buffer_bytes: int = 1 << 20   # SO_SNDBUF / SO_RCVBUF (0: leave the kernel's autotuning)
    encrypt: bool = False                # seal every frame (--encrypt); both ends must agree, or the dialer is refused
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)

    def __post_init__(self) -> None:
        if self.window < 1 or self.slots < 1 or self.batch < 1:
            raise ValueError(f"window={self.window}, slots={self.slots} and batch={self.batch} must be >= 1")
        if self.window < self.batch:
            raise ValueError(f"window={self.window} is smaller than batch={self.batch}: a batched sender "
                             "could never complete a batch; raise window or lower batch")
        if self.max_message_bytes < 1024:
            raise ValueError(f"max_message_bytes={self.max_message_bytes} is too small: use at least 1024")
        for name in ("connect_timeout", "handshake_timeout", "stall_timeout", "retry_interval",
                     "takeover_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"unknown channel mode {mode!r}; choose one of {MODES}")
    return mode

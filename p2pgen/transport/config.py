"""Data-plane configuration: frame size bound, chunking, timeouts and socket buffers.

Invariant: `chunk_bytes <= max_frame_bytes`, so every frame this process sends is one its peers (with the
same configuration) accept; a frame longer than `max_frame_bytes` is rejected before its payload is read.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TransportConfig:
    max_frame_bytes: int = 16 << 20      # a longer frame closes its connection (reason "oversized")
    chunk_bytes: int = 1 << 20           # payload bytes per frame in the ring pipeline
    connect_timeout: float = 10.0        # dial + handshake + waiting for a lower rank to dial us
    handshake_timeout: float = 5.0       # one handshake, either side
    op_timeout: float | None = 300.0     # backstop for one blocked socket call; the detector should act first
    abort_timeout: float = 5.0           # how long abort() waits for old-generation workers
    socket_buffer_bytes: int = 4 << 20   # SO_SNDBUF / SO_RCVBUF (0: leave the kernel's autotuning)
    encrypt: bool = False                # seal every frame (AES-256-GCM, transport.seal); the same on every member

    def __post_init__(self) -> None:
        if self.max_frame_bytes < 1024:
            raise ValueError(f"max_frame_bytes={self.max_frame_bytes} is too small: use at least 1024")
        if not 0 < self.chunk_bytes <= self.max_frame_bytes:
            raise ValueError(f"chunk_bytes={self.chunk_bytes} must be in 1..max_frame_bytes "
                             f"({self.max_frame_bytes}); lower chunk_bytes or raise max_frame_bytes")
        for name in ("connect_timeout", "handshake_timeout", "abort_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.op_timeout is not None and self.op_timeout <= 0:
            raise ValueError(f"op_timeout must be positive or None, got {self.op_timeout}")

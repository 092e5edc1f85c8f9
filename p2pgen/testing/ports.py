"""Test helper: open a Transport on a free port in 20000-31999 (below the kernel's ephemeral range,
which on this project's machines starts at 32768, so a test never collides with outgoing connections).
"""

from __future__ import annotations

import errno
import random

from p2pgen.transport import Transport, TransportConfig

PORT_RANGE = (20000, 32000)


def open_transport(job: str, secret: bytes, peer_id: str, incarnation: int,
                   config: TransportConfig | None = None, host: str = "127.0.0.1",
                   attempts: int = 200) -> Transport:
    """A Transport bound to a random free port in PORT_RANGE; raises OSError if none was free."""
    rng = random.Random()
    for _ in range(attempts):
        try:
            return Transport(job, secret, peer_id, incarnation, host=host,
                             port=rng.randrange(*PORT_RANGE), config=config)
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
    raise OSError(errno.EADDRINUSE, f"no free port in {PORT_RANGE} after {attempts} attempts")

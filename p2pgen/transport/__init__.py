"""Framed, authenticated, generation-stamped TCP between the applications of one job.

Layers: `frame` (header, checksum) and `handshake` (challenge-response, I8) are pure wire formats;
`Connection` moves verified frames; `Session` is the set of connections of one generation and its
abort; `Transport` is the process's listener, routes accepted connections to sessions and counts
every refusal (`stats()`).

Threads, not asyncio: every receive is a blocking `recv_into` straight into a preallocated numpy
buffer and every send a `sendmsg` from one, both releasing the GIL, and reductions run in numpy on the
receiving thread; an event loop would add a copy (stream readers) or a loop hop per chunk and
serialise reduction with I/O.
"""

from p2pgen.transport.config import TransportConfig
from p2pgen.transport.connection import Connection, RecvSlot
from p2pgen.transport.frame import FrameKind
from p2pgen.transport.group import Endpoint, Group
from p2pgen.transport.session import PROVED, UNKNOWN, Session
from p2pgen.transport.stats import REASONS
from p2pgen.transport.transport import Transport

__all__ = ["Connection", "Endpoint", "FrameKind", "Group", "PROVED", "REASONS", "RecvSlot", "Session",
           "Transport", "TransportConfig", "UNKNOWN"]

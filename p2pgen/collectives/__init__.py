"""Collectives over the data plane: the `Backend` protocol and its `tcp` implementation (CPU ring).

Public names: Backend, ReduceOp, TcpBackend. A later `nccl` backend implements the same protocol and
passes the same conformance suite (`p2pgen.testing.conformance`).
"""

from p2pgen.collectives.backend import Backend, ReduceOp
from p2pgen.collectives.tcp import TcpBackend

__all__ = ["Backend", "ReduceOp", "TcpBackend"]

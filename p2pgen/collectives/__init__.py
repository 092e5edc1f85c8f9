"""Collectives over the data plane: the `Backend` protocol and its `tcp` implementation (CPU ring).

Public names: Backend, ReduceOp, TcpBackend. `p2pgen.collectives.nccl.NcclBackend` (GPUs, CuPy NCCL) and
`p2pgen.collectives.staged.HostStagedBackend` implement the same protocol and pass the same conformance
suite (`p2pgen.testing.conformance`); they are imported only where used (CuPy is optional).
`p2pgen.collectives.compress` is the compressed all_reduce (int8, bf16) over any of them.
"""

from p2pgen.collectives.backend import Backend, ReduceOp
from p2pgen.collectives.tcp import TcpBackend

__all__ = ["Backend", "ReduceOp", "TcpBackend"]

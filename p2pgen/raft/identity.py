"""Raft node identities: `host:port/nonce`, one per Raft node a process ever starts, never reused in a job.

Owns: the node class pysyncobj builds its nodes from (`NodeId`) and the making and parsing of ids.
pysyncobj 0.3.17 names a node by its address (docs/design/pysyncobj.md, pitfalls 14-16): a process started later at the
same address *is* the old node to everyone else, with an empty log, term 0 and no recorded vote. Here the
address says only where to dial; the id adds a random nonce made when the node is created, so a later process
at the same address is a different node, admitted only by a committed add of its own id.
Invariant kept: `NodeId.address` is the whole id (pysyncobj's handshake and maps use it as the node's name);
`host` and `port` are only where to connect.
"""

from __future__ import annotations

import secrets

from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.node import TCPNode

NONCE_BYTES = 6


def new_node_id(raft_addr: str) -> str:
    """A fresh node id at `raft_addr` (HOST:PORT): the address plus a random nonce."""
    split_node_id(f"{raft_addr}/x")          # validates the address
    return f"{raft_addr}/{secrets.token_hex(NONCE_BYTES)}"


def split_node_id(node_id: str) -> tuple[str, int, str]:
    """(host, port, nonce) of a node id; ValueError naming the id when it is not `host:port/nonce`."""
    addr, sep, nonce = node_id.partition("/")
    host, colon, port = addr.rpartition(":")
    if not (sep and nonce and colon and host and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"{node_id!r} is not a Raft node id (expected HOST:PORT/NONCE)")
    return host, int(port), nonce


def raft_addr_of(node_id: str) -> str:
    """HOST:PORT a node id listens on."""
    host, port, _ = split_node_id(node_id)
    return f"{host}:{port}"


class NodeId(TCPNode):
    """A pysyncobj TCP node whose identity is `host:port/nonce` (see the module docstring)."""

    def __init__(self, node_id: str, **kwargs) -> None:
        host, port, _ = split_node_id(node_id)
        super().__init__(f"{host}:{port}", **kwargs)
        self._id = node_id        # Node.__setattr__ refuses `id`; the identity is the whole id, not the address
        self._dial = (host, port)

    @property
    def address(self) -> str:
        return self._id

    @property
    def host(self) -> str:
        return self._dial[0]

    @property
    def port(self) -> int:
        return self._dial[1]

    @property
    def ip(self) -> str:
        return globalDnsResolver().resolve(self._dial[0])

    def __repr__(self) -> str:
        return f"NodeId({self._id!r})"

"""Every backend implements the whole `Backend` protocol: each name the Peer and p2pgen.torch use of a
communicator (collectives, op_seq, failed, connect, abort, ...) is defined by TcpBackend, NcclBackend and
HostStagedBackend (checked on the classes: building them needs sockets or a GPU)."""

from __future__ import annotations

import inspect

import pytest

from p2pgen.collectives import Backend, TcpBackend
from p2pgen.collectives.nccl import NcclBackend
from p2pgen.collectives.staged import HostStagedBackend

MEMBERS = sorted({n for n in dir(Backend) if not n.startswith("_")} | set(Backend.__annotations__))
DATA = set(Backend.__annotations__)          # set by __init__, so looked for in its source


def test_the_protocol_names_what_the_peer_uses():
    assert {"op_seq", "failed", "connect", "abort", "close", "group", "generation", "rank", "world",
            "all_reduce"} <= set(MEMBERS)


@pytest.mark.parametrize("backend", [TcpBackend, NcclBackend, HostStagedBackend], ids=lambda c: c.__name__)
def test_every_backend_defines_every_member_of_the_protocol(backend):
    init = inspect.getsource(backend.__init__)
    missing = [n for n in MEMBERS if not hasattr(backend, n) and not (n in DATA and n in init)]
    assert not missing, f"{backend.__name__} lacks {missing}"
    for name in MEMBERS:
        if callable(getattr(Backend, name, None)) and hasattr(backend, name):
            assert callable(getattr(backend, name)), f"{backend.__name__}.{name} is not a method"

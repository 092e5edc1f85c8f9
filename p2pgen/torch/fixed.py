"""p2pgen as a plain, fixed-membership torch backend: `init_process_group("p2pgen", init_method=..., rank=...,
world_size=...)` with no agents, for users who only want a fast CPU backend (and torch's own test suite).

Owns: the rendezvous of one fixed group through torch's store, and the communicator it yields. Each member
opens a data-plane Transport, publishes its address in the store, reads everyone else's, and builds one
generation (number 1) that never changes: a TcpBackend over those members, with CUDA tensors either on an
NCCL communicator (`P2PGEN_TORCH_NCCL=1` and CuPy's NCCL loadable; its unique id goes through the store the
first time a CUDA tensor is used) or staged through host memory. The ring's connections are made at once;
the rest when first used.

Trust: the job secret is `$P2PGEN_SECRET_FILE`'s when set; otherwise rank 0 draws one and shares it
through the store, so the data plane is as private as torch's store (as with gloo). `$P2PGEN_ENCRYPT=1` on every
rank seals the ring's links (`p2pgen.transport.seal`; with a secret from the store they are then as private
as the store, so give a `$P2PGEN_SECRET_FILE` too). Timeouts: torch's
`timeout` bounds connecting and every blocked socket call (there is no failure detector in a fixed group:
a dead member fails the collectives in flight with PeerLost, and the group stays failed).
The advertised address is `$P2PGEN_HOST`, else the local address that reaches the TCPStore's host (127.0.0.1
for a local store).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from p2pgen.auth import read_secret_file
from p2pgen.collectives.staged import HostStagedBackend
from p2pgen.collectives.tcp import TcpBackend
from p2pgen.transport import Endpoint, Group, Transport, TransportConfig, seal

GENERATION = 1


def rendezvous(store: Any, rank: int, size: int, timeout: timedelta, name: str) -> tuple[Any, Callable[[], None]]:
    """(communicator, close) of member `rank` of a fixed group of `size` members meeting through `store`."""
    seconds = max(timeout.total_seconds(), 1.0)
    secret = read_secret_file(None) or _shared_secret(store, rank, timeout)
    job = f"torch-{name}"
    host = os.environ.get("P2PGEN_HOST") or _local_address(store)
    config = TransportConfig(connect_timeout=seconds, op_timeout=seconds, encrypt=seal.from_env(os.environ))
    transport = Transport(job, secret, f"rank{rank}", int.from_bytes(os.urandom(6), "big") or 1, host=host,
                          config=config)
    try:
        store.set(f"p2pgen/addr/{rank}", f"{transport.host}:{transport.port}:{transport.identity[1]}")
        keys = [f"p2pgen/addr/{r}" for r in range(size)]
        store.wait(keys, timeout)
        endpoints = [_endpoint(r, store.get(k).decode()) for r, k in enumerate(keys)]
        tcp = TcpBackend(transport, Group(job, GENERATION, endpoints, rank))
        tcp.connect()
    except BaseException:
        transport.close()
        raise
    comm = DeviceRouter(HostStagedBackend(tcp), store, timeout) if os.environ.get("P2PGEN_TORCH_NCCL") == "1" \
        else HostStagedBackend(tcp)

    def close() -> None:
        comm.close()
        transport.close()
    return comm, close


def _endpoint(rank: int, addr: str) -> Endpoint:
    host, port, incarnation = addr.rsplit(":", 2)
    return Endpoint(f"rank{rank}", int(incarnation), host, int(port))


def _shared_secret(store: Any, rank: int, timeout: timedelta) -> bytes:
    if rank == 0:
        store.set("p2pgen/secret", os.urandom(32).hex())
    store.wait(["p2pgen/secret"], timeout)
    return bytes.fromhex(store.get("p2pgen/secret").decode())


def _local_address(store: Any) -> str:
    """The local address that reaches the TCPStore's host (127.0.0.1 for any other store, or a local one)."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    host = getattr(store, "host", None)
    if not host or host in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((host, 9))          # no packet is sent: this only picks the outgoing interface
        return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


class DeviceRouter:
    """A fixed group's communicator when NCCL is wanted: CUDA tensors on an NCCL communicator made on first
    use (its unique id through the store), everything else on the host-staged tcp backend."""

    def __init__(self, host: HostStagedBackend, store: Any, timeout: timedelta) -> None:
        self.host, self._store, self._timeout = host, store, timeout
        self.rank, self.world, self.generation = host.rank, host.world, host.generation
        self._nccl: Any = None

    @property
    def reductions(self) -> Any:
        return self.host.reductions

    @property
    def failed(self) -> str | None:
        return self.host.failed or (self._nccl.failed if self._nccl is not None else None)

    def _for(self, *buffers: Any) -> Any:
        if any(getattr(getattr(b, "device", None), "type", "cpu") == "cuda" for b in buffers):
            return self._nccl_backend()
        return self.host

    def _nccl_backend(self) -> Any:
        if self._nccl is None:
            from p2pgen.collectives import nccl_lib
            from p2pgen.collectives.nccl import NcclBackend, new_comm_id

            lib = nccl_lib.load()
            if self.rank == 0:
                self._store.set("p2pgen/nccl_id", new_comm_id(lib))
            self._store.wait(["p2pgen/nccl_id"], self._timeout)
            self._nccl = NcclBackend(self._store.get("p2pgen/nccl_id").decode(), self.rank, self.world,
                                     self.generation, nccl=lib, cupy_major=nccl_lib.cupy_major(),
                                     init_timeout=self._timeout.total_seconds())
            self._nccl.connect()
        return self._nccl

    def all_reduce(self, buf: Any, op: Any = "sum") -> Any:
        return self._for(buf).all_reduce(buf, op)

    def broadcast(self, buf: Any, root: int) -> Any:
        return self._for(buf).broadcast(buf, root)

    def all_gather(self, output: Any, input: Any) -> Any:
        return self._for(output, input).all_gather(output, input)

    def reduce_scatter(self, output: Any, input: Any, op: Any = "sum") -> Any:
        return self._for(output, input).reduce_scatter(output, input, op)

    def all_to_all(self, output: Any, input: Any, output_splits: Sequence[int] | None = None,
                   input_splits: Sequence[int] | None = None) -> Any:
        return self._for(output, input).all_to_all(output, input, output_splits, input_splits)

    def send(self, buf: Any, dst: int) -> None:
        self._for(buf).send(buf, dst)

    def recv(self, buf: Any, src: int) -> Any:
        return self._for(buf).recv(buf, src)

    def post_send(self, buf: Any, dst: int) -> Any:
        return self.host.post_send(buf, dst) if self._for(buf) is self.host else None

    def recv_any(self, buf: Any) -> int:
        return self.host.recv_any(buf)

    def barrier(self) -> None:
        self.host.barrier()

    def monitored_barrier(self, timeout: float, wait_all_ranks: bool) -> None:
        self.host.monitored_barrier(timeout, wait_all_ranks)

    def subgroup(self, ranks: Sequence[int]) -> Any:
        return self.host.subgroup(ranks)

    def abort(self, reason: str) -> str:
        quiescence = self.host.abort(reason)
        if self._nccl is not None:
            self._nccl.abort(reason)
        return quiescence

    def close(self) -> None:
        self.host.close()
        if self._nccl is not None:
            self._nccl.close()

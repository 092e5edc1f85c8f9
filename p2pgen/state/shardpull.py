"""pull_shards: fetch the shards the election gave this member, before the generation activates.

Owns: one member's part of a repartition (DESIGN "Repartition"): for every `ShardPull` of the pending
generation addressed to it, copy the shard from its surviving owners in chunks (PCCL style: stamped,
authenticated frames from the source's state server, one shard at a time), or rebuild it (revision 0:
its initial value). A source that fails or sends bytes with another digest is dropped and the next
source is tried from the start of that shard.

Invariants:
- a shard is installed only once all its bytes arrived and hash to the digest its owners agreed on at
  the frontier (`ShardedObject.install` checks); nothing half-copied is ever visible;
- `pull_shards` returns only when every shard it was told to pull is installed; otherwise it raises
  StateSyncError naming the shard and why each source failed, and the member must not report `synced`.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from p2pgen import auth
from p2pgen.core.model import ShardPull
from p2pgen.errors import P2PGenError
from p2pgen.state import wire
from p2pgen.state.pull import PullConfig, Source
from p2pgen.state.sharded import ShardMismatch
from p2pgen.state.shared import SharedState
from p2pgen.state.wire import StateSyncError
from p2pgen.transport import handshake, hooks
from p2pgen.transport.seal import Seal


@dataclass
class ShardPullReport:
    bytes_by_source: dict[str, int] = field(default_factory=dict)
    shards: list[str] = field(default_factory=list)          # "object[index]<-source" for each shard installed
    rebuilt: list[str] = field(default_factory=list)         # rebuilt from the initial value (revision 0)
    failures: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def bytes_total(self) -> int:
        return sum(self.bytes_by_source.values())


def pull_shards(state: SharedState, pulls: Sequence[ShardPull], sources: Mapping[str, Source], *,
                job: str, secret: bytes, me: tuple[str, int], generation: int, frontier_revision: int,
                config: PullConfig = PullConfig()) -> ShardPullReport:
    """Install every shard in `pulls` (the pending generation's shard pulls addressed to `me`); `sources` maps
    peer_id -> its state server."""
    report = ShardPullReport()
    start = time.monotonic()
    key = auth.derive_key(secret, job, wire.KEY_PURPOSE)
    for sp in pulls:
        obj = state.sharded.get(sp.object_id)
        if obj is None:
            raise StateSyncError(f"told to hold shard {sp.object_id}[{sp.index}] of an object this process "
                                 "did not declare: declare the same sharded objects on every member")
        name = f"{sp.object_id}[{sp.index}]"
        if not sp.sources:
            if frontier_revision != 0 and sp.index not in obj.held:
                raise StateSyncError(f"{name} has no source and the frontier is revision {frontier_revision}: it "
                                     "must come from the checkpoint this member loaded, which did not hold it")
            if frontier_revision == 0:
                obj.reset(sp.index)
                report.rebuilt.append(name)
            continue
        _pull_one(obj, sp, [sources[p] for p in sp.sources if p in sources], key, job, me, generation, config,
                  report, name)
    report.seconds = time.monotonic() - start
    return report


def _pull_one(obj, sp: ShardPull, sources: Sequence[Source], key: bytes, job: str, me: tuple[str, int],
              generation: int, config: PullConfig, report: ShardPullReport, name: str) -> None:
    for source in sources:
        try:
            data = _fetch(source, sp.object_id, sp.index, sp.nbytes, key, job, me, generation, config)
            obj.install(sp.index, data, sp.digest)
        except (P2PGenError, OSError, ShardMismatch) as e:
            report.failures[f"{name}<-{source.peer_id}"] = f"{type(e).__name__}: {e}"
            continue
        report.bytes_by_source[source.peer_id] = report.bytes_by_source.get(source.peer_id, 0) + sp.nbytes
        report.shards.append(f"{name}<-{source.peer_id}")
        return
    raise StateSyncError(f"could not pull shard {name} for generation {generation} from "
                         f"{[s.peer_id for s in sources]}: {report.failures}")


def _fetch(source: Source, object_id: str, index: int, nbytes: int, key: bytes, job: str, me: tuple[str, int],
           generation: int, config: PullConfig) -> np.ndarray:
    sock = socket.create_connection((source.host, source.port), timeout=config.connect_timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        keys = handshake.dial(sock, key, handshake.Hello(job, generation, me, (source.peer_id, source.incarnation),
                                                         auth.new_nonce(), config.encrypt))
        sock.settimeout(config.op_timeout)
        rx = wire.FrameReceiver(sock, job, generation, (source.peer_id, source.incarnation), config.max_frame_bytes,
                                wire.Counters(), plane=hooks.SHARD, seal=Seal(keys) if keys is not None else None)
        cb = config.chunk_bytes
        n = wire.chunk_count(nbytes, cb)
        buf = np.empty(nbytes, np.uint8)
        rx.request({"op": "shard_get", "o": object_id, "i": index, "first": 0, "count": n, "cb": cb})
        for c in range(n):
            rx.recv(wire.CHUNK, index, c, memoryview(buf)[c * cb:(c + 1) * cb])
        return buf
    finally:
        sock.close()

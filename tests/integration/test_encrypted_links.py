"""Integration: `--encrypt` end to end on loopback. Three members all-reduce through sealed links (a recording
proxy on one link sees no plaintext), a joiner pulls the state and a channel carries messages, all sealed; a
member without `--encrypt` is refused on every plane, naming who must restart; a byte flipped on the wire
fails the generation like a lost peer and leaves every buffer as it was."""

from __future__ import annotations

import random
import socket
import threading

import numpy as np
import pytest

from p2pgen.channel import Channel, ChannelConfig
from p2pgen.collectives import TcpBackend, shm
from p2pgen.core.model import Frontier
from p2pgen.errors import EncryptionMismatch, PeerLost, ProtocolError
from p2pgen.state import PullConfig, ServerConfig, StateSyncError, pull_state
from p2pgen.testing.ports import open_transport
from p2pgen.transport import Endpoint, Group, TransportConfig
from tests.channel.conftest import JOB as CHANNEL_JOB
from tests.channel.conftest import SECRET as CHANNEL_SECRET
from tests.channel.conftest import open_listener
from tests.state.helpers import JOB, SECRET, make_state, open_server, source_of

pytestmark = pytest.mark.timeout(60)

SEALED = TransportConfig(encrypt=True, connect_timeout=3.0, handshake_timeout=2.0)
PLAIN = TransportConfig(connect_timeout=3.0, handshake_timeout=2.0)
GEN = 4


class Proxy:
    """A TCP relay in front of one member's data port: records what the dialer sends, and can flip one byte."""

    def __init__(self, target_port: int, flip_at: int | None = None) -> None:
        self.target_port, self.flip_at = target_port, flip_at
        self.sent = bytearray()
        self.server = socket.socket()
        for _ in range(200):
            try:
                self.server.bind(("127.0.0.1", random.randrange(20000, 32000)))
                break
            except OSError:
                continue
        else:
            self.server.close()
            raise OSError("no free port in 20000-31999 for the proxy")
        self.server.listen(1)
        self.port = self.server.getsockname()[1]
        self.socks: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._serve, daemon=True)]
        self.threads[0].start()

    def _serve(self) -> None:
        try:
            client, _ = self.server.accept()
        except OSError:
            return
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        self.socks += [client, upstream]
        back = threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True)
        self.threads.append(back)
        back.start()
        self._pump(client, upstream, True)

    def _pump(self, src: socket.socket, dst: socket.socket, record: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                if record:
                    data = bytearray(data)
                    at = self.flip_at - len(self.sent) if self.flip_at is not None else -1
                    if 0 <= at < len(data):
                        data[at] ^= 0x20
                    self.sent += data
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.server.close()
        for s in self.socks:
            s.close()
        for t in self.threads:
            t.join(5)


def run_ranks(fns) -> list:
    """Run one function per rank on its own thread; each result, or the exception it raised."""
    out: list = [None] * len(fns)

    def call(i):
        try:
            out[i] = fns[i]()
        except BaseException as e:     # handed back to the test
            out[i] = e
    threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a rank is still blocked"
    return out


@pytest.fixture
def ring(monkeypatch):
    """`ring(configs, flip_at=...)`: one Transport per config; rank 0 reaches rank 1 through a Proxy.
    Returns (transports, backends, proxy); everything is closed after the test."""
    monkeypatch.setenv(shm.ENV, "0")               # every size takes the TCP ring, as between hosts
    made: list = []

    def make(configs, flip_at=None):
        transports = [open_transport(JOB, SECRET, f"p{i}", i + 1, c) for i, c in enumerate(configs)]
        made.extend(t.close for t in transports)
        proxy = Proxy(transports[1].port, flip_at)
        made.append(proxy.close)
        members = [t.endpoint() for t in transports]
        seen_by_0 = [members[0], Endpoint(*members[1].identity, "127.0.0.1", proxy.port), *members[2:]]
        backends = [TcpBackend(t, Group(JOB, GEN, seen_by_0 if i == 0 else members, i))
                    for i, t in enumerate(transports)]
        made.extend(b.close for b in backends)
        return transports, backends, proxy
    yield make
    for close in reversed(made):
        close()


@pytest.mark.parametrize("encrypt", [True, False], ids=["sealed", "plain"])
def test_three_members_all_reduce_and_only_sealed_links_hide_the_bytes(ring, encrypt):
    transports, backends, proxy = ring([SEALED if encrypt else PLAIN] * 3)
    inputs = [np.random.default_rng(r).standard_normal(300_000).astype(np.float32) for r in range(3)]
    bufs = [x.copy() for x in inputs]
    results = run_ranks([lambda b=b, x=x: b.all_reduce(x) for b, x in zip(backends, bufs)])
    assert not any(isinstance(r, BaseException) for r in results), results
    expected = inputs[0] + inputs[1] + inputs[2]
    for buf in bufs:
        np.testing.assert_allclose(buf, expected, rtol=1e-5, atol=1e-6)
        assert buf.tobytes() == bufs[0].tobytes()            # bit-identical on every member
    sample = inputs[0][200_000:200_016].tobytes()            # rank 0 sends its chunk 2 to rank 1 verbatim
    assert (sample in proxy.sent) is (not encrypt)
    assert all(sum(t.stats()[r] for r in ("bad_seal", "replayed", "encryption_mismatch")) == 0 for t in transports)


def test_a_joiner_pulls_the_state_and_a_channel_carries_messages_sealed(tmp_path):
    src, dst = make_state(3, 1 << 20), make_state(3, 1 << 20, revision=1)
    dst.tensors["layer1.weight"][:] = 0
    server = open_server(src, ("p0", 1), config=ServerConfig(encrypt=True))
    listener = open_listener(tmp_path, config=ChannelConfig(encrypt=True, connect_timeout=3.0))
    channel = None
    try:
        with server.serving(GEN) as manifest:
            report = pull_state(dst, job=JOB, secret=SECRET, me=("joiner", 7), generation=GEN,
                                frontier=Frontier(manifest.revision, manifest.digest), sources=[source_of(server)],
                                config=PullConfig(chunk_bytes=64 << 10, encrypt=True), progress=False)
        assert dst.digest() == src.digest() and "layer1.weight" in report.tensors_fetched
        assert not any(report.refusals.values()) and not any(server.stats().values())
        channel = Channel(CHANNEL_JOB, CHANNEL_SECRET, ("prefill", 1),
                          Endpoint("decode", 1, listener.host, listener.port),
                          config=ChannelConfig(encrypt=True, connect_timeout=3.0))
        for i in range(3):
            channel.send(np.full(1000, i, np.int32))
        rx = listener.receiver("prefill")
        for i in range(3):
            msg = rx.receive(timeout=5)
            assert np.array_equal(msg.array(), np.full(1000, i, np.int32))
            msg.consumed()
        assert channel.flush(timeout=5)
        assert listener.stats()["bad_seal"] == listener.stats()["encryption_mismatch"] == 0
    finally:
        if channel is not None:
            channel.close()
        listener.close()
        server.close()


def test_a_member_without_encrypt_is_refused_on_every_plane(ring, tmp_path):
    quick = dict(connect_timeout=1.0, handshake_timeout=1.0)        # the sealed member gives up waiting after 1 s
    transports, backends, _ = ring([TransportConfig(**quick), TransportConfig(encrypt=True, **quick)])
    results = run_ranks([lambda b=b: b.all_reduce(np.ones(1000, np.float32)) for b in backends])
    assert isinstance(results[0], EncryptionMismatch), results
    assert "peer p0 (incarnation 1) joined without --encrypt" in str(results[0])
    assert "restart p0 with --encrypt" in str(results[0])
    assert isinstance(results[1], PeerLost)                 # the sealed member waits for a link that never comes
    assert transports[1].stats()["encryption_mismatch"] == 1

    server = open_server(make_state(3, 1 << 16), ("p0", 1), config=ServerConfig(encrypt=True))
    try:
        with server.serving(GEN) as manifest, pytest.raises(StateSyncError, match="restart joiner with --encrypt"):
            pull_state(make_state(3, 1 << 16, revision=1), job=JOB, secret=SECRET, me=("joiner", 7), generation=GEN,
                       frontier=Frontier(manifest.revision, manifest.digest), sources=[source_of(server)],
                       progress=False)
        assert server.stats()["encryption_mismatch"] == 1
    finally:
        server.close()

    listener = open_listener(tmp_path)                      # a plain receiver; the sender encrypts
    channel = Channel(CHANNEL_JOB, CHANNEL_SECRET, ("prefill", 1),
                      Endpoint("decode", 1, listener.host, listener.port),
                      config=ChannelConfig(encrypt=True, connect_timeout=1.0))
    try:
        with pytest.raises(EncryptionMismatch, match="restart decode with --encrypt"):
            _ = channel.resume_seq
        assert listener.stats()["encryption_mismatch"] >= 1
    finally:
        channel.close()
        listener.close()


def test_a_byte_flipped_on_the_wire_fails_the_generation_and_leaves_every_buffer(ring):
    transports, backends, _ = ring([SEALED] * 2, flip_at=4000)      # past the handshake, inside the first frame
    inputs = [np.full(200_000, r + 1.0, np.float32) for r in range(2)]
    bufs = [x.copy() for x in inputs]
    results = run_ranks([lambda b=b, x=x: b.all_reduce(x) for b, x in zip(backends, bufs)])
    assert isinstance(results[1], ProtocolError) and "(bad_seal)" in str(results[1]), results
    assert "p0 (incarnation 1, rank 0, generation 4)" in str(results[1])
    assert isinstance(results[0], (PeerLost, ProtocolError))        # its neighbour closed: like a lost peer
    assert all(b.failed is not None for b in backends)              # the generation is retired on both
    assert all(np.array_equal(b, x) for b, x in zip(bufs, inputs))  # nothing was applied
    assert transports[1].stats()["bad_seal"] == 1

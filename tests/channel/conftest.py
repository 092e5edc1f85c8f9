"""Fixtures: a channel listener on a free loopback port below 32768, channels to it, a rogue sender."""

from __future__ import annotations

import errno
import random
import socket

import pytest

from p2pgen import auth
from p2pgen.channel import Channel, ChannelConfig, ChannelListener, Endpoint
from p2pgen.channel.wire import LOG, OPEN, Stamp, recv_control, send_control
from p2pgen.transport import frame, handshake
from p2pgen.transport.seal import Seal

JOB = "channel-test"
SECRET = b"channel-test-secret-0123456789ab"
FAST = ChannelConfig(connect_timeout=3.0, handshake_timeout=2.0, takeover_timeout=5.0)


def open_listener(log_dir, incarnation: int = 1, config: ChannelConfig = FAST) -> ChannelListener:
    rng = random.Random()
    for _ in range(200):
        try:
            return ChannelListener(JOB, SECRET, ("decode", incarnation), str(log_dir),
                                   port=rng.randrange(20000, 32000), config=config)
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
    raise OSError(errno.EADDRINUSE, "no free port in 20000-31999")


class Rig:
    """A listener plus the channels a test opens to it; everything is closed at teardown."""

    def __init__(self, log_dir, config: ChannelConfig = FAST) -> None:
        self.log_dir = log_dir
        self.listener = open_listener(log_dir, config=config)
        self.rx = self.listener.receiver("prefill")
        self.closers = [self.listener.close]

    def endpoint(self) -> Endpoint:
        return Endpoint("decode", self.listener.identity[1], "127.0.0.1", self.listener.port)

    def channel(self, incarnation: int = 1, generation: int = 0, mode: str = "exactly_once",
                secret: bytes = SECRET, config: ChannelConfig = FAST) -> Channel:
        ch = Channel(JOB, secret, ("prefill", incarnation), self.endpoint(), mode=mode,
                     generation=generation, config=config)
        self.closers.insert(0, ch.close)
        return ch

    def rogue(self, incarnation: int = 1, generation: int = 0, mode: str = "exactly_once",
              encrypt: bool = False) -> Rogue:
        r = Rogue(self.endpoint(), incarnation, generation, mode, encrypt)
        self.closers.insert(0, r.sock.close)
        return r

    def close(self) -> None:
        for close in self.closers:
            close()


class Rogue:
    """A sender that passes the real handshake and OPEN/LOG exchange, then writes hand-made frames (sealed with
    the connection's keys, in counter order, when `encrypt`)."""

    def __init__(self, target: Endpoint, incarnation: int, generation: int, mode: str, encrypt: bool = False) -> None:
        self.sock = socket.create_connection((target.host, target.port), timeout=5)
        self.stamp = Stamp(frame.job_tag(JOB), generation, incarnation)
        hello = handshake.Hello(JOB, generation, ("prefill", incarnation), target.identity, auth.new_nonce(), encrypt)
        keys = handshake.dial(self.sock, auth.derive_key(SECRET, JOB, "channel"), hello)
        self.seal = Seal(keys) if keys is not None else None
        send_control(self.sock, OPEN, self.stamp, {"mode": mode}, self.seal)
        self.log = recv_control(self.sock, LOG, Stamp(self.stamp.tag, generation, target.incarnation), self.seal)

    def frame(self, seq: int, payload: bytes, *, generation: int | None = None) -> bytes:
        gen = self.stamp.generation if generation is None else generation
        if self.seal is None:
            return frame.pack_header(18, self.stamp.tag, gen, self.stamp.incarnation, seq, 0, payload) + payload
        header = frame.pack_header(18, self.stamp.tag, gen, self.stamp.incarnation, seq, 0, payload,
                                   frame.SEALED_DIGEST)
        return b"".join(bytes(b) for b in self.seal.seal_frame(header, payload))

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)


@pytest.fixture
def rig(tmp_path):
    r = Rig(tmp_path)
    try:
        yield r
    finally:
        r.close()

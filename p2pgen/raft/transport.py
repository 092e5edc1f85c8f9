"""pysyncobj's TCP transport with a two-way node identity, refusals that say why, and keep-alives.

Owns: the handshake of every Raft connection and what is sent on idle ones.
- Two-way identity (docs/design/pysyncobj.md, pitfall 15). pysyncobj's dialer names itself and the listener is whoever
  answers on the port. Here the listener answers with its own node id before anything else, and the dialer
  accepts the connection only when that id is the node it meant to reach; so a new process at a dead node's
  address (a different `host:port/nonce`, see `identity`) is never taken for the dead node.
- Refusals. A dialer whose id is not in this node's configuration (removed, or its add has not reached this
  node yet) and pysyncobj's unauthenticated admin commands (`add`, `remove`, ... as utility messages) are
  refused with a message that says why, then disconnected, and counted in `refused`; a dialer keeps the
  refusals it receives (`refusals_received`), so a node that was removed can learn it. Nothing a refused
  connection sends reaches SyncObj.
- Liveness of a verified link, judged by the kernel. pysyncobj drops a connection it read nothing on for
  `connectionTimeout`, so an idle link (between two followers, or a follower and a non-voting member) needed a
  message on it every few tenths of a second, and a dropped one lost the first vote request after a leader died
  (pitfall 1). Here, once both sides proved which node they are, the read timer no longer applies: the kernel
  probes a link idle for LIVENESS_IDLE_S (TCP keep-alive, answered by the peer's kernel, waking no thread) and
  aborts the connection when data or a probe stays unacknowledged for `connectionTimeout`
  (`TCP_USER_TIMEOUT`). A dead process's link closes at once, as before (its kernel resets it); a vanished
  host's, within `connectionTimeout` of the first unanswered send or probe; a link whose peer lives is never
  dropped for being idle, so an idle job's nodes wake only for the leader's heartbeats and their acks.
  A connection still in its handshake keeps pysyncobj's read timer. Where the socket options are missing the
  read timer stays and nothing else changes but pitfall 1.
- Link events. `events` counts what the node's thread must tick for: a link verified or closed, a refusal given
  or received; the thread sleeps on through a wake-up that changed none of it (`RaftNode`).
- Lost links. When a connection to a voter that finished the handshake closes, `on_link_lost(node id)` is called (on the
  node's thread): a peer whose process died closes it at once (its kernel does), which is a hint, not a proof,
  for whoever can check faster than a timeout (the agent probes that node's agent at once).
- Injected partitions (`p2pgen.faults`): a message to or from a node across a cut direction is dropped here,
  the connection kept (a black-holed route, one direction at a time).
- Compression of small messages (docs/design/pysyncobj.md, "Small messages"). pysyncobj compresses every message
  with `zlib.compress(data, 3)`, whose 256 KiB deflate state is set up afresh each time: more than pickling and
  encrypting an idle append costs. Messages of up to SMALL_MESSAGE bytes are compressed at the same level with a
  window and memory as small as the message needs (`SmallMessageZlib`, put in pysyncobj's `tcp_connection`
  module in its `zlib`'s place); the stream is zlib's own format, which every pysyncobj decompresses as before,
  so nodes with and without it understand each other.
Invariant kept: a connection is handed to SyncObj (`_onNodeConnected`) only after both sides proved which node
they are (the secret-derived Fernet key proves membership of the job; the id proves which node).
"""

from __future__ import annotations

import functools
import logging
import socket
import zlib
from collections import Counter, deque
from collections.abc import Callable

from pysyncobj import tcp_connection
from pysyncobj.monotonic import monotonic as monotonic_time
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

from p2pgen import faults

log = logging.getLogger(__name__)

IDENTITY = "p2pgen_identity"
REFUSED = "p2pgen_refused"
SMALL_MESSAGE = 4096              # bytes: up to this, a message is compressed with a small deflate state
SMALL_WINDOW_BITS = 12            # a 4 KiB window: it spans any small message
SMALL_MEM_LEVEL = 4               # about 20 KiB of deflate state in all, an ordinary heap allocation


class SmallMessageZlib:
    """What pysyncobj's `tcp_connection` module calls `zlib`: its `compress` gives a small message a deflate state
    sized for it (see the module docstring); a larger one, and `decompress`, are zlib's."""

    decompress = staticmethod(zlib.decompress)

    @staticmethod
    def compress(data: bytes, level: int = -1) -> bytes:
        """A zlib stream of `data`, as `zlib.compress(data, level)` makes, at the same level.

        Args:
            data: one pickled Raft message.
            level: the deflate level pysyncobj asks for.
        """
        if len(data) > SMALL_MESSAGE:
            return zlib.compress(data, level)
        compressor = zlib.compressobj(level, zlib.DEFLATED, SMALL_WINDOW_BITS, SMALL_MEM_LEVEL)
        return compressor.compress(data) + compressor.flush()


tcp_connection.zlib = SmallMessageZlib()

LIVENESS_IDLE_S = 1               # the kernel probes a link idle this long, then every this long (whole seconds)
_read_timeout = tcp_connection.TcpConnection._TcpConnection__processConnectionTimeout


def _connection_timeout(conn: tcp_connection.TcpConnection) -> None:
    """pysyncobj's read timer, for a connection the kernel does not judge (see the module docstring)."""
    if conn.state == CONNECTION_STATE.CONNECTED and getattr(conn, "judged_by_kernel", False):
        return
    _read_timeout(conn)


tcp_connection.TcpConnection._TcpConnection__processConnectionTimeout = _connection_timeout


def judge_by_kernel(conn: tcp_connection.TcpConnection, timeout: float) -> bool:
    """Hand a verified connection's liveness to the kernel: keep-alive probes on an idle link, and an abort when
    data or a probe stays unacknowledged for `timeout` seconds. False (pysyncobj's read timer stays) where the
    platform lacks the options.

    Args:
        conn: a connection whose handshake finished.
        timeout: seconds, pysyncobj's `connectionTimeout`.
    """
    sock = conn._TcpConnection__socket
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, LIVENESS_IDLE_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, LIVENESS_IDLE_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, max(1, round(timeout * 1000)))
    except (AttributeError, OSError) as e:
        log.debug("a Raft link keeps pysyncobj's read timer (no kernel liveness options: %s)", e)
        return False
    conn.judged_by_kernel = True
    return True


class NodeTransport(TCPTransport):
    def __init__(self, syncObj, selfNode, otherNodes):
        self._verified: set = set()                    # nodes whose connection finished the two-way handshake
        self.refused: Counter[str] = Counter()        # connections this node refused, by kind
        self.refusals_received: deque[tuple[float, str, str]] = deque(maxlen=32)   # (when, by node, reason)
        self.on_link_lost: Callable[[str], None] = lambda node_id: None
        self.events = 0                                # link and refusal events, for the node's thread
        super().__init__(syncObj, selfNode, otherNodes)

    @property
    def self_id(self) -> str:
        return "readonly" if self._selfIsReadonlyNode else self._selfNode.id

    # --- listener side ----------------------------------------------------------------------------

    def _onIncomingMessageReceived(self, conn, message):
        if self._syncObj.encryptor and not conn.sendRandKey:
            super()._onIncomingMessageReceived(conn, message)        # the key exchange
            return
        if isinstance(message, list):
            self._refuse(conn, "admin", "pysyncobj admin commands are not accepted by p2pgen")
            return
        if not isinstance(message, str):
            self._refuse(conn, "malformed", f"expected a node id, got a {type(message).__name__}")
            return
        if message != "readonly" and message not in self._nodeAddrToNode:
            self._refuse(conn, "unknown", f"node {message} is not in the Raft configuration of {self.self_id} "
                                          f"(it was removed, or its add has not reached this node yet)")
            return
        conn.send({"type": IDENTITY, "node": self.self_id})   # first message the dialer reads after the keys
        super()._onIncomingMessageReceived(conn, message)
        node = self._connToNode(conn)
        if node is not None:
            self._verified.add(node)
            self._judge_by_kernel(conn)
            self.events += 1

    def _judge_by_kernel(self, conn) -> None:
        judge_by_kernel(conn, self._syncObj.conf.connectionTimeout)

    def _refuse(self, conn, kind: str, reason: str) -> None:
        self.events += 1
        self.refused[kind] += 1
        log.info("refused a Raft connection (%s): %s", kind, reason)
        conn.send({"type": REFUSED, "node": self.self_id, "reason": reason})
        self._unknownConnections.discard(conn)
        conn.disconnect()

    # --- dialer side ------------------------------------------------------------------------------

    def _shouldConnect(self, node):
        """Never dial this node's own address: only an older, dead node can have had it (a node id is new per
        process), and the dial would reach this node itself."""
        if not self._selfIsReadonlyNode and (node.host, node.port) == (self._selfNode.host, self._selfNode.port):
            return False
        return super()._shouldConnect(node)

    def _onOutgoingConnected(self, conn):
        if self._syncObj.encryptor:
            super()._onOutgoingConnected(conn)     # keys first; continues in _onOutgoingMessageReceived
            return
        self._sendSelfAddress(conn)
        self._await_identity(conn)

    def _onOutgoingMessageReceived(self, conn, message):
        conn.sendRandKey = message
        self._sendSelfAddress(conn)
        self._await_identity(conn)

    def _await_identity(self, conn) -> None:
        conn.setOnMessageReceivedCallback(functools.partial(self._on_identity, conn))

    def _on_identity(self, conn, message) -> None:
        self.events += 1
        node = self._connToNode(conn)
        kind = message.get("type") if isinstance(message, dict) else None
        if node is not None and kind == IDENTITY and message.get("node") == node.id:
            conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
            self._verified.add(node)
            self._judge_by_kernel(conn)
            self._onNodeConnected(node)
            return
        if kind == REFUSED:
            self.refusals_received.append((monotonic_time(), str(message.get("node")), str(message.get("reason"))))
        else:
            self.refused["identity"] += 1
            log.info("dropped a Raft connection to %s: the listener there is %r, not that node",
                     node, message.get("node") if kind == IDENTITY else message)
        conn.disconnect()

    def _onDisconnected(self, conn):
        self.events += 1
        node = self._connToNode(conn)
        lost = node is not None and node in self._verified and _addr_of(node) is not None    # a voter
        if node is not None:
            self._verified.discard(node)
        super()._onDisconnected(conn)
        if lost:
            self.on_link_lost(str(node.id))

    def dropNode(self, node):
        self._verified.discard(node)
        super().dropNode(node)

    # --- injected partitions ---------------------------------------------------------------------

    def _here(self) -> str | None:
        """This node's address for partition rules (a non-voting node has none: its agent's)."""
        return None if self._selfIsReadonlyNode else f"{self._selfNode.host}:{self._selfNode.port}"

    def send(self, node, message):
        if faults.blocked(self._here(), _addr_of(node)):
            return True                    # lost on the way, as far as the sender can tell
        return super().send(node, message)

    def _onMessageReceived(self, node, message):
        if faults.blocked(_addr_of(node), self._here()):
            return
        super()._onMessageReceived(node, message)


def _addr_of(node) -> str | None:
    """HOST:PORT of a voter node; None for an anonymous (non-voting) one, whose own side applies the rules."""
    host, port = getattr(node, "host", None), getattr(node, "port", None)
    return f"{host}:{port}" if host and port else None

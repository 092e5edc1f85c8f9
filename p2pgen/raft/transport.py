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
- Keep-alives. A tiny message on every verified connection this node sent nothing on for `keepalive_interval` s.
  Without it idle follower-to-follower links hit `connectionTimeout` on their first send after a leader dies,
  the first vote request is lost and every failover needs a second election round (pitfall 1). Links that carry
  appends or their answers need none (each side's sends keep the other side's read timer fresh), so an idle
  job's nodes wake only for the appends and the follower-to-follower keep-alives. A keep-alive received is consumed
  here (it never reaches SyncObj, so it calls for no tick), and the node's thread sends the ones due between ticks
  (`send_keepalives`, `keepalive_due`).
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
import zlib
from collections import Counter, deque
from collections.abc import Callable

from pysyncobj import tcp_connection
from pysyncobj.monotonic import monotonic as monotonic_time
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

from p2pgen import faults

log = logging.getLogger(__name__)

KEEPALIVE = {"type": "p2pgen_keepalive"}
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


class NodeTransport(TCPTransport):
    keepalive_interval = 0.3          # well inside connectionTimeout (1 s)

    def __init__(self, syncObj, selfNode, otherNodes):
        self._last_sent: dict = {}                     # node -> when this node last sent it anything
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
            self.events += 1

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
        self._last_sent.pop(node, None)
        super().dropNode(node)

    # --- injected partitions ---------------------------------------------------------------------

    def _here(self) -> str | None:
        """This node's address for partition rules (a non-voting node has none: its agent's)."""
        return None if self._selfIsReadonlyNode else f"{self._selfNode.host}:{self._selfNode.port}"

    def send(self, node, message):
        if faults.blocked(self._here(), _addr_of(node)):
            return True                    # lost on the way, as far as the sender can tell
        self._last_sent[node] = monotonic_time()
        return super().send(node, message)

    def _onMessageReceived(self, node, message):
        if faults.blocked(_addr_of(node), self._here()) or message == KEEPALIVE:
            return                         # a keep-alive did its work on arrival: the link's read timer is fresh
        super()._onMessageReceived(node, message)

    # --- keep-alives ------------------------------------------------------------------------------

    def _onTick(self):
        super()._onTick()
        self.send_keepalives()

    def send_keepalives(self) -> None:
        """Send a keep-alive on every verified connection this node sent nothing on for `keepalive_interval` s."""
        now = monotonic_time()
        for node in list(self._verified):
            conn = self._connections.get(node)
            if conn is not None and conn.state == CONNECTION_STATE.CONNECTED and \
                    now - self._last_sent.get(node, 0.0) >= self.keepalive_interval:
                self._last_sent[node] = now
                conn.send(KEEPALIVE)

    def keepalive_due(self) -> float:
        """When (pysyncobj's clock) the next keep-alive is due; infinity with no verified connection."""
        due = float("inf")
        for node in self._verified:
            conn = self._connections.get(node)
            if conn is not None and conn.state == CONNECTION_STATE.CONNECTED:
                due = min(due, self._last_sent.get(node, 0.0) + self.keepalive_interval)
        return due


def _addr_of(node) -> str | None:
    """HOST:PORT of a voter node; None for an anonymous (non-voting) one, whose own side applies the rules."""
    host, port = getattr(node, "host", None), getattr(node, "port", None)
    return f"{host}:{port}" if host and port else None

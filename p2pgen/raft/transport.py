"""pysyncobj TCP transport with keep-alives.

Owns: a tiny message sent to every connected Raft node every `interval` seconds. Without it, idle
follower-to-follower links hit `connectionTimeout` on their first send after a leader dies, the first
vote request is lost and every failover needs a second election round (pitfall 1 in
notes/pysyncobj.md). SyncObj ignores message types it does not know, so the keep-alive is inert.
"""

from __future__ import annotations

from pysyncobj.monotonic import monotonic as monotonic_time
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

KEEPALIVE = {"type": "p2pgen_keepalive"}


class KeepAliveTransport(TCPTransport):
    interval = 0.1

    def __init__(self, syncObj, selfNode, otherNodes):
        self._last_keepalive = 0.0
        super().__init__(syncObj, selfNode, otherNodes)

    def _onTick(self):
        super()._onTick()
        now = monotonic_time()
        if now - self._last_keepalive < self.interval:
            return
        self._last_keepalive = now
        for node, conn in list(self._connections.items()):
            if conn.state == CONNECTION_STATE.CONNECTED:
                conn.send(KEEPALIVE)

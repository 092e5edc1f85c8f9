"""A small read-only HTML status page of a job, served by an agent on request (`p2pgen join --http PORT`).

Owns: an HTTP server (a thread) bound to 127.0.0.1 by default that answers `GET /` with a page which
redraws itself every second from `GET /status.json` (the agent's `show`, the last generations of its
history and the last fault with its recovery time). It reads them through the agent's own authenticated
control RPC, like `p2pgen show`, so it sees exactly what `show` sees.
Invariant kept: read-only: only GET of those two paths is answered; nothing on the page can change the job.
It is unauthenticated, so it binds to loopback unless told otherwise (`--http-bind`).
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from p2pgen.agent.client import AgentClient
from p2pgen.agent.watch import last_fault
from p2pgen.errors import P2PGenError

log = logging.getLogger(__name__)

HISTORY_SHOWN = 12

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>p2pgen job</title>
<style>
body { font: 15px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } table { border-collapse: collapse; margin: 0.5em 0 1em; }
td, th { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; } th { background: #f2f2f2; }
.muted { color: #777; } #error { color: #b00; }
</style></head>
<body>
<h1>job <span id="job">…</span> · generation <span id="generation">…</span></h1>
<p id="error"></p>
<p>active since <span id="since">…</span> · reason: <span id="reason">…</span></p>
<p>frontier: revision <span id="revision">…</span>, digest <code id="digest">…</code></p>
<p>Raft term <span id="term">…</span>, leader <span id="leader">…</span>, voters <span id="voters">…</span></p>
<p id="fault">…</p>
<h2>members</h2>
<table><thead><tr><th>rank</th><th>peer</th><th>incarnation</th><th>agent</th></tr></thead>
<tbody id="members"></tbody></table>
<h2>recent generations</h2>
<table><thead><tr><th>generation</th><th>outcome</th><th>at</th><th>members</th><th>reason</th></tr></thead>
<tbody id="history"></tbody></table>
<p class="muted">read-only view served by agent <span id="agent">…</span>; redrawn every second</p>
<script>
function when(ts) { return ts ? new Date(ts * 1000).toLocaleTimeString() : "-"; }
function set(id, text) { document.getElementById(id).textContent = text; }
function rows(id, data) {
  const body = document.getElementById(id);
  body.replaceChildren(...data.map(cells => {
    const tr = document.createElement("tr");
    cells.forEach(c => { const td = document.createElement("td"); td.textContent = c; tr.appendChild(td); });
    return tr;
  }));
}
async function refresh() {
  try {
    const r = await fetch("status.json", {cache: "no-store"});
    const s = await r.json();
    if (s.error) { set("error", s.error); return; }
    set("error", "");
    const st = s.show.state, raft = s.show.raft, a = st.active;
    set("job", st.job); set("agent", s.show.agent.addr);
    set("generation", a ? a.generation : "none yet");
    set("since", a ? when(a.activated_at) : "-"); set("reason", a ? a.reason : "-");
    set("revision", a ? a.frontier.revision : "-"); set("digest", a ? (a.frontier.digest || "<empty>") : "-");
    set("term", raft.term); set("leader", raft.leader_agent || "none heard");
    set("voters", raft.voters.map(v => v.agent).join(", "));
    set("fault", s.last_fault || "last fault: none");
    rows("members", a ? a.members.map(m => [m.rank, m.peer_id, m.incarnation, m.addrs.agent || ""]) : []);
    rows("history", s.history.slice().reverse().map(h => [h.generation, h.outcome, when(h.at),
         h.members.map(m => m.peer_id + "#" + m.incarnation).join(" "), h.reason]));
  } catch (e) { set("error", "cannot reach the agent: " + e); }
}
refresh(); setInterval(refresh, 1000);
</script>
</body></html>
"""


class StatusPage:
    def __init__(self, agent_addr: str, secret: bytes | None, job: str, host: str, port: int) -> None:
        self.agent_addr, self.secret, self.job = agent_addr, secret, job
        page = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:                       # noqa: N802 (http.server's name)
                if self.path in ("/", "/index.html"):
                    self._send(200, "text/html; charset=utf-8", PAGE.encode())
                elif self.path == "/status.json":
                    self._send(200, "application/json", json.dumps(page.status()).encode())
                else:
                    self._send(404, "text/plain", b"not found: this page serves / and /status.json\n")

            def _send(self, code: int, kind: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("status page: " + format, *args)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}/"
        self._thread = threading.Thread(target=self.server.serve_forever, name="status-page", daemon=True)

    def status(self) -> dict[str, Any]:
        try:
            with AgentClient(self.agent_addr, self.secret, job=self.job, timeout=2.0) as client:
                shown, history = client.show(), client.history()
        except (OSError, P2PGenError) as e:
            return {"error": f"the agent at {self.agent_addr} does not answer yet: {e}"}
        return {"show": shown, "history": history[-HISTORY_SHOWN:], "last_fault": last_fault(history)}

    def start(self) -> None:
        self._thread.start()
        log.info("read-only status page at %s", self.url)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

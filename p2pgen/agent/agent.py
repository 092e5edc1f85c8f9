"""The per-host agent: Raft node, failure detector, supervision of the application, control API.

Owns: one peer's participation in the job. It joins the Raft group (through any live member; no
member is special), registers the peer's current incarnation, votes `ready` for an application that
does not speak the protocol itself, reports deaths (of its own application at once, from the OS; of
other hosts from missed heartbeats), restarts its application as a new incarnation, and serves
`show`, `history` and the application's local API.

Threads: the RPC server (one thread per connection), the Raft node, the heartbeat runner, waitpid
waiters, and the *driver*, the only thread that makes decisions: it consumes events and the latest
Raft view, so decisions never race each other.
Invariants kept:
- I3: every incarnation this agent registers is new (the last one seen in the replicated state + 1);
  an incarnation it learns was evicted is never used again: the application is killed and restarted;
- I7: nothing here is special to one agent; any live agent can admit a joiner or evict a dead peer;
- I8: every control connection and heartbeat is authenticated with the job secret.
"""

from __future__ import annotations

import logging
import os
import queue
import tempfile
import threading
import time
from dataclasses import dataclass, field

from p2pgen.agent.heartbeat import HeartbeatRunner
from p2pgen.agent.rpc import RpcClient, RpcServer, split_addr
from p2pgen.agent.statedir import StateDirConfig
from p2pgen.agent.supervisor import Application
from p2pgen.agent.wire import command_from_wire
from p2pgen.auth import derive_key
from p2pgen.core import Configure, Leave, Ready, Register, Suspect
from p2pgen.core.render import history_json, state_json
from p2pgen.detect import DetectorConfig
from p2pgen.errors import AuthenticationError, P2PGenError
from p2pgen.raft.node import RaftNode, RaftTiming, RaftUnavailable, RaftView

log = logging.getLogger(__name__)


class JoinError(P2PGenError):
    """The agent could not join or start the job; the message says why and what to check."""


PORT_OFFSETS = {"agent": 0, "raft": 1, "data": 2, "state": 3, "channel": 4}   # from the control port (README)
PORTS_PER_AGENT = len(PORT_OFFSETS)


def port_of(control_addr: str, role: str) -> str:
    """The address of one of an agent's four ports: control (agent), Raft, data plane, state transfer."""
    host, port = split_addr(control_addr)
    return f"{host}:{port + PORT_OFFSETS[role]}"


def raft_addr_of(control_addr: str) -> str:
    return port_of(control_addr, "raft")


def control_addr_of(raft_addr: str) -> str:
    host, port = split_addr(raft_addr)
    return f"{host}:{port - 1}"


@dataclass
class AgentConfig:
    job: str
    peer_id: str
    listen: str                                   # control address HOST:PORT; see PORT_OFFSETS
    secret: bytes
    secret_file: str | None = None                # handed to the application (None: insecure demo secret)
    peers: list[str] = field(default_factory=list)
    command: list[str] | None = None
    max_restarts: int = 10
    min_members: int = 1
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    raft: RaftTiming = field(default_factory=RaftTiming)
    join_timeout: float = 30.0
    retire_wait: float = 5.0                      # max wait for the dead incarnation's generation to retire
    channel_dir: str = ""                         # consumption logs of this peer's channels (kept across incarnations)
    attach_grace: float = float("inf")           # an application not attached by then gets our vote (inf: never)
    state: StateDirConfig = field(default_factory=StateDirConfig)   # local copy, checkpoints, regression rule


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        if not config.channel_dir:
            safe = config.peer_id.replace("/", "_")
            config.channel_dir = os.path.join(tempfile.gettempdir(), f"p2pgen-{config.job}-{safe}-channels")
        self.addr = config.listen
        self.raft_addr = raft_addr_of(config.listen)
        self.cluster = sorted({self.raft_addr} | {raft_addr_of(p) for p in config.peers})
        self.node: RaftNode | None = None
        self.incarnation: int | None = None       # incarnation of this peer's current member
        self.app: Application | None = None
        self.app_attached = False
        self.restarts = 0
        self.exit_code = 0
        self._events: queue.Queue[tuple] = queue.Queue()
        self._voted: tuple[int, int] | None = None      # (generation, incarnation) last voted ready for
        self._leaving = threading.Event()
        self._stopped = threading.Event()
        self._app_kill: tuple[Application, bool] | None = None   # (app, counts as a failure)
        self._stopped_app: tuple[Application, float] | None = None
        self._leaderless_since: float | None = None
        host, port = split_addr(self.addr)
        self.rpc = RpcServer(host, port, config.job, config.secret, self._handlers())
        self.heartbeats = HeartbeatRunner(host, port, derive_key(config.secret, config.job, "heartbeat"),
                                          config.job, self.addr, config.detector, self._heartbeat_targets,
                                          lambda peer, why: self._events.put(("agent_suspected", peer, why)))

    # --- lifecycle ---------------------------------------------------------------------------------

    def run(self) -> int:
        """Join (or start) the job and serve until asked to leave. Returns the process exit code."""
        self.rpc.start()
        try:
            self._start_raft(initial=True)
            self.heartbeats.start()
            self._admit_member()
            self._drive()
        finally:
            self._shutdown()
        return self.exit_code

    def request_leave(self) -> None:
        """Leave the job gracefully (SIGTERM, `leave` RPC): callable from any thread."""
        self._events.put(("leave",))

    def _shutdown(self) -> None:
        if self.app is not None:
            self.app.terminate(grace=2.0)
        self.heartbeats.stop()
        if self.node is not None:
            self.node.stop()
        self.rpc.stop()
        self._stopped.set()

    # --- joining -----------------------------------------------------------------------------------

    def _start_raft(self, initial: bool, known_nodes: tuple[str, ...] = ()) -> None:
        if not self.config.peers and not known_nodes:
            self._launch_node([], configure=initial)
            return
        deadline = time.monotonic() + self.config.join_timeout
        while time.monotonic() < deadline:
            forming = False
            for peer in self.config.peers + [control_addr_of(n) for n in known_nodes]:
                if peer == self.addr:
                    continue
                try:
                    with RpcClient(peer, self.config.secret, timeout=2.0, expect_job=self.config.job) as client:
                        hello = client.call("hello")
                        if hello["mode"] == "running":
                            client.settimeout(15.0)
                            nodes = client.call("join_raft", raft_addr=self.raft_addr, peer_id=self.config.peer_id)
                            self._launch_node(nodes, configure=False)
                            return
                        forming = forming or (initial and sorted(hello["cluster"]) == self.cluster)
                except AuthenticationError as e:
                    raise JoinError(f"{e}. Start this agent with the job's --secret-file.") from e
                except (OSError, P2PGenError) as e:
                    log.debug("join through %s failed: %s", peer, e)
            if forming:
                self._launch_node(self.cluster, configure=True)
                return
            time.sleep(0.2)
        raise JoinError(f"no live member of job {self.config.job!r} answered at {', '.join(self.config.peers)} "
                        f"within {self.config.join_timeout:.0f} s; check --peer and that the job is running")

    def _launch_node(self, nodes: list[str], configure: bool) -> None:
        node = RaftNode(self.config.job, self.raft_addr, [n for n in nodes if n != self.raft_addr],
                        self.config.secret, self.config.raft)
        node.start()
        if node.wait_view(lambda v: v.ready and v.leader is not None, self.config.join_timeout) is None:
            node.stop()
            raise JoinError(f"Raft node {self.raft_addr} found no leader within {self.config.join_timeout:.0f} s")
        self.node = node
        self._leaderless_since = None
        log.info("raft node %s is in sync (nodes %s)", self.raft_addr, node.view().nodes)
        if configure and (self.config.min_members > 1 or self.config.state.sets_job_rules):
            outcome = node.submit(Configure(self.config.min_members, at=time.time(),
                                            regress_wait=self.config.state.regress_wait,
                                            allow_fresh_start=int(self.config.state.allow_fresh_start)))
            if not outcome.ok:
                raise JoinError(outcome.reason)

    def _admit_member(self) -> None:
        """Register this peer's member: the application's incarnation, or the agent's own."""
        if self.config.command:
            self._launch_app()
        else:
            self._register(self._next_incarnation())

    def _next_incarnation(self) -> int:
        view = self.node.view()
        return view.machine.last_incarnation.get(self.config.peer_id, 0) + 1

    def _member_addrs(self) -> tuple[tuple[str, str], ...]:
        roles = ("agent", "data", "state", "channel") if self.config.command else ("agent",)
        return tuple((role, port_of(self.addr, role)) for role in roles)

    def _register(self, incarnation: int) -> None:
        command = Register(self.config.peer_id, incarnation, self._member_addrs(), at=time.time())
        deadline = time.monotonic() + self.config.join_timeout
        while True:       # a quorum may be briefly lost while the job reconfigures: retry the same command
            try:
                outcome = self.node.submit(command)
                break
            except RaftUnavailable:
                if time.monotonic() > deadline:
                    raise JoinError(f"no Raft quorum to register {self.config.peer_id}#{incarnation} within "
                                    f"{self.config.join_timeout:.0f} s") from None
        if not outcome.ok:
            raise JoinError(f"registration refused: {outcome.reason}")
        self.incarnation = incarnation
        log.info("registered %s#%d", self.config.peer_id, incarnation)

    def _launch_app(self) -> None:
        incarnation = self._next_incarnation()
        env = {"P2PGEN_JOB": self.config.job, "P2PGEN_PEER_ID": self.config.peer_id,
               "P2PGEN_INCARNATION": str(incarnation), "P2PGEN_AGENT": self.addr,
               "P2PGEN_DATA_ADDR": port_of(self.addr, "data"), "P2PGEN_STATE_ADDR": port_of(self.addr, "state"),
               "P2PGEN_CHANNEL_ADDR": port_of(self.addr, "channel"), "P2PGEN_CHANNEL_DIR": self.config.channel_dir}
        env.update(self.config.state.app_env(self.config.job, self.config.peer_id, self.addr))
        if self.config.secret_file:
            env["P2PGEN_SECRET_FILE"] = self.config.secret_file
        self.app_attached = False
        self.app = Application(self.config.command, incarnation, env,
                               on_stop=lambda app: self._events.put(("app_stopped", app, time.monotonic())),
                               on_continue=lambda app: self._events.put(("app_continued", app)),
                               on_exit=lambda app, why, clean: self._events.put(("app_exited", app, why, clean)))
        log.info("started application pid %d as %s#%d", self.app.pid, self.config.peer_id, incarnation)
        self._register(incarnation)

    # --- the driver --------------------------------------------------------------------------------

    def _drive(self) -> None:
        last = time.monotonic()
        while not self._stopped.is_set():
            try:
                event = self._events.get(timeout=0.05)
            except queue.Empty:
                event = None
            now = time.monotonic()
            stalled, last = now - last > self.config.detector.timeout, now
            try:
                if stalled:
                    self._reconcile_membership_of_self(force=True)
                if event is not None and self._handle(event):
                    return
                self._reconcile()
            except RaftUnavailable as e:
                log.warning("no Raft quorum: %s", e)
                self._reconcile_membership_of_self(force=True)

    def _handle(self, event: tuple) -> bool:
        """Handle one event; True when the agent is done."""
        kind = event[0]
        if kind == "leave":
            self._leave()
            return True
        if kind == "app_exited":
            return self._on_app_exit(*event[1:])
        if kind == "app_stopped":
            self._stopped_app = (event[1], event[2])
        elif kind == "app_continued":
            self._stopped_app = None
        elif kind == "agent_suspected" and event[1] in self.heartbeats.suspected():   # drop stale suspicions
            self._evict_agent(event[1], event[2])
        return False

    def _reconcile(self) -> None:
        self._reconcile_membership_of_self(force=False)
        view = self.node.view()
        if self._stopped_app is not None:
            app, since = self._stopped_app
            if app is self.app and time.monotonic() - since > self.config.detector.timeout:
                self._stopped_app = None
                self._report_app(app, f"application stopped for more than {self.config.detector.timeout:.2f} s")
                self._kill_app(app, counted=True)
        if self.incarnation is None:
            return
        machine = view.machine
        if machine.was_evicted(self.config.peer_id, self.incarnation):
            self._on_evicted(f"{self.config.peer_id}#{self.incarnation} was evicted by the job")
            return
        pending = machine.pending
        if pending is not None and self._votes_for_member() and self._voted != (pending.generation, self.incarnation):
            member = pending.member(self.config.peer_id)
            if member is not None and member.incarnation == self.incarnation:
                outcome = self.node.submit(Ready(pending.generation, self.config.peer_id, self.incarnation,
                                                 "proved", 0, "", 0, at=time.time()))
                self._voted = (pending.generation, self.incarnation)
                log.info("ready for g%d: %s", pending.generation, outcome.reason)

    def _votes_for_member(self) -> bool:
        """The agent votes for itself, or for an application that did not attach within the grace period."""
        if self.app is None:
            return True
        return not self.app_attached and time.monotonic() - self.app.started > self.config.attach_grace

    def _reconcile_membership_of_self(self, force: bool) -> None:
        """After our own stall, or when no leader is known for long, ask the other agents whether our
        Raft node is still in the cluster; if it was removed, rejoin as a new incarnation."""
        view = self.node.view()
        now = time.monotonic()
        if view.leader is not None:
            self._leaderless_since = None
            if not force:
                return
        elif self._leaderless_since is None:
            self._leaderless_since = now
        if not force and now - self._leaderless_since < 2 * self.config.detector.timeout:
            return
        answer = self._ask_membership(view)
        if answer is not None and not answer["raft_member"]:
            log.warning("this agent was removed from the job while unreachable; rejoining as a new incarnation")
            self.node.stop()
            self.node = None
            self._start_raft(initial=False, known_nodes=view.nodes)
            self.heartbeats.reset()
            self._on_evicted("agent was removed from the Raft group while unreachable")
        self._leaderless_since = None

    def _ask_membership(self, view: RaftView) -> dict | None:
        for node in view.nodes:
            if node == self.raft_addr:
                continue
            try:
                with RpcClient(control_addr_of(node), self.config.secret, timeout=0.5,
                               expect_job=self.config.job) as client:
                    return client.call("membership", raft_addr=self.raft_addr)
            except (OSError, P2PGenError):
                continue
        return None

    def _on_evicted(self, why: str) -> None:
        log.warning("%s: restarting as a new incarnation", why)
        if self.app is None:
            self._register(self._next_incarnation())
        elif self._app_kill is None or self._app_kill[0] is not self.app:
            self._kill_app(self.app, counted=False)     # its exit event relaunches it as a new incarnation

    def _kill_app(self, app: Application, counted: bool) -> None:
        self._app_kill = (app, counted)
        app.kill()

    def _on_app_exit(self, app: Application, why: str, clean: bool) -> bool:
        if app is not self.app or self._leaving.is_set():
            return False
        counted = self._app_kill is None or self._app_kill[0] is not app or self._app_kill[1]
        self._app_kill = None
        if clean:
            log.info("application finished cleanly; leaving the job")
            self._leave()
            return True
        self._report_app(app, f"application {why}")
        if counted:
            self.restarts += 1
            if self.restarts > self.config.max_restarts:
                log.error("application failed %d times (--max-restarts %d); leaving the job",
                          self.restarts, self.config.max_restarts)
                self.exit_code = 1
                self._leave()
                return True
        self._wait_retired(app.incarnation)
        self._launch_app()
        return False

    def _report_app(self, app: Application, why: str) -> None:
        outcome = self.node.submit(Suspect(self.config.peer_id, self.config.peer_id, app.incarnation, why,
                                           at=time.time()))
        log.info("reported %s#%d: %s", self.config.peer_id, app.incarnation, outcome.reason)

    def _wait_retired(self, incarnation: int) -> None:
        """Before the new incarnation registers, let the others certify a generation without the old one
        (bounded: if nobody else can form one, go on)."""
        identity = (self.config.peer_id, incarnation)

        def retired(view: RaftView) -> bool:
            m = view.machine
            in_active = m.active is not None and identity in {x.identity for x in m.active.members}
            held = m.pending is not None and m.pending.hold is not None     # waiting for state we may hold
            return not in_active or not m.members or held
        self.node.wait_view(retired, self.config.retire_wait)

    def _evict_agent(self, control_addr: str, why: str) -> None:
        view = self.node.view()
        for member in list(view.machine.members):
            if member.addr("agent") == control_addr:
                outcome = self.node.submit(Suspect(self.config.peer_id, member.peer_id, member.incarnation,
                                                   f"agent {control_addr} {why}", at=time.time()))
                log.info("suspected %s#%d: %s", member.peer_id, member.incarnation, outcome.reason)
        if raft_addr_of(control_addr) in view.nodes:
            self.node.remove_node(raft_addr_of(control_addr))
            log.info("removed Raft node %s", raft_addr_of(control_addr))

    def _leave(self) -> None:
        self._leaving.set()
        if self.app is not None:
            self.app.terminate(grace=2.0)
            self.config.state.remove_local(self.config.job, self.config.peer_id, self.addr)
        try:
            if self.incarnation is not None:
                self.node.submit(Leave(self.config.peer_id, self.incarnation, at=time.time()), timeout=3.0)
            view = self.node.view()
            if len(view.nodes) > 1:
                if view.is_leader:
                    self.node.transfer_leadership()
                    self.node.wait_view(lambda v: not v.is_leader and v.leader is not None, 2.0)
                self.node.remove_node(self.raft_addr, timeout=3.0)
        except RaftUnavailable as e:
            log.warning("left without a quorum to record it: %s", e)

    # --- heartbeats ----------------------------------------------------------------------------------

    def _heartbeat_targets(self) -> set[str]:
        view = self.node.view() if self.node else None
        return {control_addr_of(n) for n in view.nodes} if view else set()

    # --- control API -------------------------------------------------------------------------------

    def _handlers(self) -> dict:
        return {
            "hello": self._rpc_hello, "join_raft": self._rpc_join_raft, "membership": self._rpc_membership,
            "show": self._rpc_show, "history": self._rpc_history, "submit": self._rpc_submit,
            "wait": self._rpc_wait, "attach": self._rpc_attach, "leave": self._rpc_leave,
        }

    def _require_node(self) -> RaftNode:
        node = self.node
        if node is None or node.view() is None:
            raise JoinError(f"agent {self.addr} is not part of the job yet; ask another member")
        return node

    def _rpc_hello(self, params: dict) -> dict:
        mode = "running" if self.node is not None and self.node.view() is not None else "forming"
        return {"mode": mode, "cluster": self.cluster, "job": self.config.job, "peer_id": self.config.peer_id}

    def _rpc_join_raft(self, params: dict) -> list[str]:
        node = self._require_node()
        addr = params["raft_addr"]
        split_addr(addr)
        view = node.view()
        if addr not in view.nodes:
            for dead in self._dead_nodes(view):
                node.remove_node(dead)       # remove dead members before adding (pitfall 5)
            node.add_node(addr, timeout=10.0)
            view = node.wait_view(lambda v: addr in v.nodes, 5.0) or node.view()
        self.heartbeats.renew(control_addr_of(addr))   # a suspicion of the previous agent there is stale
        log.info("admitted Raft node %s (peer %s)", addr, params.get("peer_id"))
        return list(view.nodes)

    def _dead_nodes(self, view: RaftView) -> list[str]:
        return [raft_addr_of(a) for a in self.heartbeats.suspected() if raft_addr_of(a) in view.nodes]

    def _rpc_membership(self, params: dict) -> dict:
        view = self._require_node().view()
        return {"raft_member": params["raft_addr"] in view.nodes}

    def _rpc_show(self, params: dict) -> dict:
        view = self._require_node().view()
        return {
            "state": state_json(view.machine),
            "raft": {"term": view.term, "index": view.version, "leader": view.leader, "nodes": list(view.nodes),
                     "self": self.raft_addr},
            "agent": {"peer_id": self.config.peer_id, "addr": self.addr, "incarnation": self.incarnation,
                      "app_pid": self.app.pid if self.app else None, "restarts": self.restarts,
                      "refused_connections": self.rpc.refused},
        }

    def _rpc_history(self, params: dict) -> list:
        return history_json(self._require_node().view().machine)

    def _rpc_submit(self, params: dict) -> dict:
        outcome = self._require_node().submit(command_from_wire(params.get("command")))
        return {"ok": outcome.ok, "reason": outcome.reason}

    def _rpc_wait(self, params: dict) -> dict:
        after = int(params.get("after_version", -1))
        timeout = min(float(params.get("timeout", 5.0)), 30.0)
        self._require_node().wait_view(lambda v: v.version > after, timeout)
        return self._rpc_show(params)

    def _rpc_attach(self, params: dict) -> dict:
        app = self.app
        if app is None or params.get("incarnation") != app.incarnation:
            raise ValueError(f"incarnation {params.get('incarnation')} is not this agent's current application "
                             f"({app.incarnation if app else 'none'}): a stale process must exit (I3)")
        self.app_attached = True
        voted = self._voted is not None and self._voted[1] == app.incarnation
        return {"peer_id": self.config.peer_id, "incarnation": app.incarnation, "agent_voted": voted}

    def _rpc_leave(self, params: dict) -> dict:
        self.request_leave()
        return {"leaving": True}

"""The agent's place in the job's Raft group: joining, promotion to voter, learning it was removed.

Owns: the Raft node this agent reads and submits through (`node`: a voter or a non-voting member), a pending
voter node while a promotion is under way, and every change between them. The rules (README, "Raft node
identities and voters"):
- Every Raft node this process starts has a new id `host:port/nonce` (`p2pgen.raft.identity`); no id is ever
  used twice in a job, and a later process at the same address is a different node.
- Agents started together with the same peer set form the job: the first `target_voters(n)` of them by
  address start as voters with the ids they told each other (`hello`); the rest join like anyone else.
- Any other agent joins through any live member as a non-voting member: it reads the voters from that member,
  dials them and receives the log. Joining needs no Raft membership change; its member's `Register` is its
  committed entry.
- Only the leader's agent makes voters (`VoterManager`): it asks a caught-up non-voting member to start a voter
  node under a fresh id (`prepare_voter`), then commits the add of exactly that id; once the new node has
  caught up and the log shows the add, this agent switches to it and stops its non-voting node.
- A voter that learns it was removed (it applied its own removal, or the others refuse it and a live member
  confirms) goes back to being a non-voting member; it never speaks for the job under the old id again.
Nothing here gives up on a transient loss: joining retries with backoff until a member answers, and says why
it waits (`waiting`), in the log every few seconds and in `show`.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from p2pgen.agent.rpc import RpcClient, split_addr
from p2pgen.core import Reformed
from p2pgen.core.voters import target_voters
from p2pgen.errors import AuthenticationError, P2PGenError
from p2pgen.raft.identity import new_node_id, raft_addr_of
from p2pgen.raft.node import RaftNode, RaftTiming, RaftView
from p2pgen.raft.trace import Trace

log = logging.getLogger(__name__)

PENDING_VOTER_TIMEOUT_S = 10.0     # a prepared voter whose add has not committed by then is abandoned
NONVOTER_SYNC_TIMEOUT_S = 5.0      # a non-voting node that found no leader by then is rebuilt from fresh hellos
WAITING_LOG_EVERY_S = 5.0
WAITING_QUIET_S = 2.0               # a wait shorter than this (formation, a quick join) is not logged
BACKOFF_MAX_S = 2.0
REFUSED_RECENT_S = 2.0              # refusals this recent, with no leader heard, say a voter is not one


class JoinError(P2PGenError):
    """The agent cannot join and retrying will not help (a wrong secret); the message says what to do."""


def control_addr_of(node_id: str) -> str:
    """The control address of the agent that runs `node_id` (its Raft port is the control port + 1)."""
    host, port = split_addr(raft_addr_of(node_id))
    return f"{host}:{port - 1}"


@dataclass(frozen=True)
class Hello:
    """One member's answer to `hello`."""

    addr: str
    mode: str                       # "running" | "forming" | "joining"
    cluster: tuple[str, ...]
    node: str                       # its voter id (forming: the id it will form with), "" if none
    voters: tuple[str, ...]         # running: the voters it knows, with a leader heard recently
    epoch: int = 0                  # its Raft epoch (a fenced re-form starts a new one)

    @staticmethod
    def parse(addr: str, raw: dict) -> Hello:
        return Hello(addr, raw["mode"], tuple(raw.get("cluster", ())), raw.get("node") or "",
                     tuple(raw.get("voters", ())), int(raw.get("epoch", 0)))


def _refused_without_leader(view: RaftView | None) -> str | None:
    """Who refused a voter that has never heard a leader, within the last REFUSED_RECENT_S: the others do not
    count it as a voter (the leader removed it before it caught up, or the job formed without it), so it never
    will hear one; None otherwise."""
    if view is None or view.leader is not None:
        return None
    recent = [r for r in view.refusals if time.monotonic() - r[0] < REFUSED_RECENT_S]
    return f"{recent[-1][1]} ({recent[-1][2]})" if recent else None


class RaftMembership:
    def __init__(self, job: str, addr: str, peers: list[str], secret: bytes, timing: RaftTiming, trace: Trace,
                 stopping: Callable[[], bool]) -> None:
        self.job, self.addr, self.secret, self.timing, self.trace = job, addr, secret, timing, trace
        self.peers = [p for p in peers if p != addr]
        self.cluster = tuple(sorted({addr, *self.peers}))
        self.raft_addr = f"{split_addr(addr)[0]}:{split_addr(addr)[1] + 1}"
        self.formation_id = new_node_id(self.raft_addr)    # the id this agent forms the job with, if it does
        self.epoch = 0                                      # Raft epoch: +1 at each fenced re-form
        self._stopping = stopping
        self._lock = threading.Lock()                     # guards node / pending switches
        self.node: RaftNode | None = None
        self._pending: RaftNode | None = None
        self._launching: RaftNode | None = None            # a node started by `join`, not caught up yet
        self._pending_since = 0.0
        self.waiting: str | None = "joining the job"
        self._waiting_since: float | None = None
        self._last_waiting_log = 0.0
        self.on_view: Callable[[], None] = lambda: None    # called after every new view of any node of ours
        self.on_link_lost: Callable[[str], None] = lambda node_id: None   # a working Raft link of ours closed

    # --- what others see ---------------------------------------------------------------------------

    def _view_changed(self) -> None:
        self.on_view()

    def _link_lost(self, node_id: str) -> None:
        self.on_link_lost(node_id)

    def view(self) -> RaftView | None:
        node = self.node
        return node.view() if node is not None else None

    def announced_node(self) -> str:
        """The voter id this agent runs or is about to run (while promoted, or while its formation voter waits for
        its first leader), "" for a non-voting member. A voter of the configuration whose agent announced "" would be
        removed by the leader as replaced by a non-voting member, and would then wait for a leader for ever."""
        pending, launching, node = self._pending, self._launching, self.node
        if pending is not None:
            return pending.node_id
        if launching is not None and launching.node_id:
            return launching.node_id
        return node.node_id if node is not None and node.node_id else ""

    def caught_up(self) -> bool:
        view = self.view()
        return view is not None and view.ready and view.leader is not None and not view.removed

    def hello(self) -> dict:
        node = self.node or self._launching
        view = node.view() if node is not None else None
        if view is not None and view.leader is not None and not view.removed:
            return {"mode": "running", "cluster": list(self.cluster), "node": view.node_id or "",
                    "voters": list(view.nodes), "leader": view.leader, "epoch": self.epoch}
        if node is None or (node is self._launching and node.node_id):
            forming_with = node.node_id if node is not None else self.formation_id
            return {"mode": "forming", "cluster": list(self.cluster), "node": forming_with, "voters": [],
                    "epoch": self.epoch}
        return {"mode": "joining", "cluster": list(self.cluster), "node": "", "voters": [], "epoch": self.epoch}

    # --- joining -----------------------------------------------------------------------------------

    def join(self, known_agents: tuple[str, ...] = ()) -> None:
        """Block until this agent runs a Raft node that caught up with a leader (or the agent is stopping)."""
        backoff = 0.1
        while not self._stopping():
            if not self.peers and not known_agents and self.node is None:
                if self._launch(self.formation_id, [], "started a new job: first voter"):
                    return
            else:
                hellos = self._ask_hello(list(dict.fromkeys(self.peers + list(known_agents))))
                if self._join_from(hellos):
                    return
            time.sleep(backoff)
            backoff = min(BACKOFF_MAX_S, backoff * 2)

    def _join_from(self, hellos: list[Hello]) -> bool:
        running = [h for h in hellos if h.mode == "running" and h.voters]
        if running:                     # the newest Raft epoch wins: an older one was fenced off by a re-form
            newest = max(h.epoch for h in running)
            running = [h for h in running if h.epoch == newest]
            if newest > self.epoch:
                log.warning("the job was re-formed: joining Raft epoch %d", newest)
                self.epoch = newest
        for h in running:
            if self.formation_id in h.voters and self.node is None:
                return self._launch(self.formation_id, list(h.voters), f"formed the job (voters from {h.addr})")
        for h in running:
            if self._launch(None, list(h.voters), f"joined as a non-voting member through {h.addr}"):
                return True
        if self.node is None:
            formed = self._formation(hellos)
            if formed is not None:
                return self._launch(self.formation_id, formed, "formed the job with its peers")
        answered = ", ".join(f"{h.addr} ({h.mode})" for h in hellos) or "none"
        self.wait_because(f"waiting for a live member of job {self.job!r}: asked {', '.join(self.peers) or 'nobody'}; "
                   f"answers: {answered}")
        return False

    def _formation(self, hellos: list[Hello]) -> list[str] | None:
        """The voters' ids when every agent of our initial cluster answered `forming` with the same cluster
        and this agent is one of the first `target_voters(n)` of them; else None."""
        forming = {h.addr: h for h in hellos if h.mode == "forming" and h.cluster == self.cluster}
        if set(forming) != set(self.cluster) - {self.addr}:
            return None
        initial = self.cluster[:target_voters(len(self.cluster))]
        if self.addr not in initial:
            return None
        return [self.formation_id if a == self.addr else forming[a].node for a in initial]

    def _ask_hello(self, addrs: list[str]) -> list[Hello]:
        """Hellos of the agents at `addrs` that answer. A refusal of our secret (or an address serving another
        job) is fatal only when no agent answered at all: one address taken over by another job's agent must
        not stop an agent that the others accept."""
        hellos, refused = [], None
        for peer in addrs:
            if peer == self.addr:
                continue
            try:
                with RpcClient(peer, self.secret, timeout=1.0, expect_job=self.job) as client:
                    hellos.append(Hello.parse(peer, client.call("hello")))
            except AuthenticationError as e:
                refused = e
                log.warning("hello to %s refused: %s", peer, e)
            except (OSError, P2PGenError, KeyError, TypeError) as e:
                log.debug("hello to %s failed: %s", peer, e)
        if refused is not None and not hellos:
            raise JoinError(f"{refused}. Start this agent with the job's --secret-file.") from refused
        return hellos

    def _launch(self, node_id: str | None, voters: list[str], why: str) -> bool:
        """Start a node and wait until it caught up with a leader; True when it did (it is then `node`)."""
        node = RaftNode(self.job, node_id, voters, self.secret, self.timing, self.trace, self.epoch,
                        on_view=self._view_changed, on_link_lost=self._link_lost)
        self._launching = node                  # from now on `hello` names this node's id, never a fresh one
        try:
            if node_id is not None and node_id == self.formation_id:
                self.formation_id = new_node_id(self.raft_addr)   # an id names one node, started at most once
            try:
                node.start()
            except P2PGenError as e:
                self.wait_because(f"could not start a Raft node: {e}")
                return False
            return self._await_leader(node, node_id, voters, why)
        finally:
            self._launching = None

    def _await_leader(self, node: RaftNode, node_id: str | None, voters: list[str], why: str) -> bool:
        if node_id is not None:
            while node.wait_view(lambda v: v.ready and v.leader is not None, WAITING_LOG_EVERY_S) is None:
                refused = _refused_without_leader(node.view())
                if self._stopping() or refused:  # a voter is never restarted under its id: it waits, or ends
                    node.stop()
                    if refused:
                        self.wait_because(f"voter {node_id} found no leader and is refused by {refused}: joining "
                                          "as a non-voting member instead")
                    return False
                self.wait_because(f"voter {node_id} waits for a Raft leader among {', '.join(voters) or 'itself'}")
        elif node.wait_view(lambda v: v.ready and v.leader is not None, NONVOTER_SYNC_TIMEOUT_S) is None:
            node.stop()
            self.wait_because(f"a non-voting node with voters {', '.join(voters) or '(none)'} found no leader within "
                       f"{NONVOTER_SYNC_TIMEOUT_S:.0f} s; asking the members again")
            return False
        with self._lock:
            old, self.node = self.node, node
        if old is not None:
            old.stop()
        self.done_waiting()
        kind = f"voter {node_id}" if node_id else "non-voting member"
        log.info("%s: Raft %s in sync (voters %s)", why, kind, ", ".join(node.view().nodes))
        return True

    def wait_because(self, why: str) -> None:
        """Record why the agent waits; log it once the wait lasted WAITING_QUIET_S, then every few seconds."""
        now = time.monotonic()
        if self.waiting is None or self._waiting_since is None:
            self._waiting_since = now
        self.waiting = why
        if now - self._waiting_since >= WAITING_QUIET_S and now - self._last_waiting_log >= WAITING_LOG_EVERY_S:
            self._last_waiting_log = now
            log.warning("%s", why)

    def done_waiting(self) -> None:
        self.waiting, self._waiting_since = None, None

    # --- promotion (asked by the leader's agent) ---------------------------------------------------

    def prepare_voter(self, voters: list[str]) -> str:
        """Start a voter node under a fresh id, to be added by the leader; returns the id. Idempotent while
        one is pending."""
        with self._lock:
            if self.node is not None and self.node.node_id:
                return self.node.node_id
            if self._pending is not None:
                return self._pending.node_id
            if self.node is None or not self.caught_up():
                raise P2PGenError(f"agent {self.addr} is not caught up with the job: it cannot become a voter now")
            pending = RaftNode(self.job, new_node_id(self.raft_addr), voters, self.secret, self.timing, self.trace,
                               self.epoch, on_view=self._view_changed, on_link_lost=self._link_lost)
            pending.start()
            self._pending, self._pending_since = pending, time.monotonic()
        log.info("prepared voter %s for promotion", pending.node_id)
        return pending.node_id

    @property
    def preparing_voter(self) -> bool:
        """A voter node was prepared for promotion and is not yet switched to nor abandoned (`settle_pending`)."""
        return self._pending is not None

    def abandon_voter(self, node_id: str) -> None:
        with self._lock:
            pending = self._pending
            if pending is None or pending.node_id != node_id:
                return
            self._pending = None
        pending.stop()
        log.info("abandoned voter %s (its add did not commit)", node_id)

    def settle_pending(self) -> None:
        """Switch to the pending voter once the log shows its add and it caught up; abandon it when the add
        never came."""
        pending, node = self._pending, self.node
        if pending is None or node is None:
            return
        view, mine = node.view(), pending.view()
        added = view is not None and pending.node_id in view.nodes
        if added and mine is not None and mine.ready and mine.leader is not None:
            with self._lock:
                if self._pending is not pending:
                    return
                old, self.node, self._pending = self.node, pending, None
            old.stop()
            log.info("promoted to voter %s (voters %s)", pending.node_id, ", ".join(mine.nodes))
        elif not added and time.monotonic() - self._pending_since > PENDING_VOTER_TIMEOUT_S:
            self.abandon_voter(pending.node_id)

    # --- removal -----------------------------------------------------------------------------------

    def removed_reason(self) -> str | None:
        """Why this agent's voter is no longer one, if it can tell from its own node (its own removal applied,
        or refusals from the others), else None."""
        view = self.view()
        if view is None or not view.voter:
            return None
        if view.removed:
            return f"voter {view.node_id} applied its own removal"
        recent = [r for r in view.refusals if time.monotonic() - r[0] < REFUSED_RECENT_S]
        if recent and view.leader is None:
            return f"voter {view.node_id} is refused by {recent[-1][1]}: {recent[-1][2]}"
        return None

    def confirm_not_voter(self, candidates: tuple[str, ...]) -> bool | None:
        """Ask live members (that know a leader) whether our node is still a voter. True: it is not; False: it
        is; None: nobody could tell."""
        node_id = self.node.node_id if self.node is not None else None
        if node_id is None:
            return None
        for peer in candidates:
            if peer == self.addr:
                continue
            try:
                with RpcClient(peer, self.secret, timeout=0.5, expect_job=self.job) as client:
                    answer = client.call("membership", node=node_id)
            except (OSError, P2PGenError):
                continue
            if answer.get("leader"):
                return not answer["voter"]
        return None

    def rejoin_as_nonvoter(self, why: str, known_agents: tuple[str, ...]) -> None:
        """Drop the current node (its id is never used again) and join again as a non-voting member."""
        log.warning("%s: rejoining as a non-voting member under a new identity", why)
        with self._lock:
            old, self.node = self.node, None
            pending, self._pending = self._pending, None
        for n in (old, pending):
            if n is not None:
                n.stop()
        self.wait_because(why)
        self.join(known_agents)

    # --- fenced re-form (`p2pgen recover`) ----------------------------------------------------------

    def reform_as_seed(self, epoch: int, gone: tuple[str, ...]) -> None:
        """Start Raft epoch `epoch` alone from this node's applied state; the others join it. Blocks until its
        first entry (`Reformed`) committed."""
        base = self._leave_epoch(epoch)
        log.warning("re-forming the job in Raft epoch %d from this agent's state (applied up to index %d)",
                    epoch, base[1])
        node_id = new_node_id(self.raft_addr)
        self.formation_id = new_node_id(self.raft_addr)
        if not self._launch(node_id, [], f"re-formed in Raft epoch {epoch} as its seed"):
            return
        while not self._stopping():
            try:
                outcome = self.node.submit(Reformed(epoch, self.addr, gone, base[0], at=time.time()), timeout=5.0)
                log.warning("%s", outcome.reason)
                return
            except P2PGenError as e:
                self.wait_because(f"re-form in epoch {epoch}: first entry not committed yet ({e})")

    def reform_as_follower(self, epoch: int, seed: str, known_agents: tuple[str, ...]) -> None:
        """Leave the old epoch and join `epoch` through its seed (or any member already in it)."""
        self._leave_epoch(epoch)
        log.warning("joining Raft epoch %d through its seed %s", epoch, seed)
        self.join((seed, *known_agents))

    def _leave_epoch(self, epoch: int) -> tuple[object, int]:
        """Stop every node of the old epoch (their ids are never used again); returns its applied state."""
        if epoch <= self.epoch:
            raise P2PGenError(f"Raft epoch {epoch} is not above this agent's epoch {self.epoch}")
        with self._lock:
            old, self.node = self.node, None
            pending, self._pending = self._pending, None
        for n in (pending, old):
            if n is not None:
                n.stop()
        view = old.view() if old is not None else None
        if view is None:
            raise P2PGenError("this agent holds no replicated state to re-form from")
        self.epoch = epoch
        return copy.deepcopy(view.machine), view.version

    def stop(self) -> None:
        with self._lock:
            nodes, self.node, self._pending = (self.node, self._pending), None, None
        for n in nodes:
            if n is not None:
                n.stop()

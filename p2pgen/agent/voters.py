"""The leader's agent keeps the voter set healthy: removes dead voters at once, promotes live members.

Owns: a thread that, while this agent's node leads, gathers what it knows (voters in the configuration, the
agents it hears and what they announce, how long each voter has been in the configuration), asks the pure
`p2pgen.core.voters.plan_voters` for one decision, and carries it out: a removal of exactly one node id, or a
promotion (`prepare_voter` on the chosen agent, then a committed add of the id it returns). It never waits
on registrations, retirements or anything else the agent's driver does, so a dead voter's removal commits
as soon as the detector has spoken.
Invariant kept: one membership change in flight at a time (pysyncobj refuses overlapping changes anyway), and
every change is a committed Raft entry made by the current leader.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from p2pgen.agent.heartbeat import Announcement
from p2pgen.agent.raftmember import RaftMembership, control_addr_of
from p2pgen.agent.rpc import RpcClient
from p2pgen.core.voters import AgentStatus, Voter, VoterDecision, plan_voters
from p2pgen.errors import P2PGenError

log = logging.getLogger(__name__)

TICK_S = 0.25              # a look at least this often while leading; `poke` (a suspicion, a new view) makes one now
IDLE_TICK_S = 5.0          # otherwise: only a new view matters then (it pokes), and one that makes this node lead
HOLD_BACK_S = 5.0          # after a failed promotion, leave that agent alone for this long


class VoterManager:
    def __init__(self, membership: RaftMembership, secret: bytes, job: str, grace_s: float,
                 heard: Callable[[], dict[str, Announcement]], leaving: Callable[[], bool]) -> None:
        self.membership, self.secret, self.job, self.grace_s = membership, secret, job, grace_s
        self._heard, self._leaving = heard, leaving
        self._first_seen: dict[str, float] = {}        # voter id -> when this agent first saw it configured
        self._held_back: dict[str, float] = {}         # agent addr -> until when
        self.last_decision: VoterDecision | None = None
        self._leading = False                          # this agent's node led at the last look
        self._stop = threading.Event()
        self._poked = threading.Event()
        self._thread = threading.Thread(target=self._run, name="voter-manager", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def poke(self) -> None:
        """Something this manager decides on changed (an agent suspected or replaced, a new view): look now."""
        self._poked.set()

    def stop(self) -> None:
        self._stop.set()
        self._poked.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._poked.wait(TICK_S if self._leading else IDLE_TICK_S)
            self._poked.clear()
            if self._stop.is_set():
                return
            try:
                self._tick(time.monotonic())
            except P2PGenError as e:
                log.info("voter change not made: %s", e)
            except Exception:
                log.exception("voter manager failed; retrying")

    def _tick(self, now: float) -> None:
        """One look at the voters: keep their first-seen times; if this agent's node leads, make one change."""
        node = self.membership.node
        view = node.view() if node is not None else None
        if view is None:
            return
        for voter in view.nodes:
            self._first_seen.setdefault(voter, now)
        for gone in set(self._first_seen) - set(view.nodes):
            del self._first_seen[gone]
        self._leading = view.is_leader
        if not view.is_leader:
            return
        decision = plan_voters(self._voters(view.nodes), view.node_id, self._live(view.node_id),
                               frozenset(v for v, t in self._first_seen.items() if now - t >= self.grace_s),
                               frozenset(a for a, until in self._held_back.items() if until > now),
                               leaving=self._leaving())
        self.last_decision = decision
        if decision.action == "remove":
            log.info("removing Raft voter: %s", decision.reason)     # routine self-repair: nothing to do
            node.remove_node(decision.target, timeout=3.0)
            log.info("removed Raft voter %s", decision.target)
        elif decision.action == "promote":
            self._promote(decision.target, list(view.nodes), decision.reason, now)

    def _voters(self, nodes: tuple[str, ...]) -> tuple[Voter, ...]:
        return tuple(Voter(n, control_addr_of(n)) for n in nodes)

    def _live(self, self_node: str) -> tuple[AgentStatus, ...]:
        live = [AgentStatus(addr, ann.node, ann.eligible) for addr, ann in self._heard().items()]
        live.append(AgentStatus(self.membership.addr, self_node, False))
        return tuple(live)

    def _promote(self, addr: str, voters: list[str], reason: str, now: float) -> None:
        log.info("promoting a voter: %s", reason)
        try:
            with RpcClient(addr, self.secret, timeout=3.0, expect_job=self.job) as client:
                node_id = client.call("prepare_voter", voters=voters)
            self.membership.node.add_node(node_id, timeout=5.0)
            log.info("added Raft voter %s (agent %s)", node_id, addr)
        except (OSError, P2PGenError) as e:
            self._held_back[addr] = now + HOLD_BACK_S
            log.warning("promotion of %s failed: %s", addr, e)

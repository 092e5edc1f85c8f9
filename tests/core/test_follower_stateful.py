"""Hypothesis: followers (p2pgen.core.follower) driving the generation machine, without processes.

`FollowerJob` simulates up to four members' application processes on one `GenerationMachine`: each member's
follower decides on the JSON view the agent would serve, and the test performs what it decided (votes and
reports go to the machine; fetches copy the elected frontier). Hypothesis interleaves, in any order: members
acting, joins and restarts (a new incarnation), kills (the process ends and its agent reports it), collective
failures on any subset of a generation, data-plane steps (a generation's members commit together only when every
one of them runs it healthy; otherwise its ring breaks and each of them sees the failure), failed fetches,
lagging agents, and time passing.

Checked after every step (DESIGN's invariants, as they show from the members' side):
- I1/I4: a member runs generation G only with G's certificate naming it, and it activated G holding exactly the
  certificate's frontier (revision and digest);
- I2: the generations a member activates only go up;
- I3: an identity is followed by one process only; an ended (exited or killed) process never acts again, and no
  tombstoned identity runs a generation activated after its eviction;
- I5: one serial history: every commit at revision r in any generation yields the same digest for r (digests
  chain the previous digest with the generation, so two groups diverging from one revision would differ), on
  each branch of history (a certified regression, allowed here after 5 s, opens a new one at its fork), for
  as long as a live member holds the revision (without local copies, steps no live process holds are lost);
- members running the same generation hold the same state.
At teardown (no more faults, time passing): every live member ends up running the active generation and the
active generation holds every member of the job (liveness of the follower/machine pair).
"""

from __future__ import annotations

import hashlib

from follower_transcript import FollowerInterpreter, Member
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

PEERS = ("a", "b", "c", "d")
SETTLE_ROUNDS = 40


class ChainedDigests(FollowerInterpreter):
    """Digests that chain the previous one with the generation that committed the step (see I5 above)."""

    def next_digest(self, m: Member, generation: int) -> str:
        return hashlib.sha1(f"{m.digest}|{generation}".encode()).hexdigest()[:12]


class FollowerJob(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.job = ChainedDigests()
        self.run("configure 1 wait=5 fresh=1")
        self.incarnation: dict[str, int] = {}
        self.history: dict[tuple[int, int], str] = {}  # (branch, revision) -> the one digest it may have (I5)
        self.activations: dict[str, list[int]] = {}    # peer -> generations its current process activated

    def run(self, line: str) -> list[str]:
        out = self.job.run(line)
        assert not any(x.startswith("ERROR") for x in out), (line, out)
        return out

    def live(self) -> dict[str, Member]:
        return {p: m for p, m in self.job.members.items() if not m.ended}

    @initialize(first=st.sets(st.sampled_from(PEERS), min_size=1, max_size=3))
    def start(self, first: set[str]) -> None:
        for peer in sorted(first):
            self.join_or_restart(peer)

    # --- faults and joins -----------------------------------------------------------------------------------

    @rule(peer=st.sampled_from(PEERS))
    def join_or_restart(self, peer: str) -> None:
        if peer in self.live():
            return
        inc = self.incarnation[peer] = self.incarnation.get(peer, 0) + 1
        port = 7000 + 10 * PEERS.index(peer)
        self.run(f"register {peer} {inc} agent=127.0.0.1:{port} data=127.0.0.1:{port + 2} state=127.0.0.1:{port + 3}")
        self.run(f"follow {peer} {inc}")
        self.activations[peer] = []

    @rule(peer=st.sampled_from(PEERS), reporter=st.sampled_from(PEERS))
    def kill(self, peer: str, reporter: str) -> None:
        m = self.live().get(peer)
        if m is None:
            return
        m.ended = "killed"
        self.run(f'suspect reporter={reporter} {peer} {m.follower.identity[1]} reason="process died"')
        self.forget_lost_revisions()

    @rule(peers=st.sets(st.sampled_from(PEERS), min_size=1))
    def collective_fails(self, peers: set[str]) -> None:
        for peer in peers:
            m = self.live().get(peer)
            if m is not None and m.running is not None:
                self.run(f"local {peer} failed=1")

    @rule(peer=st.sampled_from(PEERS))
    def agent_lags_or_catches_up(self, peer: str) -> None:
        m = self.live().get(peer)
        if m is not None:
            self.run(f"{'catchup' if m.lagging is not None else 'lag'} {peer}")

    @rule(seconds=st.sampled_from((0.1, 0.5, 1.0, 2.0, 6.0)))
    def time_passes(self, seconds: float) -> None:
        self.job.at += seconds

    # --- the members and the data plane ---------------------------------------------------------------------

    @rule(peer=st.sampled_from(PEERS), fetch_fails=st.booleans())
    def act(self, peer: str, fetch_fails: bool) -> None:
        m = self.live().get(peer)
        if m is None:
            return
        before = len(m.ran)
        self.run(f"act {peer}" + (" fail" if fetch_fails and m.follower.progress.voted is not None else ""))
        if len(m.ran) > before:
            self.check_activation(peer, m, m.ran[-1])

    @rule(times=st.integers(1, 4))
    def everyone_acts(self, times: int) -> None:
        for _ in range(times):
            for peer in sorted(self.live()):
                self.act(peer, False)

    @rule()
    def step(self) -> None:
        """One data-plane step of every generation some member runs: it commits on all its members if every
        member of its certificate runs it healthy (moving them to a pending join at the boundary); else the
        ring breaks and each member still in it sees the failure."""
        running = {m.running for m in self.live().values() if m.running is not None}
        for generation in sorted(running):
            cert = self.certificate(generation)
            group = [self.live().get(x.peer_id) for x in cert.members]
            healthy = all(m is not None and m.follower.identity == (x.peer_id, x.incarnation)
                          and m.running == generation
                          and not m.failed for m, x in zip(group, cert.members))
            if not healthy:
                for peer, m in self.live().items():
                    if m.running == generation:
                        self.run(f"local {peer} failed=1")
                continue
            self.run(f"commit {generation}")
            for x in cert.members:
                self.record_commit(self.live()[x.peer_id], cert.state_epoch)
            pending = self.job.machine.pending
            if pending and all(pending.member(x.peer_id) == x for x in cert.members):
                for x in cert.members:
                    self.run(f"local {x.peer_id} switch={pending.generation}")

    # --- checks ---------------------------------------------------------------------------------------------

    def certificate(self, generation: int):
        entry = next(h for h in self.job.machine.history if h.generation == generation)
        assert entry.outcome == "activated" and entry.certificate is not None
        return entry.certificate

    def check_activation(self, peer: str, m: Member, generation: int) -> None:
        cert = self.certificate(generation)
        assert m.follower.identity in [x.identity for x in cert.members], (peer, generation)
        assert (m.revision, m.digest) == (cert.frontier.revision, cert.frontier.digest), (peer, generation)
        assert not self.activations[peer] or self.activations[peer][-1] < generation      # I2
        self.activations[peer].append(generation)

    def forget_lost_revisions(self) -> None:
        """Steps committed after the last certificate live only in the processes (this test keeps no local
        copies): once no live member holds revision r any more, the job may compute r again, differently."""
        top = max((m.revision for m in self.live().values()), default=0)
        self.history = {key: digest for key, digest in self.history.items() if key[1] <= top}

    def record_commit(self, m: Member, epoch: int) -> None:
        """A state epoch is a branch of history opened by a certified regression at its fork revision: below it,
        it shares its parent branch's revisions."""
        starts = dict(self.job.machine.forks)
        while epoch > 1 and m.revision <= starts.get(epoch, 0):
            epoch -= 1
        known = self.history.setdefault((epoch, m.revision), m.digest)
        assert known == m.digest, f"revision {m.revision} has two digests: {known} and {m.digest} (I5)"

    @invariant()
    def members_of_a_generation_hold_one_state(self) -> None:
        by_generation: dict[int, set[tuple[int, str]]] = {}
        for m in self.live().values():
            if m.running is not None:
                cert = self.certificate(m.running)
                assert m.follower.identity in [x.identity for x in cert.members]
                by_generation.setdefault(m.running, set()).add((m.revision, m.digest))
        assert all(len(states) == 1 for states in by_generation.values()), by_generation

    @invariant()
    def no_tombstoned_identity_runs(self) -> None:
        dead = {(t.peer_id, t.incarnation) for t in self.job.machine.tombstones}
        for m in self.live().values():
            if m.follower.identity in dead and m.running is not None:
                assert m.running < max(h.generation for h in self.job.machine.history if h.outcome == "activated")

    def teardown(self) -> None:
        """No more faults: the job must settle with every live member in the active generation."""
        for peer, m in self.live().items():
            if m.lagging is not None:
                self.run(f"catchup {peer}")
        for _ in range(SETTLE_ROUNDS):
            self.everyone_acts(4)
            self.step()
            self.job.at += 2.0
        machine, live = self.job.machine, self.live()
        if not live:
            return
        assert machine.active is not None and machine.pending is None, self.job.run("state")
        members = {x.identity for x in machine.active.members}
        for peer, m in live.items():
            if m.follower.identity in {x.identity for x in machine.members}:
                assert m.follower.identity in members and m.running == machine.active.generation, \
                    (peer, self.job.run("state"))


FollowerJob.TestCase.settings = settings(max_examples=150, stateful_step_count=50, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
TestFollowerJob = FollowerJob.TestCase

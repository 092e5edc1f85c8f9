"""DiLoCo on in-process members (threads on loopback sockets): rounds kept across failures, exact results
against the single-process reference, streaming fragments and their staleness, and refusals."""

from __future__ import annotations

import threading

import pytest
import torch

from p2pgen.collectives.compress import compressed_all_reduce
from p2pgen.errors import GenerationChanged, PeerLost
from p2pgen.testing.cluster import LocalCluster
from p2pgen.torch.diloco import DiLoCo, InnerBatch
from tests.integration.apps.diloco_train import SYNC_EVERY, inner_loss, make_diloco, make_model, reference

pytestmark = pytest.mark.timeout(60)


class FakeStep:
    """What DiLoCo uses of a p2pgen Step, over a TcpBackend: revision, generation, rank, world,
    all_reduce and commit (which moves the member's revision)."""

    def __init__(self, member: Member, backend, fail_on: int | None = None) -> None:
        self.member, self.backend = member, backend
        self.revision, self.generation = member.revision, backend.generation
        self.rank, self.world = backend.rank, backend.world
        self.reduces = 0
        self.adopt = []                 # (ErrorFeedback, residual) adopted at commit, as Step does
        self.fail_on = fail_on          # raise PeerLost at this all-reduce (0-based) of the step

    def all_reduce(self, buf, op="sum", compress=None, feedback=None):
        if self.fail_on == self.reduces:
            raise PeerLost("a member vanished (test)")
        self.reduces += 1
        if compress is None:
            return self.backend.all_reduce(buf, op=op)
        left = compressed_all_reduce(self.backend, buf, mode=compress, op=op, residual=feedback.current(buf))
        self.adopt.append((feedback, left))
        return buf

    def commit(self) -> int:
        for feedback, left in self.adopt:
            feedback.adopt(left)
        self.member.revision += 1
        return self.member.revision


class Member:
    def __init__(self, **kwargs) -> None:
        torch.set_num_threads(1)
        self.model = make_model()
        self.diloco = make_diloco(self.model, **kwargs)
        self.loss = inner_loss(self.model)
        self.revision = 0
        self.batches: list[InnerBatch] = []

    def inner(self, batch: InnerBatch) -> torch.Tensor:
        self.batches.append(batch)
        return self.loss(batch)

    def outer(self, backend, fail_on: int | None = None):
        return self.diloco.outer_step(FakeStep(self, backend, fail_on), self.inner)

    def w(self) -> torch.Tensor:
        return self.diloco.tensors()["diloco.param.weight"]


def run_step(cluster: LocalCluster, members: list[Member], generation: int, fails: dict[int, int] | None = None):
    backends = cluster.backends(generation)
    fails = fails or {}
    return cluster.run(lambda b: members[b.rank].outer(b, fails.get(b.rank)), backends)


def test_every_member_matches_the_single_process_reference() -> None:
    members = [Member() for _ in range(3)]
    with LocalCluster(3) as cluster:
        for generation in range(1, 5):
            reports = run_step(cluster, members, generation)
    assert [r.contributors for r in reports] == [3, 3, 3]
    expected = reference([[(rank, 3) for rank in range(3)]] * 4)
    for m in members:
        assert torch.equal(m.w(), expected)
        assert torch.equal(m.model.weight.detach(), expected), "the replica starts the next round at the global"


def test_a_member_lost_during_the_inner_phase_costs_the_survivors_nothing() -> None:
    """Three members run their rounds; one dies before the outer all-reduce (the payload all-reduce fails
    on every member); the two survivors retry in the next generation without running an inner step, and
    the step averages their two rounds, bound in the first generation."""
    members = [Member() for _ in range(3)]
    with LocalCluster(3) as cluster:
        backends = cluster.backends(1)

        def attempt(b):
            with pytest.raises(PeerLost):
                members[b.rank].outer(b, fail_on=2)     # offer, count, then the payload: it fails
        cluster.run(attempt, backends)
    survivors = members[:2]
    with LocalCluster(2) as cluster:
        reports = run_step(cluster, survivors, 2)
    assert all(r.reused and r.inner_steps == 0 and r.contributors == 2 for r in reports)
    assert all(r.round.generation == 1 and r.round.world == 3 for r in reports)
    assert [len(m.batches) for m in survivors] == [SYNC_EVERY, SYNC_EVERY], "no inner step ran twice"
    expected = reference([[(0, 3), (1, 3)]])
    assert all(torch.equal(m.w(), expected) for m in survivors)


def test_a_joiner_contributes_nothing_until_the_next_outer_step() -> None:
    members = [Member() for _ in range(2)]
    with LocalCluster(2) as cluster:
        backends = cluster.backends(1)
        cluster.run(lambda b: pytest.raises(PeerLost, members[b.rank].outer, b, fail_on=2), backends)
    joiner = Member()
    members.append(joiner)
    with LocalCluster(3) as cluster:
        first = run_step(cluster, members, 2)
        assert [r.weight for r in first] == [1, 1, 0] and {r.contributors for r in first} == {2}
        assert joiner.batches == [], "the joiner ran no inner step of a round bound before it joined"
        second = run_step(cluster, members, 3)
    assert [r.weight for r in second] == [1, 1, 1]
    expected = reference([[(0, 2), (1, 2)], [(0, 3), (1, 3), (2, 3)]])
    assert all(torch.equal(m.w(), expected) for m in members)


def test_a_failed_outer_step_is_retried_once_and_applied_once() -> None:
    """The count all-reduce fails on every member: nothing is applied; the retry
    in the next generation (same members) reuses every round and applies the average once."""
    members = [Member() for _ in range(3)]
    with LocalCluster(3) as cluster:
        cluster.run(lambda b: pytest.raises(PeerLost, members[b.rank].outer, b, fail_on=1),
                    cluster.backends(1))
        assert all(m.revision == 0 for m in members)
        assert all(torch.equal(m.w(), torch.zeros(4, 8, dtype=torch.float64)) for m in members)
        reports = run_step(cluster, members, 2)
    assert all(r.reused for r in reports)
    assert all(torch.equal(m.w(), reference([[(0, 3), (1, 3), (2, 3)]])) for m in members)


def test_a_member_that_missed_a_commit_drops_its_round_and_follows_the_state() -> None:
    member = Member()
    with LocalCluster(1) as cluster:
        run_step(cluster, [member], 1)
        member.diloco._round = None
        member.revision = 5                      # as after pulling revision 5 from the others
        member.model.weight.data.fill_(9.0)      # a replica that does not follow the state
        report = run_step(cluster, [member], 2)[0]
    assert report.revision == 5 and report.round.revision == 5 and not report.reused
    assert member.batches[-SYNC_EVERY].revision == 5


def test_streaming_fragments_sync_in_turn_with_bounded_staleness() -> None:
    torch.set_num_threads(1)
    members = []
    for _ in range(2):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)).double()
        torch.manual_seed(0)
        for p in model.parameters():
            torch.nn.init.normal_(p)
        diloco = DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=0.01),
                        torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True),
                        sync_every=4, fragments=2)
        members.append((model, diloco))
    assert members[0][1].overlap == 1 and members[0][1].round_steps == 2
    assert [members[0][1].fragment_names(f) for f in (0, 1)] == [["0.weight"], ["0.bias", "1.weight", "1.bias"]]
    seen: list[list[InnerBatch]] = [[], []]

    def outer(backend, revision):
        model, diloco = members[backend.rank]
        x = torch.arange(8, dtype=torch.float64).reshape(2, 4) / 8

        def inner(batch):
            seen[backend.rank].append(batch)
            return model(x + batch.index).pow(2).sum()
        holder = type("M", (), {"revision": revision})()
        step = FakeStep(holder, backend)
        return diloco.outer_step(step, inner)

    reports = []
    with LocalCluster(2) as cluster:
        for revision in range(6):
            reports.append(cluster.run(lambda b: outer(b, revision), cluster.backends(revision + 1)))
    assert [r[0].fragment for r in reports] == [0, 1, 0, 1, 0, 1]
    for per_step in reports:
        assert all(r.applied_at - r.taken_at <= 1 for r in per_step), "applied at most `overlap` steps late"
    # Round r's inner steps: the first ran during step r-1's all-reduce (overlap), the second in step r.
    assert [(b.revision, b.index) for b in seen[0][:5]] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
    g0, g1 = (m[1].tensors() for m in members)
    assert all(torch.equal(g0[k], g1[k]) for k in g0), "global parameters and outer state identical"
    assert set(g0) >= {"diloco.outer.0.weight.momentum_buffer", "diloco.param.1.bias"}


def test_the_overlapped_all_reduce_failure_reaches_the_step() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)).double()
    diloco = DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(model.parameters(), lr=1.0),
                    sync_every=4, fragments=2)
    holder = type("M", (), {"revision": 0})()
    with LocalCluster(1) as cluster:
        (backend,) = cluster.backends(1)
        with pytest.raises(GenerationChanged):
            diloco.outer_step(_Raising(holder, backend, at=2), lambda b: model(torch.ones(2).double()).sum())
        report = diloco.outer_step(FakeStep(holder, backend), lambda b: model(torch.ones(2).double()).sum())
    assert report.reused and report.inner_steps == 0, "the round and the overlap steps were kept"


class _Raising(FakeStep):
    def __init__(self, member, backend, at: int) -> None:
        super().__init__(member, backend)
        self.at = at

    def all_reduce(self, buf, op="sum"):
        if self.reduces == self.at:
            threading.Event().wait(0.05)
            raise GenerationChanged("a new generation (test)")
        return super().all_reduce(buf, op)


def _trained(compress, steps: int = 4) -> list[torch.Tensor]:
    torch.set_num_threads(1)
    members = []
    for _ in range(3):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
        members.append((model, DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=0.01),
                                      torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True),
                                      sync_every=3, compress=compress)))

    def outer(backend, revision):
        model, diloco = members[backend.rank]
        x = torch.linspace(-1, 1, 16 * 8).reshape(8, 16) * (backend.rank + 1)
        holder = type("M", (), {"revision": revision})()
        return diloco.outer_step(FakeStep(holder, backend), lambda b: model(x + b.index).pow(2).mean())

    with LocalCluster(3) as cluster:
        for revision in range(steps):
            cluster.run(lambda b: outer(b, revision), cluster.backends(revision + 1))
    return [torch.cat([t.reshape(-1) for t in d.tensors().values()]) for _, d in members]


def test_a_compressed_outer_all_reduce_is_bit_identical_and_close_to_the_full_one() -> None:
    full = _trained(None)[0]
    for mode, tolerance in (("int8", 0.05), ("bf16", 0.02)):
        states = _trained(mode)
        assert all(torch.equal(states[0], s) for s in states[1:]), f"{mode}: members differ"
        assert 0 < (states[0] - full).abs().max() < tolerance, mode


@pytest.mark.parametrize("kwargs, message", [
    ({"sync_every": 0}, "sync_every=0"),
    ({"sync_every": 4, "fragments": 3}, "does not divide sync_every"),
    ({"sync_every": 4, "fragments": 5}, "at most that many"),
    ({"sync_every": 4, "compress": "fp4"}, "compress='fp4'"),
    ({"sync_every": 4, "fragments": 2, "overlap": 2}, "overlap=2"),
])
def test_bad_arguments_are_refused_naming_them(kwargs, message) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=message):
        DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(model.parameters(), lr=0.7),
               **kwargs)


def test_an_optimizer_over_other_parameters_is_refused() -> None:
    model, other = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="outer_optimizer holds a parameter"):
        DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(other.parameters(), lr=0.7),
               sync_every=2)
    with pytest.raises(ValueError, match="inner_optimizer holds a parameter"):
        DiLoCo(model, torch.optim.SGD(other.parameters(), lr=0.1), torch.optim.SGD(model.parameters(), lr=0.7),
               sync_every=2)

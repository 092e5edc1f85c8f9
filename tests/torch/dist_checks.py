"""torch.distributed checks against the p2pgen backend, run by every member process (spawned by
test_collectives.py): each check calls the public `torch.distributed` API on the `p2pgen` default group
and asserts what torch's contract promises (shapes, dtypes, in-place writes, async futures), then the
error contract of p2pgen.torch on a generation change.

Checks run in CHECKS order on every member (they issue collectives, so the order is part of the
protocol); a failing check is recorded and the next one still runs. The last checks retire generation 1
and move the same torch process group to generations 2 and 3 of the same members.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

import p2pgen.torch as pt
from p2pgen.collectives import TcpBackend
from p2pgen.errors import GenerationChanged, PeerLost
from p2pgen.testing.cluster import SECRET
from p2pgen.testing.ports import open_transport
from p2pgen.transport import Endpoint, Group, Transport

JOB = "torch-checks"
FLOATS = (torch.float32, torch.float64, torch.bfloat16)
INTS = (torch.int32, torch.int64)


@dataclass
class Member:
    """One process's side of the checks: its transport, the members, the generation in use."""

    transport: Transport
    endpoints: list[Endpoint]
    rank: int
    backend: TcpBackend | None = None

    @property
    def world(self) -> int:
        return len(self.endpoints)

    def enter(self, generation: int) -> None:
        self.backend = TcpBackend(self.transport, Group(JOB, generation, self.endpoints, self.rank))


def value(rank: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A rank-dependent tensor with small integer values (exact in every supported dtype)."""
    n = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.int64).reshape(shape)
    return ((n * 3 + rank * 5) % 17 - 8).to(dtype)


# --- checks on generation 1 -----------------------------------------------------------------------

def check_rank_size_backend(m: Member) -> None:
    assert dist.get_backend() == "p2pgen"
    assert (dist.get_rank(), dist.get_world_size()) == (m.rank, m.world)
    assert pt.default_group().generation == 1


def check_all_reduce_ops_and_dtypes(m: Member) -> None:
    for dtype in FLOATS + INTS:
        ops = [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
        ops += [dist.ReduceOp.AVG] if dtype in FLOATS else []
        for op in ops:
            t = value(m.rank, (3, 5), dtype)
            ptr = t.data_ptr()
            assert dist.all_reduce(t, op=op) is None
            parts = torch.stack([value(r, (3, 5), torch.float64) for r in range(m.world)])
            expected = {dist.ReduceOp.SUM: parts.sum(0), dist.ReduceOp.MIN: parts.min(0).values,
                        dist.ReduceOp.MAX: parts.max(0).values, dist.ReduceOp.AVG: parts.mean(0)}[op]
            assert t.dtype == dtype and t.shape == (3, 5) and t.data_ptr() == ptr, (dtype, op)
            assert torch.equal(t, expected.to(dtype)), (dtype, op, t, expected)


def check_broadcast_every_root(m: Member) -> None:
    for root in range(m.world):
        t = value(m.rank, (4, 2, 3), torch.float32)
        dist.broadcast(t, src=root)
        assert torch.equal(t, value(root, (4, 2, 3), torch.float32)), root


def check_all_gather_list_and_tensor(m: Member) -> None:
    mine = value(m.rank, (2, 3), torch.int64)
    before = mine.clone()
    outs = [torch.full((2, 3), -1, dtype=torch.int64) for _ in range(m.world)]
    dist.all_gather(outs, mine)
    for r, out in enumerate(outs):
        assert torch.equal(out, value(r, (2, 3), torch.int64)), r
    flat = torch.empty(m.world * 2, 3, dtype=torch.int64)
    dist.all_gather_into_tensor(flat, mine)
    assert torch.equal(flat, torch.cat([value(r, (2, 3), torch.int64) for r in range(m.world)]))
    assert torch.equal(mine, before), "all_gather wrote its input"


def check_reduce_scatter_list_and_tensor(m: Member) -> None:
    inputs = [value(m.rank * m.world + i, (5,), torch.float64) for i in range(m.world)]
    copies = [t.clone() for t in inputs]
    out = torch.zeros(5, dtype=torch.float64)
    dist.reduce_scatter(out, inputs)
    expected = sum(value(r * m.world + m.rank, (5,), torch.float64) for r in range(m.world))
    assert torch.equal(out, expected)
    assert all(torch.equal(a, b) for a, b in zip(inputs, copies)), "reduce_scatter wrote its inputs"
    out2 = torch.zeros(5, dtype=torch.float64)
    dist.reduce_scatter_tensor(out2, torch.cat(inputs), op=dist.ReduceOp.MAX)
    assert torch.equal(out2, torch.stack([value(r * m.world + m.rank, (5,), torch.float64)
                                          for r in range(m.world)]).max(0).values)


def check_in_place_gather_and_scatter(m: Member) -> None:
    """FSDP2's layouts: all-gather from a view of the output's own slot, reduce-scatter into a view of the
    input's own slot; also another rank's slot and a window straddling two slots."""
    n = 4
    for slot in (m.rank, (m.rank + 1) % m.world):
        for shift in (0, n // 2) if m.world > 1 else (0,):
            off = min(slot * n + shift, (m.world - 1) * n)
            flat = torch.zeros(m.world * n, dtype=torch.float32)
            flat[off:off + n] = value(m.rank, (n,), torch.float32)
            dist.all_gather_into_tensor(flat, flat[off:off + n])
            expected = torch.cat([value(r, (n,), torch.float32) for r in range(m.world)])
            assert torch.equal(flat, expected), (slot, shift, flat, expected)
            inp = value(m.rank, (m.world * n,), torch.float64)
            dist.reduce_scatter_tensor(inp[off:off + n], inp)
            total = sum(value(r, (m.world * n,), torch.float64) for r in range(m.world))
            assert torch.equal(inp[off:off + n], total[m.rank * n:(m.rank + 1) * n]), (slot, shift)


def check_barrier_and_send_recv(m: Member) -> None:
    dist.barrier()
    nxt, prev = (m.rank + 1) % m.world, (m.rank - 1) % m.world
    got = torch.zeros(7, dtype=torch.int32)
    sent = dist.isend(value(m.rank, (7,), torch.int32), dst=nxt)
    received = dist.irecv(got, src=prev)
    sent.wait()
    received.wait()
    assert torch.equal(got, value(prev, (7,), torch.int32))


def check_async_futures_complete_in_issue_order(m: Member) -> None:
    tensors = [torch.full((1000,), float(m.rank + i)) for i in range(4)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    chained = works[0].get_future().then(lambda fut: fut.value()[0].sum().item())
    for i in reversed(range(4)):
        assert works[i].wait() is True and works[i].is_completed()
        expected = float(sum(r + i for r in range(m.world)))
        assert torch.equal(tensors[i], torch.full((1000,), expected)), i
        assert works[i].get_future().value()[0] is tensors[i]
    assert chained.wait() == 1000.0 * sum(range(m.world))


def check_bad_arguments_raise_at_the_call(m: Member) -> None:
    cases: list[tuple[type, Callable[[], Any]]] = [
        (TypeError, lambda: dist.all_reduce(torch.ones(3, dtype=torch.float16))),
        (ValueError, lambda: dist.all_reduce(torch.ones(4, 4).t())),
        (ValueError, lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.PRODUCT)),
        (ValueError, lambda: dist.all_gather([torch.ones(2)] * (m.world + 1), torch.ones(2))),
        (ValueError, lambda: dist.all_gather_into_tensor(torch.ones(2 * m.world + 1), torch.ones(2))),
        (TypeError, lambda: dist.reduce_scatter_tensor(torch.ones(2), torch.ones(2 * m.world, dtype=torch.float64))),
    ]
    for kind, call in cases:
        try:
            call()
        except kind:
            continue
        raise AssertionError(f"expected {kind.__name__}")
    t = torch.full((3,), float(m.rank))
    dist.all_reduce(t)                      # nothing was issued by the bad calls: still in step
    assert torch.equal(t, torch.full((3,), float(sum(range(m.world)))))


# --- generation changes ---------------------------------------------------------------------------

def check_generation_change_mid_collective(m: Member) -> None:
    """Every member but the last enters an all_reduce the last never joins; rank 0's generation is then
    retired: its Work fails with GenerationChanged and leaves the buffer untouched, the others fail
    as rank 0 hangs up, and the same torch group then runs in generation 2."""
    assert m.world >= 3, "the last member must not be rank 0's ring successor"
    old, last = m.backend, m.world - 1
    t = torch.full((1 << 18,), 3.0)
    if m.rank == last:
        work = dist.irecv(torch.zeros(1), src=0)     # rank 0 sends nothing: ends when rank 0 retires G1
    else:
        work = dist.all_reduce(t, async_op=True)
    if m.rank == 0:
        time.sleep(0.2)
        assert not work.is_completed(), "an all_reduce that a member never joined completed"
        old.abort("generation 2 proposed")
        _expect_error(GenerationChanged, work.wait)
        _expect_error(GenerationChanged, work.get_future().wait)
        _expect_error(GenerationChanged, lambda: dist.all_reduce(t))       # later calls in G1 fail too
    else:
        _expect_error((PeerLost, GenerationChanged), work.wait)
        old.abort("generation 2 proposed")
    assert work.is_completed()
    assert torch.equal(t, torch.full((1 << 18,), 3.0)), "a failed all_reduce changed its buffer"
    m.enter(2)
    t = torch.full((5,), float(m.rank))
    dist.all_reduce(t)
    assert pt.default_group().generation == 2 and dist.get_world_size() == m.world
    assert torch.equal(t, torch.full((5,), float(sum(range(m.world)))))


def check_ddp_backward_fails_then_retry_in_next_generation(m: Member) -> None:
    """A DDP step whose generation is retired during backward raises the p2pgen error through
    unwrap_errors; the retried step in generation 3 gives the global-batch gradient on every member."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()
    model = pt.DistributedDataParallel(module)
    x = torch.randn(12, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    lo, hi = m.rank * 12 // m.world, (m.rank + 1) * 12 // m.world

    def step() -> None:
        module.zero_grad()
        loss = model(x[lo:hi]).pow(2).sum() / 12
        if m.rank != 0 and m.backend.generation == 2:
            m.backend.abort("generation 3 proposed")       # retired before this member's bucket all-reduce
        with pt.unwrap_errors():
            loss.backward()

    expected = GenerationChanged if m.rank != 0 else (GenerationChanged, PeerLost)
    _expect_error(expected, step)
    m.backend.abort("generation 3 proposed")
    m.enter(3)
    step()
    reference = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()
    reference.load_state_dict(module.state_dict())
    (reference(x).pow(2).sum() / 12).backward()
    for got, want in zip(module.parameters(), reference.parameters()):
        assert torch.allclose(got.grad, want.grad, rtol=1e-12, atol=1e-14), (got.grad, want.grad)


def _expect_error(kind: type | tuple[type, ...], call: Callable[[], Any]) -> None:
    try:
        call()
    except kind:
        return
    raise AssertionError(f"expected {kind}")


CHECKS: list[Callable[[Member], None]] = [
    check_rank_size_backend,
    check_all_reduce_ops_and_dtypes,
    check_broadcast_every_root,
    check_all_gather_list_and_tensor,
    check_reduce_scatter_list_and_tensor,
    check_in_place_gather_and_scatter,
    check_barrier_and_send_recv,
    check_async_futures_complete_in_issue_order,
    check_bad_arguments_raise_at_the_call,
    check_generation_change_mid_collective,
    check_ddp_backward_fails_then_retry_in_next_generation,
]


def member_main(pipe: Any, rank: int) -> None:
    """Spawned process: report the data port, receive the endpoints, run CHECKS, report each result."""
    torch.set_num_threads(1)
    transport = open_transport(JOB, SECRET, f"peer{rank}", 100 + rank)
    pipe.send(transport.endpoint().port)
    m = Member(transport, pipe.recv(), rank)
    m.enter(1)
    pt.init_process_group(lambda: m.backend)
    for check in CHECKS:
        try:
            check(m)
            pipe.send((check.__name__, "ok"))
        except BaseException:      # reported to the test, which fails on it
            pipe.send((check.__name__, traceback.format_exc()))
    dist.destroy_process_group()
    transport.close()

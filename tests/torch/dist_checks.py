"""torch.distributed checks against the p2pgen backend, run by every member process (spawned by
test_collectives.py): each check calls the public `torch.distributed` API on the `p2pgen` default group
(one that follows the generation) and asserts what torch's contract promises (shapes, dtypes, in-place
writes, async futures): every dtype gloo reduces with every op it defines, every collective torch users
reach for (reduce, gather, scatter, all_to_all, object collectives, coalescing, subgroups, monitored
barrier), functional collectives, DeviceMesh and DTensor on a generation-bound group, and refusals of bad
input at the call; then the error contract of p2pgen.torch on a generation change, subgroups included.

Checks run in CHECKS order on every member (they issue collectives, so the order is part of the
protocol); a failing check is recorded and the next one still runs. The last checks retire generation 1
and move the same torch process group to generations 2 and 3 of the same members.
"""

from __future__ import annotations

import re
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import p2pgen.torch as pt
from p2pgen.collectives import TcpBackend
from p2pgen.errors import GenerationChanged, PeerLost
from p2pgen.testing.cluster import SECRET
from p2pgen.testing.ports import open_transport
from p2pgen.transport import Endpoint, Group, Transport

JOB = "torch-checks"
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTS = (torch.int8, torch.uint8, torch.int32, torch.int64)
BITWISE = {dist.ReduceOp.BAND: torch.bitwise_and, dist.ReduceOp.BOR: torch.bitwise_or,
           dist.ReduceOp.BXOR: torch.bitwise_xor}


@dataclass
class Member:
    """One process's side of the checks: its transport, the members, the generation in use."""

    transport: Transport
    endpoints: list[Endpoint]
    rank: int
    backend: TcpBackend | None = None
    pair: Any = None                   # the subgroup of ranks 0 and 2 (made in generation 1, follows the others)

    @property
    def world(self) -> int:
        return len(self.endpoints)

    def enter(self, generation: int) -> None:
        self.backend = TcpBackend(self.transport, Group(JOB, generation, self.endpoints, self.rank))


def value(rank: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A rank-dependent tensor with small integer values (exact in every supported dtype; 0/1 for bool,
    0..7 for uint8), whose sum over 3 ranks stays in range for int8."""
    n = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.int64).reshape(shape)
    if dtype == torch.bool:
        return ((n + rank) % 2).bool()
    if dtype == torch.uint8:
        return ((n * 3 + rank * 5) % 8).to(dtype)
    return ((n * 3 + rank * 5) % 17 - 8).to(dtype)


def factor(rank: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Factors whose product over the ranks is exact in every dtype: {1, 2}, or {-2, -1, 1, 2} if signed."""
    if dtype == torch.bool:
        return value(rank, shape, dtype)
    n = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.int64).reshape(shape)
    choices = torch.tensor([1, 2] if dtype == torch.uint8 else [-2, -1, 1, 2])
    return choices[(n + rank * 3) % len(choices)].to(dtype)


# --- checks on generation 1 -----------------------------------------------------------------------

def check_rank_size_backend(m: Member) -> None:
    assert dist.get_backend() == "p2pgen"
    assert (dist.get_rank(), dist.get_world_size()) == (m.rank, m.world)
    assert pt.default_group().generation == 1


def check_all_reduce_every_dtype_and_op_gloo_has(m: Member) -> None:
    for dtype in FLOATS + INTS + (torch.bool,):
        ops = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
        ops += [dist.ReduceOp.AVG] if dtype in FLOATS else list(BITWISE)
        for op in ops:
            make = factor if op == dist.ReduceOp.PRODUCT else value
            t = make(m.rank, (3, 5), dtype)
            ptr = t.data_ptr()
            assert dist.all_reduce(t, op=op) is None
            parts = [make(r, (3, 5), dtype) for r in range(m.world)]
            assert t.dtype == dtype and t.shape == (3, 5) and t.data_ptr() == ptr, (dtype, op)
            assert torch.equal(t, _reference(parts, op, dtype)), (dtype, op, t)


def _reference(parts: list[torch.Tensor], op: Any, dtype: torch.dtype) -> torch.Tensor:
    if op in BITWISE:
        acc = parts[0]
        for p in parts[1:]:
            acc = BITWISE[op](acc, p)
        return acc
    wide = torch.stack([p.double() for p in parts])
    got = {dist.ReduceOp.SUM: wide.sum(0), dist.ReduceOp.PRODUCT: wide.prod(0), dist.ReduceOp.MIN: wide.min(0).values,
           dist.ReduceOp.MAX: wide.max(0).values, dist.ReduceOp.AVG: wide.mean(0)}[op]
    return (got != 0) if dtype == torch.bool else got.to(dtype)


def check_complex_and_non_contiguous_tensors(m: Member) -> None:
    z = torch.complex(value(m.rank, (4,), torch.float32), torch.ones(4))
    dist.all_reduce(z)
    assert torch.equal(z, torch.complex(sum(value(r, (4,), torch.float32) for r in range(m.world)),
                                        torch.full((4,), float(m.world))))
    base = value(m.rank, (4, 6), torch.float64)
    t = base.t()                                           # a transposed view: not contiguous
    dist.all_reduce(t)
    assert torch.equal(base, sum(value(r, (4, 6), torch.float64) for r in range(m.world)))


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


def check_reduce_gather_scatter(m: Member) -> None:
    root = m.world - 1
    t = value(m.rank, (6,), torch.int64)
    dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
    want = torch.stack([value(r, (6,), torch.int64) for r in range(m.world)]).max(0).values
    assert torch.equal(t, want if m.rank == root else value(m.rank, (6,), torch.int64)), "reduce"
    outs = [torch.full((2, 3), -1.0) for _ in range(m.world)] if m.rank == 0 else None
    dist.gather(value(m.rank, (2, 3), torch.float32), outs, dst=0)
    if m.rank == 0:
        assert all(torch.equal(o, value(r, (2, 3), torch.float32)) for r, o in enumerate(outs)), "gather"
    out = torch.zeros(5, dtype=torch.bfloat16)
    dist.scatter(out, [value(10 + r, (5,), torch.bfloat16) for r in range(m.world)] if m.rank == 1 else None, src=1)
    assert torch.equal(out, value(10 + m.rank, (5,), torch.bfloat16)), "scatter"


def check_all_to_all_single_with_splits_and_list(m: Member) -> None:
    sends = [(m.rank + j) % 3 for j in range(m.world)]           # rows this rank sends to each rank
    gets = [(r + m.rank) % 3 for r in range(m.world)]
    inp = torch.cat([torch.full((n, 2), float(10 * m.rank + j)) for j, n in enumerate(sends)])
    out = torch.full((sum(gets), 2), -1.0)
    dist.all_to_all_single(out, inp, gets, sends)
    assert torch.equal(out, torch.cat([torch.full((n, 2), float(10 * r + m.rank)) for r, n in enumerate(gets)]))
    outs = [torch.zeros(r + 1, dtype=torch.int8) for r in range(m.world)]
    dist.all_to_all(outs, [torch.full((m.rank + 1,), m.rank * 4 + j, dtype=torch.int8) for j in range(m.world)])
    assert [o.tolist() for o in outs] == [[r * 4 + m.rank] * (r + 1) for r in range(m.world)]


def check_object_collectives(m: Member) -> None:
    objs: list[Any] = [None] * m.world
    dist.all_gather_object(objs, {"rank": m.rank, "tag": "x" * m.rank})
    assert objs == [{"rank": r, "tag": "x" * r} for r in range(m.world)]
    box: list[Any] = [m.rank, None]
    dist.broadcast_object_list(box, src=1)
    assert box == [1, None]
    got: list[Any] = [None]
    dist.scatter_object_list(got, [("to", r) for r in range(m.world)] if m.rank == 0 else None, src=0)
    assert got == [("to", m.rank)]
    gathered = [None] * m.world if m.rank == 2 else None
    dist.gather_object(m.rank * 7, gathered, dst=2)
    assert m.rank != 2 or gathered == [r * 7 for r in range(m.world)]


def check_coalescing_manager(m: Member) -> None:
    ts = [value(m.rank, (n,), torch.float64) for n in (3, 1000, 7)]
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    for n, t in zip((3, 1000, 7), ts):
        assert torch.equal(t, sum(value(r, (n,), torch.float64) for r in range(m.world)))
    outs = [torch.zeros(m.world * 4) for _ in range(2)]
    with dist._coalescing_manager(device=torch.device("cpu")):
        for i, out in enumerate(outs):
            dist.all_gather_into_tensor(out, value(m.rank + i, (4,), torch.float32))
    for i, out in enumerate(outs):
        assert torch.equal(out, torch.cat([value(r + i, (4,), torch.float32) for r in range(m.world)]))


def check_subgroups(m: Member) -> None:
    m.pair = pair = dist.new_group([0, 2])
    odd = dist.new_group([1])
    if m.rank in (0, 2):
        t = value(m.rank, (9,), torch.int32)
        dist.all_reduce(t, group=pair)
        assert torch.equal(t, value(0, (9,), torch.int32) + value(2, (9,), torch.int32))
        assert dist.get_world_size(pair) == 2 and dist.get_rank(pair) == (m.rank // 2)
    else:
        t = torch.ones(2)
        dist.broadcast(t, src=1, group=odd)
    t = torch.ones(3)
    dist.all_reduce(t)                                  # the parent is still in step
    assert torch.equal(t, torch.full((3,), float(m.world)))


def check_monitored_barrier(m: Member) -> None:
    pt.monitored_barrier(timeout=timedelta(seconds=30))
    pt.monitored_barrier(timeout=timedelta(seconds=30), wait_all_ranks=True)
    t = torch.ones(2)
    dist.all_reduce(t)
    assert t[0].item() == m.world


def check_functional_collectives_device_mesh_and_dtensor(m: Member) -> None:
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = pt.generation_mesh()
    group = mesh.get_group()
    assert (group.rank(), group.size(), group.generation) == (m.rank, m.world, 1) and group.group_name
    mine = value(m.rank, (4,), torch.float32)
    assert torch.equal(funcol.all_reduce(mine, "sum", group),
                       sum(value(r, (4,), torch.float32) for r in range(m.world)))
    assert torch.equal(funcol.all_gather_tensor(mine, 0, group),
                       torch.cat([value(r, (4,), torch.float32) for r in range(m.world)]))
    full = torch.arange(12.0).reshape(6, 2)
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    assert torch.equal(sharded.full_tensor(), full)
    dist.destroy_process_group(group)


def check_bad_arguments_raise_at_the_call(m: Member) -> None:
    cases: list[tuple[type, str, Callable[[], Any]]] = [
        (TypeError, "bxor is not defined for float32", lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BXOR)),
        (TypeError, "avg is not defined for int64", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int64),
                                                                            op=dist.ReduceOp.AVG)),
        (TypeError, "band is not defined for bfloat16", lambda: dist.reduce_scatter_tensor(
            torch.ones(2, dtype=torch.bfloat16), torch.ones(2 * m.world, dtype=torch.bfloat16), op=dist.ReduceOp.BAND)),
        (ValueError, "PREMUL_SUM|not supported", lambda: dist.all_reduce(
            torch.ones(3), op=dist._make_nccl_premul_sum(2.0))),
        (ValueError, "tensors in the output list",
         lambda: dist.all_gather([torch.ones(2)] * (m.world + 1), torch.ones(2))),
        (ValueError, "output elements",
         lambda: dist.all_gather_into_tensor(torch.ones(2 * m.world + 1), torch.ones(2))),
        (TypeError, "dtypes differ", lambda: dist.reduce_scatter_tensor(
            torch.ones(2), torch.ones(2 * m.world, dtype=torch.float64))),
        (ValueError, "split sizes", lambda: dist.all_to_all_single(torch.ones(m.world), torch.ones(m.world),
                                                                    [1] * m.world, [2] * m.world)),
        (ValueError, "is not a rank", lambda: dist.broadcast(torch.ones(1), src=m.world + 5)),
        (TypeError, "sparse tensor reduces with SUM only", lambda: dist.all_reduce(torch.ones(3).to_sparse(),
                                                                                   op=dist.ReduceOp.MAX)),
        (TypeError, "sparse and quantized tensors are not supported", lambda: dist.broadcast(
            torch.ones(3).to_sparse(), src=0)),
    ]
    for kind, words, call in cases:
        try:
            call()
        except kind as e:
            assert re.search(words, str(e)), (words, str(e))
            continue
        raise AssertionError(f"expected {kind.__name__} ({words})")
    t = torch.full((3,), float(m.rank))
    dist.all_reduce(t)                      # nothing was issued by the bad calls: still in step
    assert torch.equal(t, torch.full((3,), float(sum(range(m.world)))))


# --- generation changes ---------------------------------------------------------------------------

def check_generation_change_mid_collective(m: Member) -> None:
    """Every member but the last enters an all_reduce the last never joins; rank 0's generation is then
    retired: its Work fails with GenerationChanged and leaves the buffer untouched, the others fail
    as rank 0 hangs up, and the same torch group then runs in generation 2. At world 3 and more the
    all_reduce takes shared memory, whose barrier waits for every member's arrival before rank 0 sends
    anything: rank 0 never sends to the last member, whose irecv (which would fail on another frame)
    ends only when rank 0 retires."""
    assert m.world >= 3, "the last member must not be rank 0's ring successor"
    old, last = m.backend, m.world - 1
    t = torch.full((1 << 13,), 3.0)
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
    assert torch.equal(t, torch.full((1 << 13,), 3.0)), "a failed all_reduce changed its buffer"
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


def check_subgroup_fails_with_its_generation_and_follows_the_next(m: Member) -> None:
    """Rank 0 enters a subgroup all_reduce that rank 2 never joins; retiring generation 3 fails it with
    GenerationChanged on rank 0, leaving its buffer untouched; in generation 4 the same subgroup works."""
    assert m.backend.generation == 3
    t = torch.full((100,), 5.0)
    if m.rank == 0:
        work = dist.all_reduce(t, group=m.pair, async_op=True)
        time.sleep(0.2)
        assert not work.is_completed()
    else:
        time.sleep(1.0)                             # rank 0 retires generation 3 first
    m.backend.abort("generation 4 proposed")
    if m.rank == 0:
        _expect_error(GenerationChanged, work.wait)
        assert torch.equal(t, torch.full((100,), 5.0))
    m.enter(4)
    if m.rank in (0, 2):
        dist.all_reduce(t, group=m.pair)
        assert torch.equal(t, torch.full((100,), 10.0)) and pt.default_group().generation == 4


def check_dtensor_on_a_later_generation_mesh_over_the_same_ranks(m: Member) -> None:
    """Generation 4's mesh has the ranks of generation 1's (whose group was destroyed): DTensor must use the
    new one. (DeviceMesh equality ignores the process group; generation_mesh names its dimension apart.)"""
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = pt.generation_mesh()
    assert mesh.mesh_dim_names == ("generation4",) and mesh.get_group().generation == 4
    full = torch.arange(12.0).reshape(6, 2)
    assert torch.equal(distribute_tensor(full, mesh, [Shard(0)]).full_tensor(), full)
    dist.destroy_process_group(mesh.get_group())


def _expect_error(kind: type | tuple[type, ...], call: Callable[[], Any]) -> None:
    try:
        call()
    except kind:
        return
    raise AssertionError(f"expected {kind}")


CHECKS: list[Callable[[Member], None]] = [
    check_rank_size_backend,
    check_all_reduce_every_dtype_and_op_gloo_has,
    check_complex_and_non_contiguous_tensors,
    check_broadcast_every_root,
    check_all_gather_list_and_tensor,
    check_reduce_scatter_list_and_tensor,
    check_in_place_gather_and_scatter,
    check_barrier_and_send_recv,
    check_async_futures_complete_in_issue_order,
    check_reduce_gather_scatter,
    check_all_to_all_single_with_splits_and_list,
    check_object_collectives,
    check_coalescing_manager,
    check_subgroups,
    check_monitored_barrier,
    check_functional_collectives_device_mesh_and_dtensor,
    check_bad_arguments_raise_at_the_call,
    check_generation_change_mid_collective,
    check_ddp_backward_fails_then_retry_in_next_generation,
    check_subgroup_fails_with_its_generation_and_follows_the_next,
    check_dtensor_on_a_later_generation_mesh_over_the_same_ranks,
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

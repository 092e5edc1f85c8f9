"""The per-generation communicator lifecycle of the nccl backend, on the fake NCCL (no GPU):
legal moves only; graphs destroyed before the communicator is aborted, never destroyed through its
destructor; bounded initialisation; the watchdog's verdicts (abort wins over a completed event); rebuilds."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from p2pgen.collectives.backend import ReduceOp
from p2pgen.collectives.nccl import Lifecycle, NcclBackend, State, new_comm_id, verdict
from p2pgen.collectives.nccl_buffers import describe, nccl_dtype, nccl_op, version_text, wire
from p2pgen.errors import GenerationChanged, PeerLost
from p2pgen.testing.fake_nccl import FakeClock, FakeNccl, FakeNcclGroup, wait_until

pytestmark = pytest.mark.timeout(20)


def _thread(fn):
    box: dict = {}

    def body():
        try:
            box["value"] = fn()
        except BaseException as e:   # handed back to the test
            box["error"] = e

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, box


@pytest.fixture
def fake():
    f = FakeNccl()
    yield f
    f.stop()


def _backend(fake, comm_id, rank, world, generation=1, **kw):
    return NcclBackend(comm_id, rank, world, generation, nccl=fake, device=fake.device(), **kw)


# ---- pure parts ---------------------------------------------------------------------------------------
def test_lifecycle_allows_only_the_drawn_moves():
    life = Lifecycle()
    for to in (State.INITIALISING, State.READY, State.ABORTED, State.CLOSED):
        life.move(to)
    assert life.history == [State.CREATED, State.INITIALISING, State.READY, State.ABORTED, State.CLOSED]
    for start, bad in ((State.CREATED, State.READY), (State.READY, State.CLOSED), (State.ABORTED, State.READY)):
        life = Lifecycle()
        life.state = start
        with pytest.raises(RuntimeError, match=f"from {start.value} to {bad.value}"):
            life.move(bad)


@pytest.mark.parametrize("args, expected", [
    ((5.0, 10.0, True, "generation 4 proposed", None), "aborted"),     # abort wins over a completed event
    ((5.0, 10.0, True, None, "remote error"), "done"),
    ((5.0, 10.0, False, None, "remote error"), "failed"),
    ((10.0, 10.0, False, None, None), "timeout"),
    ((9.9, 10.0, False, None, None), "wait"),
])
def test_watchdog_verdicts(args, expected):
    what, reason = verdict(*args)
    assert what == expected and reason


def test_dtype_and_op_mapping_refuse_what_nccl_cannot_do(fake):
    f32, i64 = describe(np.zeros(3, np.float32), "x", host=True), describe(np.zeros(3, np.int64), "y", host=True)
    assert (f32.nbytes, f32.dtype, i64.dtype) == (12, "float32", "int64")
    assert nccl_op(fake, ReduceOp.AVG, f32, 22105) == fake.NCCL_AVG
    assert nccl_op(fake, ReduceOp.MAX, i64, 22105) == fake.NCCL_MAX
    with pytest.raises(TypeError, match="reduce op avg is not defined for int64; avg takes float16"):
        nccl_op(fake, ReduceOp.AVG, i64, 22105)
    with pytest.raises(TypeError, match="reduce op bxor \\(on int64\\) is not supported.*sum, product"):
        nccl_op(fake, ReduceOp.BXOR, i64, 22105)
    with pytest.raises(ValueError, match="NCCL 2.10 or newer.*2.9.6"):
        nccl_op(fake, ReduceOp.AVG, f32, 20906)
    flag = describe(np.zeros(2, np.bool_), "b", host=True)
    assert nccl_op(fake, ReduceOp.SUM, flag, 22105) == fake.NCCL_MAX      # bool travels as uint8: or = max
    assert nccl_dtype(fake, flag) == fake.NCCL_UINT8
    c64 = describe(np.zeros(2, np.complex64), "z", host=True)
    assert wire(fake, c64) == (fake.NCCL_UINT8, 16)                       # moved as bytes
    with pytest.raises(TypeError, match="NCCL cannot reduce complex64"):
        nccl_dtype(fake, c64, "all_reduce")
    with pytest.raises(TypeError, match="dtype object"):
        describe(np.zeros(2, object), "z", host=True)
    with pytest.raises(TypeError, match="CuPy array or a torch CUDA tensor"):
        describe(np.zeros(2, np.float32), "z")
    assert version_text(22105) == "2.21.5" and version_text(2408) == "2.4.8"


# ---- init ---------------------------------------------------------------------------------------------
def test_init_runs_on_the_backend_device_and_a_buffer_elsewhere_is_refused(fake):
    group = FakeNcclGroup(1, fake=fake, device_index=0)
    b = group.backends[0]
    b.connect()
    assert b._dev.used == [0] and b.lifecycle.state is State.READY
    b._dev.index = 1                                  # buffers now described as living on device 1
    with pytest.raises(ValueError, match="device 1, this communicator on device 0"):
        b.all_reduce(np.zeros(2, np.float32))
    group.close()


def test_an_init_that_hangs_because_a_member_never_comes_is_bounded(fake):
    comm_id = new_comm_id(fake)
    clock = FakeClock(step=0.5)                       # every read moves the clock 0.5 s
    b0 = _backend(fake, comm_id, 0, 2, init_timeout=5.0, clock=clock)
    start = time.monotonic()
    with pytest.raises(PeerLost, match="did not finish in 5 s"):
        b0.connect()
    assert time.monotonic() - start < 3.0
    assert b0.lifecycle.state is State.ABORTED and b0.stats["stuck_inits"] == 1
    assert b0.abort("again") == "proved"             # nothing was ever enqueued on this communicator
    with pytest.raises(GenerationChanged):
        b0.all_reduce(np.zeros(1, np.float32))
    # The late member arrives: rank 0's init returns, finds the backend retired and aborts that communicator.
    b1 = _backend(fake, comm_id, 1, 2)
    b1.connect()
    assert wait_until(lambda: ("abort", 0) in fake.calls)
    b1.close()


def test_abort_during_init_wakes_connect_at_once(fake):
    b0 = _backend(fake, new_comm_id(fake), 0, 2, init_timeout=60.0)
    t, box = _thread(b0.connect)
    assert wait_until(lambda: ("init", 0, 2) in fake.calls)
    start = time.monotonic()
    assert b0.abort("p1#1 left generation 1") == "proved"
    t.join(2)
    assert not t.is_alive() and time.monotonic() - start < 1.0
    assert isinstance(box.get("error"), GenerationChanged) and "p1#1 left" in str(box["error"])


def test_a_failed_init_aborts_and_raises_peer_lost(fake):
    fake.fail_init = fake.NcclError("bootstrap: connection refused")
    b = _backend(fake, new_comm_id(fake), 0, 2)
    with pytest.raises(PeerLost, match="init of generation 1 failed.*connection refused"):
        b.connect()
    assert b.lifecycle.history[-1] is State.ABORTED


# ---- abort ordering and watchdog ------------------------------------------------------------------------
def test_abort_destroys_graphs_newest_first_then_aborts_and_never_destroys(fake):
    group = FakeNcclGroup(2, fake=fake)
    group.run(lambda b: b.barrier())
    b = group.backends[0]
    b.add_graph(lambda: fake.record("graph_destroyed", 0, "first"))
    b.add_graph(lambda: fake.record("graph_destroyed", 0, "second"))
    assert [b.abort("generation 2 proposed") for _ in range(3)] == ["proved"] * 3
    tail = [c for c in fake.calls if c[1] == 0][-3:]
    assert tail == [("graph_destroyed", 0, "second"), ("graph_destroyed", 0, "first"), ("abort", 0)]
    b.close()
    b.close()
    assert b.lifecycle.state is State.CLOSED
    assert fake.names(0).count("abort") == 1 and "destroy" not in fake.names()
    with pytest.raises(GenerationChanged, match="generation 2 proposed"):
        b.barrier()
    group.close()


def test_a_graph_that_cannot_be_destroyed_makes_quiescence_unknown(fake):
    group = FakeNcclGroup(1, fake=fake)
    b = group.backends[0]
    b.connect()

    def broken():
        raise RuntimeError("graph still launching")

    b.add_graph(broken)
    assert b.abort("x") == "unknown"
    assert ("abort", 0) in fake.calls                # the communicator is still aborted
    group.close()


@pytest.mark.parametrize("stage", [True, False])
def test_abort_from_another_thread_ends_a_stuck_collective(fake, stage):
    group = FakeNcclGroup(2, fake=fake, stage_outputs=stage)
    group.run(lambda b: b.barrier())
    b = group.backends[0]
    buf = np.full(1000, 7.0, np.float32)
    t, box = _thread(lambda: b.all_reduce(buf))      # rank 1 never joins: the collective hangs
    assert wait_until(lambda: "allReduce" in fake.names(0)[-1:])
    time.sleep(0.05)
    assert t.is_alive()
    assert b.abort("generation 2 proposed") == "proved"
    t.join(2)
    assert isinstance(box.get("error"), GenerationChanged)
    assert np.all(buf == 7.0), "an aborted collective changed the user buffer"
    group.close()


def test_watchdog_deadline_aborts_and_leaves_staged_buffers_unchanged(fake):
    clock = FakeClock(step=1.0)
    group = FakeNcclGroup(2, fake=fake, op_timeout=30.0, clock=clock)
    group.run(lambda b: b.barrier())
    out, inp = np.full(4, -1.0), np.arange(8, dtype=np.float64)
    with pytest.raises(PeerLost, match="did not complete before its deadline.*op_timeout 30 s"):
        group.backends[0].reduce_scatter(out, inp)
    assert np.all(out == -1.0) and np.all(inp == np.arange(8))
    assert ("abort", 0) in fake.calls and group.backends[0].lifecycle.state is State.ABORTED
    group.close()


def test_an_async_error_stops_the_wait_and_aborts(fake):
    group = FakeNcclGroup(2, fake=fake)
    group.run(lambda b: b.barrier())
    fake.inject_async_error(0, "peer 1 closed the connection")
    with pytest.raises(PeerLost, match="asynchronous error.*peer 1 closed"):
        group.backends[0].broadcast(np.zeros(3, np.float32), root=1)
    assert ("abort", 0) in fake.calls
    group.close()


# ---- one communicator per generation ------------------------------------------------------------------
def test_each_generation_gets_its_own_communicator_and_the_old_one_is_aborted_first(fake):
    g1 = FakeNcclGroup(2, generation=1, fake=fake)
    g1.run(lambda b: b.all_reduce(np.ones(4, np.float32)))
    for b in g1.backends:
        assert b.abort("generation 2 activated") == "proved"
    g2 = FakeNcclGroup(2, generation=2, fake=fake)
    sums = g2.run(lambda b: b.all_reduce(np.full(4, b.rank + 1.0, np.float32)).tolist())
    assert sums == [[3.0] * 4] * 2
    for r in (0, 1):
        names = fake.names(r)
        assert names.index("abort") < names.index("init", names.index("abort"))
    assert len({id(b._uid) for b in g1.backends + g2.backends}) >= 2
    assert g1.backends[0]._uid != g2.backends[0]._uid
    with pytest.raises(GenerationChanged):
        g1.backends[1].all_reduce(np.ones(4, np.float32))
    g2.close()
    g1.close()

"""The compressed all_reduce (int8 per-block scales, bf16) over live tcp backends, world 1-5: the same bits on
every member, within its error bound of the exact reduction, error feedback bounding the cumulative error,
buffers and residuals untouched by a raise, bad input refused before anything is sent, and the bytes on the
wire (the backend's counters) at about 1/4 (int8) and 1/2 (bf16) of float32's."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from p2pgen.collectives import shm
from p2pgen.collectives.compress import COMPRESSIONS, check_compression, compressed_all_reduce
from p2pgen.errors import GenerationChanged, PeerLost
from p2pgen.testing.cluster import LocalCluster
from p2pgen.transport import hooks
from tests.collectives.conftest import SMALL_FRAMES

pytestmark = pytest.mark.timeout(60)

SIZES = (0, 1, 7, 255, 257, 1000, 3001)       # none a multiple of both the block and the world


def _inputs(world: int, size: int, dtype, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(size) * (1 + r)).astype(dtype) for r in range(world)]


def _reduce_all(group, xs, mode, op="sum", residuals=None, block=256):
    """Run one compressed_all_reduce on every member; returns (results, new residuals)."""
    def member(b):
        buf = xs[b.rank].copy()
        res = None if residuals is None else residuals[b.rank]
        before = None if res is None else res.copy()
        left = compressed_all_reduce(b, buf, mode=mode, op=op, residual=res, block=block)
        if res is not None:
            assert np.array_equal(res, before), "the given residual was written"
        return buf, left

    out = group.run(member)
    return [o[0] for o in out], [o[1] for o in out]


def _same_bits(arrays: list[np.ndarray]) -> bool:
    return all(a.tobytes() == arrays[0].tobytes() for a in arrays)


def _block_max(a: np.ndarray, block: int) -> np.ndarray:
    """Per element: the largest |value| of its block."""
    padded = np.zeros(-(-a.size // block) * block)
    padded[:a.size] = np.abs(a)
    return np.repeat(padded.reshape(-1, block).max(axis=1), block)[:a.size]


def _int8_bound(xs: list[np.ndarray], exact: np.ndarray, divisor: int, block: int = 256) -> np.ndarray:
    """Per element: the members' scales / 2 summed (each scale max|block| / 127), over `divisor` (AVG), plus
    half the owner's requantization scale, whose block max is at most the exact one's plus that first term;
    plus the float rounding of the sums."""
    members = sum(_block_max(x.astype(np.float64), block) for x in xs) / 127 / 2 / divisor
    requant = (_block_max(exact, block) + _block_max(members, block)) / 127 / 2
    rounding = sum(np.abs(x.astype(np.float64)) for x in xs) * len(xs) * 2.0 ** -22
    return (members + requant) * (1 + 1e-5) + rounding


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("mode", COMPRESSIONS)
def test_every_member_gets_the_same_bits_within_the_bound(members, world, mode):
    group = members(world)
    for dtype in (np.float32, np.float64):
        for op in ("sum", "avg"):
            for seed, size in enumerate(SIZES):
                xs = _inputs(world, size, dtype, seed)
                results, _ = _reduce_all(group, xs, mode, op)
                assert _same_bits(results), (world, mode, dtype, op, size)
                assert all(r.dtype == dtype and r.shape == (size,) for r in results)
                exact = sum(x.astype(np.float64) for x in xs) / (world if op == "avg" else 1)
                err = np.abs(results[0] - exact)
                if mode == "int8":
                    bound = _int8_bound(xs, exact, world if op == "avg" else 1)
                else:                     # two roundings of 2^-9 relative (member, owner), plus float32 sums
                    bound = (sum(np.abs(x.astype(np.float64)) for x in xs) + np.abs(exact)) * 2.0 ** -8
                assert np.all(err <= bound), (world, mode, dtype, op, size, float((err - bound).max()))


@pytest.mark.parametrize("mode", COMPRESSIONS)
def test_zeros_stay_exact_zeros_and_small_blocks_work(members, mode):
    group = members(3)
    xs = [np.zeros(1001, np.float32) for _ in range(3)]
    xs[1][500] = 3.0                           # one block non-zero, the rest exactly zero
    for block in (1, 5, 256, 4096):
        results, left = _reduce_all(group, xs, mode, residuals=[np.zeros(1001, np.float32)] * 3, block=block)
        assert _same_bits(results)
        assert results[0][500] == 3.0 and np.count_nonzero(results[0]) == 1
        assert all(np.count_nonzero(r) == 0 for r in left)


def test_int8_codes_one_block_symmetrically(members):
    """One member, one block: q = round(x * 127 / max|x|), decoded q * scale; the max is exact."""
    x = np.array([1.0, -0.5, 0.25, 0.0, -1.0 / 127], np.float32)
    results, left = _reduce_all(members(1), [x], "int8", residuals=[np.zeros(5, np.float32)])
    scale = np.float32(1.0) / np.float32(127)
    assert results[0][0] == 1.0 and results[0][3] == 0.0 and results[0][4] == -scale
    assert np.all(np.abs(results[0] - x) <= scale / 2 * (1 + 1e-6))
    assert np.allclose(left[0], x - results[0], atol=1e-7)


def test_bf16_rounds_to_nearest_even():
    from p2pgen.collectives.compress import _CODECS

    bits = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF, 0xFF800000, 0x7FC00001], np.uint32)
    coded = _CODECS["bf16"].encode(bits.view(np.float32).reshape(1, -1))
    # a tie rounds to even (down, then up), above a tie up, the largest float32 to inf, -inf and NaN stay
    assert coded.values.reshape(-1).tolist() == [0x3F80, 0x3F82, 0x3F81, 0x7F80, 0xFF80, 0x7FC0]


@pytest.mark.parametrize("mode", COMPRESSIONS)
def test_non_finite_values_reach_every_member_alike(members, mode):
    group = members(2)
    xs = _inputs(2, 600, np.float32, 4)
    xs[0][10], xs[1][300] = np.nan, np.inf
    results, left = _reduce_all(group, xs, mode, residuals=[np.zeros(600, np.float32)] * 2)
    assert _same_bits(results)
    assert np.isnan(results[0][10]) and not np.isfinite(results[0][300])
    assert np.all(np.isfinite(results[0][512:]))
    assert all(np.all(np.isfinite(r)) for r in left), "a non-finite value was carried in the residual"


@pytest.mark.parametrize("mode", COMPRESSIONS)
def test_error_feedback_keeps_the_cumulative_error_bounded(members, mode):
    """The same inputs reduced T times, each member feeding back its residual: the results' running sum
    misses exactly what the final residuals hold, so their mean converges to the exact mean; without
    feedback the error of every call is the same and does not average out."""
    world, size, steps = 3, 700, 60
    group = members(world)
    xs = _inputs(world, size, np.float64, 11)
    exact = sum(xs) / world
    residuals = [np.zeros(size) for _ in range(world)]
    total = np.zeros(size)
    for _ in range(steps):
        results, residuals = _reduce_all(group, xs, mode, "avg", residuals)
        total += results[0]
    missing = sum(residuals) / world
    assert np.allclose(total + missing, steps * exact, rtol=0, atol=1e-9 * steps)
    with_feedback = np.abs(total / steps - exact).max()
    once, _ = _reduce_all(group, xs, mode, "avg")
    without = np.abs(once[0] - exact).max()
    assert with_feedback < without / 10, (with_feedback, without)


def test_a_raise_mid_collective_leaves_buffers_and_residuals_as_they_were():
    """A member fails on the first frame of the all_gather (after the all_to_all delivered): its ring
    neighbour raises too (a member may still complete: the contract allows it); every member that raised
    has its buffer as it was passed, and no residual is written."""
    world = 3
    xs = _inputs(world, 5000, np.float32, 5)
    residuals = [np.full(5000, 0.01, np.float32) for _ in range(world)]
    fired = []

    def fail_once(event):
        if event.direction == "received" and event.op_seq == 1 and not fired:
            fired.append(event)
            raise PeerLost("injected: a member lost in the all_gather")

    def member(b):
        buf = xs[b.rank].copy()
        try:
            compressed_all_reduce(b, buf, mode="int8", residual=residuals[b.rank])
        except (PeerLost, GenerationChanged) as e:
            return e, buf
        return None, buf

    remove = hooks.add_frame_hook(fail_once)
    try:
        with LocalCluster(world, config=SMALL_FRAMES) as cluster:
            out = cluster.run(member, cluster.backends(generation=1), timeout=30.0)
    finally:
        remove()
    assert fired
    assert sum(err is not None for err, _ in out) >= 2, [type(err).__name__ for err, _ in out]
    for r, (err, buf) in enumerate(out):
        if err is not None:
            assert np.array_equal(buf, xs[r]), f"rank {r} raised {err!r} with its buffer changed"
        assert np.all(residuals[r] == np.float32(0.01))


def test_torch_tensors_in_and_out(members):
    torch = pytest.importorskip("torch")
    group = members(2)
    xs = _inputs(2, 1000, np.float32, 6)

    def member(b):
        t = torch.from_numpy(xs[b.rank].copy()).reshape(10, 100)
        left = compressed_all_reduce(b, t, mode="int8", op="avg", residual=torch.zeros(10, 100))
        return t.numpy().reshape(-1), left

    out = group.run(member)
    assert _same_bits([o[0] for o in out])
    assert all(isinstance(left, torch.Tensor) and left.shape == (10, 100) for _, left in out)
    assert np.allclose(out[0][0], (xs[0] + xs[1]) / 2, atol=0.05)


def test_bad_input_is_refused_before_anything_is_sent():
    nothing = SimpleNamespace(world=2, rank=0)           # no collectives: any send would fail differently
    buf = np.ones(10, np.float32)
    with pytest.raises(ValueError, match=r"compress='zstd'.*'bf16', 'int8'"):
        check_compression("zstd")
    assert check_compression(None) is None and check_compression("int8") == "int8"
    with pytest.raises(ValueError, match=r"compress='fp8'"):
        compressed_all_reduce(nothing, buf, mode="fp8")
    with pytest.raises(ValueError, match="needs mode="):
        compressed_all_reduce(nothing, buf, mode=None)
    with pytest.raises(ValueError, match="sum or avg, not max"):
        compressed_all_reduce(nothing, buf, mode="int8", op="max")
    with pytest.raises(TypeError, match="float32 or float64 buffers, got int32"):
        compressed_all_reduce(nothing, np.ones(10, np.int32), mode="int8")
    with pytest.raises(ValueError, match="block=0"):
        compressed_all_reduce(nothing, buf, mode="int8", block=0)
    with pytest.raises(ValueError, match="residual has 9 elements of float32, the buffer 10"):
        compressed_all_reduce(nothing, buf, mode="int8", residual=np.zeros(9, np.float32))
    with pytest.raises(ValueError, match="residual has 10 elements of float64"):
        compressed_all_reduce(nothing, buf, mode="bf16", residual=np.zeros(10))


@pytest.mark.parametrize("mode, ratio", [("int8", (1 + 4 / 256) / 4), ("bf16", 0.5)])
def test_wire_bytes_against_float32(monkeypatch, mode, ratio):
    """The backend's counters: a compressed all_reduce of 1 MiB of float32 at world 4 sends about 1/4 (int8,
    plus a float32 scale per 256 elements) or 1/2 (bf16) of what the full-precision ring sends."""
    monkeypatch.setenv(shm.ENV, "0")                      # the uncompressed baseline on the ring, not in memory
    world, size = 4, 1 << 18
    xs = _inputs(world, size, np.float32, 7)
    with LocalCluster(world, config=SMALL_FRAMES) as cluster:
        backends = cluster.backends(generation=1)
        cluster.run(lambda b: b.barrier(), backends)

        def moved(call):
            def member(b):
                before = b.counters()
                call(b, xs[b.rank].copy())
                return {k: v - before[k] for k, v in b.counters().items()}
            return cluster.run(member, backends)

        plain = moved(lambda b, buf: b.all_reduce(buf))
        packed = moved(lambda b, buf: compressed_all_reduce(b, buf, mode=mode))
        totals = [t.wire_counters() for t in cluster.transports]     # every generation of the process
    for full, small, total in zip(plain, packed, totals):
        assert total["bytes_sent"] >= full["bytes_sent"] + small["bytes_sent"]
        assert full["bytes_sent"] == 2 * (world - 1) * size          # 2 (world-1)/world of 4 * size bytes
        assert small["bytes_sent"] / full["bytes_sent"] == pytest.approx(ratio, rel=1e-3)
    assert sum(m["bytes_sent"] for m in packed) == sum(m["bytes_received"] for m in packed)
    assert sum(m["frames_sent"] for m in packed) == sum(m["frames_received"] for m in packed)

"""Property test: an input that aliases its output, at any element offset, in every rank's own way, gives the
numpy reference on the tcp backend and on the nccl backend (fake NCCL, outputs not staged).

The window of n elements sits inside the world*n-element buffer at an arbitrary offset per rank: its own slot
(FSDP2's in-place all-gather), another rank's slot, or straddling two slots. A backend that writes an output
before it read an aliased input fails here.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2pgen.testing.fake_nccl import FakeNcclGroup

DTYPES = ("float32", "float64", "int32", "int64", "bfloat16")


@st.composite
def aliasings(draw):
    world = draw(st.integers(1, 4))
    n = draw(st.one_of(st.integers(0, 40), st.integers(900, 3000)))   # the large ones span 4 KiB frames
    offsets = [draw(st.integers(0, (world - 1) * n)) for _ in range(world)]
    return dict(world=world, n=n, offsets=offsets, collective=draw(st.sampled_from(["all_gather", "reduce_scatter"])),
                dtype=draw(st.sampled_from(DTYPES)), torch=draw(st.booleans()),
                seed=draw(st.integers(0, 2**32 - 1)))


def _values(spec: dict, rank: int, size: int) -> np.ndarray:
    return np.random.default_rng([spec["seed"], rank]).integers(-50, 51, size=size).astype(np.float64)


def _make(x: np.ndarray, spec: dict):
    if spec["torch"] or spec["dtype"] == "bfloat16":
        import torch

        return torch.from_numpy(x.copy()).to(getattr(torch, spec["dtype"]))
    return x.astype(spec["dtype"])


def _numpy(buf) -> np.ndarray:
    return buf.double().numpy() if not isinstance(buf, np.ndarray) else buf.astype(np.float64)


def run_aliased(backend, spec: dict) -> np.ndarray:
    """Run the aliased collective on this member; returns its output as float64."""
    world, n, rank = spec["world"], spec["n"], backend.rank
    off = spec["offsets"][rank]
    if spec["collective"] == "all_gather":
        out = _make(np.zeros(world * n), spec)
        window = out[off:off + n]
        window[...] = _make(_values(spec, rank, n), spec)
        backend.all_gather(out, window)
        return _numpy(out)
    inp = _make(_values(spec, rank, world * n), spec)
    backend.reduce_scatter(inp[off:off + n], inp)
    return _numpy(inp[off:off + n])


def expected(spec: dict, rank: int) -> np.ndarray:
    world, n = spec["world"], spec["n"]
    if spec["collective"] == "all_gather":
        return np.concatenate([_values(spec, r, n) for r in range(world)])
    total = sum(_values(spec, r, world * n) for r in range(world))
    return total[rank * n:(rank + 1) * n]


def _check(results: list[np.ndarray], spec: dict) -> None:
    for rank, got in enumerate(results):
        want = expected(spec, rank)
        assert np.array_equal(got, want), (f"rank {rank} of {spec}: got {got[:6]}..., want {want[:6]}...")


@pytest.mark.timeout(120)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(aliasings())
def test_tcp_backend_with_aliased_buffers(members, spec):
    _check(members(spec["world"]).run(lambda b: run_aliased(b, spec)), spec)


@pytest.mark.timeout(120)
@settings(max_examples=40, deadline=None)
@given(aliasings())
def test_nccl_backend_with_aliased_buffers_unstaged(spec):
    group = FakeNcclGroup(spec["world"], stage_outputs=False)
    try:
        _check(group.run(lambda b: run_aliased(b, spec)), spec)
    finally:
        group.close()


@pytest.mark.timeout(30)
def test_fake_nccl_poisons_undefined_aliasing(monkeypatch):
    """The fake is strict where NCCL is undefined: an overlap outside the in-place layout, passed straight to
    NCCL (the backend's staging switched off), gives garbage, so the property above can fail."""
    import p2pgen.collectives.nccl as nccl

    monkeypatch.setattr(nccl, "_undefined_alias", lambda *args: False)
    group = FakeNcclGroup(2, stage_outputs=False)
    spec = dict(world=2, n=8, offsets=[8, 0], collective="all_gather", dtype="float32", torch=False, seed=1)
    try:
        results = group.run(lambda b: run_aliased(b, spec))
    finally:
        group.close()
    with pytest.raises(AssertionError, match="rank 0"):
        _check(results, spec)

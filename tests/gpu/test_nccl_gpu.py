"""The nccl backend on a real GPU: world-1 conformance on CuPy arrays (and torch CUDA tensors where torch
sees the GPU), per-generation rebuild and abort, host staging of CUDA buffers over tcp, and several ranks on
the one GPU where NCCL >= 2.30. Skipped with a reason without a GPU (see conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest

from p2pgen.testing import conformance

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]


class OnDevice:
    """Runs a conformance case's host buffers through the nccl backend as device buffers."""

    def __init__(self, backend, torch_cuda: bool) -> None:
        self.b, self.torch_cuda = backend, torch_cuda
        self.rank, self.world, self.generation = backend.rank, backend.world, backend.generation

    def _dev(self, x):
        if isinstance(x, np.ndarray):
            import cupy

            return cupy.asarray(x)
        return x.to("cuda") if self.torch_cuda else None

    def _back(self, host, dev):
        if isinstance(host, np.ndarray):
            host[...] = dev.get()
        else:
            host.copy_(dev.cpu())
        return host

    def all_reduce(self, buf, op="sum"):
        return self._back(buf, self.b.all_reduce(self._dev(buf), op))

    def broadcast(self, buf, root):
        return self._back(buf, self.b.broadcast(self._dev(buf), root))

    def all_gather(self, output, input):
        return self._back(output, self.b.all_gather(self._dev(output), self._dev(input)))

    def reduce_scatter(self, output, input, op="sum"):
        return self._back(output, self.b.reduce_scatter(self._dev(output), self._dev(input), op))

    def barrier(self):
        self.b.barrier()


def _torch_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.parametrize("stage", [True, False])
def test_world1_conformance_on_the_gpu(stage):
    from cupy.cuda import nccl

    from p2pgen.collectives.nccl import NcclBackend, new_comm_id

    b = NcclBackend(new_comm_id(nccl), 0, 1, 1, stage_outputs=stage)
    b.connect()
    dev = OnDevice(b, _torch_cuda())
    for case in conformance.standard_cases(1):
        if case.collective == "send_recv" or (case.torch and not dev.torch_cuda):
            continue
        conformance.run_case(dev, case)
    assert b.abort("done") == "proved"


def test_rebuild_and_abort_per_generation():
    from p2pgen_lab.bench import gpu_check

    result = gpu_check.lifecycle(5)
    assert result["ok"], result
    assert result["abort_s"] < 5.0


def test_cuda_tensors_staged_through_host_over_tcp():
    import cupy

    from p2pgen.collectives.staged import HostStagedBackend
    from p2pgen.testing.cluster import LocalCluster

    with LocalCluster(2) as cluster:
        backends = [HostStagedBackend(b) for b in cluster.backends(1)]
        out = cluster.run(lambda b: b.all_reduce(cupy.full(1000, b.rank + 1.0, cupy.float32)).get().tolist(), backends)
        assert out == [[3.0] * 1000] * 2
        if _torch_cuda():
            import torch

            got = cluster.run(lambda b: b.all_reduce(torch.full((9,), b.rank + 1.0, device="cuda")).cpu().tolist(),
                              backends)
            assert got == [[3.0] * 9] * 2


def test_several_ranks_on_one_gpu_and_the_stall_watchdog():
    from cupy.cuda import nccl

    from p2pgen_lab.bench import gpu_check

    if nccl.get_version() < gpu_check.MULTI_RANK_MIN:
        pytest.skip(f"NCCL {nccl.get_version()} < 2.30: no NCCL_MULTI_RANK_GPU_ENABLE")
    got = gpu_check.multi_rank(2, [1 << 20], stall_timeout=2.0)
    assert not got["error"], got["error"]
    assert len(got["compare"]) == 2 and all(x["ok"] for x in got["compare"] + got["stall"]), got
    rank0 = next(s for s in got["stall"] if s["rank"] == 0)
    assert 2.0 <= rank0["detect_s"] < 10.0

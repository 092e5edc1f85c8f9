"""CudaStager on a real GPU: the snapshot holds the committed bytes although the next step's kernel writes
the tensor right after the commit returned. Skipped with a reason without a GPU (see conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(120)


def test_a_device_snapshot_holds_the_commit_not_the_next_steps_write(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from p2pgen.state import LocalCopy, SharedState
    from p2pgen.state.staging import CudaStager
    w = torch.full((64 << 20,), 3.0, device="cuda")
    state = SharedState({"w": w}, revision=1)
    copy = LocalCopy(str(tmp_path), "job", "p0")
    snap = copy.snapshot(state, instance="i", incarnation=1, generation=1, epoch=1, stager=CudaStager())
    w.add_(1.0)                                        # the next step, queued behind the fence
    info = copy.finish(snap)
    target = SharedState({"w": torch.zeros(64 << 20, device="cuda")})
    LocalCopy(str(tmp_path), "job", "p0").load_into(target, instance="i")
    assert info.revision == 1 and np.all(target.tensors["w"].cpu().numpy() == 3.0)

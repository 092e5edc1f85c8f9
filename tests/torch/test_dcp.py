"""torch.distributed.checkpoint of an FSDP2 state dict over p2pgen, on a fixed p2pgen group:
two members train and save their sharded model and optimizer state with DCP; three members load it into a
model built from another seed (DCP re-shards 2 -> 3) and end with exactly the saved full parameters and
momentum buffers. (examples/fsdp_spot.py's `--save-at`/`--resume`, a job restored from such a checkpoint
under agents, is tested in test_fsdp_elastic.py.)"""

from __future__ import annotations

import multiprocessing as mp

import pytest

from tests.torch import dcp_checks

pytestmark = pytest.mark.timeout(300)
RESULT_TIMEOUT_S = 200.0


def run_members(world: int, init_file: str, checkpoint: str, phase: str) -> list:
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    try:
        for rank in range(world):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=dcp_checks.member_main, args=(child, rank, world, init_file, checkpoint, phase),
                               daemon=True)
            proc.start()
            pipes.append(parent)
            procs.append(proc)
        results = []
        for rank, pipe in enumerate(pipes):
            assert pipe.poll(RESULT_TIMEOUT_S), f"{phase}: rank {rank} did not report within {RESULT_TIMEOUT_S} s"
            status, value = pipe.recv()
            assert status == "ok", f"{phase}: rank {rank} failed:\n{value}"
            results.append(value)
        return results
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(10)


def test_dcp_saves_an_fsdp2_state_dict_on_two_members_and_loads_it_resharded_on_three(tmp_path):
    checkpoint = str(tmp_path / "checkpoint")
    saved = run_members(2, str(tmp_path / "init-save"), checkpoint, "save")
    assert saved[0] == saved[1], "the members of the saving job disagree"
    loaded = run_members(3, str(tmp_path / "init-load"), checkpoint, "load")
    for rank, state in enumerate(loaded):
        assert sorted(state) == sorted(saved[0])
        wrong = [name for name in state if state[name] != saved[0][name]]
        assert not wrong, f"rank {rank} of the loading job differs from the checkpoint in {wrong}"
    fresh = dcp_checks.example().build_model(7)
    assert any(p.reshape(-1).tolist() != saved[0][f"param.{n}"] for n, p in fresh.named_parameters()), \
        "the loading job's own initial parameters already equal the checkpoint: the test could not fail"

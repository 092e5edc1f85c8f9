"""torch.distributed.checkpoint over p2pgen, run by member processes of a fixed p2pgen group (spawned by
test_dcp.py): `save` trains examples/fsdp_spot.py's transformer sharded with FSDP2 for two steps and saves
its sharded model and optimizer state dict with DCP; `load` builds the same model from another seed, sharded
on a different number of members, and loads the checkpoint into it (DCP re-shards). Each member reports the
full parameters and momentum buffers it ends with."""

from __future__ import annotations

import importlib.util
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import distribute_tensor

import p2pgen.torch  # noqa: F401  (registers the backend)

EXAMPLE = Path(__file__).parents[2] / "examples" / "fsdp_spot.py"
LR, MOMENTUM = 0.1, 0.9


def example() -> Any:
    spec = importlib.util.spec_from_file_location("fsdp_spot", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sharded(ex: Any, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    model = ex.build_model(seed)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
    optimizer = ex.new_sgd(model.parameters(), LR, MOMENTUM)
    for p in model.parameters():
        optimizer.state[p]["momentum_buffer"] = distribute_tensor(torch.zeros(p.shape, dtype=p.dtype), mesh,
                                                                  p.placements, src_data_rank=None)
    return model, optimizer


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, list[float]]:
    out = {}
    for name, p in model.named_parameters():
        out[f"param.{name}"] = p.full_tensor().reshape(-1).tolist()
        out[f"momentum.{name}"] = optimizer.state[p]["momentum_buffer"].full_tensor().reshape(-1).tolist()
    return out


def save(ex: Any, rank: int, world: int, checkpoint: str) -> dict[str, list[float]]:
    model, optimizer = sharded(ex, seed=0)
    for revision in range(2):
        optimizer.zero_grad()
        ex.loss_of(model, *ex.batch(0, revision, rank, world)).backward()
        optimizer.step()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=checkpoint)
    return full_state(model, optimizer)


def load(ex: Any, rank: int, world: int, checkpoint: str) -> dict[str, list[float]]:
    model, optimizer = sharded(ex, seed=7)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=checkpoint)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return full_state(model, optimizer)


def member_main(pipe: Any, rank: int, world: int, init_file: str, checkpoint: str, phase: str) -> None:
    torch.set_num_threads(1)
    try:
        dist.init_process_group("p2pgen", init_method=f"file://{init_file}", rank=rank, world_size=world)
        result = (save if phase == "save" else load)(example(), rank, world, checkpoint)
        dist.destroy_process_group()
        pipe.send(("ok", result))
    except BaseException:          # reported to the test, which fails on it
        pipe.send(("error", traceback.format_exc()))

"""torch-native setup: under `p2pgen join`, `dist.init_process_group("p2pgen")` with no
other argument joins the job, `dist.get_rank()`/`get_world_size()` follow the generation, and an ordinary DDP
script (examples/ddp_elastic.py) needs only its loop wrapped in `peer.steps()`; outside an agent the same
call fails saying how to start the script. `shared_tensors` is what a joiner pulls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import p2pgen.torch as pt
from p2pgen_lab.rigs.agents import free_local_base

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "ddp_elastic.py"
NO_AGENT = ("P2PGEN_AGENT", "P2PGEN_PEER_ID", "P2PGEN_INCARNATION", "P2PGEN_JOB", "MASTER_ADDR", "MASTER_PORT",
            "RANK", "WORLD_SIZE")


@pytest.mark.timeout(240)
def test_the_ddp_example_trains_under_p2pgen_join_local_with_equal_digests(tmp_path):
    steps = 12
    base = free_local_base(2)
    cmd = [sys.executable, "-m", "p2pgen", "join", "--local", "2", "--base-port", str(base), "--job",
           f"native-{base}", "--steps", str(steps), "--", sys.executable, str(EXAMPLE), "--step-delay=0.01"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path, timeout=220)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "final state: identical on every member" in done.stdout, output
    summaries = [json.loads(line[line.index("summary {") + len("summary "):]) for line in done.stdout.splitlines()
                 if "summary {" in line]
    assert sorted(s["peer"] for s in summaries) == ["peer0", "peer1"], output
    assert all(s["revision"] == steps for s in summaries), summaries
    assert all(s["worlds"] == [2] for s in summaries), "dist.get_world_size() did not follow the generation"
    assert len({s["digest"] for s in summaries}) == 1, summaries


@pytest.mark.timeout(120)
def test_init_process_group_outside_an_agent_says_how_to_start_the_script(tmp_path):
    script = ("import torch.distributed as dist, p2pgen.torch\n"
              "try:\n    dist.init_process_group('p2pgen')\n"
              "except ValueError as e:\n    print('ERROR', e)\n")
    env = {k: v for k, v in os.environ.items() if k not in NO_AGENT}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=ROOT,
                          timeout=100)
    assert done.returncode == 0, done.stderr
    message = done.stdout
    assert message.startswith("ERROR"), (done.stdout, done.stderr)
    assert "not started by a p2pgen agent" in message, message
    assert "p2pgen join --local 2 -- python SCRIPT" in message, message
    assert "init_method=, rank= and world_size=" in message, message


def test_peer_without_a_p2pgen_default_group_says_what_to_call():
    with pytest.raises(RuntimeError, match=r'dist.init_process_group\("p2pgen"\)'):
        pt.peer()


def _model_and_sgd(**kwargs) -> tuple[torch.nn.Module, torch.optim.SGD]:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, **kwargs)


def test_shared_tensors_hold_parameters_buffers_and_sgd_momentum_by_reference():
    model, sgd = _model_and_sgd(momentum=0.9)
    held = pt.shared_tensors(model, sgd)
    assert sorted(held) == sorted(
        [f"model.{n}" for n, _ in model.named_parameters()] + [f"model.{n}" for n, _ in model.named_buffers()]
        + [f"optimizer.{n}.momentum_buffer" for n, _ in model.named_parameters()])
    model(torch.randn(5, 3)).sum().backward()
    sgd.step()
    for name, p in model.named_parameters():
        assert torch.equal(held[f"model.{name}"], p.detach())
        assert held[f"optimizer.{name}.momentum_buffer"] is sgd.state[p]["momentum_buffer"]
    assert torch.equal(held["model.1.running_mean"], model[1].running_mean)


def test_zero_momentum_buffers_give_sgd_the_same_first_steps_as_a_fresh_one():
    torch.manual_seed(0)
    x = torch.randn(5, 3)
    fresh, fresh_sgd = _model_and_sgd(momentum=0.9)
    shared, shared_sgd = _model_and_sgd(momentum=0.9)
    shared.load_state_dict(fresh.state_dict())
    pt.shared_tensors(shared, shared_sgd)
    for model, sgd in ((fresh, fresh_sgd), (shared, shared_sgd)):
        for _ in range(2):
            sgd.zero_grad()
            model(x).pow(2).sum().backward()
            sgd.step()
    for a, b in zip(fresh.parameters(), shared.parameters()):
        assert torch.equal(a, b)


def test_an_optimizer_without_state_yet_is_refused_with_what_to_do():
    model = torch.nn.Linear(3, 4)
    with pytest.raises(ValueError, match="Adam holds no state for weight yet.*first optimizer step"):
        pt.shared_tensors(model, torch.optim.Adam(model.parameters()))
    with pytest.raises(ValueError, match="SGD holds no state"):
        pt.shared_tensors(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.5))
    other = torch.nn.Linear(3, 4)
    with pytest.raises(ValueError, match="not the model's"):
        pt.shared_tensors(model, torch.optim.SGD(other.parameters(), lr=0.1))


@pytest.mark.timeout(120)
def test_a_following_group_with_no_generation_refuses_collectives_saying_where_they_run():
    script = ("import torch, p2pgen.torch as pt\n"
              "pt.init_process_group(lambda: None)\n"      # a following group with no generation (not a Peer)
              "try:\n    torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))\n"
              "except RuntimeError as e:\n    print('ERROR', e)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=100)
    assert done.returncode == 0, done.stderr
    assert "this group has none now" in done.stdout and "peer.steps()" in done.stdout, (done.stdout, done.stderr)


ADOPTED_DDP = """
import json, torch, torch.distributed as dist
import p2pgen.torch as pt
from p2pgen.torch.group import ALONE
pt.init_process_group(lambda: ALONE)                 # what a Peer's group is before the process's first step
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(),
                                                                      torch.nn.Linear(4, 2)))
twin = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
twin.load_state_dict(model.module.state_dict())
before = (model.find_unused_parameters, len(model._comm_hooks))
pt.adopt(model)
pt.adopt(model)                                      # twice: no second hook
x = torch.randn(6, 3)
for _ in range(3):                                   # past the first backward, when torch would rebuild buckets
    model.zero_grad(); twin.zero_grad()
    model(x).pow(2).mean().backward(); twin(x).pow(2).mean().backward()
same = all(torch.equal(a.grad, b.grad) for a, b in zip(model.module.parameters(), twin.parameters()))
gathered = [torch.zeros(2), ]
dist.all_gather(gathered, torch.tensor([1.5, 2.5]))
t = torch.tensor([3.0]); dist.all_reduce(t, op=dist.ReduceOp.AVG); dist.broadcast(t, 0); dist.barrier()
print(json.dumps({"before": before, "after": [model.find_unused_parameters, len(model._comm_hooks)],
                  "rank": dist.get_rank(), "world": dist.get_world_size(), "same_grads": same,
                  "rebuilt": model._has_rebuilt_buckets,
                  "gathered": gathered[0].tolist(), "reduced": t.tolist()}))
"""


@pytest.mark.timeout(120)
def test_torchs_own_ddp_builds_alone_and_is_adopted_never_rebuilding_its_buckets():
    done = subprocess.run([sys.executable, "-c", ADOPTED_DDP], capture_output=True, text=True, cwd=ROOT,
                          timeout=100)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["before"] == [False, 0] and got["after"] == [True, 1], got
    assert (got["rank"], got["world"]) == (0, 1) and got["same_grads"], got
    assert got["gathered"] == [1.5, 2.5] and got["reduced"] == [3.0], got
    assert got["rebuilt"] is False, "torch rebuilt the buckets: a joiner would issue other collectives"


@pytest.mark.timeout(120)
def test_adopting_a_ddp_that_cannot_follow_generations_is_refused_with_what_to_do():
    script = ("import torch, torch.distributed as dist, p2pgen.torch as pt\n"
              "from p2pgen.torch.group import ALONE\n"
              "pt.init_process_group(lambda: ALONE)\n"
              "m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2), static_graph=True)\n"
              "try:\n    pt.adopt(m)\nexcept ValueError as e:\n    print('ERROR', e)\n"
              "import os, sys\nsys.stdout.flush()\nos._exit(0)\n")   # torch's C++ teardown aborts now and then
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=100)
    assert done.returncode == 0, done.stderr
    assert "static_graph=True is not supported" in done.stdout and "drop static_graph" in done.stdout, done.stdout

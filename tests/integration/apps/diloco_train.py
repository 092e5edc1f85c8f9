"""An exact DiLoCo training for tests: a float64 linear model whose every value stays on a 2**-20 grid.

Model: W (4 x 8, float64). An inner step's batch: BATCH samples with integer features x and integer targets
y = W* x, cut by rank and world (`InnerBatch.shard`); loss 0.5 * |W x - y|^2 / shard size. Both optimizers
are `GridSGD`: SGD whose results are rounded to the grid. So every parameter, pseudo-gradient and momentum
is a multiple of 2**-20 well below 2**30: sums of a few of them are exact in float64 whatever their order
(the ring's reduction order is not the reference's), and every member and the single-process reference
compute the same bits. The inner optimizer keeps no state, so a contributor's round is a function of the
global parameters and its (revision, rank, world): `reference` replays the contributor sets recorded in the
traces and must give every committed revision bit for bit.

Faults (env DILOCO_FAULTS="peer:point:revision,...", point in {inner, after_allreduce}) make this process
SIGKILL itself once (a marker file in DILOCO_MARKERS records that it fired). DILOCO_HOLD="REVISION:WORLD"
slows the members down from REVISION on (a pause of HOLD_PAUSE_S before each step) while their generation has
fewer than WORLD members, so that joiners still starting up join before the job reaches its last revision.
The steps still run and commit: a pending generation is joined at a commit, so a member that stopped stepping
would never let the joiners in.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterable, Sequence

import torch

GRID = 2.0 ** -20
HOLD_PAUSE_S = 1.5
BATCH, SYNC_EVERY, INNER_LR, OUTER_LR, OUTER_MOMENTUM = 12, 4, 2.0 ** -5, 0.75, 0.5
W_STAR = torch.arange(32, dtype=torch.float64).reshape(4, 8) % 7 - 3


def on_grid(t: torch.Tensor) -> torch.Tensor:
    return torch.round(t / GRID) * GRID


class GridSGD(torch.optim.Optimizer):
    """SGD (optionally with momentum, its buffer created at construction) rounded to the grid."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, momentum: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum})
        for group in self.param_groups:
            for p in group["params"]:
                if group["momentum"]:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p)

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001, ANN201 - torch's signature
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = on_grid(p.grad)
                if group["momentum"]:
                    buf = self.state[p]["momentum_buffer"]
                    buf.copy_(on_grid(buf * group["momentum"] + g))
                    g = buf
                p.copy_(on_grid(p - group["lr"] * g))


def make_model() -> torch.nn.Module:
    model = torch.nn.Linear(8, 4, bias=False).double()
    with torch.no_grad():
        model.weight.zero_()
    return model


def make_diloco(model: torch.nn.Module, **kwargs):
    from p2pgen.torch.diloco import DiLoCo

    return DiLoCo(model, GridSGD(model.parameters(), INNER_LR),
                  GridSGD(model.parameters(), OUTER_LR, OUTER_MOMENTUM), sync_every=SYNC_EVERY, **kwargs)


def samples(revision: int, index: int, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.arange(lo, hi, dtype=torch.int64) + (revision * SYNC_EVERY + index) * BATCH
    x = ((ids[:, None] * 7919 + torch.arange(8)[None, :] * 104729) % 7 - 3).double()
    return x, x @ W_STAR.T


def inner_loss(model: torch.nn.Module):
    def loss(batch) -> torch.Tensor:
        lo, hi = batch.shard(BATCH)
        x, y = samples(batch.revision, batch.index, lo, hi)
        return 0.5 * ((model(x) - y) ** 2).sum() / max(1, hi - lo)
    return loss


def reference(contributors: Sequence[Sequence[tuple[int, int]]]) -> torch.Tensor:
    """The global W after one outer step per entry of `contributors` (each: the (rank, world) of every
    member whose round the step averaged), in one process, with the same rounding as the members."""
    torch.set_num_threads(1)
    model = make_model()
    inner = GridSGD(model.parameters(), INNER_LR)
    outer = GridSGD(model.parameters(), OUTER_LR, OUTER_MOMENTUM)
    global_w = model.weight.detach().clone()
    loss = inner_loss(model)
    for revision, members in enumerate(contributors):
        total = torch.zeros_like(global_w)
        for rank, world in members:
            from p2pgen.torch.diloco import InnerBatch

            with torch.no_grad():
                model.weight.copy_(global_w)
            for index in range(SYNC_EVERY):
                loss(InnerBatch(revision, rank, world, index)).backward()
                inner.step()
                inner.zero_grad(set_to_none=True)
            total += global_w - model.weight.detach()
        with torch.no_grad():
            model.weight.copy_(global_w)
        model.weight.grad = total / len(members)
        outer.step()
        model.weight.grad = None
        global_w = model.weight.detach().clone()
    return global_w


def maybe_fault(peer: str, point: str, revision: int) -> None:
    for spec in filter(None, os.environ.get("DILOCO_FAULTS", "").split(",")):
        who, where, when = spec.split(":")
        marker = os.path.join(os.environ["DILOCO_MARKERS"], spec.replace(":", "_"))
        if (who, where, int(when)) == (peer, point, revision) and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


class FaultyCommit:
    """The step, whose commit() may first kill this process (the fault point after the outer all-reduce)."""

    def __init__(self, step, peer_id: str) -> None:
        self._step, self._peer_id = step, peer_id

    def __getattr__(self, name: str):
        return getattr(self._step, name)

    def commit(self) -> int:
        maybe_fault(self._peer_id, "after_allreduce", self._step.revision)
        return self._step.commit()


def main() -> None:
    import p2pgen

    torch.set_num_threads(1)
    steps = int(os.environ.get("DILOCO_STEPS", 30))
    delay = float(os.environ.get("DILOCO_INNER_DELAY", 0.01))
    model = make_model()
    diloco = make_diloco(model)
    state = p2pgen.SharedState(tensors=diloco.tensors())
    peer = p2pgen.join(state=state)
    loss = inner_loss(model)

    def inner(batch) -> torch.Tensor:
        time.sleep(delay)
        maybe_fault(peer.peer_id, "inner", batch.revision)
        return loss(batch)

    hold_at, hold_world = (int(v) for v in os.environ.get("DILOCO_HOLD", "0:0").split(":"))
    for step in peer.steps():
        if state.revision >= steps:
            break
        if hold_world and state.revision >= hold_at and step.world < hold_world:
            time.sleep(HOLD_PAUSE_S)
        with step:
            diloco.outer_step(FaultyCommit(step, peer.peer_id), inner)
    summary = {"peer": peer.peer_id, "incarnation": peer.incarnation, "revision": state.revision,
               "digest": state.digest(), "w": state.tensors["diloco.param.weight"].tolist()}
    with open(os.path.join(os.environ["P2PGEN_SUMMARY_DIR"], f"{peer.peer_id}-{peer.incarnation}.json"), "w") as f:
        json.dump(summary, f)
    peer.close()
    sys.exit(0)


if __name__ == "__main__":
    main()

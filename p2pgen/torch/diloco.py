"""DiLoCo and streaming DiLoCo on certified generations: local inner steps, one outer step per revision.

Owns the split between what the job agrees on and what stays local. Shared (in the SharedState, pulled by
joiners, kept by local copies): the global parameters (`diloco.param.<name>`) and the outer optimizer's
state (`diloco.outer.<name>.<key>`). Local: the model's parameters during the inner steps (the replica),
the inner optimizer's state, the round in progress and its pseudo-gradient, the compression residual.

One committed revision is one outer step, in which fragment `revision % fragments` is synchronized:
1. the members agree (`p2pgen.core.outer`) who contributes a round for this revision: the rounds bound
   in one generation, so that their data (a function of revision, rank, world and inner index) is disjoint;
2. each contributor runs what is left of its round (`sync_every // fragments` inner steps; nothing when it
   already ran them before a failed attempt) and takes the fragment's pseudo-gradient
   (global - replica), the others contribute zeros with weight 0;
3. one all-reduce (SUM) of the contributor count and one of the pseudo-gradients, optionally compressed;
   with `overlap` the latter runs on a side thread while the first `overlap` inner steps of the next round
   run (streaming DiLoCo);
4. the outer optimizer steps the fragment's global parameters with the average over the agreed count, the
   replica's fragment takes the new global values, and the step commits.

Invariants: shared state changes only after the last collective, so a failed outer step leaves it as it was
and is retried in the next generation with the same pseudo-gradients (the round is kept), never applied
twice (a member that missed a commit pulls the newer state and drops its round). Staleness: a fragment's
pseudo-gradient covers the replica's inner steps since that fragment's previous synchronization
(`sync_every` inner steps when nothing failed), and the global update is applied `overlap` inner steps after
it was taken; those `overlap` steps' progress on that fragment is replaced by the global values.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from p2pgen.collectives.compress import ErrorFeedback, check_compression
from p2pgen.core.outer import NOT_STARTED, OuterPlan, Round, held_for, offer, plan_outer_step


@dataclass(frozen=True)
class InnerBatch:
    """Which data an inner step takes: inner step `index` of the round for outer step `revision`, as member
    `rank` of `world` (the generation the round was bound in). Split the round's batches by rank and world
    so that the members' shards are disjoint (`shard`)."""

    revision: int
    rank: int
    world: int
    index: int

    def shard(self, batch: int) -> tuple[int, int]:
        """This member's contiguous part [lo, hi) of a global batch of `batch` samples."""
        return self.rank * batch // self.world, (self.rank + 1) * batch // self.world


@dataclass(frozen=True)
class OuterReport:
    """What one outer step did: the `fragment` it synchronized at `revision` in `generation`, this member's
    `weight` (1: it contributed its round), the agreed `contributors`, the `round` it contributed (None when
    weight 0), whether that round was `reused` from an earlier failed attempt, the inner steps this call
    ran, and the replica's inner-step counter when the pseudo-gradient was `taken_at` and when the global
    values were `applied_at` (their difference is the staleness, at most `overlap`)."""

    revision: int
    generation: int
    fragment: int
    weight: int
    contributors: int
    round: Round | None
    reused: bool
    inner_steps: int
    taken_at: int
    applied_at: int


class DiLoCo:
    """Semi-synchronous training of `model`: `sync_every` local inner steps per outer step per fragment.

    Use inside the step loop; `outer_step` runs the inner steps, the outer all-reduce and the commit:

        diloco = p2pgen.torch.DiLoCo(model, inner_opt, outer_opt, sync_every=50)
        state = p2pgen.SharedState(tensors=diloco.tensors())
        peer = p2pgen.join(state=state)
        for step in peer.steps():
            with step:
                diloco.outer_step(step, lambda batch: loss_of(model, data(batch)))

    Args:
        model: the replica; its parameters are trained locally between outer steps.
        inner_optimizer: optimizer over the model's parameters for the inner steps (its state stays local).
        outer_optimizer: optimizer over the model's parameters for the outer step (e.g. SGD, lr 0.7,
            momentum 0.9, Nesterov); its state is shared. SGD's momentum is created here; any other
            optimizer with state must have taken a step already, the same on every member.
        sync_every: inner steps between two synchronizations of each fragment (H).
        fragments: streaming DiLoCo's fragments: the parameters cut into this many contiguous groups, one
            synchronized per outer step, so each round is `sync_every // fragments` inner steps.
        compress: None, "bf16" or "int8": the outer all-reduce's compression.
        overlap: inner steps of the next round run while the outer all-reduce is in flight (default 1 with
            fragments, 0 without).

    Raises:
        ValueError: `sync_every < 1`; `fragments` < 1, more than the parameters, or not dividing
            `sync_every`; an unknown `compress`; `overlap` not below the round's length; an optimizer
            holding a parameter that is not the model's; parameters of mixed dtypes or devices.
    """

    def __init__(self, model: torch.nn.Module, inner_optimizer: torch.optim.Optimizer,
                 outer_optimizer: torch.optim.Optimizer, sync_every: int, fragments: int = 1,
                 compress: str | None = None, overlap: int | None = None) -> None:
        self.model, self.inner, self.outer = model, inner_optimizer, outer_optimizer
        self._named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.sync_every, self.fragments = _check_counts(sync_every, fragments, len(self._named))
        self.round_steps = self.sync_every // self.fragments
        self.overlap = _check_overlap(overlap, self.fragments, self.round_steps)
        self.compress = check_compression(compress)
        _check_parameters(self._named)
        self._device = self._named[0][1].device
        for what, optimizer in (("inner_optimizer", inner_optimizer), ("outer_optimizer", outer_optimizer)):
            _check_holds_only(what, optimizer, self._named)
        self._global = {name: p.detach().clone() for name, p in self._named}
        self._outer_state = _outer_state(outer_optimizer, self._named)
        self._groups = _fragment_groups([p.numel() for _, p in self._named], self.fragments)
        self._replica_revision: int | None = None       # the revision the replica was last brought in line with
        self._round: Round | None = None
        self._round_done = 0
        self._next: Round | None = None
        self._next_done = 0
        self._feedback = [ErrorFeedback() for _ in range(self.fragments)]   # int8/bf16 residuals, per fragment
        self.inner_steps_run = 0
        self.last: OuterReport | None = None

    def tensors(self) -> dict[str, torch.Tensor]:
        """The shared tensors, by reference: put them in the SharedState (`SharedState(tensors=...)` or
        `state.tensors.update(...)`) before the first step."""
        out = {f"diloco.param.{name}": t for name, t in self._global.items()}
        out.update(self._outer_state)
        return out

    def fragment_of(self, revision: int) -> int:
        """The fragment outer step `revision` synchronizes."""
        return revision % self.fragments

    def fragment_names(self, fragment: int) -> list[str]:
        """The parameter names in `fragment`."""
        return [self._named[i][0] for i in self._groups[fragment]]

    def outer_step(self, step: Any, inner: Callable[[InnerBatch], torch.Tensor]) -> OuterReport:
        """Run outer step `step.revision`: the inner steps left in this member's round, the outer
        all-reduce, the outer optimizer on the fragment's global parameters, and `step.commit()`.

        Args:
            step: the current `p2pgen.Step` (inside `with step:`).
            inner: one inner step's forward pass: given its InnerBatch, returns the loss to back-propagate.

        Raises:
            GenerationChanged, PeerLost: from the all-reduces (the `with step:` block discards the step; the
                next attempt reuses this member's round).
            RuntimeError: the agreed contributor count is 0 (the members disagree about the rule).
        """
        revision = step.revision
        self._align_replica(revision)
        agreed = _all_reduce_int(step, offer(self._round, revision), "max", self._device)
        plan = plan_outer_step(self._round, revision, agreed)
        contributed = self._prepare_round(step, plan)
        ran = self._finish_round(inner) if plan.contribute else 0
        fragment = self.fragment_of(revision)
        delta, taken_at = self._pseudo_gradient(fragment, plan.weight), self.inner_steps_run
        _trace(step, "outer", revision=revision, generation=step.generation, fragment=fragment,
               weight=plan.weight, round=None if contributed is None else list(_round_fields(contributed)),
               reused=contributed is not None and not plan.start, inner_steps=ran)
        count = _all_reduce_int(step, plan.weight, "sum", self._device)
        if count < 1:
            raise RuntimeError(f"outer step {revision}: no member contributed (agreed offer {agreed}); the "
                               "members do not apply the same contribution rule")
        reduced, ran_next = self._reduce_overlapped(step, delta, fragment, inner)
        self._apply(fragment, reduced, count)
        step.commit()
        self._advance(revision)
        self.last = OuterReport(revision, step.generation, fragment, plan.weight, count, contributed,
                                contributed is not None and not plan.start, ran + ran_next, taken_at,
                                self.inner_steps_run)
        return self.last

    # --- the round ------------------------------------------------------------------------------------

    def _align_replica(self, revision: int) -> None:
        """A replica that does not follow the shared state (the first step, a pulled or restored state, a
        commit this member missed) takes the global values, and its rounds are dropped."""
        if self._replica_revision == revision:
            return
        with torch.no_grad():
            for name, p in self._named:
                p.copy_(self._global[name])
        self._round, self._round_done, self._next, self._next_done = None, 0, None, 0
        self._replica_revision = revision

    def _prepare_round(self, step: Any, plan: OuterPlan) -> Round | None:
        if plan.start:
            self._round, self._round_done = Round(step.revision, step.generation, step.rank, step.world), 0
        elif not plan.contribute:
            self._round, self._round_done = None, 0
        return held_for(self._round, step.revision) if plan.contribute else None

    def _finish_round(self, inner: Callable[[InnerBatch], torch.Tensor]) -> int:
        held = self._round
        assert held is not None
        ran = 0
        while self._round_done < self.round_steps:
            self._inner_step(inner, InnerBatch(held.revision, held.rank, held.world, self._round_done))
            self._round_done += 1
            ran += 1
        return ran

    def _inner_step(self, inner: Callable[[InnerBatch], torch.Tensor], batch: InnerBatch) -> None:
        loss = inner(batch)
        loss.backward()
        self.inner.step()
        self.inner.zero_grad(set_to_none=True)
        self.inner_steps_run += 1

    def _run_next_round(self, step: Any, inner: Callable[[InnerBatch], torch.Tensor],
                        stop: threading.Event) -> int:
        """Inner steps of the next round while the outer all-reduce is in flight (at most `overlap` in
        all), bound to this generation unless this member already bound one."""
        if self._next is None:
            self._next = Round(step.revision + 1, step.generation, step.rank, step.world)
            self._next_done = 0
        ran = 0
        while self._next_done < self.overlap and not stop.is_set():
            self._inner_step(inner, InnerBatch(self._next.revision, self._next.rank, self._next.world,
                                               self._next_done))
            self._next_done += 1
            ran += 1
        return ran

    # --- the outer step ---------------------------------------------------------------------------------

    def _pseudo_gradient(self, fragment: int, weight: int) -> torch.Tensor:
        params = [self._named[i] for i in self._groups[fragment]]
        with torch.no_grad():
            if not weight:
                return torch.zeros(sum(p.numel() for _, p in params), dtype=params[0][1].dtype,
                                   device=params[0][1].device)
            return torch.cat([(self._global[name] - p).reshape(-1) for name, p in params])

    def _reduce_overlapped(self, step: Any, delta: torch.Tensor, fragment: int,
                           inner: Callable[[InnerBatch], torch.Tensor]) -> tuple[torch.Tensor, int]:
        if not self.overlap:
            return self._reduce(step, delta, fragment), 0
        result: dict[str, Any] = {}
        done = threading.Event()

        def reduce() -> None:
            try:
                result["value"] = self._reduce(step, delta, fragment)
            except BaseException as e:          # handed to the step's thread below
                result["error"] = e
            finally:
                done.set()

        worker = threading.Thread(target=reduce, name="p2pgen-diloco-reduce", daemon=True)
        worker.start()
        try:
            ran = self._run_next_round(step, inner, done)
        finally:
            worker.join()
        if "error" in result:
            raise result["error"]
        return result["value"], ran

    def _reduce(self, step: Any, delta: torch.Tensor, fragment: int) -> torch.Tensor:
        if self.compress is None:
            step.all_reduce(delta, op="sum")
        else:
            step.all_reduce(delta, op="sum", compress=self.compress, feedback=self._feedback[fragment])
        return delta

    def _apply(self, fragment: int, reduced: torch.Tensor, count: int) -> None:
        """The outer optimizer on the fragment's global values; the replica's fragment takes them."""
        average = reduced / count
        offset = 0
        params = []
        with torch.no_grad():
            for i in self._groups[fragment]:
                name, p = self._named[i]
                p.copy_(self._global[name])
                p.grad = average[offset:offset + p.numel()].view_as(p).clone()
                offset += p.numel()
                params.append((name, p))
        self.outer.step()
        with torch.no_grad():
            for name, p in params:
                self._global[name].copy_(p)
                p.grad = None

    def _advance(self, revision: int) -> None:
        self._replica_revision = revision + 1
        self._round, self._round_done = self._next, self._next_done
        self._next, self._next_done = None, 0


def _trace(step: Any, event: str, **fields: Any) -> None:
    record = getattr(step, "record", None)          # a Step records into the peer's trace; a stand-in may not
    if record is not None:
        record(event, **fields)


def _round_fields(held: Round) -> tuple[int, int, int, int]:
    return held.revision, held.generation, held.rank, held.world


def _all_reduce_int(step: Any, value: int, op: str, device: torch.device) -> int:
    buf = torch.tensor([value], dtype=torch.int64, device=device)
    step.all_reduce(buf, op=op)
    return int(buf[0])


def _check_counts(sync_every: Any, fragments: Any, n_params: int) -> tuple[int, int]:
    if not isinstance(sync_every, int) or isinstance(sync_every, bool) or sync_every < 1:
        raise ValueError(f"sync_every={sync_every!r}: give the number of inner steps between synchronizations, "
                         "an integer >= 1")
    if not isinstance(fragments, int) or isinstance(fragments, bool) or fragments < 1:
        raise ValueError(f"fragments={fragments!r}: give an integer >= 1 (1: plain DiLoCo)")
    if n_params == 0:
        raise ValueError("the model has no trainable parameters: DiLoCo synchronizes parameters")
    if fragments > n_params:
        raise ValueError(f"fragments={fragments} but the model has {n_params} parameter tensors: fragments are "
                         "groups of whole parameter tensors, so give at most that many")
    if sync_every % fragments:
        raise ValueError(f"fragments={fragments} does not divide sync_every={sync_every}: each fragment is "
                         "synchronized every sync_every inner steps, one per sync_every/fragments steps")
    return sync_every, fragments


def _check_overlap(overlap: Any, fragments: int, round_steps: int) -> int:
    if overlap is None:
        overlap = 1 if fragments > 1 and round_steps > 1 else 0
    if not isinstance(overlap, int) or isinstance(overlap, bool) or not 0 <= overlap < round_steps:
        raise ValueError(f"overlap={overlap!r}: the inner steps run while the outer all-reduce is in flight "
                         f"must be an integer in [0, {round_steps}) (a round is sync_every/fragments = "
                         f"{round_steps} inner steps)")
    return overlap


def _check_parameters(named: Sequence[tuple[str, torch.Tensor]]) -> None:
    kinds = {(p.dtype, p.device) for _, p in named}
    if len(kinds) > 1:
        raise ValueError(f"the model's trainable parameters mix dtypes/devices {sorted(map(str, kinds))}: "
                         "DiLoCo reduces each fragment as one buffer; cast the model to one dtype and device")
    if not next(iter(kinds))[0].is_floating_point:
        raise ValueError("the model's parameters are not floating point: DiLoCo trains floating-point models")


def _check_holds_only(what: str, optimizer: torch.optim.Optimizer,
                      named: Sequence[tuple[str, torch.Tensor]]) -> None:
    ours = {id(p) for _, p in named}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in ours:
                raise ValueError(f"{what} holds a parameter (shape {tuple(p.shape)}) that is not one of the "
                                 "model's trainable parameters: build it over model.parameters()")


def _outer_state(optimizer: torch.optim.Optimizer,
                 named: Sequence[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    from p2pgen.torch import _optimizer_tensors

    names = {id(p): name for name, p in named}
    out: dict[str, torch.Tensor] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            tensors = _optimizer_tensors(optimizer, group, p, names[id(p)])
            out.update({f"diloco.outer.{key.removeprefix('optimizer.')}": t for key, t in tensors.items()})
    return out


def _fragment_groups(sizes: Sequence[int], fragments: int) -> list[list[int]]:
    """Parameter indices cut into `fragments` contiguous, non-empty groups of about equal element counts:
    group f ends at the first tensor whose running total reaches (f + 1) / fragments of the whole, leaving
    at least one tensor for each group after it."""
    total, groups, start, running = sum(sizes), [], 0, 0
    for f in range(fragments):
        end = start
        last = len(sizes) - (fragments - f - 1)     # exclusive bound leaving one tensor per later group
        while end < last and (end == start or running < total * (f + 1) / fragments):
            running += sizes[end]
            end += 1
        groups.append(list(range(start, end)))
        start = end
    groups[-1].extend(range(start, len(sizes)))
    return groups


__all__ = ["NOT_STARTED", "DiLoCo", "InnerBatch", "OuterReport"]

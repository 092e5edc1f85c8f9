"""Every sample exactly once across faults and world changes: an elastic sampler whose position is shared state.

Owns: which dataset indices each step consumes. The sample stream is the concatenation of one seeded permutation
of `range(dataset_len)` per epoch; step r of the job (the step that commits revision r + 1) consumes positions
[P(r), P(r) + global_batch) of that stream, where P(r) = base_position + (r - base_revision) * global_batch, and
member `rank` of `world` takes the contiguous part [rank * B // world, (rank + 1) * B // world) of it.

The sampler's record (seed, dataset length, global batch, base revision and position) lives in the SharedState's
objects under one key, so it is in the state's digest, pulled by joiners and restored from local copies and
checkpoints like the rest of the state; the position itself is a function of the committed revision, so it
advances exactly when a step commits and never otherwise (a discarded or redone step consumes the same indices
again, a committed one never twice). Changing the global batch re-bases the record at the current revision.

Invariants: for every revision the parts of all ranks of any world partition that revision's global batch; the
global batch of revision r does not depend on the world; over consecutive revisions every index of an epoch
appears exactly once (the stream crosses epoch boundaries: a batch may end one epoch and start the next).
`ElasticLoader` (torch, optional) adds worker processes and prefetch: every batch it prefetches is labelled with
the (revision, rank, world) it was made for, and one that does not match the step asking is dropped, never handed
out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from p2pgen.state import SharedState

STATE_KEY = "p2pgen.data"


@dataclass(frozen=True)
class DataPosition:
    """The record kept in shared state: where revision `base_revision`'s step starts in the sample stream."""

    seed: int
    dataset_len: int
    global_batch: int
    base_revision: int = 0
    base_position: int = 0

    def position(self, revision: int) -> int:
        """The stream position where the step of `revision` (committing revision + 1) starts.

        Raises:
            ValueError: a revision before the record's base (the state went back past a re-basing).
        """
        if revision < self.base_revision:
            raise ValueError(f"revision {revision} is before this sampler's base revision {self.base_revision}")
        return self.base_position + (revision - self.base_revision) * self.global_batch

    def epoch_offset(self, revision: int) -> tuple[int, int]:
        """(epoch, offset within the epoch) where the step of `revision` starts."""
        return divmod(self.position(revision), self.dataset_len)


def permutation(seed: int, epoch: int, dataset_len: int) -> np.ndarray:
    """The order of epoch `epoch`: the same on every member, every process and every run with this seed."""
    return np.random.default_rng([seed, epoch]).permutation(dataset_len)


def stream(record: DataPosition, start: int, count: int) -> np.ndarray:
    """Indices at stream positions [start, start + count), across epoch boundaries."""
    out = np.empty(count, dtype=np.int64)
    done, n = 0, record.dataset_len
    while done < count:
        epoch, offset = divmod(start + done, n)
        take = min(count - done, n - offset)
        out[done:done + take] = permutation(record.seed, epoch, n)[offset:offset + take]
        done += take
    return out


def share(global_batch: int, rank: int, world: int) -> tuple[int, int]:
    """[lo, hi) of a global batch that member `rank` of `world` takes (contiguous, sizes differ by at most one).

    Raises:
        ValueError: rank outside 0..world-1.
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of {world}")
    return rank * global_batch // world, (rank + 1) * global_batch // world


class ElasticSampler:
    """The indices each step consumes; its record is shared state (see the module docstring).

    Every member constructs it with the same arguments on the same SharedState before `p2pgen.join`. A state
    that already holds a record (a restored local copy, a checkpoint, a pulled state) keeps it; one that holds a
    record of another dataset or seed is refused.
    """

    def __init__(self, state: SharedState, dataset_len: int, global_batch: int, seed: int = 0,
                 max_per_member: int | None = None) -> None:
        """
        Args:
            state: the job's SharedState (the record goes into `state.objects["p2pgen.data"]`).
            dataset_len: samples in the dataset (> 0).
            global_batch: samples per step, whatever the world (1..dataset_len).
            seed: the permutation seed.
            max_per_member: the most samples one member processes at once (its memory cap); a share larger than
                this is cut into micro-batches (`micro_batches`), for gradient accumulation.
        Raises:
            ValueError: a bad length, batch or cap, or a record in `state` that another dataset or seed made.
        """
        if dataset_len <= 0:
            raise ValueError(f"dataset_len is {dataset_len}: an elastic sampler needs a dataset with samples")
        if not 0 < global_batch <= dataset_len:
            raise ValueError(f"global_batch {global_batch} must be between 1 and the dataset length {dataset_len}")
        if max_per_member is not None and max_per_member < 1:
            raise ValueError(f"max_per_member is {max_per_member}: give at least 1 sample, or None for no cap")
        self.state, self.max_per_member = state, max_per_member
        self._expect = (seed, dataset_len)
        held = state.objects.get(STATE_KEY)
        if held is None:
            state.objects[STATE_KEY] = asdict(DataPosition(seed, dataset_len, global_batch, state.revision, 0))
        else:
            _check_same_data(DataPosition(**held), seed, dataset_len)
            if held["global_batch"] != global_batch:
                raise ValueError(f"the state's sampler takes global batches of {held['global_batch']}, this one "
                                 f"{global_batch}: keep the batch, or call set_global_batch() inside a step")

    @property
    def record(self) -> DataPosition:
        """The record as the state holds it now (after a pull or a restore: the pulled one).

        Raises:
            ValueError: the state now holds the record of another dataset or seed (pulled from members that were
                started with other data).
        """
        record = DataPosition(**self.state.objects[STATE_KEY])
        _check_same_data(record, *self._expect)
        return record

    def position(self, revision: int | None = None) -> tuple[int, int]:
        """(epoch, offset) where the step of `revision` (default: the state's current revision) starts."""
        return self.record.epoch_offset(self.state.revision if revision is None else revision)

    def global_indices(self, revision: int) -> np.ndarray:
        """The global batch of the step of `revision`: `global_batch` dataset indices."""
        record = self.record
        return stream(record, record.position(revision), record.global_batch)

    def indices(self, step: Any) -> np.ndarray:
        """This member's indices for `step` (a `p2pgen.Step`, or anything with revision, rank and world)."""
        return self.indices_for(step.revision, step.rank, step.world)

    def indices_for(self, revision: int, rank: int, world: int) -> np.ndarray:
        """Member `rank` of `world`'s part of the step of `revision`."""
        record = self.record
        lo, hi = share(record.global_batch, rank, world)
        return stream(record, record.position(revision) + lo, hi - lo)

    def micro_batches(self, step: Any) -> list[np.ndarray]:
        """This member's indices for `step` cut into pieces of at most `max_per_member` (one piece without a cap).
        Accumulate the gradients of all pieces (each scaled by the *global* batch) before the all-reduce."""
        mine = self.indices(step)
        cap = self.max_per_member or max(1, len(mine))
        return [mine[i:i + cap] for i in range(0, len(mine), cap)] or [mine]

    def set_global_batch(self, global_batch: int) -> None:
        """Take `global_batch` samples per step from the current revision on (call it inside a step, before
        `commit()`, on every member alike, so that the change is committed with the step).

        Raises:
            ValueError: not between 1 and the dataset length.
        """
        record = self.record
        if not 0 < global_batch <= record.dataset_len:
            raise ValueError(f"global_batch {global_batch} must be between 1 and the dataset length "
                             f"{record.dataset_len}")
        revision = self.state.revision
        self.state.objects[STATE_KEY] = asdict(DataPosition(record.seed, record.dataset_len, global_batch, revision,
                                                            record.position(revision)))


def _check_same_data(held: DataPosition, seed: int, dataset_len: int) -> None:
    differs = [f"{what}: the state has {a}, this run {b}" for what, a, b in (
        ("dataset length", held.dataset_len, dataset_len), ("seed", held.seed, seed)) if a != b]
    if differs:
        raise ValueError("the shared state holds the data position of another dataset or seed ("
                         + "; ".join(differs) + "): resuming would skip or repeat samples. Start from a fresh "
                         "state, or construct the sampler with the state's dataset and seed")


class ElasticLoader:
    """A torch DataLoader over an ElasticSampler: `loader.batch(step)` returns this member's collated batch for
    the step, read by `num_workers` worker processes that prefetch the next steps' batches.

    Batches are prefetched for the revisions after the step asked for, with its rank and world. When a step asks
    for another (revision, rank, world) (a new generation, a discarded or redone step, a pulled state), the
    prefetched batches are dropped (`restarts` counts the times) and the workers start over from that step: a
    batch made for another step is never returned. A member whose share of a step is empty (a world larger than
    the global batch) gets None.
    """

    def __init__(self, dataset: Any, sampler: ElasticSampler, num_workers: int = 0,
                 collate_fn: Callable[[list[Any]], Any] | None = None, prefetch_factor: int = 2) -> None:
        """
        Args:
            dataset: a map-style dataset (`dataset[i]` for every index of the sampler).
            sampler: the job's ElasticSampler.
            num_workers: torch DataLoader worker processes (0: read in this process).
            collate_fn: merges samples into a batch (default: torch's default_collate).
            prefetch_factor: batches each worker reads ahead.
        Raises:
            ValueError: the dataset's length differs from the sampler's.
        """
        if len(dataset) != sampler.record.dataset_len:
            raise ValueError(f"the dataset has {len(dataset)} samples, the sampler {sampler.record.dataset_len}")
        self.dataset, self.sampler, self.num_workers = dataset, sampler, num_workers
        self.collate_fn, self.prefetch_factor = collate_fn, prefetch_factor
        self.restarts = 0
        self._key: tuple[int, int, int] | None = None      # the (revision, rank, world) the next batch is for
        self._it: Iterator[Any] | None = None

    def batch(self, step: Any) -> Any:
        """This member's batch for `step` (collated), or None when its share is empty."""
        key = (step.revision, step.rank, step.world)
        lo, hi = share(self.sampler.record.global_batch, step.rank, step.world)
        if lo == hi:
            return None
        if key != self._key:
            self._restart(key)
        assert self._it is not None
        made_for, batch = next(self._it)
        if made_for != key:                       # cannot happen: the iterator was built for this key
            raise RuntimeError(f"a batch made for {made_for} reached step {key}")
        self._key = (key[0] + 1, key[1], key[2])
        return batch

    def _restart(self, key: tuple[int, int, int]) -> None:
        import torch.utils.data as tud

        if self._it is not None:
            self.restarts += 1
        self.close()
        revision, rank, world = key
        batches = _StepBatches(self.sampler, revision, rank, world)
        loader = tud.DataLoader(_Labelled(self.dataset), batch_sampler=batches, num_workers=self.num_workers,
                                collate_fn=_Collate(self.collate_fn or tud.default_collate),
                                **({"prefetch_factor": self.prefetch_factor} if self.num_workers else {}))
        self._it = iter(loader)

    def close(self) -> None:
        """Drop the prefetched batches and the worker processes (torch stops the workers when the last
        reference to its iterator goes); the loader starts again on the next `batch`."""
        self._it, self._key = None, None


class _StepBatches:
    """The batch sampler of one (rank, world) from one revision on: [(revision, index), ...] per step."""

    def __init__(self, sampler: ElasticSampler, revision: int, rank: int, world: int) -> None:
        self.record, self.revision, self.rank, self.world = sampler.record, revision, rank, world

    def __iter__(self) -> Iterator[list[tuple[tuple[int, int, int], int]]]:
        lo, hi = share(self.record.global_batch, self.rank, self.world)
        revision = self.revision
        while True:
            key = (revision, self.rank, self.world)
            ids = stream(self.record, self.record.position(revision) + lo, hi - lo)
            yield [(key, int(i)) for i in ids]
            revision += 1


class _Collate:
    """Collates the samples of one labelled batch: (label, collate(samples)). A class, so workers can unpickle it."""

    def __init__(self, collate: Callable[[list[Any]], Any]) -> None:
        self.collate = collate

    def __call__(self, items: list[tuple[Any, Any]]) -> tuple[Any, Any]:
        return items[0][0], self.collate([x for _, x in items])


class _Labelled:
    """A dataset of (label, index) -> (label, dataset[index]), so each batch carries the step it was made for."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[Any, int]) -> tuple[Any, Any]:
        label, index = item
        return label, self.dataset[index]

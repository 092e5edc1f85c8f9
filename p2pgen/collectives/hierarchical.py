"""Hierarchical all_reduce for a generation whose members sit in groups behind slow links (zones).

Owns: `HierarchicalAllReduce`, which a TcpBackend runs instead of its flat ring for an all_reduce of at least
`min_bytes` (the hook `TcpBackend.all_reduce_hook`, set by `attach`), and `attach` itself. The certificate says
when (core.topology: 2+ groups of 2+ members behind links SLOW_FACTOR times slower than inside the groups); the
backend factory (collectives.select) attaches it, so every member of the generation takes the same path.

Algorithms, built only from the backend's own subgroup collectives (so every frame is stamped and checksummed as
usual, and a generation change fails them like any other):
- groups of equal size m (the common case, and the faster one): reduce-scatter inside the group (member i of the
  group holds the group's reduction of slice i), all_reduce of slice i across the groups by their members i (each
  "column" of members leads one slice), all-gather inside the group. Each slow link carries 2 (G-1)/G x S/m
  bytes each way, against 2 (N-1)/N x S for the flat ring (S: the buffer, G groups, N members);
- otherwise (or `leaders_only`): all_reduce inside the group, all_reduce of the whole buffer across the groups'
  first members (one leader per group), broadcast from the leader inside the group.
Invariants (the Backend contract, unchanged):
- bit-identical results: every element's final value is reduced once, by one ring of one subgroup, and reaches
  every other member verbatim (AVG sums through both levels, then the members holding a slice divide the same
  bits by the same N);
- a raising all_reduce leaves the buffer as it was: the stages work in private buffers and the caller's buffer
  is written once, at the end;
- one all_reduce advances the parent's `op_seq` by one on every member (the hook's caller counts it).
The caller must not run another collective of the generation from another thread meanwhile (as for any
communicator): the stages take the session's operation slot one after the other, not all at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from p2pgen.collectives.backend import ReduceOp
from p2pgen.collectives.buffers import Flat, divide

if TYPE_CHECKING:
    from p2pgen.collectives.tcp import TcpBackend

MIN_BYTES = 256 << 10          # smaller all_reduces take the flat ring: three stages cost three latencies


class HierarchicalAllReduce:
    """The all_reduce of `backend`'s generation through `groups` (its ranks, grouped; see the module docstring)."""

    def __init__(self, backend: TcpBackend, groups: Sequence[Sequence[int]], min_bytes: int = MIN_BYTES,
                 leaders_only: bool = False) -> None:
        """Args:
            backend: the generation's TcpBackend (not a subgroup).
            groups: every rank of the generation exactly once, grouped (e.g. by zone); the same on every member.
            min_bytes: smaller all_reduces keep the flat ring.
            leaders_only: always one leader per group, even when the groups have equal sizes.
        Raises:
            ValueError: the groups do not partition the generation's ranks, or fewer than two are given.
        """
        self.groups = tuple(tuple(sorted(int(r) for r in g)) for g in groups)
        flat = sorted(r for g in self.groups for r in g)
        if flat != list(range(backend.world)) or len(self.groups) < 2 or not all(self.groups):
            raise ValueError(f"hierarchical all_reduce: groups {[list(g) for g in self.groups]} must split ranks "
                             f"0..{backend.world - 1} of generation {backend.generation} into 2+ non-empty groups, "
                             "each rank once")
        if min_bytes < 0:
            raise ValueError(f"hierarchical all_reduce: min_bytes must be >= 0, got {min_bytes}")
        self.backend, self.min_bytes = backend, min_bytes
        self.mine = next(g for g in self.groups if backend.rank in g)
        self.position = self.mine.index(backend.rank)
        self.columns = not leaders_only and len({len(g) for g in self.groups}) == 1
        self._inner: Any = None            # subgroups, made at the first call (the same on every member)
        self._across: Any = None
        self._buffers: dict[str, np.ndarray] = {}

    @property
    def algorithm(self) -> str:
        """ "columns" (reduce-scatter, all_reduce per slice, all-gather) or "leaders" (one leader per group)."""
        return "columns" if self.columns else "leaders"

    def takes(self, nbytes: int) -> bool:
        """Whether an all_reduce of `nbytes` goes through the groups (the same answer on every member)."""
        return nbytes > 0 and nbytes >= self.min_bytes

    def all_reduce(self, flat: Flat, op: ReduceOp) -> None:
        """Reduce `flat` (its op/dtype pair already checked) on every member; written only once it is done."""
        self._subgroups()
        if self.columns:
            self._by_columns(flat, op)
        else:
            self._by_leaders(flat, op)

    def _subgroups(self) -> None:
        if self._inner is not None:
            return
        self._inner = self.backend.subgroup(self.mine)
        if self.columns:
            self._across = self.backend.subgroup(sorted(g[self.position] for g in self.groups))
        elif self.position == 0:
            self._across = self.backend.subgroup(sorted(g[0] for g in self.groups))

    def _by_columns(self, flat: Flat, op: ReduceOp) -> None:
        m, n = len(self.mine), flat.size
        slice_ = -(-n // m)
        padded = slice_ * m
        summed = ReduceOp.SUM if op is ReduceOp.AVG else op
        source = flat.elems
        if padded != n:                        # the tail slice is padded; the padding's result is dropped
            source = self._buffer("padded", flat, padded)
            source[n:] = 0
            np.copyto(source[:n], flat.elems)
        mine = self._buffer("slice", flat, slice_)
        self._inner.reduce_scatter(_typed(mine, flat), _typed(source, flat), summed)
        self._across.all_reduce(_typed(mine, flat), summed)
        if op is ReduceOp.AVG:
            divide(flat.bf16, mine, self.backend.world)
        gathered = self._buffer("gathered", flat, padded)
        self._inner.all_gather(_typed(gathered, flat), _typed(mine, flat))
        np.copyto(flat.elems, gathered[:n])

    def _by_leaders(self, flat: Flat, op: ReduceOp) -> None:
        summed = ReduceOp.SUM if op is ReduceOp.AVG else op
        work = self._buffer("gathered", flat, flat.size)
        np.copyto(work, flat.elems)
        self._inner.all_reduce(_typed(work, flat), summed)
        if self._across is not None:
            self._across.all_reduce(_typed(work, flat), summed)
            if op is ReduceOp.AVG:
                divide(flat.bf16, work, self.backend.world)
        self._inner.broadcast(_typed(work, flat), 0)
        np.copyto(flat.elems, work)

    def _buffer(self, name: str, flat: Flat, size: int) -> np.ndarray:
        """A private buffer of `size` elements of `flat`'s element type (grown, never shrunk)."""
        nbytes = size * flat.elems.itemsize
        held = self._buffers.get(name)
        if held is None or held.nbytes < nbytes:
            held = self._buffers[name] = np.empty(nbytes, np.uint8)
        return held[:nbytes].view(flat.elems.dtype)


def _typed(arr: np.ndarray, like: Flat) -> Any:
    """`arr` as a buffer the backend reduces as `like`'s dtype: bfloat16 travels as 16-bit patterns in numpy,
    so it goes in as a torch bfloat16 view of them."""
    if not like.bf16:
        return arr
    import torch

    return torch.from_numpy(arr).view(torch.bfloat16)


def attach(backend: TcpBackend, groups: Sequence[Sequence[int]], **options: Any) -> HierarchicalAllReduce:
    """Make `backend`'s all_reduce hierarchical over `groups` (see HierarchicalAllReduce for the options).

    Raises:
        ValueError: as HierarchicalAllReduce.
    """
    hook = HierarchicalAllReduce(backend, groups, **options)
    backend.all_reduce_hook = hook
    return hook

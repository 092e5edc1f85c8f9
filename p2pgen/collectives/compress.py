"""Compressed all_reduce: int8 with per-block scales, or bf16, on the wire, over any Backend's collectives.

Owns: the two codecs and `compressed_all_reduce`, which runs on nothing but the Backend protocol's all_to_all
and all_gather (so over tcp, shm and nccl alike) with numpy. The buffer's blocks of `block` elements are
dealt out to owners in contiguous runs (rank j owns the j-th of `world` near-equal runs of whole blocks).
Every member quantizes its contribution (buffer plus residual) once, sends each run's bytes to its owner
(all_to_all of uint8), the owner dequantizes every contribution, sums them in float32/float64 in rank
order (AVG: divides the sum once), quantizes the reduced run ONCE, and an all_gather of the owners' bytes
lets every member dequantize the same bytes.

Codecs:
- int8: symmetric, one float32 scale per block (scale = max|x| / 127, q = round-half-even(x * (1 / scale))
  in -127..127, x ~ q * scale). Symmetric rather than min-max because pseudo-gradients and gradients are
  centred on zero: zero stays exactly zero (empty and sparse blocks cost no error), one scale per block
  is 4 bytes against min-max's 8, and its bound |x - q * scale| <= scale / 2 holds for every element.
  Min-max wins only on blocks far off centre (all positive), which these are not.
- bf16: round-to-nearest-even of float32 to its upper 16 bits (float64 goes through float32 first; NaN
  stays NaN). No scales.
Non-finite values reach the result, on every member (data-dependent values cannot raise without the members
falling out of step): bf16 keeps inf and NaN per element; int8 turns a block holding one (or a float64 block
beyond float32 range) into NaN.

Invariants:
- Bit-identical results: each run is reduced by exactly one member in rank order and quantized once;
  every member (the owner too) decodes those same bytes with the same element-wise kernels.
- The caller's buffer is written only after both collectives returned; a raise (a lost peer) leaves it as
  it was passed. The given residual is never written.
- Error feedback: the residual returned is exactly what this call left out of this member's share of the
  result: its contribution minus the decoded contribution, plus, on the run it owns, the reduced run
  minus its decoded bytes (times `world` for AVG); non-finite entries are dropped (they are in the result).
  Summed over the members, residuals carry everything the results of the calls made so far lacked, so the
  cumulative error stays bounded over repeated calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from p2pgen.collectives.backend import Backend, ReduceOp, as_op
from p2pgen.collectives.buffers import Flat

COMPRESSIONS = ("bf16", "int8")
BLOCK = 256                        # elements per int8 scale (and the unit in which runs are dealt out)
_OPS = (ReduceOp.SUM, ReduceOp.AVG)
_DTYPES = ("float32", "float64")
_LEVELS = 127.0                     # int8 codes -127..127: symmetric around an exact zero


def check_compression(mode: str | None) -> str | None:
    """`mode` if it names a compression (or is None: uncompressed).

    Raises:
        ValueError: `mode` is something else; names the `compress` argument and the choices.
    """
    if mode is None or (isinstance(mode, str) and mode in COMPRESSIONS):
        return mode
    raise ValueError(f"compress={mode!r} is not a compression p2pgen knows: use one of "
                     f"{', '.join(map(repr, COMPRESSIONS))}, or None for an uncompressed all_reduce")


def compressed_all_reduce(backend: Backend, buf: Any, *, mode: str, op: ReduceOp | str = "sum",
                          residual: Any = None, block: int = BLOCK) -> Any:
    """Reduce `buf` in place across the generation with `mode` on the wire; same bits on every member.

    Every member must call it with the same mode, op, block, size and dtype, like any collective.

    Args:
        backend: this generation's Backend (its all_to_all and all_gather carry the bytes).
        buf: a float32 or float64 numpy array or CPU torch tensor, C-contiguous.
        mode: "int8" or "bf16" (`COMPRESSIONS`).
        op: "sum" or "avg".
        residual: None, or this member's error feedback (same element count and dtype as `buf`; numpy
            array or CPU torch tensor): added to the contribution, never written.
        block: elements per int8 scale and per unit of ownership (>= 1).
    Returns:
        None without `residual`; else the new residual (a numpy array shaped like `residual`, or a torch
        tensor for a torch one), to adopt only once the step that used it commits.
    Raises:
        ValueError: an unknown mode, an op other than sum/avg, a bad block, a residual that does not fit.
        TypeError: a buffer that is not float32/float64, or not a numpy array or CPU tensor.
        PeerLost, GenerationChanged: the collective failed; `buf` is as it was passed.
    """
    codec = _CODECS[_check_mode(mode)]
    op, flat = _check_op(op), Flat(buf, "compressed_all_reduce buffer")
    if flat.dtype_name not in _DTYPES:
        raise TypeError(f"compressed_all_reduce takes {' or '.join(_DTYPES)} buffers, got {flat.dtype_name}: "
                        "use the uncompressed all_reduce for other dtypes")
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block={block!r} must be a positive int (elements per scale; default {BLOCK})")
    extra = _check_residual(residual, flat)
    if not flat.size:
        return None if residual is None else _like(residual, np.zeros(0, flat.elems.dtype))
    layout = _Layout(flat.size, backend.world, block)
    x = layout.padded(flat.elems, extra)
    mine = codec.encode(x)
    reduced, owner_left = _reduce_owned(backend, codec, layout, mine, op, flat.elems.dtype)
    result = _gather(backend, codec, layout, reduced, flat.elems.dtype)
    left = None
    if residual is not None:
        with np.errstate(invalid="ignore"):
            left = (x - codec.decode(mine, flat.elems.dtype)).reshape(-1)[:flat.size]
        lo, hi = layout.elems(backend.rank)
        left[lo:hi] += owner_left.reshape(-1)[:hi - lo]
        left[~np.isfinite(left)] = 0         # a non-finite value is in the result already: do not carry it on
    np.copyto(flat.elems, result)
    return None if left is None else _like(residual, left)


def _check_mode(mode: str) -> str:
    if check_compression(mode) is None:
        raise ValueError(f"compressed_all_reduce needs mode= one of {', '.join(map(repr, COMPRESSIONS))}; "
                         "for no compression call the backend's all_reduce")
    return mode


def _check_op(op: ReduceOp | str) -> ReduceOp:
    op = as_op(op)
    if op not in _OPS:
        raise ValueError(f"compressed_all_reduce reduces with sum or avg, not {op.value}: use the uncompressed "
                         "all_reduce for other ops")
    return op


def _check_residual(residual: Any, flat: Flat) -> np.ndarray | None:
    if residual is None:
        return None
    got = Flat(residual, "residual")
    if got.size != flat.size or got.dtype_name != flat.dtype_name:
        raise ValueError(f"residual has {got.size} elements of {got.dtype_name}, the buffer {flat.size} of "
                         f"{flat.dtype_name}: pass the residual this buffer's last call returned (or None)")
    return got.elems


def _like(residual: Any, left: np.ndarray) -> Any:
    shaped = left.reshape(tuple(residual.shape))
    if isinstance(residual, np.ndarray):
        return shaped
    import torch

    return torch.from_numpy(shaped)


class _Layout:
    """Blocks of the buffer (the last one short), dealt out to `world` owners in contiguous runs."""

    def __init__(self, size: int, world: int, block: int) -> None:
        self.size, self.block = size, block
        self.blocks = -(-size // block)
        base, extra = divmod(self.blocks, world)
        self.runs, lo = [], 0
        for j in range(world):
            hi = lo + base + (j < extra)
            self.runs.append((lo, hi))
            lo = hi

    def elems(self, owner: int) -> tuple[int, int]:
        lo, hi = self.runs[owner]
        return min(self.size, lo * self.block), min(self.size, hi * self.block)

    def padded(self, elems: np.ndarray, extra: np.ndarray | None) -> np.ndarray:
        """The contribution (elems + extra) as a zero-padded (blocks, block) array."""
        x = np.zeros(self.blocks * self.block, elems.dtype)
        if extra is None:
            x[:self.size] = elems
        else:
            np.add(elems, extra, out=x[:self.size])
        return x.reshape(self.blocks, self.block)


def _reduce_owned(backend: Backend, codec: _Codec, layout: _Layout, mine: _Coded, op: ReduceOp,
                  dtype: np.dtype) -> tuple[_Coded, np.ndarray]:
    """Send every run's coded contribution to its owner; reduce the run this member owns and code it once.
    Returns the coded reduced run and what its coding left out (scaled to a sum's terms for AVG)."""
    n, r = backend.world, backend.rank
    sends = [codec.pack(mine, layout, j) for j in range(n)]
    width = len(sends[r])
    got = np.empty(n * width, np.uint8)
    backend.all_to_all(got, np.concatenate(sends), output_splits=[width] * n,
                       input_splits=[len(s) for s in sends])
    blocks = layout.runs[r][1] - layout.runs[r][0]
    total = codec.decode(codec.unpack(got[:width], blocks, layout), dtype)
    for i in range(1, n):
        total += codec.decode(codec.unpack(got[i * width:(i + 1) * width], blocks, layout), dtype)
    if op is ReduceOp.AVG:
        total /= dtype.type(n)
    reduced = codec.encode(total)
    with np.errstate(invalid="ignore"):
        left = total - codec.decode(reduced, dtype)
    if op is ReduceOp.AVG:
        left *= dtype.type(n)
    return reduced, left


def _gather(backend: Backend, codec: _Codec, layout: _Layout, reduced: _Coded, dtype: np.dtype) -> np.ndarray:
    """all_gather every owner's coded run (padded to the longest) and decode the whole result."""
    n, r = backend.world, backend.rank
    sizes = [codec.nbytes(hi - lo, layout.elems(j)[1] - layout.elems(j)[0])
             for j, (lo, hi) in enumerate(layout.runs)]
    width = max(sizes)
    mine = np.zeros(width, np.uint8)
    mine[:sizes[r]] = codec.pack(reduced, layout, r, whole=True)
    everyone = np.empty(n * width, np.uint8)
    backend.all_gather(everyone, mine)
    result = np.empty(layout.size, dtype)
    for j, (lo, hi) in enumerate(layout.runs):
        a, b = layout.elems(j)
        coded = codec.unpack(everyone[j * width:j * width + sizes[j]], hi - lo, layout)
        result[a:b] = codec.decode(coded, dtype).reshape(-1)[:b - a]
    return result


class _Coded:
    """A coded (blocks, block) array: `values` (int8 codes or bf16 bits, one per element) and, for int8,
    one float32 `scales` entry per block."""

    def __init__(self, values: np.ndarray, scales: np.ndarray | None) -> None:
        self.values, self.scales = values, scales


class _Codec:
    """Wire format of a run of blocks: its scales (if any), then one code per element of the run."""

    scale_bytes = 0
    code: np.dtype

    def nbytes(self, blocks: int, elems: int) -> int:
        return self.scale_bytes * blocks + self.code.itemsize * elems

    def pack(self, coded: _Coded, layout: _Layout, owner: int, whole: bool = False) -> np.ndarray:
        """The bytes of owner's run of `coded` (`whole`: `coded` is just that run)."""
        lo, hi = layout.runs[owner]
        a, b = layout.elems(owner)
        if whole:
            lo, hi, a, b = 0, hi - lo, 0, b - a
        parts = [coded.values.reshape(-1)[a:b].view(np.uint8)]
        if coded.scales is not None:
            parts.insert(0, coded.scales[lo:hi].view(np.uint8))
        return np.concatenate(parts)

    def unpack(self, raw: np.ndarray, blocks: int, layout: _Layout) -> _Coded:
        """A run of `blocks` blocks from its bytes, zero-padded to whole blocks."""
        split = self.scale_bytes * blocks
        values = np.zeros(blocks * layout.block, self.code)
        codes = raw[split:]
        values[:codes.size // self.code.itemsize] = codes.view(self.code)
        scales = raw[:split].copy().view(np.float32) if self.scale_bytes else None
        return _Coded(values.reshape(blocks, layout.block), scales)

    def encode(self, x: np.ndarray) -> _Coded:
        raise NotImplementedError

    def decode(self, coded: _Coded, dtype: np.dtype) -> np.ndarray:
        raise NotImplementedError


class _Int8(_Codec):
    scale_bytes = 4
    code = np.dtype(np.int8)

    def encode(self, x: np.ndarray) -> _Coded:
        amax = np.max(np.abs(x), axis=1)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            scales = (amax / _LEVELS).astype(np.float32)
            scales[~np.isfinite(scales)] = np.nan
            inverse = (1 / scales).astype(x.dtype)
        empty = np.flatnonzero(~(scales > 0))          # all-zero blocks, and NaN ones: code 0
        inverse[empty] = 0
        with np.errstate(invalid="ignore"):
            codes = np.multiply(x, inverse[:, None])
        codes[empty] = 0
        np.rint(codes, out=codes)
        np.clip(codes, -_LEVELS, _LEVELS, out=codes)
        return _Coded(codes.astype(np.int8), scales)

    def decode(self, coded: _Coded, dtype: np.dtype) -> np.ndarray:
        out = coded.values.astype(dtype)
        out *= coded.scales[:, None].astype(dtype)
        return out


class _Bf16(_Codec):
    code = np.dtype(np.uint16)

    def encode(self, x: np.ndarray) -> _Coded:
        with np.errstate(over="ignore"):
            x32 = x.astype(np.float32, copy=False)
        bits = x32.view(np.uint32)
        up = bits >> 16
        up &= 1
        up += np.uint32(0x7FFF)
        up += bits                       # round to nearest, ties to the even upper half
        up >>= 16
        rounded = up.astype(np.uint16)
        nan = np.flatnonzero(np.isnan(x32))
        rounded.reshape(-1)[nan] = (bits.reshape(-1)[nan] >> 16).astype(np.uint16) | np.uint16(0x0040)
        return _Coded(rounded, None)

    def decode(self, coded: _Coded, dtype: np.dtype) -> np.ndarray:
        out = (coded.values.astype(np.uint32) << 16).view(np.float32)
        return out if dtype == np.float32 else out.astype(dtype)


_CODECS: dict[str, _Codec] = {"int8": _Int8(), "bf16": _Bf16()}


class ErrorFeedback:
    """The error-feedback residual of one buffer's compressed all_reduces on this member: local, never shared
    state (a joiner or a restarted process starts from zero). It changes only through `adopt`, which
    `Step` calls when the step that computed the new residual commits, so a step that fails and is retried
    runs again on the same residual and no feedback is applied twice."""

    def __init__(self) -> None:
        self.residual: Any = None           # None: nothing left out yet (zeros)

    def current(self, buf: Any) -> Any:
        """The residual to add to `buf`'s next contribution: the adopted one, or zeros shaped like `buf`."""
        if self.residual is not None:
            return self.residual
        flat = Flat(buf, "compressed_all_reduce buffer")
        return np.zeros(flat.size, flat.elems.dtype)

    def adopt(self, residual: Any) -> None:
        """Make `residual` (what a committed step's compressed_all_reduce returned) the current one."""
        self.residual = residual

    def reset(self) -> None:
        """Forget the residual (e.g. after the buffer's shape changed)."""
        self.residual = None

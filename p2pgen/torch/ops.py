"""torch.distributed's collective calls, translated onto one generation's p2pgen Backend.

Each function takes the communicator an operation was issued on (`comm`: a Backend, or a step's view of
one) and torch's arguments, checks them **at the call** (so bad input raises in the caller's frame, naming
the collective, the dtype or size and what is supported, before anything is sent and while every member
is still in step), and returns the closure that does the work on the group's worker thread.

What the closures keep: outputs are written only after every collective they need returned, so an operation
that raises leaves every tensor passed to it as it was (results go to scratch buffers first wherever the
backend's own guarantee does not cover a torch layout: lists, coalesced calls, non-contiguous tensors, the
root-only writes of reduce and gather). Which (op, dtype) pairs reduce is the backend's table
(`comm.reductions`); complex tensors reduce with SUM/AVG as their real views; data movement takes any dtype.

How the collectives torch has and p2pgen's Backend lacks are built: reduce is an all_reduce of a copy whose
result only the root keeps; gather and scatter are all_to_all with only the root's segments non-empty;
all_to_all of lists, all_gather of uneven shapes (one broadcast per rank) and reduce_scatter of uneven
shapes (an all_reduce of the concatenation) are built the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from p2pgen.collectives.backend import REDUCTIONS, ReduceOp, check_reduction

Run = Callable[[], Any]

_TORCH_OPS = {dist.ReduceOp.SUM: ReduceOp.SUM, dist.ReduceOp.AVG: ReduceOp.AVG,
              dist.ReduceOp.PRODUCT: ReduceOp.PRODUCT, dist.ReduceOp.MIN: ReduceOp.MIN,
              dist.ReduceOp.MAX: ReduceOp.MAX, dist.ReduceOp.BAND: ReduceOp.BAND,
              dist.ReduceOp.BOR: ReduceOp.BOR, dist.ReduceOp.BXOR: ReduceOp.BXOR}


# ---- argument checks ----------------------------------------------------------------------------
def reduce_op(op: Any, what: str) -> ReduceOp:
    """p2pgen's op for torch's `op` (a ReduceOp, its RedOpType, or an options object carrying one)."""
    if isinstance(op, ReduceOp):
        return op
    op = getattr(op, "reduceOp", op)
    for known, name in _TORCH_OPS.items():
        try:
            if op == known:
                return name
        except TypeError:
            break
    raise ValueError(f"{what}: reduce op {op} is not supported by p2pgen; use one of "
                     f"{', '.join(o.name for o in _TORCH_OPS)}")


def tensors_of(tensors: Sequence[Any], what: str) -> list[torch.Tensor]:
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
        if t.layout != torch.strided or t.is_quantized:
            raise TypeError(f"{what}: sparse and quantized tensors are not supported by p2pgen (got {t.layout}"
                            f"{', quantized' if t.is_quantized else ''}): pass a dense tensor")
    return list(tensors)


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _reducible(t: torch.Tensor, op: ReduceOp, comm: Any, what: str) -> torch.Tensor:
    """The tensor the backend reduces: `t`, or its real view for complex SUM/AVG; raises if op does not take it."""
    if t.is_complex() and op in (ReduceOp.SUM, ReduceOp.AVG):
        t = torch.view_as_real(t.resolve_conj() if t.is_conj() else t)
    check_reduction(what, op, dtype_name(t), getattr(comm, "reductions", REDUCTIONS))
    return t


def _same_dtype(ts: Sequence[torch.Tensor], like: torch.Tensor, what: str) -> None:
    for t in ts:
        if t.dtype != like.dtype:
            raise TypeError(f"{what}: dtypes differ ({t.dtype} vs {like.dtype}); every tensor must be {like.dtype}")


def _rank(rank: int, comm: Any, what: str) -> int:
    if not isinstance(rank, int) or not 0 <= rank < comm.world:
        raise ValueError(f"{what}={rank!r} is not a rank of this group (0..{comm.world - 1}, generation "
                         f"{comm.generation})")
    return rank


def _peer(rank: int, comm: Any, what: str) -> int:
    if _rank(rank, comm, what) == comm.rank:
        raise ValueError(f"{what}={rank} is this member itself: send/recv need another rank")
    return rank


def _count(n: int, expected: int, what: str, detail: str) -> None:
    if n != expected:
        raise ValueError(f"{what}: {detail}: got {n}, expected {expected}")


# ---- buffers ------------------------------------------------------------------------------------
def _flat(t: torch.Tensor) -> torch.Tensor:
    """A contiguous 1-D tensor holding `t`'s elements: a view when `t` is contiguous, else a copy."""
    return t.detach().reshape(-1) if t.is_contiguous() else t.detach().contiguous().view(-1)


def _scratch_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.numel(), dtype=t.dtype, device=t.device)


def _write(outs: Sequence[torch.Tensor], results: Sequence[torch.Tensor]) -> None:
    with torch.no_grad():
        for out, got in zip(outs, results):
            out.copy_(got.reshape(out.shape))


def _cat(ts: Sequence[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    if not ts:
        return torch.empty(0, dtype=like.dtype, device=like.device)
    return torch.cat([t.detach().reshape(-1) for t in ts])


def _in_place(comm_call: Callable[[torch.Tensor], Any], t: torch.Tensor) -> None:
    """comm_call on a contiguous buffer holding `t`, written back if that buffer is a copy."""
    flat = _flat(t)
    comm_call(flat)
    if flat.data_ptr() != t.data_ptr() or not t.is_contiguous():
        with torch.no_grad():
            t.copy_(flat.view(t.shape))


# ---- collectives --------------------------------------------------------------------------------
def all_reduce(comm: Any, tensors: Sequence[torch.Tensor], op: Any, what: str = "all_reduce") -> Run:
    """Every tensor reduced in place; with several (coalesced), all are written only once all succeeded."""
    name = reduce_op(op, what)
    if len(tensors) == 1 and isinstance(tensors[0], torch.Tensor) and tensors[0].layout == torch.sparse_coo:
        return _sparse_sum(comm, tensors[0], name, what)
    tensors = tensors_of(tensors, what)
    bufs = [_reducible(t, name, comm, what) for t in tensors]
    if len(bufs) == 1:
        (buf,) = bufs
        return lambda: (_in_place(lambda flat: comm.all_reduce(flat, name), buf), tensors)[1]

    def run() -> list[torch.Tensor]:
        copies = [_flat(b).clone() for b in bufs]
        for c in copies:
            comm.all_reduce(c, name)
        _write(bufs, copies)
        return tensors
    return run


def _sparse_sum(comm: Any, tensor: torch.Tensor, op: ReduceOp, what: str) -> Run:
    """SUM of sparse COO tensors (as gloo does): every member's indices and values are gathered (uneven sizes:
    one broadcast per rank), concatenated and coalesced; the tensor takes the result in place."""
    if op is not ReduceOp.SUM:
        raise TypeError(f"{what}: a sparse tensor reduces with SUM only, not {op.value}")
    check_reduction(what, op, dtype_name(tensor), getattr(comm, "reductions", REDUCTIONS))

    def run() -> list[torch.Tensor]:
        mine = tensor.detach().coalesce()
        counts = torch.zeros(comm.world, dtype=torch.int64)
        comm.all_gather(counts, torch.tensor([mine._nnz()], dtype=torch.int64))
        per_row = mine.values()[0].numel() if mine._nnz() else int(torch.tensor(mine.shape[mine.sparse_dim():]).prod())
        dims = mine.sparse_dim()
        indices = _gather_one(comm, [torch.empty(int(c) * dims, dtype=torch.int64) for c in counts],
                              mine.indices().reshape(-1))
        values = _gather_one(comm, [torch.empty(int(c) * per_row, dtype=mine.dtype) for c in counts],
                             mine.values().reshape(-1))
        total = torch.sparse_coo_tensor(torch.cat([i.view(dims, -1) for i in indices], dim=1),
                                        torch.cat([v.view(-1, *mine.shape[dims:]) for v in values]),
                                        mine.shape).coalesce()
        with torch.no_grad():
            tensor.copy_(total)
        return [tensor]
    return run


def broadcast(comm: Any, tensors: Sequence[torch.Tensor], root: int, what: str = "broadcast") -> Run:
    tensors = tensors_of(tensors, what)
    root = _rank(root, comm, f"{what} root")

    def run() -> list[torch.Tensor]:
        if len(tensors) == 1:
            _in_place(lambda flat: comm.broadcast(flat, root), tensors[0])
            return tensors
        copies = [_flat(t).clone() for t in tensors]
        for c in copies:
            comm.broadcast(c, root)
        _write(tensors, copies)
        return tensors
    return run


def reduce(comm: Any, tensors: Sequence[torch.Tensor], op: Any, root: int) -> Run:
    """The root's tensor becomes the reduction; every other member's tensor is left as it was."""
    (tensor,) = tensors_of(tensors, "reduce")
    name, root = reduce_op(op, "reduce"), _rank(root, comm, "reduce root")
    buf = _reducible(tensor, name, comm, "reduce")

    def run() -> list[torch.Tensor]:
        copy = _flat(buf).clone()
        comm.all_reduce(copy, name)
        if comm.rank == root:
            _write([buf], [copy])
        return [tensor]
    return run


def all_gather(comm: Any, output_lists: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor]) -> Run:
    """all_gather (one input) and all_gather_coalesced (several): output_lists[i][r] receives rank r's input i."""
    inputs = tensors_of(inputs, "all_gather input")
    if len(output_lists) != len(inputs):
        raise ValueError(f"all_gather: {len(output_lists)} output lists for {len(inputs)} inputs")
    for outs, inp in zip(output_lists, inputs):
        tensors_of(outs, "all_gather output")
        _count(len(outs), comm.world, "all_gather", "tensors in the output list (one per rank)")
        _same_dtype(outs, inp, "all_gather")
        _count(outs[comm.rank].numel(), inp.numel(), "all_gather", f"elements of output {comm.rank} (this rank's)")

    def run() -> list[list[torch.Tensor]]:
        gathered = [_gather_one(comm, outs, inp) for outs, inp in zip(output_lists, inputs)]
        for outs, parts in zip(output_lists, gathered):
            _write(outs, parts)
        return [list(outs) for outs in output_lists]
    return run


def _gather_one(comm: Any, outs: Sequence[torch.Tensor], inp: torch.Tensor) -> list[torch.Tensor]:
    n = inp.numel()
    if all(o.numel() == n for o in outs):
        whole = torch.empty(comm.world * n, dtype=inp.dtype, device=inp.device)
        comm.all_gather(whole, _flat(inp))
        return list(whole.split(n)) if n else [whole[:0]] * comm.world
    parts = []                                      # uneven shapes: one broadcast per rank, in rank order
    for r, out in enumerate(outs):
        part = _flat(inp).clone() if r == comm.rank else _scratch_like(out)
        comm.broadcast(part, r)
        parts.append(part)
    return parts


def all_gather_into_tensor(comm: Any, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> Run:
    """`outputs[i]` (world x inputs[i] elements) receives every rank's inputs[i] in rank order. One pair goes
    straight to the backend (an input may alias its output, as FSDP2's does); several go through scratch."""
    outputs = tensors_of(outputs, "all_gather_into_tensor output")
    inputs = tensors_of(inputs, "all_gather_into_tensor input")
    _count(len(outputs), len(inputs), "all_gather_into_tensor", "outputs (one per input)")
    for out, inp in zip(outputs, inputs):
        _same_dtype([out], inp, "all_gather_into_tensor")
        _count(out.numel(), comm.world * inp.numel(), "all_gather_into_tensor",
               f"output elements (world {comm.world} x input {inp.numel()})")
    if len(outputs) == 1 and outputs[0].is_contiguous():
        out, inp = outputs[0], inputs[0]
        return lambda: (comm.all_gather(out.detach().view(-1), _flat(inp)), [out])[1]

    def run() -> list[torch.Tensor]:
        results = []
        for out, inp in zip(outputs, inputs):
            whole = _scratch_like(out)
            comm.all_gather(whole, _flat(inp))
            results.append(whole)
        _write(outputs, results)
        return list(outputs)
    return run


def reduce_scatter(comm: Any, outputs: Sequence[torch.Tensor], input_lists: Sequence[Sequence[torch.Tensor]],
                   op: Any) -> Run:
    """outputs[i] receives the reduction over ranks of input_lists[i][this rank]."""
    outputs = tensors_of(outputs, "reduce_scatter output")
    name = reduce_op(op, "reduce_scatter")
    _count(len(input_lists), len(outputs), "reduce_scatter", "input lists (one per output)")
    pairs = []
    for out, ins in zip(outputs, input_lists):
        tensors_of(ins, "reduce_scatter input")
        _count(len(ins), comm.world, "reduce_scatter", "tensors in the input list (one per rank)")
        _same_dtype(ins, out, "reduce_scatter")
        _count(ins[comm.rank].numel(), out.numel(), "reduce_scatter", f"elements of input {comm.rank} (this rank's)")
        pairs.append((_reducible(out, name, comm, "reduce_scatter"),
                      [_reducible(i, name, comm, "reduce_scatter") for i in ins]))

    def run() -> list[torch.Tensor]:
        results = []
        for out, ins in pairs:
            whole, mine = _cat(ins, out), _scratch_like(out)
            if all(i.numel() == out.numel() for i in ins):
                comm.reduce_scatter(mine, whole, name)
            else:                                   # uneven: reduce everything, keep this rank's part
                comm.all_reduce(whole, name)
                start = sum(i.numel() for i in ins[:comm.rank])
                mine = whole[start:start + out.numel()]
            results.append(mine)
        _write([p[0] for p in pairs], results)
        return list(outputs)
    return run


def reduce_scatter_tensor(comm: Any, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                          op: Any) -> Run:
    """outputs[i] receives block `rank` of the reduction of inputs[i] (world x outputs[i] elements)."""
    outputs = tensors_of(outputs, "reduce_scatter_tensor output")
    inputs = tensors_of(inputs, "reduce_scatter_tensor input")
    name = reduce_op(op, "reduce_scatter_tensor")
    _count(len(outputs), len(inputs), "reduce_scatter_tensor", "outputs (one per input)")
    pairs = []
    for out, inp in zip(outputs, inputs):
        _same_dtype([out], inp, "reduce_scatter_tensor")
        _count(inp.numel(), comm.world * out.numel(), "reduce_scatter_tensor",
               f"input elements (world {comm.world} x output {out.numel()})")
        pairs.append((_reducible(out, name, comm, "reduce_scatter_tensor"),
                      _reducible(inp, name, comm, "reduce_scatter_tensor")))
    if len(pairs) == 1 and pairs[0][0].is_contiguous():
        out, inp = pairs[0]
        return lambda: (comm.reduce_scatter(out.detach().view(-1), _flat(inp), name), list(outputs))[1]

    def run() -> list[torch.Tensor]:
        results = []
        for out, inp in pairs:
            mine = _scratch_like(out)
            comm.reduce_scatter(mine, _flat(inp), name)
            results.append(mine)
        _write([p[0] for p in pairs], results)
        return list(outputs)
    return run


def all_to_all_single(comm: Any, output: torch.Tensor, input: torch.Tensor, output_splits: Sequence[int],
                      input_splits: Sequence[int]) -> Run:
    """Rows (dim 0) of `input` go to the ranks in order, `input_splits[j]` rows to rank j (equal parts when
    no splits are given); `output` receives `output_splits[i]` rows from rank i."""
    output, input = tensors_of([output, input], "all_to_all_single")
    _same_dtype([output], input, "all_to_all_single")
    sends = _row_splits(input, input_splits, comm.world, "all_to_all_single input")
    gets = _row_splits(output, output_splits, comm.world, "all_to_all_single output")
    _count(gets[comm.rank], sends[comm.rank], "all_to_all_single", "elements this rank sends itself")

    def run() -> list[torch.Tensor]:
        result = _scratch_like(output)
        comm.all_to_all(result, _flat(input), gets, sends)
        _write([output], [result])
        return [output]
    return run


def _row_splits(t: torch.Tensor, rows: Sequence[int], world: int, what: str) -> list[int]:
    """Element counts per rank for row splits of `t` along dim 0 (empty: equal parts)."""
    per_row = t[0].numel() if t.dim() and t.shape[0] else max(t.numel(), 1)
    if not rows:
        length = t.shape[0] if t.dim() else 1
        if length % world:
            raise ValueError(f"{what}: {length} rows do not split into {world} equal parts; pass split sizes")
        return [length // world * per_row] * world
    rows = [int(r) for r in rows]
    length = t.shape[0] if t.dim() else 1
    if len(rows) != world or any(r < 0 for r in rows) or sum(rows) != length:
        raise ValueError(f"{what}: split sizes {rows} must be {world} non-negative row counts summing to "
                         f"{length} rows")
    return [r * per_row for r in rows]


def all_to_all(comm: Any, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> Run:
    """inputs[j] goes to rank j; outputs[i] receives rank i's tensor for this rank."""
    outputs, inputs = tensors_of(outputs, "all_to_all output"), tensors_of(inputs, "all_to_all input")
    _count(len(inputs), comm.world, "all_to_all", "input tensors (one per rank)")
    _count(len(outputs), comm.world, "all_to_all", "output tensors (one per rank)")
    _same_dtype(outputs + inputs, inputs[0], "all_to_all")
    _count(outputs[comm.rank].numel(), inputs[comm.rank].numel(), "all_to_all", "elements this rank sends itself")

    def run() -> list[torch.Tensor]:
        result = torch.empty(sum(o.numel() for o in outputs), dtype=outputs[0].dtype, device=outputs[0].device)
        comm.all_to_all(result, _cat(inputs, inputs[0]), [o.numel() for o in outputs], [i.numel() for i in inputs])
        _write(outputs, list(result.split([o.numel() for o in outputs])))
        return list(outputs)
    return run


def gather(comm: Any, output_lists: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor], root: int) -> Run:
    """The root's output list receives every rank's input in rank order (an all_to_all to the root)."""
    (inp,) = tensors_of(inputs, "gather input")
    root, n = _rank(root, comm, "gather root"), inp.numel()
    outs: list[torch.Tensor] = []
    if comm.rank == root:
        if len(output_lists) != 1:
            raise ValueError(f"gather: the root needs one output list, got {len(output_lists)}")
        outs = tensors_of(output_lists[0], "gather output")
        _count(len(outs), comm.world, "gather", "tensors in the root's output list (one per rank)")
        _same_dtype(outs, inp, "gather")
        _count(outs[root].numel(), n, "gather", "elements of the root's own output")
    elif output_lists and any(len(o) for o in output_lists):
        raise ValueError(f"gather: only the root (rank {root}) passes an output list; rank {comm.rank} passed one")
    sends = [n if j == root else 0 for j in range(comm.world)]
    gets = [o.numel() for o in outs] if comm.rank == root else [0] * comm.world

    def run() -> list[list[torch.Tensor]]:
        result = torch.empty(sum(gets), dtype=inp.dtype, device=inp.device)
        comm.all_to_all(result, _flat(inp), gets, sends)
        if outs:
            _write(outs, list(result.split(gets)))
        return [outs]
    return run


def scatter(comm: Any, outputs: Sequence[torch.Tensor], input_lists: Sequence[Sequence[torch.Tensor]],
            root: int) -> Run:
    """Every rank's output receives the root's input for that rank (an all_to_all from the root)."""
    (out,) = tensors_of(outputs, "scatter output")
    root, n = _rank(root, comm, "scatter root"), out.numel()
    ins: list[torch.Tensor] = []
    if comm.rank == root:
        if len(input_lists) != 1:
            raise ValueError(f"scatter: the root needs one input list, got {len(input_lists)}")
        ins = tensors_of(input_lists[0], "scatter input")
        _count(len(ins), comm.world, "scatter", "tensors in the root's input list (one per rank)")
        _same_dtype(ins, out, "scatter")
        _count(ins[root].numel(), n, "scatter", "elements of the root's own input")
    elif input_lists and any(len(i) for i in input_lists):
        raise ValueError(f"scatter: only the root (rank {root}) passes an input list; rank {comm.rank} passed one")
    sends = [i.numel() for i in ins] if comm.rank == root else [0] * comm.world
    gets = [n if i == root else 0 for i in range(comm.world)]

    def run() -> list[torch.Tensor]:
        result = _scratch_like(out)
        comm.all_to_all(result, _cat(ins, out), gets, sends)
        _write([out], [result])
        return [out]
    return run


def barrier(comm: Any) -> Run:
    return lambda: (comm.barrier(), [])[1]


def send(comm: Any, tensors: Sequence[torch.Tensor], dst: int) -> Run:
    (tensor,) = tensors_of(tensors, "send")
    dst = _peer(dst, comm, "send dst")
    return lambda: (comm.send(_flat(tensor), dst), [tensor])[1]


def post_send(comm: Any, tensors: Sequence[torch.Tensor], dst: int) -> Run | None:
    """Post the send now (the caller's thread); returns the closure that waits until it left, or None when
    the communicator cannot post this buffer without a worker (a device buffer to stage)."""
    (tensor,) = tensors_of(tensors, "send")
    flush = comm.post_send(_flat(tensor), _peer(dst, comm, "send dst"))
    return None if flush is None else (lambda: (flush(), [tensor])[1])


def recv_any(comm: Any, tensors: Sequence[torch.Tensor]) -> Callable[[], tuple[int, list[torch.Tensor]]]:
    """Receive from whichever member sends first; the closure returns (source rank, [tensor])."""
    (tensor,) = tensors_of(tensors, "recv")

    def run() -> tuple[int, list[torch.Tensor]]:
        got = _scratch_like(tensor)
        source = comm.recv_any(got)
        _write([tensor], [got])
        return source, [tensor]
    return run


def recv(comm: Any, tensors: Sequence[torch.Tensor], src: int) -> Run:
    (tensor,) = tensors_of(tensors, "recv")
    src = _peer(src, comm, "recv src")

    def run() -> list[torch.Tensor]:
        got = _scratch_like(tensor)
        comm.recv(got, src)
        _write([tensor], [got])
        return [tensor]
    return run

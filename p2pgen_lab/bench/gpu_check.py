"""The GPU device check of the nccl backend, in one run (`python -m p2pgen_lab.bench.gpu_check`).

On one GPU it measures, side by side in the same run:
1. world 1: all_reduce sum float32 through p2pgen's NcclBackend (outputs staged, and in place) and through
   raw `cupy.cuda.nccl` on the same sizes; busbw as in nccl-tests (algbw x 2(n-1)/n; algbw for n = 1);
2. the per-generation lifecycle: `--generations` rebuilds (new unique id, init, one all_reduce, abort), with
   init and abort times;
3. where the NCCL is 2.30 or newer: `--world` processes on the one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1), the
   same all_reduce comparison, then a stall: rank 0 runs an all_reduce the others never join, and its
   watchdog must raise PeerLost after `--stall-timeout` s and abort the communicator (time reported).
Raw NCCL calls are enqueued back to back and synchronised once per size; p2pgen's are synchronous (each waits
for its event), as the Backend contract says. Prints one table (or JSON with --json). Exit code 1 when a
correctness check failed; speed is reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from typing import Any

from p2pgen.collectives.nccl_lib import NcclUnavailable

MULTI_RANK_MIN = 23000            # NCCL 2.30.0


def busbw(world: int, size: int, seconds: float) -> float:
    return size / seconds / 1e9 * (2 * (world - 1) / world if world > 1 else 1)


def _load() -> tuple[Any, Any, int]:
    from p2pgen.collectives import nccl_lib

    nccl = nccl_lib.load()
    import cupy

    return cupy, nccl, nccl_lib.cupy_major()


def _time_raw(cupy: Any, comm: Any, nccl: Any, x: Any, iters: int) -> float:
    stream = cupy.cuda.get_current_stream()
    for _ in range(3):
        comm.allReduce(x.data.ptr, x.data.ptr, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
    stream.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        comm.allReduce(x.data.ptr, x.data.ptr, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
    stream.synchronize()
    return (time.perf_counter() - start) / iters


def _time_p2pgen(cupy: Any, backend: Any, x: Any, iters: int) -> float:
    for _ in range(3):
        backend.all_reduce(x)
    cupy.cuda.get_current_stream().synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        backend.all_reduce(x)
    cupy.cuda.get_current_stream().synchronize()
    return (time.perf_counter() - start) / iters


def _iters(size: int) -> int:
    return max(10, min(200, (4 << 30) // max(size, 1)))


def compare(rank: int, world: int, ids: dict[str, str], sizes: list[int]) -> dict[str, Any]:
    """On one member: raw vs p2pgen (staged, in place) all_reduce times per size, and a correctness check."""
    cupy, nccl, major = _load()
    from p2pgen.collectives.nccl import NcclBackend
    from p2pgen.collectives.nccl_id import decode, to_cupy

    raw = nccl.NcclCommunicator(world, to_cupy(decode(ids["raw"]), major), rank)
    staged = NcclBackend(ids["staged"], rank, world, 1, init_timeout=120)
    direct = NcclBackend(ids["direct"], rank, world, 2, init_timeout=120, stage_outputs=False)
    staged.connect()
    direct.connect()
    check = cupy.full(1 << 20, rank + 1, cupy.float32)
    staged.all_reduce(check)
    ok = bool((check == world * (world + 1) / 2).all())
    rows = []
    for size in sizes:
        x = cupy.ones(size // 4, cupy.float32)
        n = _iters(size)
        rows.append({"size": size, "raw_s": _time_raw(cupy, raw, nccl, x, n),
                     "staged_s": _time_p2pgen(cupy, staged, x, n), "direct_s": _time_p2pgen(cupy, direct, x, n)})
    result = {"rank": rank, "ok": ok, "rows": rows, "init_s": staged.stats["init_s"]}
    for b in (staged, direct):
        b.abort("check done")
    raw.abort()
    return result


def lifecycle(generations: int) -> dict[str, Any]:
    """World-1 rebuilds: each generation a new id, init, one all_reduce, abort."""
    cupy, nccl, _ = _load()
    from p2pgen.collectives.nccl import NcclBackend, new_comm_id

    inits, aborts, totals, ok = [], [], [], True
    x = cupy.ones(1 << 18, cupy.float32)
    for g in range(1, generations + 1):
        start = time.perf_counter()
        b = NcclBackend(new_comm_id(nccl), 0, 1, g, init_timeout=60)
        b.connect()
        b.all_reduce(x)
        ok &= b.abort(f"generation {g + 1}") == "proved" and b.lifecycle.state.value == "aborted"
        totals.append(time.perf_counter() - start)
        inits.append(b.stats["init_s"])
        aborts.append(b.stats["abort_s"])
    return {"ok": bool(ok and bool((x == 1).all())), "generations": generations, "init_s": _median(inits),
            "abort_s": _median(aborts), "rebuild_s": _median(totals)}


def stall(rank: int, world: int, comm_id: str, timeout: float) -> dict[str, Any]:
    """Rank 0 runs an all_reduce nobody joins: its watchdog must end it with PeerLost and abort."""
    cupy, _, _ = _load()
    from p2pgen.collectives.nccl import NcclBackend
    from p2pgen.errors import PeerLost

    b = NcclBackend(comm_id, rank, world, 9, init_timeout=120, op_timeout=timeout)
    b.connect()
    b.barrier()
    result: dict[str, Any] = {"rank": rank}
    if rank == 0:
        x = cupy.full(1 << 20, 3.0, cupy.float32)
        start = time.perf_counter()
        try:
            b.all_reduce(x)
            result["ok"] = False
        except PeerLost:
            result["ok"] = bool((x == 3.0).all())     # staged: the user buffer is untouched
        result["detect_s"] = time.perf_counter() - start
        result["abort_s"] = b.stats["abort_s"]
    else:
        time.sleep(timeout + 2.0)
        result["ok"] = b.abort("stall check done") == "proved"
    return result


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if s else 0.0


def _worker(rank: int, world: int, ids: dict[str, str], sizes: list[int], stall_timeout: float, q: Any) -> None:
    try:
        q.put(("compare", compare(rank, world, ids, sizes)))
        q.put(("stall", stall(rank, world, ids["stall"], stall_timeout)))
    except BaseException as e:   # reported by the parent
        q.put(("error", {"rank": rank, "error": f"{type(e).__name__}: {e}"}))


def multi_rank(world: int, sizes: list[int], stall_timeout: float) -> dict[str, Any]:
    _, nccl, _ = _load()
    from p2pgen.collectives.nccl import new_comm_id

    ids = {k: new_comm_id(nccl) for k in ("raw", "staged", "direct", "stall")}
    os.environ["NCCL_MULTI_RANK_GPU_ENABLE"] = "1"
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, world, ids, sizes, stall_timeout, q), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    got: dict[str, list[dict[str, Any]]] = {"compare": [], "stall": [], "error": []}
    deadline = time.monotonic() + 300
    while sum(len(v) for v in got.values()) < 2 * world and not got["error"] and time.monotonic() < deadline:
        try:
            kind, value = q.get(timeout=5)
            got[kind].append(value)
        except Exception:
            if not any(p.is_alive() for p in procs):
                break
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
    return got


def _rows(world: int, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per size, the slowest member's time of each path."""
    rows = []
    for i, r in enumerate(results[0]["rows"]):
        row = {"size": r["size"]}
        for k in ("raw_s", "staged_s", "direct_s"):
            row[k] = max(x["rows"][i][k] for x in results)
            row[k.replace("_s", "_busbw")] = busbw(world, r["size"], row[k])
        row["ratio_staged"] = row["staged_busbw"] / row["raw_busbw"]
        row["ratio_direct"] = row["direct_busbw"] / row["raw_busbw"]
        rows.append(row)
    return rows


def format_table(world: int, rows: list[dict[str, Any]]) -> str:
    head = (f"# all_reduce sum float32, world {world} on one GPU: busbw GB/s\n"
            f"# {'size(B)':>12} {'raw nccl':>10} {'p2pgen staged':>14} {'ratio':>6} {'p2pgen in-place':>16} "
            f"{'ratio':>6}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['size']:>14} {r['raw_busbw']:>10.2f} {r['staged_busbw']:>14.2f} {r['ratio_staged']:>6.3f} "
                     f"{r['direct_busbw']:>16.2f} {r['ratio_direct']:>6.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m p2pgen_lab.bench.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", default=["1M", "16M", "128M", "512M"])
    p.add_argument("--world", type=int, default=4, help="ranks on the one GPU when NCCL >= 2.30 (default 4)")
    p.add_argument("--generations", type=int, default=20)
    p.add_argument("--stall-timeout", type=float, default=3.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    from p2pgen.collectives.nccl_buffers import version_text
    from p2pgen_lab.bench.allreduce import parse_size

    sizes = [parse_size(s) for s in args.sizes]
    try:
        cupy, nccl, major = _load()
    except NcclUnavailable as e:            # no GPU stack here: say so, and why; nothing was checked
        skipped = {"skipped": f"no CuPy NCCL on this machine: {e}"}
        print(json.dumps(skipped, indent=1) if args.json else _text(skipped))
        return 0
    version = int(nccl.get_version())
    report: dict[str, Any] = {"cupy": cupy.__version__, "cupy_major": major, "nccl": version_text(version),
                              "gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()}
    one = compare(0, 1, {k: _new(nccl) for k in ("raw", "staged", "direct")}, sizes)
    report["world1"] = {"ok": one["ok"], "rows": _rows(1, [one])}
    report["lifecycle"] = lifecycle(args.generations)
    if version >= MULTI_RANK_MIN and args.world > 1:
        got = multi_rank(args.world, sizes, args.stall_timeout)
        report["multi"] = {"world": args.world, "errors": got["error"], "stall": got["stall"],
                           "ok": len(got["compare"]) == args.world
                           and all(x["ok"] for x in got["compare"] + got["stall"]),
                           "rows": _rows(args.world, got["compare"]) if len(got["compare"]) == args.world else []}
    else:
        report["multi"] = {"skipped": f"NCCL {version_text(version)} < 2.30 or --world 1: no multi-rank run"}
    ok = report["world1"]["ok"] and report["lifecycle"]["ok"] and report["multi"].get("ok", True)
    print(json.dumps(report, indent=1) if args.json else _text(report))
    return 0 if ok else 1


def _new(nccl: Any) -> str:
    from p2pgen.collectives.nccl import new_comm_id

    return new_comm_id(nccl)


def _text(report: dict[str, Any]) -> str:
    if "skipped" in report:
        return f"# GPU part skipped: {report['skipped']}"
    out = [f"# {report['gpu']} · CuPy {report['cupy']} · NCCL {report['nccl']}",
           format_table(1, report["world1"]["rows"]), f"# world-1 correctness: {report['world1']['ok']}"]
    lc = report["lifecycle"]
    out.append(f"# lifecycle x{lc['generations']} (median): init {lc['init_s'] * 1e3:.1f} ms, abort "
               f"{lc['abort_s'] * 1e3:.2f} ms, rebuild {lc['rebuild_s'] * 1e3:.1f} ms, ok {lc['ok']}")
    multi = report["multi"]
    if "skipped" in multi:
        out.append(f"# multi-rank: {multi['skipped']}")
    else:
        if multi["rows"]:
            out.append(format_table(multi["world"], multi["rows"]))
        for s in multi["stall"]:
            if s.get("rank") == 0:
                out.append(f"# stall: watchdog raised after {s['detect_s']:.2f} s, abort {s['abort_s'] * 1e3:.2f} ms, "
                           f"buffer untouched {s['ok']}")
        out.append(f"# multi-rank ok: {multi['ok']} errors: {multi['errors']}")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())

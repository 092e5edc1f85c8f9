"""all_reduce benchmark: p2pgen's tcp backend and torch gloo, same machine, same run, one after the other.

Each backend runs `world` processes on loopback, or one process in each host of an emulated cluster
(`p2pgen_lab.rigs.netns`: network namespaces on a bridge with shaped links; the worker enters its host before it
opens a socket, and both backends use the hosts' own addresses); both groups are started up front and take turns: for
every size, `rounds` rounds of (p2pgen, gloo) (which one goes first alternates), each round `iters` timed
calls after a warm-up. A round's time is the slowest rank's mean; a size's time is the median over its
rounds, and the table adds the min..max over the rounds of each round's ratio. Interleaving at that grain
exposes both backends to the same background load on a shared machine, which a run of one backend after
the other does not; 21 rounds by default: with 3 the median ratio at 64 MiB moved by 0.2 or more between
runs on a shared 2-core machine, with 11 it still moved by 9 % (2.01-2.20, world 4, three runs). As in
nccl-tests: algbw = bytes / time and busbw = algbw * 2 (world - 1) / world
(what each link carries in a ring all-reduce).

`encrypt=True` (`--encrypt`) adds a third group, p2pgen with sealed links (`p2pgen.transport.seal`), to the same
interleaved rounds: its time beside plain p2pgen's, the cost as the sealed/plain time ratio (median, and min..max
over the rounds), and the per-core AES-256-GCM throughput of the frame seal measured in the same run. It composes
with the other options (`--no-shm`, `--chunk`, `--world`, `--no-gloo`); sizes that take shared memory never leave
the host and are not sealed, so measure the ring with `--no-shm`.

`compress="int8"` or `"bf16"` (`--compress`) adds a group running p2pgen's compressed all_reduce
(`p2pgen.collectives.compress`) to the same interleaved rounds: its time beside plain p2pgen's, the
compressed/plain time ratio, and the payload bytes each rank sends per call on both (the backend's counters,
rank 0's: every rank sends the same), with their ratio. Plain p2pgen through shared memory sends almost
nothing: compare with `--no-shm` (or `--hosts`). Not combined with `--encrypt`.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import socket
import statistics
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from p2pgen_lab.rigs.netns import EmulatedCluster

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
JOB = "bench-allreduce"
ROUNDS = 21


@dataclass
class Row:
    size: int
    count: int
    p2pgen_s: float
    gloo_s: float | None
    ratio_min: float | None = None     # min and max over the rounds of that round's gloo time / p2pgen time
    ratio_max: float | None = None
    path: str = "ring"                 # how p2pgen's all_reduce ran: "shm" (shared memory) or "ring" (TCP)
    sealed_s: float | None = None      # p2pgen with --encrypt, in the same rounds (None: not measured)
    seal_ratio_min: float | None = None   # min and max over the rounds of that round's sealed time / plain time
    seal_ratio_max: float | None = None
    compress: str | None = None        # the compressed group's mode (None: not measured)
    compressed_s: float | None = None
    comp_ratio_min: float | None = None   # min and max over the rounds of that round's compressed / plain time
    comp_ratio_max: float | None = None
    sent_bytes: int | None = None         # payload bytes rank 0 sent per call: plain p2pgen, compressed
    compressed_sent_bytes: int | None = None


def parse_size(text: str) -> int:
    t = text.strip().upper().rstrip("B").rstrip("I")
    unit = t[-1] if t and t[-1] in _UNITS else ""
    number = t[:-1] if unit else t
    if not number.isdigit() or int(number) * _UNITS[unit] < 4:
        raise ValueError(f"size {text!r}: give bytes (>= 4) like 4096, 4K, 64M")
    return int(number) * _UNITS[unit]


def iterations(size: int) -> int:
    return max(5, min(500, (512 << 20) // max(size, 1)))


def run(world: int, sizes: list[int], iters: int = 0, chunk_bytes: int = 1 << 20,
        gloo: bool = True, rounds: int = ROUNDS, shm: bool = True, hosts: EmulatedCluster | None = None,
        encrypt: bool = False, compress: str | None = None, idle: float = 0.0) -> list[Row]:
    """Time every size on both backends.

    Args:
        world: processes (with `hosts`: one per host, so `len(hosts.names)`).
        shm: False starts p2pgen's workers with P2PGEN_SHM=0, so that every size takes the TCP ring.
        hosts: an emulated cluster already created: rank i runs inside host i.
        encrypt: also time p2pgen with sealed links in the same rounds.
        compress: "int8" or "bf16": also time p2pgen's compressed all_reduce in the same rounds.
        idle: seconds every rank sleeps before each timed call (not timed): the link idles between
            collectives, as between DiLoCo's outer steps, so a call pays TCP's restart after idle.
    Raises:
        ValueError: `world` differs from the cluster's host count; an unknown `compress`; `compress` with
            `encrypt`.
    """
    from p2pgen.collectives.compress import check_compression

    if hosts is not None and world != len(hosts.names):
        raise ValueError(f"world {world} on an emulated cluster of {len(hosts.names)} hosts: one rank per host")
    if check_compression(compress) and encrypt:
        raise ValueError("compress and encrypt: measure one at a time")
    places = [(hosts.names[r], hosts.addrs[r]) for r in range(world)] if hosts else [("", "127.0.0.1")] * world
    plan = [(s, iters or iterations(s)) for s in sizes]
    groups = {"p2pgen": _Group(places, "p2pgen", chunk_bytes, shm)}
    paths: dict[int, str] = {}
    sent: dict[str, list[int | None]] = {"p2pgen": [None] * len(plan), "compressed": [None] * len(plan)}
    try:
        if compress:
            groups["compressed"] = _Group(places, "p2pgen", chunk_bytes, shm, compress=compress)
        if encrypt:
            groups["sealed"] = _Group(places, "p2pgen", chunk_bytes, shm, encrypt=True)
        if gloo:
            groups["gloo"] = _Group(places, "gloo", chunk_bytes, shm)
        times: dict[str, list[list[float]]] = {name: [[] for _ in plan] for name in groups}
        for i, (size, n) in enumerate(plan):
            for k in range(rounds):
                names = list(groups) if k % 2 == 0 else list(groups)[::-1]    # who goes first alternates
                for name in names:
                    seconds, on_shm, nbytes = groups[name].time(size, n, idle)
                    times[name][i].append(seconds)
                    if name in sent:
                        sent[name][i] = nbytes
                    if name == "p2pgen":
                        paths[i] = "shm" if on_shm else "ring"
    finally:
        for group in groups.values():
            group.close()
    med = {name: [statistics.median(t) for t in ts] for name, ts in times.items()}
    rows = []
    for i, (s, _) in enumerate(plan):
        row = Row(s, s // 4, med["p2pgen"][i], med["gloo"][i] if gloo else None, path=paths[i])
        if gloo:
            ratios = [g / p for p, g in zip(times["p2pgen"][i], times["gloo"][i])]
            row.ratio_min, row.ratio_max = min(ratios), max(ratios)
        if encrypt:
            costs = [e / p for p, e in zip(times["p2pgen"][i], times["sealed"][i])]
            row.sealed_s, row.seal_ratio_min, row.seal_ratio_max = med["sealed"][i], min(costs), max(costs)
        if compress:
            costs = [c / p for p, c in zip(times["p2pgen"][i], times["compressed"][i])]
            row.compress, row.compressed_s = compress, med["compressed"][i]
            row.comp_ratio_min, row.comp_ratio_max = min(costs), max(costs)
            row.sent_bytes, row.compressed_sent_bytes = sent["p2pgen"][i], sent["compressed"][i]
        rows.append(row)
    return rows


def seal_throughput(nbytes: int = 1 << 20, seconds: float = 0.3) -> tuple[float, float]:
    """(encrypt, decrypt) GB/s of one core with the seal's cipher (AES-256-GCM, OpenSSL through `cryptography`)
    on frames of `nbytes` with a frame header as associated data, each timed for about `seconds` (a throwaway
    key and nonce: only the speed is measured)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from p2pgen.transport import frame

    aead, nonce, header = AESGCM(os.urandom(32)), bytes(12), bytes(frame.HEADER_BYTES)
    plain, wire, out = bytearray(os.urandom(nbytes)), bytearray(nbytes + 16), bytearray(nbytes)

    def rate(step) -> float:
        count, start = 0, time.perf_counter()
        while count < 3 or time.perf_counter() - start < seconds:
            step()
            count += 1
        return count * nbytes / (time.perf_counter() - start) / 1e9

    encrypt = rate(lambda: aead.encrypt_into(nonce, plain, header, wire))
    return encrypt, rate(lambda: aead.decrypt_into(nonce, wire, header, out))


def busbw(world: int, size: int, seconds: float) -> float:
    return size / seconds / 1e9 * (2 * (world - 1) / world if world > 1 else 1)


def format_table(world: int, rows: list[Row], where: str = "127.0.0.1", link_bits: int | None = None,
                 seal_rates: tuple[float, float] | None = None) -> str:
    """The nccl-tests-style table; `where` names the place (loopback or the emulated cluster), `link_bits` (one
    shaped rate for every link) adds each backend's busbw as a fraction of that rate; with sealed rows, their
    columns and the cost ratio, and `seal_rates` (`seal_throughput()`) as a closing line."""
    if any(r.sealed_s is not None for r in rows):
        return _sealed_table(world, rows, seal_rates, where)
    if any(r.compressed_s is not None for r in rows):
        return _compressed_table(world, rows, where)
    head = (f"# all_reduce sum float32, world {world} on {where}, {os.cpu_count()} CPUs\n"
            f"# {'':>24}{'p2pgen':^36}{'torch gloo':^36}\n"
            f"# {'size(B)':>12} {'count':>10} " + f"{'time(us)':>12} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11} " * 2
            + f"{'busbw ratio':>11} {'per round':>11} {'p2pgen path':>11}"
            + (f" {'p2pgen/link':>11} {'gloo/link':>9}" if link_bits else ""))
    lines = [head]
    for r in rows:
        cells = [f"{r.size:>14} {r.count:>10} ", _cells(world, r.size, r.p2pgen_s)]
        cells.append(_cells(world, r.size, r.gloo_s))
        cells.append(f"{r.gloo_s / r.p2pgen_s:>11.2f}" if r.gloo_s else f"{'-':>11}")
        spread = f"{r.ratio_min:.2f}..{r.ratio_max:.2f}" if r.ratio_min is not None else "-"
        cells.append(f" {spread:>11} {r.path:>11}")
        if link_bits:
            cells.append(f" {_of_link(world, r.size, r.p2pgen_s, link_bits):>11} "
                         f"{_of_link(world, r.size, r.gloo_s, link_bits):>9}")
        lines.append("".join(cells))
    lines.append("# p2pgen path: shm = shared memory (every rank on this host), ring = the TCP ring (other hosts, "
                 "or P2PGEN_SHM=0; `--no-shm` measures it)")
    return "\n".join(lines)


def _of_link(world: int, size: int, seconds: float | None, link_bits: int) -> str:
    """busbw as a fraction of the link rate (each link of a ring carries busbw)."""
    return "-" if seconds is None else f"{busbw(world, size, seconds) * 8e9 / link_bits:.2f}"


def _sealed_table(world: int, rows: list[Row], seal_rates: tuple[float, float] | None, where: str) -> str:
    gloo = any(r.gloo_s is not None for r in rows)
    head = (f"# all_reduce sum float32, world {world} on {where}, {os.cpu_count()} CPUs: plain vs sealed "
            "(--encrypt)\n"
            f"# {'':>24}{'p2pgen plain':^36}{'p2pgen sealed':^36}" + (f"{'torch gloo':^36}" if gloo else "") + "\n"
            f"# {'size(B)':>12} {'count':>10} " + f"{'time(us)':>12} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11} "
            * (3 if gloo else 2) + f"{'sealed/plain':>12} {'per round':>11} {'p2pgen path':>11}")
    lines = [head]
    for r in rows:
        cells = [f"{r.size:>14} {r.count:>10} ", _cells(world, r.size, r.p2pgen_s), _cells(world, r.size, r.sealed_s)]
        if gloo:
            cells.append(_cells(world, r.size, r.gloo_s))
        cells.append(f"{r.sealed_s / r.p2pgen_s:>12.3f}")
        cells.append(f" {f'{r.seal_ratio_min:.2f}..{r.seal_ratio_max:.2f}':>11} {r.path:>11}")
        lines.append("".join(cells))
    lines.append("# sealed/plain: time ratio, median over the interleaved rounds (1.05 = 5 % slower); per round: its "
                 "min..max.\n# Sizes on the shm path never leave the host and are not sealed: measure the ring with "
                 "--no-shm")
    if seal_rates is not None:
        lines.append(f"# AES-256-GCM on one core (1 MiB frames): encrypt {seal_rates[0]:.2f} GB/s, decrypt "
                     f"{seal_rates[1]:.2f} GB/s")
    return "\n".join(lines)


def _compressed_table(world: int, rows: list[Row], where: str) -> str:
    gloo = any(r.gloo_s is not None for r in rows)
    mode = rows[0].compress
    head = (f"# all_reduce sum float32, world {world} on {where}, {os.cpu_count()} CPUs: plain vs compressed "
            f"({mode})\n"
            f"# {'':>24}{'p2pgen plain':^36}{f'p2pgen {mode}':^36}" + (f"{'torch gloo':^36}" if gloo else "") + "\n"
            f"# {'size(B)':>12} {'count':>10} " + f"{'time(us)':>12} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11} "
            * (3 if gloo else 2) + f"{'comp/plain':>10} {'per round':>11} {'sent plain':>12} {'sent comp':>12} "
            f"{'sent ratio':>10} {'p2pgen path':>11}")
    lines = [head]
    for r in rows:
        cells = [f"{r.size:>14} {r.count:>10} ", _cells(world, r.size, r.p2pgen_s),
                 _cells(world, r.size, r.compressed_s)]
        if gloo:
            cells.append(_cells(world, r.size, r.gloo_s))
        cells.append(f"{r.compressed_s / r.p2pgen_s:>10.3f}")
        cells.append(f" {f'{r.comp_ratio_min:.2f}..{r.comp_ratio_max:.2f}':>11}")
        ratio = f"{r.compressed_sent_bytes / r.sent_bytes:.3f}" if r.sent_bytes else "-"
        cells.append(f" {r.sent_bytes:>12} {r.compressed_sent_bytes:>12} {ratio:>10} {r.path:>11}")
        lines.append("".join(cells))
    lines.append("# comp/plain: time ratio, median over the interleaved rounds (0.5 = twice as fast); per round: its "
                 "min..max.\n# busbw of the compressed group: the float32 size over its time, as for plain. sent: "
                 "payload bytes rank 0 sent per call (the backend's counters).\n# Sizes on the shm path move in "
                 "memory, not on the wire: compare with --no-shm or --hosts")
    return "\n".join(lines)


def _cells(world: int, size: int, seconds: float | None) -> str:
    if seconds is None:
        return f"{'-':>12} {'-':>11} {'-':>11} "
    return f"{seconds * 1e6:>12.1f} {size / seconds / 1e9:>11.3f} {busbw(world, size, seconds):>11.3f} "


def to_json(world: int, rows: list[Row], seal_rates: tuple[float, float] | None = None) -> str:
    out = []
    for r in rows:
        d = asdict(r)
        d["p2pgen_busbw_GBps"] = busbw(world, r.size, r.p2pgen_s)
        d["gloo_busbw_GBps"] = busbw(world, r.size, r.gloo_s) if r.gloo_s else None
        if r.sealed_s is not None:
            d["sealed_busbw_GBps"] = busbw(world, r.size, r.sealed_s)
            d["sealed_over_plain"] = r.sealed_s / r.p2pgen_s
        if r.compressed_s is not None:
            d["compressed_over_plain"] = r.compressed_s / r.p2pgen_s
            d["compressed_busbw_GBps"] = busbw(world, r.size, r.compressed_s)
        out.append(d)
    doc = {"world": world, "op": "sum", "dtype": "float32", "rows": out}
    if seal_rates is not None:
        doc["aes256gcm_one_core_GBps"] = {"encrypt": seal_rates[0], "decrypt": seal_rates[1]}
    return json.dumps(doc, indent=2)


# ---- workers -------------------------------------------------------------------------------------
class _Group:
    """`world` worker processes of one backend, idle between the sizes they are told to time."""

    def __init__(self, places: list[tuple[str, str]], backend: str, chunk_bytes: int, shm: bool,
                 encrypt: bool = False, compress: str | None = None) -> None:
        """`places[rank]`: (network namespace, or "" for this one; the address the rank listens on)."""
        ctx = mp.get_context("spawn")
        self.pipes, self.procs = [], []
        store_port = _free_port() if backend == "gloo" else 0
        try:
            for rank in range(len(places)):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_worker, args=(child, backend, rank, places, chunk_bytes, store_port, shm,
                                                      encrypt, compress), daemon=True)
                p.start()
                self.pipes.append(parent)
                self.procs.append(p)
            if backend == "p2pgen":
                ports = [pipe.recv() for pipe in self.pipes]
                for pipe in self.pipes:
                    pipe.send(ports)
        except BaseException:
            self.close()
            raise

    def time(self, size: int, iters: int, idle: float = 0.0) -> tuple[float, bool, int | None]:
        """The slowest rank's mean seconds per call (each after `idle` seconds of sleep, not timed), whether
        rank 0's calls ran through shared memory, and the payload bytes rank 0 sent per call (None: gloo, no
        counters)."""
        for pipe in self.pipes:
            pipe.send((size, iters, idle))
        reports = [pipe.recv() for pipe in self.pipes]
        return max(seconds for seconds, _, _ in reports), reports[0][1], reports[0][2]

    def close(self) -> None:
        stop_workers(self.pipes, self.procs)


def stop_workers(pipes: list, procs: list) -> None:
    """Tell each worker to end (None on its pipe), then join it; one that does not end in 30 s is killed."""
    for pipe in pipes:
        try:
            pipe.send(None)
        except OSError:
            pass
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()
            p.join(5)


def _worker(pipe, backend: str, rank: int, places: list[tuple[str, str]], chunk_bytes: int, store_port: int,
            shm: bool, encrypt: bool, compress: str | None) -> None:
    netns_name, _ = places[rank]
    if netns_name:
        from p2pgen_lab.rigs.netns import enter

        enter(netns_name)
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")   # c10d warns that hosts have no DNS names
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if not shm:
        os.environ["P2PGEN_SHM"] = "0"
    import torch

    torch.set_num_threads(1)
    counters = None
    if backend == "p2pgen":
        step, close, on_shm, counters = _p2pgen_step(pipe, rank, places, chunk_bytes, encrypt, compress)
    else:
        (step, close), on_shm = _gloo_step(rank, places, store_port), lambda: False
    try:
        while (job := pipe.recv()) is not None:
            seconds, nbytes = _time(step, *job, counters=counters)
            pipe.send((seconds, on_shm(), nbytes))
    finally:
        close()


def _time(step, size: int, iters: int, idle: float, counters=None) -> tuple[float, int | None]:
    """Mean seconds per call of `step` on `size` bytes of float32 (each after `idle` seconds of sleep, which
    are not timed), and the payload bytes sent per call."""
    import torch

    buf = torch.zeros(size // 4, dtype=torch.float32)
    buf[::7] = 1.0            # a compressed all_reduce codes values, not just zeros
    for i in range(max(2, iters // 10)):
        step(buf)
        _keep_finite(buf, i)
    step(torch.zeros(1))      # line the ranks up
    before = counters()["bytes_sent"] if counters else 0
    seconds = 0.0
    for i in range(iters):
        if idle:
            time.sleep(idle)
        t0 = time.perf_counter()
        step(buf)
        seconds += time.perf_counter() - t0
        _keep_finite(buf, i)
    seconds /= iters
    return seconds, (counters()["bytes_sent"] - before) // iters if counters else None


def _keep_finite(buf, i: int) -> None:
    """Every 8th call, scale `buf` back to a maximum near 1 by a power of two (exact): a sum over N ranks grows
    N-fold per call and would reach inf, which the codecs and kernels treat apart. The same on every rank and
    backend, one pass over the buffer per 8 calls."""
    if i % 8 == 7:
        top = float(buf.abs().max())
        if top > 1.0:
            buf.mul_(2.0 ** -math.frexp(top)[1])


def _p2pgen_step(pipe, rank: int, places: list[tuple[str, str]], chunk_bytes: int, encrypt: bool,
                 compress: str | None):
    from p2pgen.collectives import TcpBackend
    from p2pgen.collectives.compress import compressed_all_reduce
    from p2pgen.testing.cluster import SECRET
    from p2pgen.testing.ports import open_transport
    from p2pgen.transport import Endpoint, Group, TransportConfig

    config = TransportConfig(chunk_bytes=chunk_bytes, max_frame_bytes=max(16 << 20, chunk_bytes), encrypt=encrypt)
    transport = open_transport(JOB, SECRET, f"bench{rank}", rank + 1, config, host=places[rank][1])
    pipe.send(transport.port)
    ports = pipe.recv()
    members = [Endpoint(f"bench{i}", i + 1, places[i][1], ports[i]) for i in range(len(places))]
    backend = TcpBackend(transport, Group(JOB, 1, members, rank))
    step = backend.all_reduce
    if compress:
        def step(buf):
            return compressed_all_reduce(backend, buf, mode=compress) if buf.numel() > 1 else backend.all_reduce(buf)
    return step, transport.close, lambda: backend.shm_active, backend.counters


def _gloo_step(rank: int, places: list[tuple[str, str]], store_port: int):
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0" if places[rank][0] else "lo")
    dist.init_process_group("gloo", init_method=f"tcp://{places[0][1]}:{store_port}", rank=rank,
                            world_size=len(places))
    return dist.all_reduce, dist.destroy_process_group


def _free_port() -> int:
    """A free port below the ephemeral range (the bench runs next to the tests' port rules)."""
    import random

    for _ in range(200):
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise OSError("no free port in 20000-31999 for the gloo store")

"""`p2pgen bench channel`: the channel fault experiment on CPU. Does trusting the sender's completion lose or
duplicate messages under faults, and what does exactly-once (receiver consumption log, dedup, resend
from the log) cost when nothing fails?

Part 1, faults: for each fault (F1 receiver SIGKILL + restart, F2 sender self-abort, F3 receiver
SIGSTOP 100-800 ms), message size and mode (naive, batched, exactly_once), one stream with `injections`
faults at random points (`p2pgen_lab.rigs.channels.run_cell`); losses and duplicates come from the
receiver's consumption log. Part 2, fault-free throughput of `naive` (no dedup) and `exactly_once`
(dedup), interleaved run by run so both see the same machine load; the overhead is the ratio of the
medians, measured in this run.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass

from p2pgen.channel.config import BATCHED, EXACTLY_ONCE, NAIVE
from p2pgen_lab.rigs.channels import FAULTS, Cell, cell_json, run_cell, throughput

MODES = (NAIVE, BATCHED, EXACTLY_ONCE)
SIZES = (16, 64 << 10)
_THROUGHPUT_BYTES = 256 << 20


@dataclass
class Throughput:
    size: int
    count: int
    naive: list[float]           # messages per second, one per repeat
    exactly_once: list[float]

    @property
    def ratio(self) -> float:
        """exactly_once / naive, medians: below 1 is the cost of dedup."""
        return statistics.median(self.exactly_once) / statistics.median(self.naive)

    def pair_ratios(self) -> list[float]:
        return [e / n for e, n in zip(self.exactly_once, self.naive)]


def message_count(size: int, seconds_budget: float = 2.0) -> int:
    """Messages per throughput run: about a couple of seconds at CPU-loopback rates."""
    return max(2000, min(30000, _THROUGHPUT_BYTES // size, int(seconds_budget * 8000)))


def run_faults(injections: int, sizes=SIZES, faults=FAULTS, modes=MODES, window: int = 32, seed: int = 0,
               progress=None) -> list[Cell]:
    cells = []
    for fault in faults:
        for size in sizes:
            for mode in modes:
                cell = run_cell(mode, fault, size, injections, window=window, seed=seed)
                cells.append(cell)
                if progress:
                    progress(cell)
                seed += 1
    return cells


def run_throughput(repeats: int, sizes=SIZES, window: int = 32) -> list[Throughput]:
    rows = []
    for size in sizes:
        count = message_count(size)
        row = Throughput(size, count, [], [])
        for _ in range(repeats):
            row.naive.append(throughput(NAIVE, size, count, window=window))
            row.exactly_once.append(throughput(EXACTLY_ONCE, size, count, window=window))
        rows.append(row)
    return rows


def format_faults(cells: list[Cell], window: int) -> str:
    by = {(c.fault, c.size, c.mode): c for c in cells}
    keys = sorted({(c.fault, c.size) for c in cells})
    modes = [m for m in MODES if any(c.mode == m for c in cells)]
    head = [f"# channel faults on 127.0.0.1, {os.cpu_count()} CPUs; window {window}, batch 16; "
            "errors counted in the receiver's consumption log",
            f"# {'':>13}" + "".join(f"{m:^38}" for m in modes),
            f"# {'fault':>5} {'size(B)':>7}"
            + f" {'inj':>4} {'trig':>4} {'dup':>6} {'loss':>6} {'dup/t':>6} {'loss/t':>6}" * len(modes)]
    lines = head
    for fault, size in keys:
        row = f"{fault:>7} {size:>7}"
        for m in modes:
            c = by.get((fault, size, m))
            row += _fault_cells(c) if c else f" {'-':>4}" * 2 + f" {'-':>6}" * 4
        lines.append(row)
    for m in modes:
        mine = [c for c in cells if c.mode == m]
        lines.append(f"# {m}: {sum(c.injections for c in mine)} injected faults, "
                     f"{sum(c.triggers for c in mine)} recoveries, {sum(c.duplicates for c in mine)} duplicates, "
                     f"{sum(c.losses for c in mine)} losses, {sum(c.corrupt_consumed for c in mine)} corrupt "
                     f"messages consumed, {sum(c.sent for c in mine)} messages")
    return "\n".join(lines)


def _fault_cells(c: Cell) -> str:
    t = max(c.triggers, 1)
    return (f" {c.injections:>4} {c.triggers:>4} {c.duplicates:>6} {c.losses:>6} "
            f"{c.duplicates / t:>6.2f} {c.losses / t:>6.2f}")


def format_throughput(rows: list[Throughput]) -> str:
    lines = [f"# fault-free throughput, median of {len(rows[0].naive) if rows else 0} interleaved runs "
             "(messages/s; MB/s)",
             f"# {'size(B)':>7} {'count':>6} {'naive (no dedup)':>22} {'exactly_once (dedup)':>22} "
             f"{'ratio':>7} {'pair ratios min..max':>22}"]
    for r in rows:
        n, e = statistics.median(r.naive), statistics.median(r.exactly_once)
        pairs = r.pair_ratios()
        lines.append(f"{r.size:>9} {r.count:>6} {n:>10.0f} {n * r.size / 1e6:>10.2f}  "
                     f"{e:>10.0f} {e * r.size / 1e6:>10.2f}  {r.ratio:>7.3f} "
                     f"{min(pairs):>10.3f}..{max(pairs):<10.3f}")
    return "\n".join(lines)


def to_json(cells: list[Cell], rows: list[Throughput], window: int) -> str:
    return json.dumps({"window": window, "cells": [cell_json(c) for c in cells],
                       "throughput": [{**asdict(r), "ratio": r.ratio} for r in rows]}, indent=2)


def main(injections: int, repeats: int, sizes: list[int], faults: list[str], window: int, as_json: bool,
         out: str | None) -> int:
    progress = None if as_json else (lambda c: print(f"  {c.fault} {c.size}B {c.mode}: {c.triggers} recoveries, "
                                                      f"{c.duplicates} dup, {c.losses} loss", flush=True))
    cells = run_faults(injections, sizes, faults, window=window, progress=progress) if injections else []
    rows = run_throughput(repeats, sizes, window) if repeats else []
    text = to_json(cells, rows, window)
    if out:
        with open(out, "w") as f:
            f.write(text)
    if as_json:
        print(text)
    else:
        if cells:
            print(format_faults(cells, window))
        if rows:
            print(format_throughput(rows))
    return 0

"""Figures of `p2pgen sim`: the U-curve of the heartbeat timeout and the morph of a cluster under churn.

Owns: drawing only (matplotlib, imported here and nowhere else, with the non-interactive Agg backend).
Invariant: a figure plots result objects computed elsewhere; every axis carries its unit, every
figure a legend.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from p2pgen.sim.engine import Run  # noqa: E402
from p2pgen.sim.report import P2PGEN_MTBF, ChurnResult, DetectorResult  # noqa: E402
from p2pgen.sim.tables import (  # noqa: E402
    MTBFS, P2PGEN_TIMEOUTS, PHI_FLOORS, SEED_MTBF_ROWS, SEED_TIMEOUT_ROWS, TIMEOUTS,
)

BAND_COLORS = {"hang": "darkred", "reconfigure": "salmon", "false eviction": "tab:purple"}
KIND_BANDS = {"hang": "hang", "evict": "reconfigure", "rejoin": "reconfigure",
              "false-evict": "false eviction", "false-rejoin": "false eviction"}


def detector_figure(r: DetectorResult, path: str | Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6), constrained_layout=True)
    rows = r.seed_sweep
    left.plot(TIMEOUTS, [s.hang_cost for s in rows], "-o", color="tab:red", label="detection stall (hang)")
    left.plot(TIMEOUTS, [s.fp_cost for s in rows], "-o", color="tab:purple", label="false positives (evict + rejoin)")
    left.plot(TIMEOUTS, [s.reconfig_cost for s in rows], "-o", color="lightcoral",
              label="reconfiguring after deaths")
    left.plot(TIMEOUTS, [s.additive_overhead for s in rows], "-", color="black", lw=2, label="total (additive, as the seed)")
    left.plot(TIMEOUTS, [s.overhead for s in rows], "--", color="black", label="total (overlapping stalls merged)")
    ts = sorted(SEED_TIMEOUT_ROWS)
    left.plot(ts, [SEED_TIMEOUT_ROWS[t][2] for t in ts], "s", ms=9, mfc="none", mec="tab:green", mew=2,
              label="seed's published overhead")
    left.set(title="Seed model: heartbeat-timeout sweep (MTBF 50 s, reconfigure 1 s)",
             xlabel="heartbeat timeout (s)", ylabel="overhead (share of wall-clock)", ylim=(0, None))
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    right.plot(P2PGEN_TIMEOUTS, [1 - s.goodput for s in r.p2pgen_fixed], "-o", label="fixed timeout (x = timeout)")
    right.plot(PHI_FLOORS, [1 - s.goodput for s in r.p2pgen_phi], "-s", label="phi-accrual, threshold 8 (x = floor)")
    right.set(title=f"p2pgen at MTBF {P2PGEN_MTBF:g} s (heartbeats 0.1 s, {r.spec.costs.evict_p50:g} s reconfigure)",
              xlabel="timeout or floor (s)", ylabel="overhead = 1 - goodput", ylim=(0, None))
    right.legend(fontsize=8)
    right.grid(alpha=0.3)
    _save(fig, path)


def churn_figure(r: ChurnResult, morphs: list[Run], path: str | Path) -> None:
    fig = plt.figure(figsize=(13, 8.5), constrained_layout=True)
    grid = fig.add_gridspec(2, 2, width_ratios=(1.6, 1))
    for i, run in enumerate(morphs):
        _morph(fig.add_subplot(grid[i, 0]), run)
    _goodput(fig.add_subplot(grid[:, 1]), r)
    _save(fig, path)


def _morph(ax: plt.Axes, run: Run) -> None:
    end = run.duration
    seen: set[str] = set()
    for stall in run.stalls:
        band = KIND_BANDS[stall.kind]
        ax.axvspan(stall.start, min(stall.end, end), color=BAND_COLORS[band], alpha=0.45, lw=0,
                   label=None if band in seen else band)
        seen.add(band)
    times, sizes = zip(*run.sizes)
    ax.step(list(times) + [end], list(sizes) + [sizes[-1]], where="post", color="tab:blue", lw=2, label="members")
    ax.set(xlim=(0, end), ylim=(0, run.scenario.size + 4), xlabel="time (s)", ylabel="members")
    ax.set_yticks(range(run.scenario.size + 1))
    twin = ax.twinx()
    grid = np.linspace(0.0, end, 2000)
    twin.plot(grid, run.progress(grid), color="tab:orange", lw=2, label="cumulative progress")
    twin.plot([0, end], [0, end], ":", color="gray", label="no churn")
    twin.set(ylim=(0, end * 1.5), ylabel="cumulative progress (s of training)")
    ax.set_title(f"{run.scenario.name}: MTBF {run.scenario.mtbf:g} s, goodput {run.goodput():.2f} over this window")
    handles = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(handles[0] + more[0], handles[1] + more[1], fontsize=8, loc="upper left", ncol=3)


def _goodput(ax: plt.Axes, r: ChurnResult) -> None:
    for name, rows in r.ladder:
        ax.plot(MTBFS, [s.goodput for s in rows], "-o", label=name.strip(), lw=2.5 if name.endswith("= p2pgen") else 1)
    ax.plot(MTBFS, [SEED_MTBF_ROWS[m][1] for m in MTBFS], "s", ms=10, mfc="none", mec="black", mew=2,
            label="seed's published goodput")
    ax.axhline(0.9, color="gray", ls=":", lw=1)
    ax.set(xscale="log", xlabel="cluster MTBF (s, log scale)", ylabel="goodput (share of wall-clock kept)",
           title="Goodput vs churn, one design change at a time", ylim=(0, 1.0))
    ax.set_xticks(MTBFS, [f"{m:g}" for m in MTBFS])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.legend(fontsize=7.5, loc="lower right")
    ax.grid(alpha=0.3)


def _save(fig: plt.Figure, path: str | Path) -> None:
    fig.savefig(path, dpi=90)
    plt.close(fig)

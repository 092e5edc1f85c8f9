"""Figures of `p2pgen sim`: the U-curve of the heartbeat timeout and the morph of a cluster under churn.

Owns: drawing only (matplotlib, imported here and nowhere else, with the non-interactive Agg backend).
Invariant: a figure plots result objects computed elsewhere; every axis carries its unit, every
figure a legend.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from p2pgen_lab.simulator.engine import Run  # noqa: E402
from p2pgen_lab.simulator.report import P2PGEN_MTBF, ChurnResult, DetectorResult  # noqa: E402
from p2pgen_lab.simulator.tables import (  # noqa: E402
    FIXED_ROW,
    MTBFS,
    P2PGEN_ROW,
    P2PGEN_TIMEOUTS,
    PHI_FLOORS,
    SEED_MTBF_ROWS,
    SEED_TIMEOUT_ROWS,
    TIMEOUTS,
    agent_default_detector,
    describe_detector,
)

BAND_COLORS = {"hang": "darkred", "reconfigure": "salmon", "false eviction": "tab:purple"}
KIND_BANDS = {"hang": "hang", "evict": "reconfigure", "rejoin": "reconfigure",
              "false-evict": "false eviction", "false-rejoin": "false eviction"}


def detector_figure(r: DetectorResult, path: str | Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), constrained_layout=True)
    rows = r.seed_sweep
    left.plot(TIMEOUTS, [s.hang_cost for s in rows], "-o", color="tab:red", label="detection stall (hang)")
    left.plot(TIMEOUTS, [s.fp_cost for s in rows], "-o", color="tab:purple", label="false positives (evict + rejoin)")
    left.plot(TIMEOUTS, [s.reconfig_cost for s in rows], "-o", color="lightcoral",
              label="reconfiguring after deaths")
    left.plot(TIMEOUTS, [s.additive_overhead for s in rows], "-", color="black", lw=2,
              label="total (additive, as the study counts)")
    left.plot(TIMEOUTS, [s.overhead for s in rows], "--", color="black", label="total (overlapping stalls merged)")
    ts = sorted(SEED_TIMEOUT_ROWS)
    left.plot(ts, [SEED_TIMEOUT_ROWS[t][2] for t in ts], "s", ms=9, mfc="none", mec="tab:green", mew=2,
              label="the study's published overhead")
    left.set(title="Churn study's model: heartbeat-timeout sweep\n(MTBF 50 s, reconfigure 1 s, heartbeats 0.5 s)",
             xlabel="heartbeat timeout (s)", ylabel="overhead (share of wall-clock)", ylim=(0, None))
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    # phi with floor F behaves like a fixed timeout F here, so the curves coincide: the fixed one is drawn wide
    # and pale underneath, phi thin and dashed on top, so that both stay visible.
    right.plot(P2PGEN_TIMEOUTS, [1 - s.goodput for s in r.p2pgen_fixed], "-o", color="tab:blue", lw=6, ms=11,
               alpha=0.35, label="fixed timeout (x = timeout)")
    right.plot(PHI_FLOORS, [1 - s.goodput for s in r.p2pgen_phi], "--s", color="tab:orange", lw=1.5, ms=6,
               mfc="none", mew=1.5, label="phi-accrual, threshold 8, timeout 3 s (x = floor)")
    default = agent_default_detector()
    right.plot([default.floor], [1 - r.agent_default.goodput], "*", color="tab:red", ms=16,
               label=f"agent's default ({describe_detector(default)}; x = floor)")
    right.set(title=f"p2pgen at MTBF {P2PGEN_MTBF:g} s\n(heartbeats 0.1 s, eviction {r.spec.costs.evict_p50:.2f} s, "
                    f"join {r.spec.costs.join_p50:.2f} s at p50)",
              xlabel="timeout or floor (s)", ylabel="overhead = 1 - goodput", ylim=(0, None))
    right.legend(fontsize=8, loc="upper right")
    right.grid(alpha=0.3)
    _save(fig, path)


def churn_figure(r: ChurnResult, morphs: list[Run], path: str | Path) -> None:
    fig = plt.figure(figsize=(15, 10), constrained_layout=True)
    fig.get_layout_engine().set(wspace=0.08)
    grid = fig.add_gridspec(2, 2, width_ratios=(1.5, 1))
    for i, (run, title) in enumerate(zip(morphs, ("study model", "p2pgen (the agent's default detector)"))):
        _morph(fig.add_subplot(grid[i, 0]), run, title)
    _goodput(fig.add_subplot(grid[:, 1]), r)
    _save(fig, path)


def _morph(ax: plt.Axes, run: Run, title: str) -> None:
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
    ax.set_title(f"{title}: MTBF {run.scenario.mtbf:g} s, goodput {run.goodput():.2f} over this window")
    handles = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(handles[0] + more[0], handles[1] + more[1], fontsize=8, loc="upper left", ncol=3)


def _goodput(ax: plt.Axes, r: ChurnResult) -> None:
    styles = {P2PGEN_ROW: dict(lw=3, marker="o", ms=8, zorder=3),
              FIXED_ROW: dict(lw=1.5, ls="--", marker="D", ms=9, mfc="none", mew=1.5, zorder=4)}
    lowest = 1.0
    for i, (name, rows) in enumerate(r.ladder):
        values = [s.goodput for s in rows]
        lowest = min(lowest, *values)
        label = name.strip() + (" (stalls merged)" if i == 0 else "")
        ax.plot(MTBFS, values, **{"lw": 1.2, "marker": "o", "ms": 5, **styles.get(i, {})}, label=_wrap(label))
    seed_rows = r.ladder[0][1]
    ax.plot(MTBFS, [1 - s.additive_overhead for s in seed_rows], ":", color="black", lw=1.5, marker="x", ms=7,
            label="study model, stalls added up (the study's accounting)")
    ax.plot(MTBFS, [SEED_MTBF_ROWS[m][1] for m in MTBFS], "s", ms=12, mfc="none", mec="black", mew=2,
            label="the study's published goodput (additive)")
    ax.axhline(0.9, color="gray", ls=":", lw=1, label="goodput 0.9 (the design target)")
    ax.set(xscale="log", xlabel="cluster MTBF (s, log scale)", ylabel="goodput (share of wall-clock kept)",
           title=f"Goodput vs churn, one design change at a time\n(costs: {_source(r)})",
           ylim=(max(0.0, np.floor(lowest * 10 - 0.5) / 10), 1.0))
    ax.set_xticks(MTBFS, [f"{m:g}" for m in MTBFS])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=1)
    ax.grid(alpha=0.3)


def _wrap(label: str, width: int = 58) -> str:
    return "\n".join(textwrap.wrap(label, width))


def _source(r: ChurnResult) -> str:
    source = r.spec.costs.source
    return source if len(source) < 60 else source.split(":")[0] + " (see the table)"


def _save(fig: plt.Figure, path: str | Path) -> None:
    fig.savefig(path, dpi=90)
    plt.close(fig)

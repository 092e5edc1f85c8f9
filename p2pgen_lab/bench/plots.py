"""`bench allreduce --plot` and `bench recovery --plot`: each benchmark's table drawn beside its baseline.

Owns: drawing only (matplotlib with the non-interactive Agg backend, imported here and nowhere else in the
benchmarks), from the same rows and summaries the tables print.
Invariant kept: the baseline measured in the same run is always drawn next to p2pgen, every axis says its
unit, every series is labelled.
"""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

OURS, BASE = "tab:blue", "tab:orange"


def _size_label(n: float) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}"


def plot_allreduce(world: int, rows: list[Any], busbw: Any, path: str) -> None:
    """Bus bandwidth and time per all_reduce against the buffer size, p2pgen beside torch gloo."""
    sizes = [r.size for r in rows]
    fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(12, 4.8))
    series = [("p2pgen", [r.p2pgen_s for r in rows], OURS, "o")]
    if any(r.gloo_s is not None for r in rows):
        series.append(("torch gloo (baseline)", [r.gloo_s for r in rows], BASE, "s"))
    for label, seconds, color, marker in series:
        pts = [(s, t) for s, t in zip(sizes, seconds) if t]
        ax_bw.plot([s for s, _ in pts], [busbw(world, s, t) for s, t in pts], marker=marker, color=color, label=label)
        ax_t.plot([s for s, _ in pts], [t * 1e6 for _, t in pts], marker=marker, color=color, label=label)
    for ax in (ax_bw, ax_t):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [_size_label(s) for s in sizes])
        ax.set_xlabel("buffer size (bytes, float32 sum)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=9)
    ax_bw.set_ylabel("bus bandwidth (GB/s)")
    ax_bw.set_title(f"all_reduce bus bandwidth, {world} processes on one machine", fontsize=11)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time per all_reduce (µs, log)")
    ax_t.set_title("time per all_reduce (median)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_recovery(results: dict[str, Any], summaries: dict[str, Any], metrics: tuple, faults: tuple,
                  path: str) -> None:
    """The step-loop recovery table (p2pgen beside the restart-all baseline: p50 bars, p99 whiskers, one
    panel per measurement) and, if measured, the membership fault-to-active times."""
    panels: list[tuple[str, Any]] = []
    if "steploop" in summaries:
        panels += [("steploop", m) for m in metrics]
    if results.get("membership"):
        panels.append(("membership", None))
    if not panels:
        raise ValueError("nothing to plot: run the membership or steploop section (--only membership/steploop)")
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
    for ax, (section, metric) in zip(axes.flat, panels):
        if section == "steploop":
            _steploop_panel(ax, summaries["steploop"], metric, faults)
        else:
            _membership_panel(ax, summaries["membership"])
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle("bench recovery: p50 bars, p99 whiskers", fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _steploop_panel(ax: Any, summary: dict[str, Any], metric: tuple, faults: tuple) -> None:
    key, label, scale = metric
    width = 0.38
    for offset, (policy, color, name) in ((-width / 2, ("p2pgen", OURS, "p2pgen")),
                                          (width / 2, ("restart-all", BASE, "restart-all (baseline)"))):
        stats = [summary.get(policy, {}).get(kind, {}).get(key) for kind in faults]
        xs = [i + offset for i, s in enumerate(stats) if s]
        p50 = [s["p50"] * scale for s in stats if s]
        p99 = [s["p99"] * scale for s in stats if s]
        ax.bar(xs, p50, width, color=color, label=name,
               yerr=[[0] * len(p50), [b - a for a, b in zip(p50, p99)]], capsize=3)
    ax.set_xticks(range(len(faults)), faults, fontsize=9)
    ax.set_ylabel(label)
    ax.set_xlabel("fault")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)


def _membership_panel(ax: Any, summary: dict[str, dict[str, float]]) -> None:
    keys = sorted(summary)
    p50 = [summary[k]["p50"] * 1000 for k in keys]
    p99 = [summary[k]["p99"] * 1000 for k in keys]
    ax.barh(range(len(keys)), p50, color=OURS, label="p2pgen",
            xerr=[[0] * len(keys), [b - a for a, b in zip(p50, p99)]], capsize=3)
    ax.set_yticks(range(len(keys)), [k.removesuffix("_s").replace("_", " ") for k in keys], fontsize=8)
    ax.set_xlabel("fault → next active generation (ms)")
    ax.set_title("membership (no baseline: restart-all has no generations)", fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=8)


def plot_diloco(results: list[Any], target: float, where: str, path: str) -> None:
    """Loss against wall time, one line per configuration (synchronous DDP on gloo first; a colour each, dashed
    when compressed, dotted for torchft's), the target a grey dashed line."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = plt.get_cmap("tab20").colors
    for i, r in enumerate(results):
        if r.curve:
            style = ":" if "torchft" in r.label else "--" if r.label.endswith(("int8", "bf16")) else "-"
            ax.plot([t for t, _ in r.curve], [loss for _, loss in r.curve], marker=".", linestyle=style,
                    color=colors[(2 * i) % 20 + (2 * i) // 20 % 2], label=r.label)
    ax.axhline(target, color="grey", linestyle="--", label=f"target {target:g}")
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the start")
    ax.set_ylabel("held-out loss (MSE)")
    ax.set_title(f"DiLoCo vs synchronous training, {where}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

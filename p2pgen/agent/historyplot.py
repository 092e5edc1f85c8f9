"""`p2pgen history --plot out.png`: the job's timeline as a picture.

Owns: drawing only (matplotlib with the non-interactive Agg backend, imported here and nowhere else in the
agent), from the `history` entries `p2pgen history --json` prints: members over time with each generation
change marked by its kind (a join, a removal, a graceful leave) and labelled with its generation and reason,
the time between consecutive generations, and the frontier revision each activation resumed from.
Invariant kept: pure function of the entries; every axis says its unit.
"""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

KINDS = (("joined", "join", "tab:green", "^"), ("left gracefully", "graceful leave", "tab:gray", "s"),
         ("removed", "removal (fault or suspicion)", "tab:red", "v"))
LABEL_CHARS = 46


def change_kind(reason: str) -> str:
    """`join`, `graceful leave`, `removal (fault or suspicion)` or `other`, from a generation's reason."""
    for needle, kind, _, _ in KINDS:
        if needle in reason:
            return kind
    return "other"


def _short(reason: str) -> str:
    return reason if len(reason) <= LABEL_CHARS else reason[:LABEL_CHARS - 1] + "…"


def plot_history(history: list[dict[str, Any]], path: str, title: str = "") -> None:
    """Write the timeline of `history` (oldest first) to `path` (PNG, SVG or PDF by its extension)."""
    activated = [h for h in history if h["outcome"] == "activated"]
    if not activated:
        raise ValueError("no activated generation in this history yet: nothing to draw (try again once the job "
                         "formed its first generation)")
    t0 = activated[0]["at"]
    times = [h["at"] - t0 for h in activated]
    sizes = [len(h["members"]) for h in activated]
    fig, (ax_members, ax_gap, ax_rev) = plt.subplots(3, 1, figsize=(11, 8.5), sharex=True,
                                                     gridspec_kw={"height_ratios": [3, 1.4, 1.4]})
    ax_members.step(times, sizes, where="post", color="tab:blue", linewidth=2, label="members in the active generation")
    for _needle, kind, color, marker in KINDS:
        xs = [t for t, h in zip(times, activated) if change_kind(h["reason"]) == kind]
        ys = [n for n, h in zip(sizes, activated) if change_kind(h["reason"]) == kind]
        if xs:
            ax_members.scatter(xs, ys, color=color, marker=marker, s=60, zorder=3, label=kind)
    for t, n, h in zip(times, sizes, activated):
        ax_members.annotate(f"g{h['generation']}: {_short(h['reason'])}", (t, n), xytext=(4, 6),
                            textcoords="offset points", fontsize=7, rotation=28, color="0.25")
    abandoned = [h["at"] - t0 for h in history if h["outcome"] != "activated" and h["at"] >= t0]
    for x in abandoned:
        ax_members.axvline(x, color="0.8", linewidth=0.8, linestyle=":")
    ax_members.set_ylabel("members")
    ax_members.set_ylim(0, max(sizes) + 1.5)
    ax_members.yaxis.get_major_locator().set_params(integer=True)
    ax_members.legend(loc="lower left", fontsize=8, title="dotted: abandoned proposals" if abandoned else None,
                      title_fontsize=8)
    ax_members.set_title(title or f"job timeline: {len(activated)} generation(s) activated over "
                                  f"{times[-1]:.1f} s", fontsize=11)
    gaps = [b - a for a, b in zip(times, times[1:])]
    ax_gap.bar(times[1:], gaps, width=max(times[-1], 1) / 120, color="tab:orange",
               label="time since the previous generation")
    ax_gap.set_ylabel("s between\ngenerations")
    ax_gap.legend(loc="upper left", fontsize=8)
    revisions = [(h["certificate"] or {}).get("frontier", {}).get("revision") for h in activated]
    known = [(t, r) for t, r in zip(times, revisions) if r is not None]
    if known:
        ax_rev.step([t for t, _ in known], [r for _, r in known], where="post", color="tab:purple",
                    marker="o", markersize=3, label="frontier revision each generation resumed from")
        ax_rev.legend(loc="upper left", fontsize=8)
    ax_rev.set_ylabel("revision\n(steps)")
    ax_rev.set_xlabel("seconds since the first generation")
    for ax in (ax_members, ax_gap, ax_rev):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

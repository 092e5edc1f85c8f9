"""`p2pgen history --plot`: a job's timeline drawn from its history (a real cluster's and a made-up one)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib", reason="history --plot needs the sim extra (matplotlib)")

from matplotlib.image import imread  # noqa: E402

from p2pgen.agent.historyplot import change_kind, plot_history  # noqa: E402
from p2pgen_lab.rigs.agents import active_members, free_control_ports  # noqa: E402


def _entry(generation, members, reason, at, revision, outcome="activated"):
    return {"generation": generation, "outcome": outcome, "at": at, "reason": reason,
            "members": [{"peer_id": m, "incarnation": 1} for m in members],
            "certificate": {"frontier": {"revision": revision, "digest": "d"}} if outcome == "activated" else None}


def test_change_kinds_come_from_the_reason():
    assert change_kind("p2#2 joined") == "join"
    assert change_kind("p1#1 removed (left gracefully)") == "graceful leave"
    assert change_kind("p1#1 removed (suspected by p0: agent silent)") == "removal (fault or suspicion)"
    assert change_kind("re-formed in Raft epoch 1") == "other"


def test_a_timeline_is_drawn_as_an_image(tmp_path):
    history = [_entry(1, ["a", "b", "c"], "c#1 joined", 100.0, 0),
               _entry(2, ["a", "b"], "c#1 removed (suspected by c: application killed by SIGKILL)", 104.0, 37),
               _entry(3, ["a", "b", "c"], "c#2 joined", 105.0, 0, outcome="abandoned"),
               _entry(4, ["a", "b", "c"], "c#2 joined", 109.5, 80),
               _entry(5, ["a", "c"], "b#1 removed (left gracefully)", 120.0, 190)]
    out = tmp_path / "timeline.png"
    plot_history(history, str(out))
    height, width = imread(str(out)).shape[:2]
    assert width >= 1000 and height >= 800             # legible at 100 % zoom


def test_an_empty_history_says_there_is_nothing_to_draw(tmp_path):
    with pytest.raises(ValueError, match="no activated generation"):
        plot_history([], str(tmp_path / "x.png"))


@pytest.mark.timeout(120)
def test_history_plot_of_a_live_job(cluster, tmp_path):
    addrs = [f"127.0.0.1:{p}" for p in free_control_ports(3)]
    for i, addr in enumerate(addrs):
        cluster.start(f"p{i}", addr, [a for a in addrs if a != addr], extra=("--min-members=3",))
    cluster.wait(addrs[0], lambda s: len(active_members(s)) == 3, timeout=60)
    cluster.agents["p2"].signal(signal.SIGKILL)
    cluster.wait(addrs[0], lambda s: len(active_members(s)) == 2, timeout=60)
    out = tmp_path / "job.png"
    done = subprocess.run([sys.executable, "-m", "p2pgen", "history", "--peer", addrs[0], "--secret-file",
                           str(cluster.secret_file), "--plot", str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote {out}"
    assert imread(str(out)).shape[1] >= 1000

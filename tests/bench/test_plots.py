"""`bench allreduce --plot` and `bench recovery --plot` draw the tables they print beside the baselines."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib", reason="--plot needs the sim extra (matplotlib)")

from matplotlib.image import imread  # noqa: E402

from p2pgen_lab.bench import allreduce, recovery  # noqa: E402
from p2pgen_lab.bench.plots import plot_allreduce, plot_recovery  # noqa: E402


def test_allreduce_plot_has_both_backends(tmp_path):
    rows = [allreduce.Row(s, s // 4, 1e-4 + s / 1e9, 2e-4 + s / 8e8) for s in (8, 4096, 1 << 20, 16 << 20)]
    out = tmp_path / "ar.png"
    plot_allreduce(4, rows, allreduce.busbw, str(out))
    assert imread(str(out)).shape[1] >= 1200


def _record(policy: str, kind: str, scale: float) -> dict:
    return {"policy": policy, "kind": kind, "to_active_s": 0.4 * scale, "to_first_commit_s": 0.6 * scale,
            "to_regain_s": 0.9 * scale, "rollback_steps": 1 * scale, "processes_started": 1 * scale}


def test_recovery_plot_draws_steploop_beside_restart_all_and_membership(tmp_path):
    records = [_record(p, k, s) for p, s in (("p2pgen", 1.0), ("restart-all", 5.0)) for k in recovery.FAULTS]
    results = {"steploop": records, "membership": {"sigkill_app_to_active_s": [0.2, 0.3],
                                                   "leader_agent_kill_to_active_s": [1.4, 1.6]}}
    summaries = {"steploop": recovery.summarize_steploop(records),
                 "membership": {k: recovery.summarize(v) for k, v in results["membership"].items()}}
    out = tmp_path / "rec.png"
    plot_recovery(results, summaries, recovery.STEPLOOP_METRICS, recovery.FAULTS, str(out))
    height, width = imread(str(out)).shape[:2]
    assert width >= 1500 and height >= 800


def test_recovery_plot_without_a_plottable_section_says_which_to_run(tmp_path):
    with pytest.raises(ValueError, match="--only membership/steploop"):
        plot_recovery({"catchup": []}, {}, recovery.STEPLOOP_METRICS, recovery.FAULTS, str(tmp_path / "x.png"))

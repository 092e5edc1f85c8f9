"""`p2pgen sim churn|detector`: tables, JSON, figures and recovery costs, on short runs."""

from __future__ import annotations

import argparse
import json

import pytest

from p2pgen_lab.simulator import cli
from p2pgen_lab.simulator.costs import load_costs

FAST = ["--runs", "1", "--duration", "400"]


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    cli.add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def write_recovery(path, evict=0.1, join=0.2):
    path.write_text(json.dumps({"sigkill_app_to_active_s": {"p50": evict, "p99": 2 * evict},
                                "agent_kill_to_active_s": {"p50": 1.3, "p99": 1.6},
                                "join_to_member_s": {"p50": join, "p99": 2 * join}}))
    return path


def test_detector_prints_the_seed_beside_ours_and_draws_the_u(tmp_path, capsys):
    png = tmp_path / "u.png"
    assert run(["sim", "detector", *FAST, "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "seed: detect lat  FP rate  overhead" in out and "0.3297" in out and "assumptions:" in out
    assert "phi floor 0.3 s" in out and "costs: assumed" in out
    assert png.stat().st_size > 10_000


def test_churn_json_uses_measured_costs_when_given(tmp_path, capsys):
    recovery = write_recovery(tmp_path / "recovery.json")
    assert run(["sim", "churn", *FAST, "--timeout", "1.5", "--json", "--recovery-json", str(recovery)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["spec"]["costs"]["evict_p50"] == 0.1 and data["spec"]["costs"]["source"].startswith("measured")
    assert [row["mtbf"] for row in data["seed_mtbf"]] == [200.0, 50.0, 12.0]
    assert data["seed_mtbf"][2]["seed_reference"] == [8.3, 0.670]
    assert all(0 < r["goodput"] <= 1 for entry in data["ladder"] for r in entry["rows"])


def test_churn_draws_the_morph(tmp_path, capsys):
    png = tmp_path / "churn.png"
    assert run(["sim", "churn", *FAST, "--timeout", "1.5", "--plot", str(png)]) == 0
    assert "= p2pgen" in capsys.readouterr().out
    assert png.stat().st_size > 10_000


def test_a_bad_recovery_file_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"sigkill_app_to_active_s": {"p50": 0.3}}))
    assert run(["sim", "churn", *FAST, "--recovery-json", str(bad)]) == 2
    assert "expected sigkill_app_to_active_s and join_to_member_s" in capsys.readouterr().err


def test_costs_default_to_the_stated_assumption():
    costs = load_costs(None)
    assert costs.quantile("p50") == (0.3, 0.3) and costs.source.startswith("assumed")
    with pytest.raises(ValueError, match="p50"):
        costs.quantile("p90")


def join_defaults():
    """The detector an agent started by `p2pgen join` with no detector flag runs."""
    from p2pgen.agent.cli import add_commands
    from p2pgen.agent.detectflags import config_from_args

    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    return config_from_args(parser.parse_args(["join"]))


def test_the_p2pgen_row_runs_the_detector_p2pgen_join_runs_by_default(capsys):
    from p2pgen_lab.simulator.costs import assumed_costs
    from p2pgen_lab.simulator.tables import FIXED_ROW, P2PGEN_ROW, ladder

    joined = join_defaults()
    rows = ladder(assumed_costs(), 2.0, 100.0)
    assert rows[P2PGEN_ROW].detector == joined and rows[P2PGEN_ROW].name.endswith("= p2pgen")
    assert rows[FIXED_ROW].detector.kind == "fixed" and rows[FIXED_ROW].detector.timeout == 2.0
    assert run(["sim", "churn", *FAST, "--timeout", "2.0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["p2pgen_detector"] == joined.__dict__
    assert data["ladder"][data["p2pgen_row"]]["scenario"].endswith("= p2pgen")


def test_the_detector_sweep_reports_the_agents_default(capsys):
    assert run(["sim", "detector", *FAST, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    default = data["agent_default"]
    assert default["detector"] == join_defaults().__dict__ and 0 < default["goodput"] <= 1

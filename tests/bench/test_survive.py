"""`p2pgen bench survive`: the regression analysis on a hand-written trace, and the copies section through
the CLI at a small size. No speed figure is asserted."""

from __future__ import annotations

import json

import pytest

from p2pgen import cli
from p2pgen_lab.bench import survive

pytestmark = pytest.mark.timeout(90)


def ev(kind: str, t: float, peer: str, inc: int, **fields) -> dict:
    return {"event": kind, "t": t, "peer": peer, "incarnation": inc, **fields}


def test_regressions_compare_each_activation_with_what_was_committed_and_certified():
    events = [
        ev("active", 1.0, "a", 1, generation=1, revision=0), ev("active", 1.0, "b", 1, generation=1, revision=0),
        *(ev("commit", 1.0 + r / 10, "a", 1, revision=r) for r in range(1, 11)),
        ev("active", 3.0, "a", 1, generation=2, revision=10),             # certified 10
        *(ev("commit", 3.0 + r / 10, "a", 1, revision=r) for r in range(11, 14)),
        ev("active", 5.0, "c", 1, generation=3, revision=12),             # 1 committed step redone
        ev("held", 6.0, "c", 1, generation=4),
        ev("active", 7.0, "c", 1, generation=4, revision=4),              # below certified 12: 8 steps lost
    ]
    got = survive.regressions(events)
    assert got["generations"] == 4
    assert (got["resumed_below_committed"], got["steps_lost_vs_committed"]) == (2, 1 + 8)
    assert (got["resumed_below_certified"], got["steps_lost_vs_certified"]) == (1, 8)
    assert got["held"] == 1 and got["final_revision"] == 13


def test_the_copies_section_runs_through_the_cli(tmp_path, capsys):
    out = tmp_path / "survive.json"
    assert cli.main(["bench", "survive", "--only", "copies", "--sizes", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "restore local copy" in printed and "pull from 1 peer (baseline)" in printed
    (row,) = json.loads(out.read_text())["copies"]
    assert row["mbytes"] == 1 and all(row[k] > 0 for k in ("save_copy_s", "restore_copy_s", "write_checkpoint_s",
                                                             "load_checkpoint_s", "pull_s"))


def test_bad_arguments_are_refused_with_a_reason():
    with pytest.raises(SystemExit, match="--churn-members >= 3"):
        cli.main(["bench", "survive", "--churn-members", "2"])


def test_the_overhead_rate_counts_one_members_commits_in_the_window_and_the_copy_lag():
    events = [{"event": "commit", "peer": "s0", "t": 10.0 + i * 0.5, "revision": i, "snapshot": i - i % 2}
              for i in range(1, 9)] + [{"event": "commit", "peer": "s1", "t": 11.0, "revision": 3, "snapshot": 0}]
    rate, taken, lag = survive._rate(events, "s0", 10.5, 13.5)           # revisions 1..7
    assert rate == pytest.approx(2.0) and taken == pytest.approx(3 / 7) and lag == pytest.approx(4 / 7)
    assert survive._rate(events, "s0", 0.0, 1.0) == (0.0, 0.0, 0.0)     # fewer than two commits: no rate


def test_the_vote_digest_with_the_copy_costs_less_than_a_rehash():
    row = survive.digest_cost(8, 1)
    assert row["digest_rehash_s"] > row["digest_with_copy_s"] >= 0 and row["save_s"] > 0


def test_a_bad_state_size_is_refused_with_a_reason():
    with pytest.raises(SystemExit, match="--state-mb"):
        cli.main(["bench", "survive", "--only", "overhead", "--state-mb", "0"])

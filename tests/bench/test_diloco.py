"""`p2pgen bench diloco`'s reading of the run logs and its table, and the shipped task's determinism."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from p2pgen_lab.bench import diloco
from p2pgen_lab.bench.apps import diloco_task

pytestmark = pytest.mark.timeout(60)


def _log(path, events):
    path.write_text("".join(json.dumps(e) + "\n" for e in events))


def test_a_run_is_read_from_host_zeros_log(tmp_path) -> None:
    _log(tmp_path / "m0.jsonl", [{"event": "start", "t": 100.0},
                                 {"event": "eval", "t": 104.0, "steps": 50, "outer": 1, "loss": 0.004},
                                 {"event": "eval", "t": 107.5, "steps": 100, "outer": 2, "loss": 0.0024},
                                 {"event": "end", "t": 108.0}])
    r = diloco._result("H=50", diloco.read_log(tmp_path / "m0.jsonl"), 0.0025, [2 << 20, 4 << 20])
    assert (r.reached, r.seconds, r.sent_mb_per_host, r.outer_steps, r.inner_steps) == (True, 7.5, 3.0, 2, 100)
    assert r.curve == [(4.0, 0.004), (7.5, 0.0024)]
    missed = diloco._result("sync", diloco.read_log(tmp_path / "m0.jsonl"), 0.001, [0])
    assert not missed.reached and missed.seconds == 7.5 and missed.final_loss == 0.0024


def test_the_table_gives_speed_ups_against_ddp_and_marks_a_missed_target() -> None:
    rows = [diloco.Result("DDP, gloo", True, 40.0, 400.0, 0.0024, 70, 70, []),
            diloco.Result("p2pgen DiLoCo H=50", True, 8.0, 40.0, 0.0023, 4, 200, []),
            diloco.Result("p2pgen DiLoCo H=10", False, 150.0, 90.0, 0.003, 30, 300, [])]
    text = diloco.format_results(rows, 0.0025, "4 hosts")
    assert "speed-up vs DDP, gloo" in text and "5.00x" in text and "1.00x" in text and "150.0 (not reached)" in text
    assert [c.label for c in diloco.configs([10, 50], ["int8"])] == [
        "DDP, gloo", "p2pgen, synchronous", "p2pgen DiLoCo H=10", "p2pgen DiLoCo H=50",
        "p2pgen DiLoCo H=10, int8", "p2pgen DiLoCo H=50, int8"]
    assert diloco.configs([10], ["int8"])[-1].args() == ["--mode", "diloco", "--sync-every", "10",
                                                          "--compress", "int8"]


def test_the_task_gives_every_member_its_own_shard_the_same_way_each_time() -> None:
    a, b = diloco_task.batch(3, 1, 0, 4), diloco_task.batch(3, 1, 0, 4)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(diloco_task.batch(3, 1, 1, 4)[0], a[0])
    assert sum(p.numel() for p in diloco_task.mlp(1).parameters()) == 1_181_760


def test_bad_options_are_refused_before_anything_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "p2pgen", "bench", "diloco", "--sync-every", "0"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "--sync-every >= 1" in out.stderr


def test_torchft_rows_come_after_p2pgens_and_only_when_asked() -> None:
    labels = [c.label for c in diloco.configs([10, 50], [], torchft=True)]
    assert labels[-4:] == ["p2pgen DiLoCo H=10", "p2pgen DiLoCo H=50", "torchft DiLoCo H=10", "torchft DiLoCo H=50"]
    assert all(c.mode != "torchft" for c in diloco.configs([10, 50], ["int8"]))
    assert [(c.label, c.mode, c.sync_every) for c in diloco.fault_configs(50, torchft=True)] == [
        ("p2pgen DiLoCo H=50", "diloco", 50), ("torchft DiLoCo H=50", "torchft", 50)]
    assert [c.mode for c in diloco.fault_configs(50, torchft=False)] == ["diloco"]


def test_the_torchft_rows_are_skipped_with_the_reason_when_torchft_is_missing(monkeypatch) -> None:
    from p2pgen_lab.bench import peers

    monkeypatch.setitem(sys.modules, "torchft", None)          # `import torchft` raises ImportError
    reason = peers.torchft_missing()
    assert reason is not None and "pip install -e .[bench]" in reason
    monkeypatch.setattr(diloco, "torchft_missing", lambda: "torchft is not installed (no module)")
    assert diloco.torchft_skipped() == "torchft DiLoCo rows skipped: torchft is not installed (no module)"
    monkeypatch.setattr(diloco, "torchft_missing", lambda: None)
    assert diloco.torchft_skipped() is None


def test_resets_are_counted_over_every_replicas_log_and_shown_in_the_fault_table(tmp_path) -> None:
    _log(tmp_path / "m0.jsonl", [{"event": "start", "t": 0.0},
                                 {"event": "reset", "t": 1.0, "kind": "sync failed", "outer": 3, "error": "peer"},
                                 {"event": "eval", "t": 2.0, "steps": 100, "outer": 4, "loss": 0.003}])
    _log(tmp_path / "m1.jsonl", [{"event": "start", "t": 0.0}, {"event": "start", "t": 5.0},
                                 {"event": "reset", "t": 6.0, "kind": "healed", "outer": 4, "error": None}])
    assert diloco.count_resets([tmp_path / "m0.jsonl", tmp_path / "m1.jsonl", tmp_path / "m2.jsonl"]) == 2
    clean = diloco.Result("torchft DiLoCo H=50", True, 90.0, 10.0, 0.002, 40, 2000, [])
    faulty = diloco.Result("torchft DiLoCo H=50", True, 90.0, 10.0, 0.003, 30, 1500, [], resets=7)
    text = diloco.format_torchft_faults(clean, faulty, 30, 90)
    assert "steps kept 0.750" in text and "resets (all replicas)" in text
    assert text.splitlines()[-1].split()[-1] == "7" and text.splitlines()[-2].split()[-1] == "0"
    assert json.loads(diloco.to_json([], None, (clean, faulty)))["torchft_faults"][1]["resets"] == 7


def _replica(committed: bool, healed: bool, step: int, error: Exception | None = None):
    from types import SimpleNamespace

    manager = SimpleNamespace(current_step=lambda: step,
                              errored=lambda: None if error is None else SimpleNamespace(original_exception=error))
    return SimpleNamespace(manager=manager, committed=committed, healed=healed, model=diloco_task.mlp(1))


def test_the_torchft_replica_logs_a_reset_for_every_outer_step_torchft_threw_away(tmp_path) -> None:
    app = pytest.importorskip("p2pgen_lab.bench.apps.torchft_diloco", exc_type=ImportError)
    log = diloco_task.Log(str(tmp_path / "m1.jsonl"))
    loss = diloco_task.eval_loss(diloco_task.mlp(1))
    assert not app._after_sync(_replica(False, False, 3, RuntimeError("peer closed")), log, 150, 1.0)
    assert app._after_sync(_replica(True, True, 7), log, 200, loss)
    assert not app._after_sync(_replica(True, False, 8), log, 250, loss / 2)
    events = [{k: v for k, v in e.items() if k != "t"} for e in diloco.read_log(tmp_path / "m1.jsonl")]
    assert events == [{"event": "reset", "kind": "sync failed", "outer": 3, "error": "peer closed"},
                      {"event": "reset", "kind": "healed", "outer": 7, "error": None},
                      {"event": "eval", "steps": 200, "outer": 7, "loss": loss},
                      {"event": "eval", "steps": 250, "outer": 8, "loss": loss}]


def test_the_torchft_checkpoint_transport_advertises_the_hosts_address() -> None:
    from datetime import timedelta

    app = pytest.importorskip("p2pgen_lab.bench.apps.torchft_diloco", exc_type=ImportError)
    transport = app.HostTransport("10.9.8.7", timedelta(seconds=5))
    try:
        url = transport.metadata()
        assert url.startswith("http://10.9.8.7:") and url.endswith("/checkpoint/")
        assert int(url.split(":")[2].split("/")[0]) == int(transport.address().split(":")[2].split("/")[0])
    finally:
        transport.shutdown()


class _NoHosts:
    """Stands in for the emulated cluster: nothing to create or remove."""

    def create(self) -> None:
        pass

    def remove(self) -> None:
        pass

    def describe(self) -> str:
        return "no hosts"


def test_json_output_still_draws_the_plot(tmp_path, monkeypatch, capsys) -> None:
    pytest.importorskip("matplotlib")
    from p2pgen import cli
    from p2pgen_lab.bench import cli as bench_cli

    monkeypatch.setattr(bench_cli, "_cluster", lambda command, args: _NoHosts())
    monkeypatch.setattr(diloco, "run_config", lambda hosts, config, workdir, target, seconds, every=0.0:
                        diloco.Result(config.label, True, 2.0, 1.0, 0.002, 1, 1, [(1.0, 0.003), (2.0, 0.002)]))
    plot = tmp_path / "loss.png"
    assert cli.main(["bench", "diloco", "--only", "ddp", "--json", "--plot", str(plot),
                     "--workdir", str(tmp_path / "logs")]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["label"] == "DDP, gloo"
    assert plot.stat().st_size > 0

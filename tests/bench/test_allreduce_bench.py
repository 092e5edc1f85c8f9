"""`p2pgen bench allreduce`: argument handling, the table's arithmetic, and one tiny real run (no speed
figure is asserted)."""

from __future__ import annotations

import json

import pytest

from p2pgen import cli
from p2pgen_lab.bench import allreduce


def test_parse_size_accepts_suffixes_and_explains_bad_input():
    assert allreduce.parse_size("4K") == 4096
    assert allreduce.parse_size("64MiB") == 64 << 20
    assert allreduce.parse_size("8") == 8
    with pytest.raises(ValueError, match="give bytes"):
        allreduce.parse_size("lots")


def test_busbw_follows_nccl_tests():
    assert allreduce.busbw(4, 1_000_000_000, 1.0) == pytest.approx(1.5)
    assert allreduce.busbw(1, 1_000_000_000, 1.0) == pytest.approx(1.0)


def test_table_has_both_backends_and_the_ratio():
    table = allreduce.format_table(4, [allreduce.Row(4096, 1024, 0.001, 0.002, 1.5, 2.5, "shm")])
    assert "p2pgen" in table and "torch gloo" in table and "busbw ratio" in table and "per round" in table
    assert table.splitlines()[-2].split()[-3:] == ["2.00", "1.50..2.50", "shm"]


@pytest.mark.timeout(90)
def test_cli_runs_a_tiny_benchmark_against_gloo(capsys):
    rc = cli.main(["bench", "allreduce", "--world", "2", "--sizes", "4K", "128K", "--iters", "5", "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    small, large = doc["rows"]
    assert small["size"] == 4096 and small["p2pgen_s"] > 0 and small["gloo_s"] > 0
    assert 0 < small["ratio_min"] <= small["ratio_max"]
    assert (small["path"], large["path"]) == ("ring", "shm")     # below and above shm.MIN_BYTES


@pytest.mark.timeout(90)
def test_cli_without_shared_memory_takes_the_ring(capsys):
    rc = cli.main(["bench", "allreduce", "--world", "2", "--sizes", "128K", "--iters", "5", "--no-gloo",
                   "--no-shm", "--json"])
    assert rc == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["path"] == "ring" and row["gloo_s"] is None


def test_sealed_table_has_both_p2pgen_columns_the_cost_ratio_and_the_cipher_rate():
    row = allreduce.Row(1 << 20, 1 << 18, 0.010, None, path="ring", sealed_s=0.0105, seal_ratio_min=1.01,
                        seal_ratio_max=1.09)
    table = allreduce.format_table(4, [row], seal_rates=(4.5, 5.0))
    assert "p2pgen plain" in table and "p2pgen sealed" in table and "torch gloo" not in table
    assert table.splitlines()[3].split()[-3:] == ["1.050", "1.01..1.09", "ring"]
    assert "encrypt 4.50 GB/s, decrypt 5.00 GB/s" in table


@pytest.mark.slow               # a third group of worker processes: ~15 s on 2 cores
@pytest.mark.timeout(90)
def test_cli_encrypt_times_sealed_links_in_the_same_rounds(capsys):
    rc = cli.main(["bench", "allreduce", "--world", "2", "--sizes", "128K", "--iters", "3", "--rounds", "2",
                   "--no-gloo", "--no-shm", "--encrypt", "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["rows"]
    assert row["path"] == "ring" and row["sealed_s"] > 0 and 0 < row["seal_ratio_min"] <= row["seal_ratio_max"]
    assert doc["aes256gcm_one_core_GBps"]["encrypt"] > 0


def test_compressed_table_has_both_p2pgen_columns_and_the_bytes_sent():
    row = allreduce.Row(1 << 20, 1 << 18, 0.010, None, path="ring", compress="int8", compressed_s=0.004,
                        comp_ratio_min=0.35, comp_ratio_max=0.45, sent_bytes=1572864, compressed_sent_bytes=399360)
    table = allreduce.format_table(4, [row])
    assert "p2pgen plain" in table and "p2pgen int8" in table and "sent ratio" in table
    assert table.splitlines()[3].split()[-6:] == ["0.400", "0.35..0.45", "1572864", "399360", "0.254", "ring"]


def test_compress_and_encrypt_are_measured_one_at_a_time():
    with pytest.raises(SystemExit, match="one at a time"):
        cli.main(["bench", "allreduce", "--compress", "int8", "--encrypt"])
    with pytest.raises(SystemExit):
        cli.main(["bench", "allreduce", "--compress", "fp4"])


@pytest.mark.slow               # a third group of worker processes: ~15 s on 2 cores
@pytest.mark.timeout(90)
def test_cli_compress_reports_time_and_bytes_sent_beside_plain(capsys):
    rc = cli.main(["bench", "allreduce", "--world", "2", "--sizes", "128K", "--iters", "3", "--rounds", "2",
                   "--no-gloo", "--no-shm", "--compress", "bf16", "--json"])
    assert rc == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["compress"] == "bf16" and row["compressed_s"] > 0
    assert row["sent_bytes"] == 128 << 10 and row["compressed_sent_bytes"] == 64 << 10    # 2 (w-1)/w of size


def test_idle_gaps_are_slept_before_each_call_but_not_timed(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(allreduce.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(allreduce.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    calls = []

    def step(buf):
        calls.append(clock[0])
        clock[0] += 0.01

    seconds, sent = allreduce._time(step, 4096, iters=4, idle=0.5)
    assert seconds == pytest.approx(0.01) and sent is None
    timed = calls[-4:]
    assert all(b - a == pytest.approx(0.51) for a, b in zip(timed, timed[1:]))    # 0.5 s asleep before each
    with pytest.raises(SystemExit, match="--idle >= 0"):
        cli.main(["bench", "allreduce", "--idle", "-1"])

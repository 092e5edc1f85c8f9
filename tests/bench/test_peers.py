"""The real peers of `p2pgen bench recovery`'s step loop: the pretend host's restarts (cheap, for real), the
process-tree kill, and (slow, only where installed) one block of each peer: three faults, every figure
present, torchft healing without a rollback and torchrun rolling back to its checkpoint. No speed figure is
asserted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from p2pgen_lab.bench import peers, recovery

pytestmark = pytest.mark.timeout(90)

PRINT_PID_AND_SLEEP = [sys.executable, "-c", "import os, sys, time; print(os.getpid(), flush=True); time.sleep(60)"]


def _pids(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()]


def _wait_for(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_a_host_restarts_its_child_when_it_dies_or_stays_stopped_and_dies_with_a_tree_kill(tmp_path):
    log = tmp_path / "children.log"
    with open(log, "w") as out:
        host = subprocess.Popen([sys.executable, "-m", "p2pgen_lab.bench.apps.host", "--stopped-timeout=0.3", "--",
                                 *PRINT_PID_AND_SLEEP], stdout=out, start_new_session=True)
    try:
        _wait_for(lambda: len(_pids(log)) == 1)
        os.kill(_pids(log)[0], signal.SIGKILL)
        _wait_for(lambda: len(_pids(log)) == 2)                 # restarted after an exit
        os.kill(_pids(log)[1], signal.SIGSTOP)
        _wait_for(lambda: len(_pids(log)) == 3)                 # killed after 0.3 s stopped, restarted
        child = _pids(log)[2]
        assert peers.descendants(host.pid) == [child]
    finally:
        peers.kill_tree(host)
    assert host.returncode == -signal.SIGKILL
    _wait_for(lambda: not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2])


def _smoke(peer: str, tmp_path: Path) -> list[dict]:
    why = peers.MISSING[peer]()
    if why is not None:
        pytest.skip(why)
    return recovery.run_steploop_block(peer, 1, 0, recovery.Plan.quick(), 1.0, tmp_path / peer)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_torchft_heals_every_fault_from_a_peer_without_a_rollback(tmp_path):
    records = _smoke("torchft", tmp_path)
    assert [r["kind"] for r in records] == list(recovery.FAULTS)
    for r in records:
        assert r["rollback_steps"] == 0 and r["heal_s"] is not None and r["to_first_commit_s"] > 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_torchrun_restarts_every_worker_and_rolls_back_to_its_checkpoint(tmp_path):
    records = _smoke("torchrun", tmp_path)
    assert [r["kind"] for r in records] == list(recovery.FAULTS)
    for r in records:
        assert r["rollback_steps"] > 0 and r["heal_s"] is not None
        every = recovery.Plan.quick().checkpoint_every
        assert r["revision_at_fault"] - r["rollback_steps"] == r["revision_at_fault"] // every * every

"""The local copy saved in the background: a kill at any phase leaves a whole revision, exactly; the
writer's digests serve the vote; the host staging interface with its CPU stand-ins; space and ENOSPC."""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from p2pgen.core.view import JobView
from p2pgen.state import LocalCopy, LocalCopyError, SharedState, StateKeeper, StateKeeperConfig
from p2pgen.state import localcopy as lc
from p2pgen.state.staging import CpuStager
from p2pgen.state.writer import BackgroundWriter
from tests.state.savekill import JOB, PEER, PIECES, RUN, revision_state

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).parents[2]
PHASES = {"snapshotting": 2, "snapshotted": 2, "hashing": 2, "hashed": 2, "pointer-written": 2, "moved": 3}


def resumed(folder: Path) -> SharedState:
    """What a restarted process loads from `folder` (verified), into a state of revision 0."""
    state = revision_state(0)
    LocalCopy(str(folder), JOB, PEER).load_into(state, instance=RUN)
    return state


def assert_exactly(state: SharedState, revision: int) -> None:
    want = revision_state(revision)
    assert state.revision == revision and state.objects == want.objects
    for name in want.tensors:
        assert np.array_equal(state.tensors[name], want.tensors[name]), name


@pytest.mark.parametrize("phase", sorted(PHASES))
def test_a_kill_at_any_phase_of_a_background_save_resumes_a_whole_revision(tmp_path, phase):
    proc = subprocess.Popen([sys.executable, "-m", "tests.state.savekill", str(tmp_path), phase], cwd=ROOT)
    try:
        assert proc.wait(30) == -signal.SIGKILL, f"the save never reached {phase}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # before the pointer moved: revision 2, whole (the torn slot is not named); after: revision 3, not the
    # revision 4 the next step was writing into the tensors meanwhile
    assert_exactly(resumed(tmp_path), PHASES[phase])
    # and the mark says what the copy lacks: committed revision 3 (generation 1) until the pointer moved
    copy = LocalCopy(str(tmp_path), JOB, PEER)
    assert copy.unsaved_commits(copy.describe()) == ((3, 1) if PHASES[phase] == 2 else None)


def test_a_background_save_that_completes_holds_the_snapshot_not_the_next_step(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tests.state.savekill", str(tmp_path), "never"], cwd=ROOT,
                          timeout=30)
    assert proc.returncode == 0
    assert_exactly(resumed(tmp_path), 3)


class DeviceStandIn:
    """A CPU stand-in for a device: `start` only enqueues (the copy runs on a side thread, the 'stream'),
    `fence` waits until the copies have read their sources (as the current stream waiting for the copy's
    event orders the next step's writes after it), `wait` until they landed. Records the calls' order."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self._jobs: list[threading.Thread] = []
        self._read = threading.Event()

    def start(self, value, into) -> None:
        self.calls.append("start")
        source = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
        staged = np.empty_like(source)

        def copy() -> None:
            staged[...] = source            # the device-to-host read
            self._read.set()
            into[...] = staged              # landing in the host buffer
        self._jobs.append(threading.Thread(target=copy))
        self._jobs[-1].start()

    def fence(self) -> None:
        self.calls.append("fence")
        for job in self._jobs:
            job.join()                      # here: reads done (the stand-in finishes both at once)

    def wait(self) -> None:
        self.calls.append("wait")
        for job in self._jobs:
            job.join()
        self._jobs = []


def test_the_writer_hashes_only_staged_bytes_and_the_step_may_write_after_the_fence(tmp_path):
    copy = LocalCopy(str(tmp_path), JOB, PEER)
    state, stager = revision_state(5), DeviceStandIn()
    writer = BackgroundWriter(copy)
    try:
        snap = copy.snapshot(state, instance=RUN, incarnation=1, generation=1, epoch=1, stager=stager)
        assert stager.calls == ["start"] * PIECES + ["fence"]       # the commit returns only after the fence
        for value in state.tensors.values():
            value[...] = -1.0                                        # the next step
        writer.submit(snap)
        writer.wait()
        [(_, info)] = writer.take()
    finally:
        writer.close()
    assert stager.calls[-1] == "wait" and info.revision == 5
    assert_exactly(resumed(tmp_path), 5)
    assert info.digest == revision_state(5).digest()


def test_the_cpu_stager_copies_at_start():
    into = np.zeros(16, np.uint8)
    CpuStager().start(np.arange(4, dtype=np.float32), into)
    assert bytes(into) == np.arange(4, dtype=np.float32).tobytes()


# --- the keeper: background saves, digests for the vote, space ----------------------------------------

VIEW = JobView(job=JOB, instance=RUN, index=1, leader="n1", agents=1, members=(), active=None, pending=None,
               tombstones=frozenset(), state_epoch=1, forks=())


def active(generation: int = 2, revision: int = 0, digest: str = "") -> SimpleNamespace:
    return SimpleNamespace(generation=generation, state_epoch=1, frontier=SimpleNamespace(revision=revision,
                                                                                           digest=digest))


def torch_state() -> SharedState:
    return SharedState({"w": torch.zeros(3 << 20), "m": torch.ones(1 << 20)}, {"step": 0})


def keeper_for(tmp_path: Path, state: SharedState, **config) -> StateKeeper:
    keeper = StateKeeper(StateKeeperConfig(local_dir=str(tmp_path), **config), state, JOB, (PEER, 1))
    keeper.instance = RUN
    return keeper


def step(state: SharedState, keeper: StateKeeper, gen) -> None:
    state.tensors["w"].add_(1.0)
    state._commit()
    keeper.committed(gen, rank=1)


def test_the_vote_after_a_background_save_hashes_nothing(tmp_path):
    state = torch_state()
    keeper = keeper_for(tmp_path, state, local_budget=1e9)
    try:
        gen = active()
        keeper.activated(gen)
        for _ in range(3):
            step(state, keeper, gen)
            keeper.settle()                            # each save finishes before the next commit
        keeper.vote_fields(VIEW)                       # takes the last save's digests in
        before = state.hashed_bytes
        digest = state.digest()
        assert state.hashed_bytes == before            # the frontier digest came from the writer's hashing
        assert keeper.local.describe().revision == 3 and keeper.local.describe().digest == digest
        state.tensors["w"].add_(1.0)                   # a write torch sees: that tensor is hashed again
        state.digest()
        assert state.hashed_bytes - before == state.tensors["w"].numel() * 4
    finally:
        keeper.close()
    state.touch()
    assert digest != state.digest()


def test_the_save_at_an_activation_reuses_the_digests_the_vote_computed(tmp_path):
    state = torch_state()
    keeper = keeper_for(tmp_path, state, local_budget=1e9)
    try:
        state._commit()                                 # a revision no snapshot took (as after a skipped one)
        keeper.vote_fields(VIEW)
        digest = state.digest()                        # the vote hashes the state once
        hashed = state.hashed_bytes
        keeper.activated(active(revision=1, digest=digest))
        assert keeper.local.describe().digest == digest and state.hashed_bytes == hashed
    finally:
        keeper.close()


def test_a_commit_never_waits_for_the_writer(tmp_path, monkeypatch):
    state = torch_state()
    keeper = keeper_for(tmp_path, state, local_budget=1e9)
    gate = threading.Event()
    finish = LocalCopy.finish
    monkeypatch.setattr(LocalCopy, "finish", lambda self, snap: gate.wait(10) and finish(self, snap))
    try:
        gen = active()
        step(state, keeper, gen)                       # its save is held in the writer
        step(state, keeper, gen)
        step(state, keeper, gen)                       # both return at once: the writer is busy, no snapshot
        assert keeper.snapshotted == 1 and keeper.skipped == {"busy": 2}
        gate.set()
        keeper.settle()
        assert keeper.local.describe().revision == 1
    finally:
        gate.set()
        keeper.close()


def test_a_restored_copy_says_which_committed_revisions_it_does_not_hold(tmp_path, monkeypatch):
    state = torch_state()
    keeper = keeper_for(tmp_path, state, local_budget=1e9)
    gen = active()
    step(state, keeper, gen)
    keeper.settle()
    monkeypatch.setattr(keeper.writer, "submit", lambda snap: None)     # the saves that follow never finish
    monkeypatch.setattr(BackgroundWriter, "busy", property(lambda self: True))
    step(state, keeper, gen)
    step(state, keeper, gen)
    monkeypatch.undo()
    keeper.close()
    again = keeper_for(tmp_path, torch_state())
    try:
        line = again.restore(VIEW)
        said = again.vote_fields(VIEW)               # the vote says it, so the job declares the loss if no one holds 3
        again.activated(active(revision=1, digest=again.state.digest()))
        after = again.vote_fields(VIEW)              # said once: the activation's own mark replaces it
    finally:
        again.close()
    assert "revision 1" in line and "committed up to revision 3" in line and "2..3" in line
    assert (said["committed"], said["committed_lineage"]) == (3, gen.generation)
    assert "committed" not in after


def test_a_copy_that_cannot_fit_is_refused_at_start_naming_the_size_and_the_flags(tmp_path, monkeypatch):
    real = os.statvfs(tmp_path)
    monkeypatch.setattr(os, "statvfs", lambda path: SimpleNamespace(f_bavail=1, f_frsize=real.f_frsize))
    with pytest.raises(LocalCopyError, match=r"needs 32\.0 MiB.*--local-state-dir.*--no-local-state"):
        keeper_for(tmp_path, torch_state())


def test_no_space_mid_run_is_logged_and_training_goes_on_without_the_copy(tmp_path, monkeypatch, caplog):
    state = torch_state()
    keeper = keeper_for(tmp_path, state, local_budget=1e9)
    gen = active()
    try:
        step(state, keeper, gen)
        keeper.settle()
        assert keeper.local.describe().revision == 1

        def full(fd, offset, length):
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(lc.os, "posix_fallocate", full)
        state.tensors["x"] = torch.zeros(10)           # a new layout: the free slot must grow
        with caplog.at_level(logging.ERROR):
            for _ in range(3):
                step(state, keeper, gen)
        assert "WITHOUT the local copy" in caplog.text and "No space left" in caplog.text
        assert caplog.text.count("WITHOUT") == 1 and keeper.writer is None
        assert keeper.local.describe().revision == 1   # the whole copy of before stays readable
        assert not (tmp_path / "slot-1.bin").exists()  # the unfinished slot gave its space back
    finally:
        keeper.close()

"""Checkpoints: atomic (a torn one is never listed), verified before use, pruned; the StateKeeper's choices."""

from __future__ import annotations

import json

import pytest

from p2pgen.core import Frontier, Member
from p2pgen.core.view import ActiveGeneration, JobView
from p2pgen.state import (
    CheckpointError,
    StateKeeper,
    StateKeeperConfig,
    list_checkpoints,
    load_checkpoint,
    write_checkpoint,
)
from p2pgen.state import checkpoint as ck
from tests.state.helpers import make_state

pytestmark = pytest.mark.timeout(30)

RUN = "a#1@1.0"


def at(revision: int):
    state = make_state(1, 4096, revision=revision)
    for t in state.tensors.values():
        t[...] = revision
    state.objects["step"] = revision
    return state


def write(directory, revision: int, epoch: int = 1, instance: str = RUN, keep: int = 0):
    return write_checkpoint(at(revision), directory, job="job", instance=instance, epoch=epoch, generation=2,
                            writer=("a", 1), owners=("a#1", "b#1"), keep=keep)


def test_a_checkpoint_round_trips_and_describes_its_objects(tmp_path):
    path = write(tmp_path, 12, epoch=2)
    (info,) = list_checkpoints(tmp_path)
    assert info.path == path and (info.revision, info.epoch, info.instance) == (12, 2, RUN)
    assert info.digest == at(12).digest()
    fields = {"object_id", "application_revision", "digest", "owners", "partition", "reconstruction_source",
              "verification_rule"}
    assert all(fields <= set(r) for r in info.manifest["objects"])
    target = make_state(9, 4096, revision=0)
    load_checkpoint(target, info)
    assert target.revision == 12 and target.digest() == at(12).digest() and target.objects["step"] == 12


def test_a_writer_killed_before_the_rename_leaves_nothing_listed(tmp_path, monkeypatch):
    def killed(*args):
        raise KeyboardInterrupt("killed before the rename")
    monkeypatch.setattr(ck.os, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        write(tmp_path, 5)
    monkeypatch.undo()
    assert list_checkpoints(tmp_path) == []


def test_a_torn_folder_left_by_a_dead_writer_is_not_listed(tmp_path):
    write(tmp_path, 5)
    torn = tmp_path / ".tmp-ckpt-000000000010-deadbeef-123-abcd"
    torn.mkdir()
    (torn / "t0.bin").write_bytes(b"half")
    assert [c.revision for c in list_checkpoints(tmp_path)] == [5]


def test_a_checkpoint_of_another_format_is_not_offered(tmp_path, caplog):
    """Format 1 hashed tensors in one pass; its digests are not this p2pgen's: skipped, with the reason."""
    old, new = write(tmp_path, 5), write(tmp_path, 6)
    body = json.loads((old / ck.MANIFEST).read_text())
    body["format"] = 1
    (old / ck.MANIFEST).write_text(json.dumps(body))
    assert [c.revision for c in list_checkpoints(tmp_path)] == [6]
    assert "format 1, this p2pgen reads 2" in caplog.text and new.exists() and old.exists()


def test_a_corrupted_checkpoint_is_refused_and_set_aside(tmp_path):
    write(tmp_path, 5)
    (info,) = list_checkpoints(tmp_path)
    victim = info.path / info.manifest["objects"][0]["file"]
    raw = bytearray(victim.read_bytes())
    raw[0] ^= 1
    victim.write_bytes(bytes(raw))
    target = make_state(9, 4096, revision=0)
    before = target.digest()
    with pytest.raises(CheckpointError, match="does not hash"):
        load_checkpoint(target, info)
    assert target.digest() == before and target.revision == 0
    ck.quarantine(info, "test")
    assert list_checkpoints(tmp_path) == [] and any(p.name.startswith("corrupt-") for p in tmp_path.iterdir())


def test_only_the_newest_are_kept_and_a_revision_is_written_once(tmp_path):
    for r in (2, 4, 6, 8):
        write(tmp_path, r, keep=2)
    assert [c.revision for c in list_checkpoints(tmp_path)] == [8, 6]
    assert write(tmp_path, 8, keep=2) == list_checkpoints(tmp_path)[0].path


def test_save_checkpoint_outside_a_job_can_be_restored_from(tmp_path):
    state = at(30)
    path = state.save_checkpoint(str(tmp_path))
    (info,) = list_checkpoints(tmp_path)
    assert str(info.path) == path and info.instance == "" and info.revision == 30


# --- the StateKeeper: what a vote offers, what a process restores -------------------------------------

def active(generation, revision, digest, members=()):
    return ActiveGeneration(generation=generation, parent=generation - 1, members=members,
                            frontier=Frontier(revision, digest), state_epoch=1, comm_id="", ownership=(), recovery="",
                            regressed_from=None, raft_index=generation, activated_at=0.0)


def job_state(instance=RUN, epoch=1, forks=()):
    return JobView(job="job", instance=instance, index=1, leader="n1", agents=1, members=(), active=None, pending=None,
                   tombstones=frozenset(), state_epoch=epoch, forks=tuple(forks))


def test_a_vote_offers_the_newest_checkpoint_of_this_run_or_of_a_restore_folder(tmp_path):
    mine, other, restore = tmp_path / "mine", tmp_path / "other", tmp_path / "restore"
    write(mine, 10)
    write(mine, 20, instance="another run")
    write(restore, 15, instance="", epoch=7)
    keeper = StateKeeper(StateKeeperConfig(checkpoint_dir=str(mine), restore_dirs=(str(restore),)), at(0), "job",
                         ("a", 2))
    fields = keeper.vote_fields(job_state())
    assert (fields["ckpt_revision"], fields["ckpt_epoch"]) == (15, 1)       # a restore folder counts as epoch 1
    write(mine, 18)
    assert keeper.vote_fields(job_state())["ckpt_revision"] == 18
    assert "ckpt_revision" not in StateKeeper(StateKeeperConfig(checkpoint_dir=str(other)), at(0), "job",
                                              ("a", 2)).vote_fields(job_state())


def test_a_checkpoint_of_a_branch_the_job_left_is_not_offered(tmp_path):
    write(tmp_path, 10, epoch=1)
    write(tmp_path, 30, epoch=1)
    keeper = StateKeeper(StateKeeperConfig(checkpoint_dir=str(tmp_path)), at(0), "job", ("a", 2))
    assert keeper.vote_fields(job_state(epoch=2, forks=[(2, 20)]))["ckpt_revision"] == 10


def test_the_frontier_checkpoint_is_loaded_and_a_bad_one_set_aside(tmp_path):
    write(tmp_path, 10)
    state = at(0)
    keeper = StateKeeper(StateKeeperConfig(checkpoint_dir=str(tmp_path)), state, "job", ("a", 2))
    keeper.load_frontier_checkpoint(job_state(), Frontier(10, at(10).digest()))
    assert state.revision == 10 and state.digest() == at(10).digest()
    (info,) = list_checkpoints(tmp_path)
    (info.path / "objects.pkl").write_bytes(b"garbage")
    with pytest.raises(CheckpointError):
        keeper.load_frontier_checkpoint(job_state(), Frontier(10, at(10).digest()))
    assert list_checkpoints(tmp_path) == []


def test_rank_zero_writes_every_n_revisions_and_everyone_saves_the_local_copy(tmp_path):
    cert = active(4, 0, "", members=(Member("a", 2),))
    states = {rank: at(0) for rank in (0, 1)}
    keepers = {rank: StateKeeper(StateKeeperConfig(local_dir=str(tmp_path / f"local{rank}"),
                                                   checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=3,
                                                   local_budget=1e9),
                                 states[rank], "job", (f"p{rank}", 1)) for rank in (0, 1)}
    for k in keepers.values():
        k.vote_fields(job_state())
    for _ in range(7):
        for rank, k in keepers.items():
            states[rank]._commit()
            k.committed(cert, rank)
            k.settle()                # the background save finishes before the next commit
    assert [c.revision for c in list_checkpoints(tmp_path / "ckpt")] == [6, 3]
    assert all(k.local.describe().revision == 7 for k in keepers.values())


def test_restore_uses_a_copy_of_this_run_and_branch_only(tmp_path):
    saved = at(9)
    keeper = StateKeeper(StateKeeperConfig(local_dir=str(tmp_path)), saved, "job", ("a", 1))
    keeper.vote_fields(job_state())
    keeper.activated(active(3, 9, "x"))
    for js, revision in ((job_state(instance="another run"), 0), (job_state(epoch=2, forks=[(2, 5)]), 0),
                         (job_state(epoch=2, forks=[(2, 9)]), 9)):
        state = at(0)
        note = StateKeeper(StateKeeperConfig(local_dir=str(tmp_path)), state, "job", ("a", 2)).restore(js)
        assert state.revision == revision, note
    assert json.loads((tmp_path / "current.json").read_text())["epoch"] == 1


def test_a_state_pulled_after_a_restore_votes_the_jobs_epoch_not_the_copys(tmp_path):
    """Schedule #2 of `p2pgen chaos --seed 1 --injections 6`: p0#2 restored its copy of revision 17 (state epoch 1),
    pulled the frontier r56 of epoch 2 (forked at r48), and voted again when that proposal was abandoned. The vote
    said epoch 1, was refused as a branch the job left, and p0#2, its vote counted as cast, never voted again."""
    saved = at(17)
    writer = StateKeeper(StateKeeperConfig(local_dir=str(tmp_path)), saved, "job", ("a", 1))
    writer.vote_fields(job_state())
    writer.activated(active(1, 17, "x"))
    keeper = StateKeeper(StateKeeperConfig(local_dir=str(tmp_path)), at(0), "job", ("a", 2))
    now = job_state(epoch=2, forks=[(2, 48)])
    assert "resumed from the local copy of revision 17" in keeper.restore(now)
    assert keeper.vote_fields(now)["epoch"] == 1 and now.on_branch(1, 17)
    keeper.pulled(now)                                                     # the frontier r56 replaced it
    epoch = keeper.vote_fields(now)["epoch"]
    assert epoch == 2 and now.on_branch(epoch, 56) and not now.on_branch(1, 56)


def test_the_local_copy_every_n_commits_is_also_saved_at_each_activation(tmp_path):
    state = at(0)
    config = StateKeeperConfig(local_dir=str(tmp_path), local_every=3, local_budget=1e9)
    keeper = StateKeeper(config, state, "job", ("a", 1))
    keeper.vote_fields(job_state())
    cert = active(2, 0, "")
    for _ in range(7):
        state._commit()
        keeper.committed(cert, 1)
        keeper.settle()
    assert keeper.local.describe().revision == 6
    keeper.activated(active(3, 7, state.digest()))
    assert keeper.local.describe().revision == 7          # the certified revision is always in the copy

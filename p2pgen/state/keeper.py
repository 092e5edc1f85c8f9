"""StateKeeper: where a member's state lives besides its process (a local copy, checkpoints), for the step loop.

Owns the application side of "state that survives": restoring the local copy before the first vote,
what a vote says about the state's epoch and the newest usable checkpoint, snapshotting the local copy
at commits (when `p2pgen.state.savepolicy` says so; hashed and published by a background writer) and
saving it whole at every activation that changed the state, writing a checkpoint every N revisions
(rank 0 only: each object once), and loading the checkpoint the frontier election chose. Configured by
the agent through the environment (`StateKeeperConfig.from_env`); every part is optional.

Invariants:
- The local copy is restored at most once per process, before this process votes for the first time,
  and only if it belongs to this run of the job and to a state epoch the job has not left (a copy of a
  dead branch is ignored, and said so); otherwise the process starts from the state it built.
- A vote offers only a checkpoint of this run of the job, or one from a `--restore` folder (which
  belongs to no run of this job yet: it counts as state epoch 1), and only one on the current branch.
- Sharded objects: every member writes the shards it is the first owner of beside each checkpoint
  (`p2pgen.state.shardckpt`); a checkpoint is offered only when every shard of its revision is there, and
  loading it installs them all (the member then serves them to the others).
- The local copy holds the certified revision before a generation's first step (the activation's save is
  waited for); between activations it lags the committed revision by the snapshots the policy skipped and
  the one in flight, never holds a torn revision, and the mark of the last commit lets the next
  incarnation say which committed revisions it does not hold. The step never waits for the writer.
- No space for the two slots at start: `LocalCopyError` naming the size and the flags; a save that fails
  mid-run (ENOSPC) is logged and training goes on without the local copy.
- A checkpoint that fails to load is set aside (`corrupt-...`) and the error is raised: the process
  must not report `synced`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from p2pgen.core import Frontier
from p2pgen.core.view import ActiveGeneration, JobView
from p2pgen.state.checkpoint import (
    CheckpointError,
    CheckpointInfo,
    list_checkpoints,
    load_checkpoint,
    quarantine,
    write_checkpoint,
)
from p2pgen.state.localcopy import LocalCopy, LocalCopyError
from p2pgen.state.savepolicy import SAVE, SavePolicy, decide
from p2pgen.state.shardckpt import find_shards, load_shards, prune_shards, write_shards
from p2pgen.state.shared import SharedState
from p2pgen.state.staging import stager_for
from p2pgen.state.writer import BackgroundWriter

log = logging.getLogger(__name__)

ENV_LOCAL = "P2PGEN_LOCAL_STATE_DIR"
ENV_LOCAL_EVERY = "P2PGEN_LOCAL_STATE_EVERY"
ENV_LOCAL_BUDGET = "P2PGEN_LOCAL_STATE_BUDGET"
ENV_CHECKPOINT_DIR = "P2PGEN_CHECKPOINT_DIR"
ENV_CHECKPOINT_EVERY = "P2PGEN_CHECKPOINT_EVERY"
ENV_CHECKPOINT_KEEP = "P2PGEN_CHECKPOINT_KEEP"
ENV_RESTORE = "P2PGEN_RESTORE_DIR"


@dataclass(frozen=True)
class StateKeeperConfig:
    local_dir: str = ""              # the local copy's folder ("": no local copy)
    local_every: int = 1             # save it every N commits at most (and at every activation that changed it)
    local_budget: float = 0.05       # share of the step time the snapshots may block the steps (`savepolicy`)
    checkpoint_dir: str = ""         # where checkpoints are written and read ("": none)
    checkpoint_every: int = 0        # write one every N revisions (0: never write)
    checkpoint_keep: int = 3
    restore_dirs: tuple[str, ...] = field(default=())   # checkpoints of an earlier run to start from

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> StateKeeperConfig:
        numbers = {name: env.get(name, default) for name, default in
                   ((ENV_LOCAL_EVERY, "1"), (ENV_CHECKPOINT_EVERY, "0"), (ENV_CHECKPOINT_KEEP, "3"))}
        if not all(v.isdigit() for v in numbers.values()) or numbers[ENV_LOCAL_EVERY] == "0":
            raise ValueError(f"{', '.join(f'{k}={v!r}' for k, v in numbers.items())}: whole numbers >= 0 "
                             f"({ENV_LOCAL_EVERY} >= 1)")
        budget = env.get(ENV_LOCAL_BUDGET, "0.05")
        try:
            local_budget = float(budget)
        except ValueError:
            local_budget = -1.0
        if not local_budget > 0:
            raise ValueError(f"{ENV_LOCAL_BUDGET}={budget!r}: a fraction of the step time > 0 (default 0.05)")
        return cls(env.get(ENV_LOCAL, ""), int(numbers[ENV_LOCAL_EVERY]), local_budget,
                   env.get(ENV_CHECKPOINT_DIR, ""), int(numbers[ENV_CHECKPOINT_EVERY]),
                   int(numbers[ENV_CHECKPOINT_KEEP]), tuple(d for d in env.get(ENV_RESTORE, "").split(os.pathsep) if d))

    @property
    def enabled(self) -> bool:
        return bool(self.local_dir or self.checkpoint_dir or self.restore_dirs)


class StateKeeper:
    """One process's local copy and checkpoints. `view` arguments are the job as the step loop sees it."""

    def __init__(self, config: StateKeeperConfig, state: SharedState, job: str, identity: tuple[str, int]) -> None:
        self.config, self.state, self.job, self.identity = config, state, job, identity
        self.local = LocalCopy(config.local_dir, job, identity[0]) if config.local_dir else None
        if self.local is not None:
            self.local.check_space(state)
        self.policy = SavePolicy(every=config.local_every, budget=config.local_budget)
        self.writer = BackgroundWriter(self.local) if self.local is not None else None
        self.stager = stager_for(list(state.tensors.values())) if self.local is not None else None
        self.snapshotted = 0           # revision of the last snapshot taken (saved, or being saved)
        self.unsaved: tuple[int, int] | None = None   # restored: (revision, generation) committed above the copy
        self.skipped: dict[str, int] = {}   # commits that took no snapshot, by the policy's reason
        self._step_s = 0.0             # mean seconds per step lately, snapshots excluded
        self._snapshot_s = 0.0         # seconds the last snapshot blocked its step
        self._last_commit = 0.0        # monotonic time of the last commit (0: none yet)
        self.epoch = 0                 # state epoch of the state held (0: not known, e.g. just pulled)
        self.lineage = 0               # the generation a restored local copy was saved in (0: none restored)
        self.instance = ""             # this run of the job (from the replicated state), once seen
        self.restored: str = ""        # what restore() did, for the application's log and the trace
        self._restore_tried = False
        self._saved: tuple[int, str] | None = None      # (revision, digest) of the last local copy written
        self.checkpoints_written = 0

    # --- before the first vote -------------------------------------------------------------------------

    def restore(self, view: JobView) -> str:
        """Load the local copy once, if it is usable; returns a line saying what happened ("" if no copy)."""
        self.instance = view.instance
        if self._restore_tried or self.local is None:
            return ""
        self._restore_tried = True
        info = self.local.describe()
        if info is None:
            return ""
        if info.revision <= self.state.revision:
            self.restored = (f"local copy of revision {info.revision} not used: this process starts at revision "
                             f"{self.state.revision} already")
            return self.restored
        if not view.on_branch(info.epoch, info.revision):
            self.restored = (f"local copy of revision {info.revision} (state epoch {info.epoch}) ignored: the job "
                             f"left that branch of history (forks {list(view.forks)})")
            log.warning("%s", self.restored)
            return self.restored
        self.restored = self._load_local()[1]
        return self.restored

    def recover(self, view: JobView) -> str:
        """After a catch-up failed having written some tensors (a mix of two revisions): put the state back
        to the local copy, if there is one on the job's branch. Returns what happened; "" when the state
        could not be recovered this way (the process must then restart)."""
        self.instance = view.instance
        info = self.local.describe() if self.local is not None else None
        if info is None or not view.on_branch(info.epoch, info.revision):
            return ""
        loaded, line = self._load_local()
        return line if loaded else ""

    def _load_local(self) -> tuple[bool, str]:
        """Load the local copy (verified before anything is written): whether it was, and a line saying so."""
        self.settle()
        try:
            done = self.local.load_into(self.state, instance=self.instance)
        except LocalCopyError as e:
            line = f"local copy in {self.local.folder} not used: {e}"
            log.warning("%s", line)
            return False, line
        self.epoch = done.info.epoch
        self.lineage = done.info.generation
        self._saved = (done.info.revision, done.info.digest)
        self.snapshotted = done.info.revision
        line = (f"resumed from the local copy of revision {done.info.revision} (digest {done.info.digest}, "
                f"saved by incarnation {done.info.incarnation} in generation {done.info.generation}; "
                f"{done.info.nbytes / 1e6:.1f} MB verified and loaded in {done.seconds * 1e3:.0f} ms)")
        self.unsaved = self.local.unsaved_commits(done.info)
        if self.unsaved is not None:
            line += (f"; this peer had committed up to revision {self.unsaved[0]} (generation {self.unsaved[1]}), "
                     f"whose saves had not finished: revisions {done.info.revision + 1}.."
                     f"{self.unsaved[0]} come from a member that holds them, or are done again (and the job says "
                     "so: regressed_from)")
        log.warning("%s", line)
        return True, line

    def vote_fields(self, view: JobView) -> dict[str, Any]:
        """What a `ready` vote says about the state (its epoch) and the newest usable checkpoint. Waits for the
        save in flight, whose digests then spare the vote's digest the hashing of unchanged tensors."""
        self.instance = view.instance
        self.settle()
        fields: dict[str, Any] = {"epoch": self.epoch}
        if self.unsaved is not None:
            fields.update(committed=self.unsaved[0], committed_lineage=self.unsaved[1])
        best = self._best_checkpoint(view)
        if best is not None:
            info, epoch = best
            fields.update(ckpt_revision=info.revision, ckpt_digest=info.digest, ckpt_epoch=epoch)
        return fields

    # --- between generations ---------------------------------------------------------------------------

    def pulled(self, view: JobView) -> None:
        """The state was replaced by the frontier pulled for the pending generation (`view`): it is of the job's
        current state epoch now, whatever copy was restored before. A vote that kept the restored copy's older epoch
        was refused as a branch the job left whenever the pulled revision lay above the fork, and the member, whose
        refused vote counts as cast, never voted again: the job waited for it for ever.

        Args:
            view: the job as the pull found it (its `state_epoch`).
        """
        self.epoch = view.state_epoch

    def load_frontier_checkpoint(self, view: JobView, frontier: Frontier) -> str:
        """Load the checkpoint holding `frontier` (the election chose it); returns a line for the log."""
        for info, _ in self._candidates(view):
            if (info.revision, info.digest) != (frontier.revision, frontier.digest):
                continue
            try:
                load_checkpoint(self.state, info)
                if self.state.sharded:
                    load_shards(self.state, info.path.parent, info.revision)
            except (CheckpointError, OSError) as e:
                quarantine(info, str(e))
                raise CheckpointError(f"the frontier's checkpoint {info.path} failed to load: {e}") from e
            self.epoch = 0
            return f"loaded checkpoint {info.path} (revision {info.revision}, digest {info.digest})"
        raise CheckpointError(f"no checkpoint of revision {frontier.revision} with digest {frontier.digest} "
                              f"is readable here any more")

    def activated(self, active: ActiveGeneration) -> None:
        """The state now belongs to `active`: note its epoch; if it changed, save the local copy before the
        generation's first step (whole, not in the background: the copy then holds the certified revision)."""
        self.epoch = active.state_epoch
        self.unsaved = None                 # said in this generation's election: its own mark replaces it
        if self.writer is None:
            return
        self.settle()
        if self.writer is not None and self._saved != (self.state.revision, active.frontier.digest):
            if self._snapshot(active):
                self.settle()
        if self.writer is not None:
            self._mark(self.state.revision, active.generation)
        self._last_commit = 0.0

    def committed(self, active: ActiveGeneration, rank: int) -> None:
        """After a commit: snapshot the state for the local copy when the save policy says so (its writer
        hashes and publishes it while the next steps compute); rank 0 writes a checkpoint every
        `checkpoint_every` revisions."""
        self._collect()
        if self.writer is not None:
            self._commit_local(active)
        every = self.config.checkpoint_every
        if self.state.sharded and every and self.config.checkpoint_dir and self.state.revision % every == 0:
            self._checkpoint_shards(active)
        if rank == 0 and every and self.config.checkpoint_dir and self.state.revision % every == 0:
            members = tuple(f"{m.peer_id}#{m.incarnation}" for m in active.members)
            try:
                write_checkpoint(self.state, self.config.checkpoint_dir, job=self.job, instance=self.instance,
                                 epoch=self.epoch, generation=active.generation, writer=self.identity,
                                 owners=members, keep=self.config.checkpoint_keep)
                self.checkpoints_written += 1
            except OSError as e:
                log.error("checkpoint of revision %d in %s failed: %s (training goes on)", self.state.revision,
                          self.config.checkpoint_dir, e)

    # --- helpers -------------------------------------------------------------------------------------

    def _checkpoint_shards(self, active: ActiveGeneration) -> None:
        """Write the shards this member is the first owner of (each shard once) beside the checkpoint."""
        me = f"{self.identity[0]}#{self.identity[1]}"
        keys = [(object_id, shard) for object_id, shard, owners in active.ownership if owners[:1] == (me,)]
        try:
            write_shards(self.state, self.config.checkpoint_dir, keys)
            kept = list_checkpoints(self.config.checkpoint_dir)[:max(self.config.checkpoint_keep, 1)]
            if kept and self.config.checkpoint_keep:
                prune_shards(self.config.checkpoint_dir, min(i.revision for i in kept))
        except OSError as e:
            log.error("shards of revision %d in %s failed: %s (training goes on)", self.state.revision,
                      self.config.checkpoint_dir, e)

    def settle(self) -> None:
        """Wait for the save in flight and take in what finished (its digests enter the state's cache)."""
        if self.writer is not None:
            self.writer.wait()
            self._collect()

    def close(self) -> None:
        """Let the save in flight finish, stop the writer and unmap the slots."""
        if self.writer is not None:
            self.writer.close()
            self._collect()
            self.writer = None
        if self.local is not None:
            self.local.close()

    def _commit_local(self, active: ActiveGeneration) -> None:
        """Mark the commit, measure the step, and take a snapshot if the save policy says so."""
        revision, now = self.state.revision, time.monotonic()
        self._mark(revision, active.generation)
        if self.writer is None:             # the mark could not be written: the copy is off now
            return
        if self._last_commit:
            step = now - self._last_commit
            self._step_s = step if not self._step_s else 0.8 * self._step_s + 0.2 * step
        decision = decide(self.policy, revision, self.snapshotted, self.writer.busy, self._step_s,
                          self._snapshot_s + self.writer.seconds)
        if decision == SAVE:
            started = time.monotonic()
            self._snapshot(active)
            self._snapshot_s = time.monotonic() - started
            now = time.monotonic()          # the step time excludes the snapshot: the budget is its share
        else:
            self.skipped[decision] = self.skipped.get(decision, 0) + 1
        self._last_commit = now

    def _snapshot(self, active: ActiveGeneration) -> bool:
        """Snapshot the state into the free slot and hand it to the writer; whether it was taken."""
        try:
            snap = self.local.snapshot(self.state, instance=self.instance, incarnation=self.identity[1],
                                       generation=active.generation, epoch=self.epoch, stager=self.stager)
        except OSError as e:
            self._stop_local(self.state.revision, e)
            return False
        self.snapshotted = self.state.revision
        self.writer.submit(snap)
        return True

    def _collect(self) -> None:
        """Take in the saves the writer finished: their digests, or the error that stopped one."""
        if self.writer is None:
            return
        for snap, outcome in self.writer.take():
            if isinstance(outcome, Exception):
                self._stop_local(int(snap.meta["revision"]), outcome)
                continue
            self._saved = (outcome.revision, outcome.digest)
            for name, blocks in snap.blocks.items():
                self.state._remember(name, snap.keys.get(name), blocks)

    def _mark(self, revision: int, generation: int) -> None:
        try:
            self.local.mark_committed(revision, self.instance, self.identity[1], generation)
        except OSError as e:
            self._stop_local(revision, e)

    def _stop_local(self, revision: int, error: Exception) -> None:
        """A save failed (a full tmpfs: ENOSPC): say so, free the unfinished slot, go on without the copy."""
        if self.writer is None:
            return
        kept = self.local.describe()
        log.error("local copy of revision %d in %s failed: %s. Training goes on WITHOUT the local copy: a crash "
                  "now resumes from %s, another member or a checkpoint. Free space there, or restart with "
                  "--local-state-dir DIR on a filesystem with room (or --no-local-state)", revision, self.local.folder,
                  error, f"the copy of revision {kept.revision}" if kept else "no copy,")
        writer, self.writer = self.writer, None
        writer.close()
        self.local.drop_free_slot()

    def _candidates(self, view: JobView) -> list[tuple[CheckpointInfo, int]]:
        """(checkpoint, the epoch it counts as) for every checkpoint this process may offer."""
        found = []
        if self.config.checkpoint_dir:
            for info in list_checkpoints(self.config.checkpoint_dir):
                if (info.job, info.instance) == (self.job, view.instance):
                    found.append((info, info.epoch))
        for folder in self.config.restore_dirs:
            found += [(info, 1) for info in list_checkpoints(folder)]      # the start of this run's history
        layout = [o.partition for o in self.state.sharded.values()]
        return [(i, e) for i, e in found if view.on_branch(e, i.revision)
                and (not layout or find_shards(i.path.parent, i.revision, layout) is not None)]

    def _best_checkpoint(self, view: JobView) -> tuple[CheckpointInfo, int] | None:
        candidates = self._candidates(view)
        return max(candidates, key=lambda c: c[0].revision) if candidates else None


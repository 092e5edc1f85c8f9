"""Where a supervised application's state lives outside its process: the agent's part.

Owns: the `p2pgen join` flags for local copies, checkpoints and the regression rule; the folder that
holds this peer's local copy (kept across the application's incarnations, on tmpfs by default); the
environment each incarnation gets (read by `p2pgen.state.StateKeeperConfig.from_env`); the job rules
the agent proposes when it forms the job (`Configure`); and removing the local copy when the agent
leaves gracefully.

Invariant kept: one local copy folder per (job, peer id, control address) on a host, so two agents
(of two jobs, or two peers) never write into one, while an agent replaced at the same address (a
restarted agent process) finds its predecessor's copy (the application checks that the copy belongs to
this run of the job before using it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from dataclasses import dataclass, field

from p2pgen.core import DEFAULT_REGRESS_WAIT, HOLD_FLOOR_S
from p2pgen.state.keeper import (
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_EVERY,
    ENV_CHECKPOINT_KEEP,
    ENV_LOCAL,
    ENV_LOCAL_BUDGET,
    ENV_LOCAL_EVERY,
    ENV_RESTORE,
)
from p2pgen.state.localcopy import CopyInfo, LocalCopy

SHM = "/dev/shm"


@dataclass
class StateDirConfig:
    local: bool = True                       # keep a local copy of the application's committed state
    local_base: str = ""                     # its parent folder ("": /dev/shm when writable, else the temp dir)
    local_every: int = 1                     # saved every N commits (steps since the last one may be redone)
    local_budget: float = 0.05               # share of the step time its snapshots may take
    checkpoint_dir: str = ""
    checkpoint_every: int = 0
    checkpoint_keep: int = 3
    restore: list[str] = field(default_factory=list)
    regress_wait: float = DEFAULT_REGRESS_WAIT
    allow_fresh_start: bool = False

    @property
    def sets_job_rules(self) -> bool:
        """True when the job rules differ from the core's defaults (then the agent must configure them)."""
        return self.regress_wait != DEFAULT_REGRESS_WAIT or self.allow_fresh_start

    def local_folder(self, job: str, peer_id: str, listen: str) -> str:
        base = self.local_base or (SHM if os.access(SHM, os.W_OK) else tempfile.gettempdir())
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{job}-{peer_id}-{listen}")
        return os.path.join(base, f"p2pgen-state-{safe}")

    def app_env(self, job: str, peer_id: str, listen: str) -> dict[str, str]:
        """The environment that tells an application where its state lives besides its process."""
        env = {ENV_CHECKPOINT_EVERY: str(self.checkpoint_every), ENV_CHECKPOINT_KEEP: str(self.checkpoint_keep),
               ENV_LOCAL_EVERY: str(self.local_every), ENV_LOCAL_BUDGET: repr(self.local_budget)}
        if self.local:
            env[ENV_LOCAL] = self.local_folder(job, peer_id, listen)
        if self.checkpoint_dir:
            env[ENV_CHECKPOINT_DIR] = os.path.abspath(self.checkpoint_dir)
        if self.restore:
            env[ENV_RESTORE] = os.pathsep.join(os.path.abspath(d) for d in self.restore)
        return env

    def describe_local(self, job: str, peer_id: str, listen: str) -> CopyInfo | None:
        """What the local copy's pointer says (revision, digest, generation, incarnation), unverified; None when
        there is no copy (the application verifies it before using it)."""
        folder = self.local_folder(job, peer_id, listen)
        if not self.local or not os.path.isdir(folder):
            return None
        try:
            return LocalCopy(folder, job, peer_id).describe()
        except (OSError, ValueError, KeyError):
            return None

    def unsaved_commits(self, job: str, peer_id: str, listen: str, copy_: CopyInfo) -> tuple[int, int] | None:
        """(revision, generation) the dead application had committed above `copy_` (its mark), when its saves
        had not caught up; None otherwise."""
        folder = self.local_folder(job, peer_id, listen)
        if not self.local or not os.path.isdir(folder):
            return None
        return LocalCopy(folder, job, peer_id).unsaved_commits(copy_)

    def remove_local(self, job: str, peer_id: str, listen: str) -> None:
        """The peer left the job: its local copy is of no further use."""
        if self.local:
            shutil.rmtree(self.local_folder(job, peer_id, listen), ignore_errors=True)


def add_state_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("state that survives the application (local copy, checkpoints, regression)")
    group.add_argument("--no-local-state", action="store_true",
                       help="do not keep a local copy of the application's committed state across its restarts")
    group.add_argument("--local-state-dir", default="", metavar="DIR",
                       help="parent folder of the local copy (default: /dev/shm when writable, else the temp dir)")
    group.add_argument("--local-state-every", type=int, default=1, metavar="N",
                       help="save the local copy every N commits (default 1; a crash may then redo up to N-1 "
                            "steps committed since the last generation change, never a certified one)")
    group.add_argument("--local-state-budget", type=float, default=0.05, metavar="F",
                       help="share of the step time the local copy's snapshots may take (default 0.05: the step "
                            "rate stays >= 0.95x of the rate without a copy; the writer hashes and publishes each "
                            "snapshot in the background; larger: snapshots more often, fewer steps redone after a "
                            "crash of every holder)")
    group.add_argument("--checkpoint-dir", default="", metavar="DIR",
                       help="where checkpoints are written (rank 0, every --checkpoint-every revisions) and read")
    group.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                       help="write a checkpoint every N revisions (default 0: never)")
    group.add_argument("--checkpoint-keep", type=int, default=3, metavar="K",
                       help="checkpoints kept in --checkpoint-dir (default 3; 0: all)")
    group.add_argument("--restore", action="append", default=[], metavar="DIR",
                       help="start from the newest checkpoint in DIR (of an earlier run) if it is newer than "
                            "every member's state")
    group.add_argument("--regress-wait", type=float, default=DEFAULT_REGRESS_WAIT, metavar="S",
                       help="a generation that would resume below the certified revision waits for a holder, a "
                            "local copy or a checkpoint as long as the missing steps took to make, at least "
                            f"{HOLD_FLOOR_S:g} s and at most S seconds (an application restarting from its own "
                            "copy: S), unless every incarnation that could hold them has said what it holds "
                            f"(default {DEFAULT_REGRESS_WAIT:g}; same on every agent)")
    group.add_argument("--allow-fresh-start", action="store_true",
                       help="after that wait, allow resuming from revision 0 when nothing survived (default: the "
                            "generation stays held and says so)")


def state_config_from_args(args: argparse.Namespace) -> StateDirConfig:
    """The flags above as a config; ValueError naming the flag when one is out of range."""
    if args.checkpoint_every < 0 or args.checkpoint_keep < 0 or args.local_state_every < 1:
        raise ValueError("--checkpoint-every and --checkpoint-keep must be >= 0, --local-state-every >= 1")
    if not args.local_state_budget > 0:
        raise ValueError("--local-state-budget must be > 0 (a fraction of the step time), "
                         f"got {args.local_state_budget}")
    if not 0 <= args.regress_wait <= 86400:
        raise ValueError(f"--regress-wait must be within 0..86400 seconds, got {args.regress_wait}")
    if args.checkpoint_every and not args.checkpoint_dir:
        raise ValueError("--checkpoint-every needs --checkpoint-dir DIR")
    for d in args.restore:
        if not os.path.isdir(d):
            raise ValueError(f"--restore {d}: no such folder")
    return StateDirConfig(local=not args.no_local_state, local_base=args.local_state_dir,
                          local_every=args.local_state_every, local_budget=args.local_state_budget,
                          checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                          checkpoint_keep=args.checkpoint_keep, restore=list(args.restore),
                          regress_wait=args.regress_wait, allow_fresh_start=args.allow_fresh_start)


def state_flags(config: StateDirConfig) -> list[str]:
    """The flags that recreate `config` (for `--local`, which starts agents as processes)."""
    flags = [f"--checkpoint-every={config.checkpoint_every}", f"--checkpoint-keep={config.checkpoint_keep}",
             f"--regress-wait={config.regress_wait}", f"--local-state-every={config.local_every}",
             f"--local-state-budget={config.local_budget}"]
    if not config.local:
        flags.append("--no-local-state")
    if config.local_base:
        flags.append(f"--local-state-dir={config.local_base}")
    if config.checkpoint_dir:
        flags.append(f"--checkpoint-dir={os.path.abspath(config.checkpoint_dir)}")
    flags += [f"--restore={os.path.abspath(d)}" for d in config.restore]
    if config.allow_fresh_start:
        flags.append("--allow-fresh-start")
    return flags

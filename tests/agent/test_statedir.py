"""What an agent reads from the local copy its dead application left: the pointer's copy, and the mark of the
revisions committed above it (reported with the copy, so that the job says when it resumes below them)."""

from __future__ import annotations

import numpy as np

from p2pgen.agent.statedir import StateDirConfig
from p2pgen.state import LocalCopy, SharedState

JOB, PEER, LISTEN, RUN = "job", "p0", "127.0.0.1:1", "run-1"


def saved(dirs: StateDirConfig, revision: int) -> LocalCopy:
    copy = LocalCopy(dirs.local_folder(JOB, PEER, LISTEN), JOB, PEER)
    state = SharedState({"w": np.full(16, revision, np.float32)}, {}, revision=revision)
    copy.save(state, instance=RUN, incarnation=1, generation=3, epoch=1)
    return copy


def test_the_mark_above_the_copy_is_reported_with_the_generation_it_was_committed_in(tmp_path):
    dirs = StateDirConfig(local_base=str(tmp_path))
    copy = saved(dirs, 7)
    copy.mark_committed(9, RUN, 1, generation=4)
    copy.close()
    info = dirs.describe_local(JOB, PEER, LISTEN)
    assert info is not None and info.revision == 7 and info.instance == RUN
    assert dirs.unsaved_commits(JOB, PEER, LISTEN, info) == (9, 4)


def test_a_mark_the_copy_holds_or_of_another_run_says_nothing(tmp_path):
    dirs = StateDirConfig(local_base=str(tmp_path))
    copy = saved(dirs, 7)
    copy.mark_committed(7, RUN, 1, generation=3)           # the save caught up
    info = dirs.describe_local(JOB, PEER, LISTEN)
    assert dirs.unsaved_commits(JOB, PEER, LISTEN, info) is None
    copy.mark_committed(12, "another-run", 1, generation=9)  # a mark this copy's run never wrote
    assert dirs.unsaved_commits(JOB, PEER, LISTEN, info) is None
    copy.close()
    assert StateDirConfig(local=False, local_base=str(tmp_path)).unsaved_commits(JOB, PEER, LISTEN, info) is None

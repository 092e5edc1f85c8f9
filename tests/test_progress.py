"""The progress file protocol: one line per committed step, read incrementally, cut lines skipped, one stop."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from p2pgen.progress import ENV, CommitLog, Progress, write_stop
from p2pgen.state import SharedState

pytestmark = pytest.mark.timeout(30)


def step(state: SharedState, generation: int = 3) -> SimpleNamespace:
    return SimpleNamespace(peer=SimpleNamespace(state=state), generation=generation)


def test_committed_steps_are_read_back_incrementally_and_a_cut_line_is_skipped(tmp_path):
    import numpy as np
    state = SharedState(tensors={"w": np.zeros(4)})
    progress = Progress(str(tmp_path), "node/1", 2)
    log = CommitLog(tmp_path)
    assert log.poll() == []
    state._commit()
    progress.committed(step(state))
    first = log.poll()
    assert [(c.peer, c.incarnation, c.generation, c.revision, c.digest) for c in first] == \
        [("node/1", 2, 3, 1, state.digest())]
    with open(tmp_path / "node_1-2.jsonl", "a") as f:
        f.write(json.dumps({"t": 1.0, "peer": "node/1"})[:-3])          # a writer killed mid-line
    assert log.poll() == []
    (tmp_path / "p0-1.jsonl").write_text('{"t": 2.0, "peer": "p0", "incarnation": 1, "generation": 1, "rev')
    assert log.poll() == []                                           # not ended yet: read again next time
    with open(tmp_path / "p0-1.jsonl", "a") as f:
        f.write('ision": 5, "digest": "d"}\n')
    assert [c.revision for c in log.poll()] == [5] and len(log.commits) == 2
    progress.close()


def test_the_stop_revision_is_what_the_harness_wrote_and_infinity_before(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path))
    progress = Progress.from_env(SimpleNamespace(peer_id="p0", incarnation=1))
    assert progress.stop_revision() == float("inf")
    write_stop(tmp_path, 42)
    assert progress.stop_revision() == 42 and not os.path.exists(tmp_path / "stop.tmp")
    progress.close()


def test_without_the_variable_progress_is_a_no_op(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    progress = Progress.from_env(SimpleNamespace(peer_id="p0", incarnation=1))
    progress.committed(None)
    assert progress.stop_revision() == float("inf")
    progress.close()

"""A process that saves its local copy in the background and is SIGKILLed at one phase of that save.

Run as `python -m tests.state.savekill FOLDER PHASE`: saves revisions 1 and 2 whole (both slots used),
marks revision 3 committed (as a commit does, before its snapshot), takes the snapshot of revision 3 (into
the slot that held revision 1), hands it to the background writer,
writes revision 4's values into the live tensors while the writer works (the next step), and SIGKILLs
itself the first time the save reaches PHASE (`p2pgen.state.localcopy.PHASE_HOOK`). Exits 0 when PHASE
never came.
"""

from __future__ import annotations

import os
import signal
import sys

import numpy as np

from p2pgen.state import LocalCopy, SharedState
from p2pgen.state import localcopy as lc
from p2pgen.state.writer import BackgroundWriter

JOB, PEER, RUN = "job", "p0", "p0#1@1.0"
PIECES, N = 4, 1 << 18           # 4 tensors of 1 MiB: several blocks each, so a phase lands mid-save


def revision_state(revision: int) -> SharedState:
    """The exact state of `revision`: every element of tensor i equals revision * 10 + i."""
    tensors = {f"w{i}": np.full(N, revision * 10 + i, np.float32) for i in range(PIECES)}
    return SharedState(tensors, {"step": revision}, revision=revision)


def write_revision(state: SharedState, revision: int) -> None:
    for i in range(PIECES):
        state.tensors[f"w{i}"][...] = revision * 10 + i
    state.objects["step"] = revision
    state.revision = revision


def main(folder: str, phase: str) -> None:
    copy = LocalCopy(folder, JOB, PEER)
    state = revision_state(1)
    copy.save(state, instance=RUN, incarnation=1, generation=1, epoch=1)
    write_revision(state, 2)
    copy.save(state, instance=RUN, incarnation=1, generation=1, epoch=1)
    write_revision(state, 3)

    def hook(at: str) -> None:
        if at == phase:
            os.kill(os.getpid(), signal.SIGKILL)
    lc.PHASE_HOOK = hook
    copy.mark_committed(3, RUN, 1, generation=1)
    writer = BackgroundWriter(copy)
    try:
        writer.submit(copy.snapshot(state, instance=RUN, incarnation=1, generation=1, epoch=1))
        write_revision(state, 4)                   # the next step writes the tensors while the writer works
        writer.wait()
    finally:
        writer.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""LocalCopy: double-buffered, verified on reuse, bound to its job run, peer and layout."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from p2pgen.state import LocalCopy, LocalCopyError, SharedState
from p2pgen.state import localcopy as lc
from tests.state.helpers import make_state

pytestmark = pytest.mark.timeout(30)

JOB, PEER, RUN = "job", "p0", "p0#1@1.0"


def fresh(seed: int = 0) -> SharedState:
    state = make_state(seed, 4096, revision=0)
    state.tensors["t"] = torch.zeros(5, 3, dtype=torch.float64)
    return state


def trained(revision: int) -> SharedState:
    state = fresh()
    for name in state.tensors:
        state.tensors[name][...] = revision if name != "t" else torch.full((5, 3), float(revision), dtype=torch.float64)
    state.objects["step"] = revision
    state.revision = revision
    return state


def save(copy: LocalCopy, state: SharedState, epoch: int = 1):
    return copy.save(state, instance=RUN, incarnation=1, generation=3, epoch=epoch)


def test_a_restarted_process_gets_back_exactly_the_committed_state(tmp_path):
    copy = LocalCopy(str(tmp_path), JOB, PEER)
    source = trained(7)
    info = save(copy, source, epoch=2)
    assert (info.revision, info.digest, info.epoch) == (7, source.digest(), 2)
    target = fresh()
    t = target.tensors["t"]
    done = LocalCopy(str(tmp_path), JOB, PEER).load_into(target, instance=RUN)
    assert done.info == info
    assert target.revision == 7 and target.digest() == source.digest() and target.objects["step"] == 7
    assert target.tensors["t"] is t                               # written in place: references stay valid


def test_the_two_slots_alternate_and_the_pointer_names_the_newest(tmp_path):
    copy = LocalCopy(str(tmp_path), JOB, PEER)
    slots = []
    for r in (1, 2, 3):
        save(copy, trained(r))
        slots.append(json.loads((tmp_path / lc.POINTER).read_text())["slot"])
    assert slots == [0, 1, 0]
    assert copy.describe().revision == 3


def test_a_save_cut_before_its_pointer_moved_leaves_the_previous_copy_whole(tmp_path, monkeypatch):
    copy = LocalCopy(str(tmp_path), JOB, PEER)
    save(copy, trained(1))
    save(copy, trained(2))                                        # pointer -> slot 1; slot 0 is free

    def killed(*args):
        raise SystemExit("killed before the rename")
    monkeypatch.setattr(lc.os, "replace", killed)
    with pytest.raises(SystemExit):
        save(copy, trained(3))                                    # slot 0 fully overwritten with revision 3
    monkeypatch.undo()
    target = fresh()
    LocalCopy(str(tmp_path), JOB, PEER).load_into(target, instance=RUN)
    assert target.revision == 2 and target.digest() == trained(2).digest()


def test_a_corrupted_copy_is_refused_and_the_state_is_left_untouched(tmp_path):
    copy = LocalCopy(str(tmp_path), JOB, PEER)
    save(copy, trained(4))
    slot = tmp_path / f"slot-{json.loads((tmp_path / lc.POINTER).read_text())['slot']}.bin"
    raw = bytearray(slot.read_bytes())
    raw[10] ^= 0xFF
    slot.write_bytes(bytes(raw))
    target = fresh()
    before = target.digest()
    with pytest.raises(LocalCopyError, match="does not hash"):
        copy.load_into(target, instance=RUN)
    assert target.digest() == before and target.revision == 0


@pytest.mark.parametrize("change, match", [
    (lambda s: s.tensors.__setitem__("extra", np.zeros(2)), "differ"),
    (lambda s: s.tensors.__setitem__("t", torch.zeros(5, 3, dtype=torch.float32)), "differ"),
])
def test_a_copy_of_another_layout_is_refused(tmp_path, change, match):
    copy = LocalCopy(str(tmp_path), JOB, PEER)
    save(copy, trained(4))
    target = fresh()
    change(target)
    with pytest.raises(LocalCopyError, match=match):
        copy.load_into(target, instance=RUN)


def test_a_copy_of_another_run_or_peer_is_refused(tmp_path):
    save(LocalCopy(str(tmp_path), JOB, PEER), trained(4))
    with pytest.raises(LocalCopyError, match="another run"):
        LocalCopy(str(tmp_path), JOB, PEER).load_into(fresh(), instance="p0#1@2.0")
    with pytest.raises(LocalCopyError, match="belongs to p0"):
        LocalCopy(str(tmp_path), JOB, "p1").load_into(fresh(), instance=RUN)
    with pytest.raises(LocalCopyError, match="no local copy"):
        LocalCopy(str(tmp_path / "empty"), JOB, PEER).load_into(fresh(), instance=RUN)


def test_a_smaller_state_shrinks_the_slot_file(tmp_path):
    copy = LocalCopy(str(tmp_path), JOB, PEER)
    big = trained(1)
    big.tensors["big"] = np.ones(100_000, np.float32)
    save(copy, big)
    save(copy, trained(2))
    save(copy, trained(3))                                        # slot 0 again, now for the smaller state
    assert os.path.getsize(tmp_path / "slot-0.bin") == copy.describe().nbytes

"""mid_allreduce fires after frame k of the armed collective, k capped to a frame the member surely posts on
the path its call takes: the ring (2(world-1) frames) or the shared-memory barrier (rank 0: a `go` per other
member; every other rank: one `arrive`). Uncapped, a schedule's k = 4 never fires through shared memory."""

from __future__ import annotations

import os
from dataclasses import asdict

import pytest

from p2pgen_lab.chaos.app import Injector
from p2pgen_lab.chaos.schedule import Injection

pytestmark = pytest.mark.timeout(30)

MID = Injection("kill_app", "mid_allreduce", "p2", revision=8, frame=4)


@pytest.fixture
def injector(tmp_path, monkeypatch):
    os.mkdir(tmp_path / "fired")
    inj = Injector(str(tmp_path), {"injections": [asdict(MID)]}, "p2", lambda event, **fields: None)
    inj.fired = []
    monkeypatch.setattr(inj, "_fire", lambda injection, context: inj.fired.append(inj.frames_posted))
    return inj


def post(injector, seq, frames):
    for _ in range(frames):
        injector.on_frame(seq)


@pytest.mark.parametrize("rank, world, shared_memory, fires_after", [
    (1, 4, False, 5),     # the ring: frame 4 exists (6 frames), fires after the fifth
    (1, 2, False, 2),     # the ring at world 2 posts 2 frames: capped to the last
    (1, 4, True, 1),      # shared memory, rank != 0: one `arrive` per barrier
    (0, 4, True, 3),      # shared memory, rank 0: a `go` to each of the 3 others
])
def test_frame_k_is_capped_to_a_frame_the_path_posts(injector, rank, world, shared_memory, fires_after):
    injector.arm_frames(seq=7, revision=8, rank=rank, world=world, shared_memory=shared_memory)
    post(injector, 6, 3)                 # another collective's frames do not count
    post(injector, 7, fires_after - 1)
    assert injector.fired == []
    post(injector, 7, 1)
    assert injector.fired == [fires_after]
    post(injector, 7, 3)
    assert injector.fired == [fires_after]     # once per run


def test_a_collective_before_the_injection_revision_does_not_fire(injector):
    injector.arm_frames(seq=3, revision=7, rank=1, world=4, shared_memory=True)
    post(injector, 3, 6)
    assert injector.fired == []

"""Catch-up: only differing tensors move, sources share the work, a dead source's chunks are resumed
elsewhere, and nothing unverified or unauthorized touches a user's tensors."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest
import torch

from p2pgen import auth
from p2pgen.core.model import Frontier
from p2pgen.errors import ProtocolError
from p2pgen.state import DigestMismatch, PullConfig, ServerConfig, SharedState, StateSyncError, pull_state, wire
from p2pgen.transport import handshake
from tests.state.helpers import JOB, SECRET, make_state, source_of

pytestmark = pytest.mark.timeout(30)

GEN = 5
SMALL = PullConfig(chunk_bytes=64 << 10, batch_bytes=256 << 10, connect_timeout=5.0, op_timeout=10.0)


def pull(state, sources, me=("joiner", 7), secret=SECRET, generation=GEN, frontier=None, **kw):
    frontier = frontier or Frontier(sources[0].manifest.revision, sources[0].manifest.digest)
    return pull_state(state, job=JOB, secret=secret, me=me, generation=generation, frontier=frontier,
                      sources=[source_of(s) for s in sources], config=kw.pop("config", SMALL), progress=False,
                      **kw)


class Serving:
    """A server inside its serving window for GEN; `.manifest` is what it serves."""

    def __init__(self, server, generation=GEN):
        self.server = server
        self._cm = server.serving(generation)
        self.manifest = self._cm.__enter__()

    def leave(self):
        self._cm.__exit__(None, None, None)

    def __getattr__(self, name):
        return getattr(self.server, name)


def bytes_of(state):
    return {n: np.asarray(state.tensors[n]).tobytes() for n in sorted(state.tensors)}


def test_pull_fetches_only_the_differing_tensors(servers):
    src = make_state(1, 1 << 20)
    dst = make_state(1, 1 << 20, revision=3)
    dst.tensors["layer2.weight"][100] += 1.0
    s = Serving(servers(src, ("p0", 1)))
    report = pull(dst, [s])
    assert report.tensors_fetched == ("layer2.weight",)
    assert set(report.tensors_skipped) == {"bias", "layer0.weight", "layer1.weight", "layer3.weight"}
    assert report.bytes_total == src.tensors["layer2.weight"].nbytes
    assert report.objects_fetched and dst.objects == src.objects and dst.revision == src.revision
    assert dst.digest() == src.digest() and bytes_of(dst) == bytes_of(src)


def test_several_sources_share_the_transfer(servers):
    src_a, src_b, dst = make_state(2, 2 << 20), make_state(2, 2 << 20), make_state(9, 2 << 20)
    a, b = Serving(servers(src_a, ("p0", 1))), Serving(servers(src_b, ("p1", 1)))
    delivered = {"p0": threading.Event(), "p1": threading.Event()}

    def hold_each_until_the_other_delivered(source, nbytes):   # else a fast source may take every batch first
        delivered[source.peer_id].set()
        other = "p1" if source.peer_id == "p0" else "p0"
        assert delivered[other].wait(10), f"{other} never got a batch while {source.peer_id} was held"
    report = pull(dst, [a, b], on_chunk=hold_each_until_the_other_delivered)
    assert set(report.bytes_by_source) == {"p0", "p1"} and min(report.bytes_by_source.values()) > 0
    assert report.bytes_total == sum(src_a.tensors[n].nbytes for n in report.tensors_fetched)
    assert dst.digest() == src_a.digest()


def test_a_joiner_with_a_corrupted_copy_ends_bit_identical_and_keeps_its_tensor_objects(servers):
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 128)
    src = SharedState({n: p.detach().clone() for n, p in model.named_parameters()}, {"step": 40}, revision=40)
    params = dict(model.named_parameters())
    with torch.no_grad():
        params["weight"].view(-1)[::97] += 3.0          # the joiner's copy is corrupt
    dst = SharedState(params, {"step": 39}, revision=39)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    pointers = {n: p.data_ptr() for n, p in params.items()}
    report = pull(dst, [Serving(servers(src, ("p0", 1)))])
    assert report.tensors_fetched == ("weight",)
    for n, p in params.items():
        assert dst.tensors[n] is p and p.data_ptr() == pointers[n]
        assert torch.equal(p.detach(), src.tensors[n])
    assert optimizer.param_groups[0]["params"][0] is params["weight"]
    assert dst.digest() == src.digest() and dst.revision == 40


def test_a_source_killed_mid_transfer_does_not_stop_the_catch_up(source_processes):
    size = 24 << 20
    a = source_processes(3, size, GEN, "p0", 1, "joiner")
    b = source_processes(3, size, GEN, "p1", 1, "joiner")
    expected = make_state(3, size)
    dst = make_state(4, size, revision=0)
    killed = []

    def kill_a_after_its_first_chunk(source, nbytes):
        if source.peer_id == "p0" and not killed:
            os.kill(a.pid, signal.SIGKILL)
            killed.append(a.pid)
    report = pull_state(dst, job=JOB, secret=SECRET, me=("joiner", 7), generation=GEN,
                        frontier=Frontier(expected.revision, expected.digest()), sources=[a.source, b.source],
                        config=PullConfig(chunk_bytes=256 << 10, batch_bytes=4 << 20, op_timeout=10.0),
                        progress=False, on_chunk=kill_a_after_its_first_chunk)
    assert killed and a.proc.wait(5) == -signal.SIGKILL
    assert "p0" in report.failed_sources and report.resumed >= 1
    assert report.bytes_by_source["p1"] > report.bytes_by_source["p0"] > 0
    assert report.bytes_total == sum(expected.tensors[n].nbytes for n in report.tensors_fetched)
    assert bytes_of(dst) == bytes_of(expected) and dst.digest() == expected.digest()


def test_a_source_that_closes_after_some_chunks_is_resumed_by_another(servers):
    src, dst = make_state(5, 2 << 20), make_state(6, 2 << 20)
    a, b = Serving(servers(src, ("p0", 1))), Serving(servers(src, ("p1", 1)))
    seen = []
    left = threading.Event()

    def close_a_after_three_chunks(source, nbytes):
        seen.append(source.peer_id)
        if source.peer_id == "p0" and seen.count("p0") == 3:
            a.leave()                     # p0 leaves its window mid-batch: its connections are shut down
            left.set()
        elif source.peer_id == "p1" and seen.count("p1") == 1:
            # hold p1 until p0 is gone and has hit its closed connection, so batches are still queued
            # for p0 to fail on (else a fast p1 may take every remaining batch first)
            assert left.wait(10), "p0 never delivered three chunks"
            time.sleep(0.3)
    report = pull(dst, [a, b], on_chunk=close_a_after_three_chunks)
    assert "p0" in report.failed_sources and report.resumed >= 1
    assert dst.digest() == src.digest()


def test_an_unauthorized_puller_is_refused_and_nothing_changes(servers):
    src, dst = make_state(7, 1 << 20), make_state(8, 1 << 20)
    before = bytes_of(dst)
    s = Serving(servers(src, ("p0", 1), allowed={"someone-else"}))
    with pytest.raises(StateSyncError, match="not_member"):
        pull(dst, [s])
    assert s.stats()["not_member"] == 1 and bytes_of(dst) == before


def test_a_wrong_secret_is_refused_and_nothing_changes(servers):
    src, dst = make_state(7, 1 << 20), make_state(8, 1 << 20)
    before = bytes_of(dst)
    s = Serving(servers(src, ("p0", 1)))
    with pytest.raises(StateSyncError, match="secret"):
        pull(dst, [s], secret=b"not-the-job-secret")
    assert s.stats()["auth_failed"] == 1 and bytes_of(dst) == before


def test_a_restarted_source_incarnation_is_not_accepted(servers):
    src, dst = make_state(7, 1 << 20), make_state(8, 1 << 20)
    s = Serving(servers(src, ("p0", 2)))
    frontier = Frontier(s.manifest.revision, s.manifest.digest)
    with pytest.raises(StateSyncError, match="wrong_incarnation"):
        pull_state(dst, job=JOB, secret=SECRET, me=("joiner", 7), generation=GEN, frontier=frontier,
                   sources=[dataclasses.replace(source_of(s), incarnation=1)], config=SMALL, progress=False)
    assert s.stats()["wrong_incarnation"] == 1


def test_a_stale_generation_is_refused(servers):
    src, dst = make_state(7, 1 << 20), make_state(8, 1 << 20)
    s = Serving(servers(src, ("p0", 1)))
    with pytest.raises(StateSyncError, match="GenerationChanged.*serving generation 5"):
        pull(dst, [s], generation=GEN - 1)
    assert s.stats()["stale_generation"] == 1


def test_a_source_outside_its_serving_window_sends_nothing(servers):
    src, dst = make_state(7, 1 << 20), make_state(8, 1 << 20)
    server = servers(src, ("p0", 1), config=ServerConfig(wait_for_window=0.3))
    frontier = Frontier(src.revision, src.digest())
    with pytest.raises(StateSyncError, match="not_serving"):
        pull_state(dst, job=JOB, secret=SECRET, me=("joiner", 7), generation=GEN, frontier=frontier,
                   sources=[source_of(server)], config=SMALL, progress=False)
    assert server.stats()["not_serving"] == 1


def test_a_source_that_is_not_at_the_frontier_is_dropped(servers):
    src, dst = make_state(7, 1 << 20), make_state(8, 1 << 20)
    s = Serving(servers(src, ("p0", 1)))
    with pytest.raises(StateSyncError, match="not the frontier"):
        pull(dst, [s], frontier=Frontier(src.revision, "f" * 32))


def test_bytes_that_do_not_match_the_manifest_leave_a_staged_tensor_untouched(servers):
    src, dst = make_state(7, 1 << 20), make_state(8, 1 << 20)
    s = Serving(servers(src, ("p0", 1)))
    src.tensors["layer1.weight"][0] += 1.0      # breaks the window contract: numpy writes are invisible to it
    before = bytes_of(dst)
    with pytest.raises(DigestMismatch, match="layer1.weight") as raised:
        pull(dst, [s], config=dataclasses.replace(SMALL, in_place=False))
    assert bytes_of(dst)["layer1.weight"] == before["layer1.weight"]
    assert "layer1.weight" not in raised.value.changed
    assert dst.revision == 10 and dst.objects["rng"] != src.objects["rng"]   # objects not applied either


def test_bytes_that_do_not_match_the_manifest_received_in_place_are_reported_as_a_changed_state(servers):
    """In place (the default), a tensor that fails verification has already been written: the error names
    it in `changed` and says the state holds neither revision; the revision and objects are not applied."""
    src, dst = make_state(7, 1 << 20), make_state(8, 1 << 20)
    s = Serving(servers(src, ("p0", 1)))
    src.tensors["layer1.weight"][0] += 1.0
    before = bytes_of(dst)
    with pytest.raises(DigestMismatch, match="layer1.weight") as raised:
        pull(dst, [s])
    assert "layer1.weight" in raised.value.changed and "holds neither its revision 10" in str(raised.value)
    assert bytes_of(dst)["layer1.weight"] != before["layer1.weight"]
    assert dst.revision == 10 and dst.objects["rng"] != src.objects["rng"]


def test_a_pull_refused_before_any_byte_reports_nothing_changed(servers):
    src, dst = make_state(7, 1 << 20), make_state(8, 1 << 20)
    before = bytes_of(dst)
    s = Serving(servers(src, ("p0", 1), allowed={"someone-else"}))
    with pytest.raises(StateSyncError) as raised:
        pull(dst, [s])
    assert raised.value.changed == () and bytes_of(dst) == before


def test_a_torch_tensor_written_inside_the_window_is_refused(servers):
    src = SharedState({"w": torch.zeros(1000)}, revision=2)
    dst = SharedState({"w": torch.ones(1000)}, revision=1)
    s = Serving(servers(src, ("p0", 1)))
    src.tensors["w"].add_(1.0)
    with pytest.raises(StateSyncError, match="mutated"):
        pull(dst, [s])
    assert s.stats()["mutated"] == 1 and torch.equal(dst.tensors["w"], torch.ones(1000))


def test_malformed_and_oversized_requests_are_refused_and_counted(servers):
    s = Serving(servers(make_state(7, 1 << 16), ("p0", 1)))
    key = auth.derive_key(SECRET, JOB, wire.KEY_PURPOSE)
    for body, reason in ((b"\xff\xff\xff\xff", "oversized"), (b"\x00\x00\x00\x02\xc1\xc1", "malformed")):
        with socket.create_connection((s.host, s.port), timeout=5) as sock:
            handshake.dial(sock, key, handshake.Hello(JOB, GEN, ("joiner", 7), ("p0", 1), auth.new_nonce()))
            sock.sendall(body)
            rx = wire.FrameReceiver(sock, JOB, GEN, ("p0", 1), 1 << 20, wire.Counters())
            with pytest.raises(ProtocolError, match=reason):
                rx.recv(wire.MANIFEST, 0, 0)
        assert s.stats()[reason] == 1


def test_staging_buffers_of_many_sizes_are_reused_without_mixing_them_up(servers):
    """Installed tensors' staging buffers go back to a pool; a later tensor takes the smallest that fits
    (found by index: arrays of other shapes in the pool must not be compared with it)."""
    sizes = {"a": 1 << 8, "b": 1 << 14, "c": 1 << 11, "d": 1 << 12, "e": 1 << 9}   # small, large, then between
    src = SharedState(tensors={n: np.arange(k, dtype=np.float32) * (i + 1) for i, (n, k) in enumerate(sizes.items())})
    dst = SharedState(tensors={n: np.zeros(k, dtype=np.float32) for n, k in sizes.items()})
    s = Serving(servers(src, ("p0", 1)))
    report = pull(dst, [s], config=dataclasses.replace(SMALL, batch_bytes=4 << 10))
    assert sorted(report.tensors_fetched) == sorted(sizes)
    assert dst.digest() == src.digest() and bytes_of(dst) == bytes_of(src)


def test_the_final_digest_is_the_state_digest_whatever_the_tensor_layout(servers):
    """The pull's final digest is built from the verified block digests; it must equal `state.digest()`
    recomputed from scratch, for contiguous (received in place) and non-contiguous (staged, then written by
    `load_tensor`) numpy and torch tensors, and writes into a torch tensor bump its `_version`."""
    rng = np.random.default_rng(5)
    base = {"a": rng.standard_normal(3000, dtype=np.float32), "b": rng.integers(0, 9, (40, 30)).astype(np.int64),
            "c": torch.randn(50, 20), "d": torch.randn(30, 40)}
    src = SharedState({"a": base["a"], "b": base["b"].T.copy(), "c": base["c"], "d": base["d"]},
                      {"step": 2}, revision=2)
    dst = SharedState({"a": np.zeros(3000, np.float32), "b": np.zeros((40, 30), np.int64).T,
                       "c": torch.zeros(50, 20), "d": torch.zeros(40, 30).t()}, revision=0)
    assert not dst.tensors["b"].flags.c_contiguous and not dst.tensors["d"].is_contiguous()
    version_c = dst.tensors["c"]._version
    report = pull(dst, [Serving(servers(src, ("p0", 1)))], config=PullConfig(chunk_bytes=4096))
    assert report.digest == src.digest() == dst.digest()
    assert dst.tensors["c"]._version > version_c
    assert bytes_of(dst) == bytes_of(src)
    dst.touch()
    assert dst.digest() == src.digest()


@pytest.mark.parametrize("chunk_bytes", [64 << 10, 4 << 20], ids=["chunks_within_a_block", "one_block_per_chunk"])
def test_pulled_torch_tensors_are_not_hashed_again_for_synced(servers, chunk_bytes):
    """A pull caches the verified digests of the torch tensors it wrote, keyed by the new revision, so the
    digest a peer reports as `synced` hashes nothing; numpy arrays are hashed again (no change counter)."""
    src = SharedState({"w": torch.randn(3 << 20), "v": torch.randn(1000), "n": np.arange(500.0)}, revision=3)
    dst = SharedState({"w": torch.zeros(3 << 20), "v": torch.zeros(1000), "n": np.zeros(500)}, revision=1)
    pull(dst, [Serving(servers(src, ("p0", 1)))], config=PullConfig(chunk_bytes=chunk_bytes))
    hashed = dst.hashed_bytes
    assert dst.digest() == src.digest() and dst.revision == 3
    assert dst.hashed_bytes - hashed == dst.tensors["n"].nbytes


def test_a_complete_pull_does_not_wait_for_a_source_that_never_answers(servers):
    """A source that accepted the connection but never answers the handshake (stopped with SIGSTOP, say)
    must not hold a pull the other source completed: with timeouts of an hour, waiting for it would hang
    this test until its timeout."""
    src, dst = make_state(3, 1 << 20), make_state(4, 1 << 20)
    a = Serving(servers(src, ("p0", 1)))
    mute = socket.socket()
    try:
        mute.bind(("127.0.0.1", 0))
        mute.listen(4)                    # the kernel completes the TCP handshake; nobody ever accepts
        silent = dataclasses.replace(source_of(a), peer_id="p9", port=mute.getsockname()[1])
        config = dataclasses.replace(SMALL, connect_timeout=3600.0, op_timeout=3600.0)
        report = pull_state(dst, job=JOB, secret=SECRET, me=("joiner", 7), generation=GEN,
                            frontier=Frontier(a.manifest.revision, a.manifest.digest),
                            sources=[silent, source_of(a)], config=config, progress=False)
    finally:
        mute.close()
    assert dst.digest() == src.digest() and bytes_of(dst) == bytes_of(src)
    assert set(report.bytes_by_source) == {"p0"} and report.failed_sources == {}


def test_a_pull_its_caller_stops_ends_at_once_and_changes_nothing(servers):
    """The only source never answers (its host cut off, say): with timeouts of an hour the pull would hang
    this test until its timeout. Its caller stops it (the generation it pulls for was abandoned): the pull
    raises, saying why, and the state is as it was."""
    src, dst = make_state(3, 1 << 20), make_state(4, 1 << 20)
    a = Serving(servers(src, ("p0", 1)))
    before, asked = bytes_of(dst), threading.Event()

    def stop():
        if asked.is_set():
            return "generation 5 is no longer pending (generation 6 is): the job moved on"
        asked.set()                       # the first question: the pull is running and nothing came
        return None

    mute = socket.socket()
    try:
        mute.bind(("127.0.0.1", 0))
        mute.listen(4)
        silent = dataclasses.replace(source_of(a), peer_id="p9", port=mute.getsockname()[1])
        config = dataclasses.replace(SMALL, connect_timeout=3600.0, op_timeout=3600.0)
        with pytest.raises(StateSyncError, match=r"for generation 5 stopped: generation 5 is no longer pending") as e:
            pull_state(dst, job=JOB, secret=SECRET, me=("joiner", 7), generation=GEN,
                       frontier=Frontier(a.manifest.revision, a.manifest.digest), sources=[silent], config=config,
                       progress=False, stop=stop)
    finally:
        mute.close()
    assert asked.is_set() and e.value.changed == () and bytes_of(dst) == before


def test_a_caller_that_never_stops_the_pull_changes_nothing_about_it(servers):
    src, dst = make_state(3, 1 << 20), make_state(4, 1 << 20)
    a = Serving(servers(src, ("p0", 1)))
    report = pull(dst, [a], stop=lambda: None)
    assert dst.digest() == src.digest() and bytes_of(dst) == bytes_of(src)
    assert set(report.bytes_by_source) == {"p0"}

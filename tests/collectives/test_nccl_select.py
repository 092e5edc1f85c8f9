"""Choosing a generation's backend: rank 0 alone offers a fresh NCCL id for its ready vote; every member
builds the nccl backend from the certificate's `comm_id`; tcp stays the default and takes staged GPU buffers;
the package imports without CuPy and says how to install it when nccl is asked for."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from p2pgen.collectives import nccl_id, nccl_lib
from p2pgen.collectives.nccl import NcclBackend
from p2pgen.collectives.select import backend_factory, offer_comm_id
from p2pgen.collectives.staged import HostStagedBackend
from p2pgen.core import Frontier, Member
from p2pgen.core.view import ActiveGeneration, PendingGeneration
from p2pgen.testing.cluster import LocalCluster
from p2pgen.testing.fake_nccl import FakeNccl

pytestmark = pytest.mark.timeout(30)

PENDING = PendingGeneration(generation=4, parent=3, members=(Member("a", 2), Member("b", 1)), ready=frozenset(),
                            frontier=None, pulls=(), shard_pulls=(), synced=frozenset(), hold=None)


def certificate(generation: int, comm_id: str) -> ActiveGeneration:
    return ActiveGeneration(generation=generation, parent=generation - 1, members=PENDING.members,
                            frontier=Frontier(0, ""), state_epoch=1, comm_id=comm_id, ownership=(), recovery="",
                            regressed_from=None, raft_index=1, activated_at=0.0)


def test_only_rank0_of_a_nccl_job_offers_a_comm_id():
    fake = FakeNccl()
    assert PENDING.rank_of(("a", 2)) == 0 and PENDING.rank_of(("a", 1)) is None and PENDING.rank_of(("b", 1)) == 1
    assert offer_comm_id("tcp", PENDING, ("a", 2), nccl=fake) == ""
    assert offer_comm_id("nccl", PENDING, ("b", 1), nccl=fake) == ""
    offered = offer_comm_id("nccl", PENDING, ("a", 2), nccl=fake)
    assert len(nccl_id.decode(offered)) == 128 and fake.names() == ["get_unique_id"]
    with pytest.raises(ValueError, match="unknown backend 'gloo'"):
        offer_comm_id("gloo", PENDING, ("a", 2))


def test_every_member_builds_its_nccl_backend_from_the_certificate():
    fake = FakeNccl()
    with LocalCluster(2) as cluster:
        groups = cluster.groups(4)
        cert = certificate(4, offer_comm_id("nccl", PENDING, ("a", 2), nccl=fake))
        backends = [backend_factory("nccl", cert, t, g, nccl=fake, device=fake.device())
                    for t, g in zip(cluster.transports, groups)]
        assert all(isinstance(b, NcclBackend) for b in backends)
        assert [(b.rank, b.world, b.generation) for b in backends] == [(0, 2, 4), (1, 2, 4)]
        assert backends[0].group is groups[0] and backends[0]._uid == backends[1]._uid
        with pytest.raises(ValueError, match="no communicator id"):
            backend_factory("nccl", certificate(4, ""), cluster.transports[0], groups[0],
                            nccl=fake, device=fake.device())
        with pytest.raises(ValueError, match="group is of generation 4, certificate of 5"):
            backend_factory("nccl", certificate(5, cert.comm_id), cluster.transports[0], groups[0], nccl=fake)
        tcp = backend_factory("tcp", cert, cluster.transports[0], groups[0])
        assert isinstance(tcp, HostStagedBackend) and tcp.generation == 4
        tcp.close()


def test_the_package_imports_without_cupy():
    code = ("import sys; import p2pgen, p2pgen.collectives.nccl, p2pgen.collectives.select, "
            "p2pgen.testing.fake_nccl, p2pgen_lab.bench.gpu_check; assert 'cupy' not in sys.modules, 'cupy imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_asking_for_nccl_without_cupy_says_how_to_install_it():
    with pytest.raises(nccl_lib.NcclUnavailable, match=r'pip install -e "\.\[gpu\]"'):
        nccl_lib.load()

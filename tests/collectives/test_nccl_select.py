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
from p2pgen.collectives.select import backend_factory, is_rank0, offer_comm_id
from p2pgen.collectives.staged import HostStagedBackend
from p2pgen.testing.cluster import LocalCluster
from p2pgen.testing.fake_nccl import FakeNccl

pytestmark = pytest.mark.timeout(30)

PENDING = {"generation": 4, "members": [{"rank": 0, "peer_id": "a", "incarnation": 2},
                                        {"rank": 1, "peer_id": "b", "incarnation": 1}]}


def test_only_rank0_of_a_nccl_job_offers_a_comm_id():
    fake = FakeNccl()
    assert is_rank0(PENDING, ("a", 2)) and not is_rank0(PENDING, ("a", 1)) and not is_rank0(PENDING, ("b", 1))
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
        cert = {"generation": 4, "comm_id": offer_comm_id("nccl", PENDING, ("a", 2), nccl=fake)}
        backends = [backend_factory("nccl", cert, t, g, nccl=fake, device=fake.device())
                    for t, g in zip(cluster.transports, groups)]
        assert all(isinstance(b, NcclBackend) for b in backends)
        assert [(b.rank, b.world, b.generation) for b in backends] == [(0, 2, 4), (1, 2, 4)]
        assert backends[0].group is groups[0] and backends[0]._uid == backends[1]._uid
        with pytest.raises(ValueError, match="no communicator id"):
            backend_factory("nccl", {"generation": 4, "comm_id": ""}, cluster.transports[0], groups[0],
                            nccl=fake, device=fake.device())
        with pytest.raises(ValueError, match="group is of generation 4, certificate of 5"):
            backend_factory("nccl", {**cert, "generation": 5}, cluster.transports[0], groups[0], nccl=fake)
        tcp = backend_factory("tcp", cert, cluster.transports[0], groups[0])
        assert isinstance(tcp, HostStagedBackend) and tcp.generation == 4
        tcp.close()


def test_the_package_imports_without_cupy():
    code = ("import sys; import p2pgen, p2pgen.collectives.nccl, p2pgen.collectives.select, "
            "p2pgen.testing.fake_nccl, p2pgen.bench.gpu_check; assert 'cupy' not in sys.modules, 'cupy imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_asking_for_nccl_without_cupy_says_how_to_install_it():
    with pytest.raises(nccl_lib.NcclUnavailable, match=r'pip install -e "\.\[gpu\]"'):
        nccl_lib.load()

"""Integration: `p2pgen recover` after a majority of Raft voters is lost for good.

Five agents train the exact integer mini-training (every agent a voter); three of them are SIGKILLed at once, so the
two survivors can commit nothing. `recover` first refuses while the majority still answers; after the kill it
re-forms the job in Raft epoch 1 from the survivor that applied the most, the certificate says so, training resumes
from the survivors' highest revision, and the killed agents, started again at their addresses, join the new epoch
as new incarnations; every member ends equal to the serial reference, and the Raft trace checker finds both epochs
consistent.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from p2pgen.cli import main
from p2pgen.raft import checker
from p2pgen_lab.rigs.agents import active, active_members, free_control_ports
from tests.integration.test_state_survives import committed, finish

pytestmark = pytest.mark.timeout(240)

APP = [sys.executable, str(Path(__file__).parent / "apps" / "exact_train.py")]
STEPS = 400              # 0.04 s a step: still training through the kill and the re-form


def test_recover_re_forms_a_job_that_lost_its_majority_for_good(cluster, tmp_path, monkeypatch, capsys):
    dirs = {n: tmp_path / n for n in ("summaries", "traces", "markers")}
    for d in dirs.values():
        d.mkdir()
    for key, value in (("EXACT_MARKERS", dirs["markers"]), ("EXACT_STEP_DELAY", "0.04"), ("EXACT_STEPS", STEPS),
                       ("P2PGEN_SUMMARY_DIR", dirs["summaries"]), ("P2PGEN_TRACE_DIR", dirs["traces"])):
        monkeypatch.setenv(key, str(value))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parents[2]),
                                                      os.environ.get("PYTHONPATH", "")]))
    addrs = [f"127.0.0.1:{p}" for p in free_control_ports(5)]
    peers = [f"p{i}" for i in range(5)]
    for peer, addr in zip(peers, addrs):
        cluster.start(peer, addr, [a for a in addrs if a != addr], command=APP,
                      extra=("--min-members=5", "--attach-grace=60"))
    cluster.wait(addrs[0], lambda s: len(active_members(s)) == 5 and len(s["raft"]["voters"]) == 5, 90)
    cluster.wait_until(lambda: committed(dirs["traces"]) >= 20, 90, "20 steps committed")
    recover = ["recover", "--secret-file", str(cluster.secret_file), "--peer", addrs[0], "--timeout", "60"]

    assert main(recover + ["--gone", addrs[4]]) == 1               # the majority answers: refused, nothing changes
    assert "refused" in capsys.readouterr().err

    lost = addrs[2:]
    for peer in peers[2:]:
        cluster.agents[peer].signal(signal.SIGKILL)                 # three of five voters, gone for good
    before = committed(dirs["traces"])
    time.sleep(3.0)
    assert main(recover + [f"--gone={a}" for a in lost]) == 0, capsys.readouterr()
    said = capsys.readouterr().out
    assert "re-formed: Raft epoch 1" in said

    cert = cluster.wait(addrs[0], lambda s: active(s) is not None and active(s).get("raft_epoch") == 1, 60)
    cert = active(cert)
    assert cert["reformed"].startswith("re-formed in Raft epoch 1 from seed agent")
    assert all(a in cert["reformed"] for a in lost)
    assert sorted(p for p, _ in active_members({"state": {"active": cert}})) == ["p0", "p1"]
    assert cert["frontier"]["revision"] >= before - 1 and cert["regressed_from"] is None

    for peer, addr in zip(peers[2:], lost):                          # the lost hosts come back, as new processes
        cluster.start(peer, addr, addrs[:2], command=APP, extra=("--attach-grace=60",))
    back = cluster.wait(addrs[0], lambda s: len(active_members(s)) == 5, 90)
    assert all(inc > 1 for p, inc in active_members(back) if p in peers[2:])   # new incarnations (I3)
    assert back["raft"]["epoch"] == 1
    finals = finish(cluster, dirs["summaries"], STEPS, peers)
    assert len({f["digest"] for f in finals}) == 1

    result = checker.check_dir(dirs["traces"])
    assert result.passed, result.render()

"""Integration: a spot notice drains a member, and the job loses no step and waits for no detector.

Three members train the exact integer mini-training. p2's agent polls a local HTTP endpoint (played by the test on
127.0.0.1) that answers 404 until it names a termination time; p1's agent watches a notice file. When each notice
comes, that agent drains: its application stops at the next step boundary and exits cleanly, a generation without
it forms at a frontier no lower than what it committed, and the agent exits 0. p0 ends alone at the last step with
the serial reference.
"""

from __future__ import annotations

import glob
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from p2pgen.agent.cli import format_drain
from p2pgen_lab.rigs.agents import free_control_ports
from tests.agent.test_notice import Endpoint
from tests.integration.test_state_survives import committed, finish, run_env, wait_certificate  # noqa: F401

pytestmark = pytest.mark.timeout(180)

APP = [sys.executable, str(Path(__file__).parent / "apps" / "exact_train.py")]
STEPS = 400


def _summary(summaries: Path, peer: str) -> dict:
    (path,) = glob.glob(str(summaries / f"{peer}-*.json"))
    data = json.loads(Path(path).read_text())
    Path(path).unlink()                  # `finish` checks the members that trained to the end
    return data


def test_a_notice_drains_a_member_at_a_step_boundary(cluster, run_env, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.setenv("EXACT_STEPS", str(STEPS))
    endpoint = Endpoint()
    notice_file = tmp_path / "spot-notice"
    try:
        addrs = [f"127.0.0.1:{p}" for p in free_control_ports(3)]
        sources = {"p1": ("--notice-file", str(notice_file)), "p2": ("--notice-url", endpoint.url)}
        for i, peer in enumerate(("p0", "p1", "p2")):
            cluster.start(peer, addrs[i], [a for a in addrs if a != addrs[i]], command=APP,
                          extra=("--min-members=3", "--attach-grace=60", "--notice-interval=0.2",
                                 *sources.get(peer, ())))
        cluster.wait_until(lambda: committed(run_env["traces"]) >= 20, 90, "20 steps committed")
        assert endpoint.hits > 0 and not notice_file.exists()

        goes_at = datetime.fromtimestamp(time.time() + 60, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        endpoint.answer = (200, json.dumps({"action": "terminate", "time": goes_at}), 0.0)
        for peer, _addr in (("p2", addrs[2]), ("p1", addrs[1])):
            if peer == "p1":
                notice_file.write_text("")                             # "soon": the drain's own timeout
            agent = cluster.agents[peer]
            cluster.wait_until(lambda: not agent.alive(), 60, f"{peer} draining and leaving")
            assert agent.proc.returncode == 0, cluster.logs()
            assert "draining (termination notice from" in agent.log.read_text()
            stopped = _summary(run_env["summaries"], peer)                 # it stopped at a boundary, cleanly
            cert, history = wait_certificate(
                cluster, addrs[0], lambda c: peer not in {m["peer_id"] for m in c["members"]}
                and c["frontier"]["revision"] >= stopped["revision"], 60, f"a generation without {peer}")
            assert all(c["regressed_from"] is None for c in history)
            assert {m["peer_id"] for m in cert["members"]} <= {"p0", "p1"}
        finish(cluster, run_env["summaries"], STEPS, peers=["p0"])
    finally:
        endpoint.close()


def test_show_says_when_a_draining_agent_leaves():
    when = time.mktime((2026, 12, 2, 18, 4, 5, 0, 0, -1))
    text = format_drain({"why": "SIGTERM", "leaves_by": when, "since": when - 25, "stop_at_boundary": True})
    assert text == "draining, leaves by 18:04:05 (SIGTERM, the application stops at its next step boundary)"

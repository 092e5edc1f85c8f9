"""`p2pgen join --standby 1`: a warm standby is promoted as the application's next incarnation.

An agent with a standby whose application is SIGKILLed promotes the standby (same pid, a new incarnation number,
registered through Raft, active with the other member), starts a fresh standby, replaces a standby that dies
while waiting without counting an application restart, promotes that one at the next death, and leaves no
process behind when it stops.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from p2pgen_lab.rigs.agents import Cluster, active_members, free_control_ports, pid_alive

# no --attach-grace: the application must attach and vote itself, so "active" means the promoted process joined
DETECT = ("--detector=fixed", "--detect-timeout=2.0", "--detect-floor=0.5", "--heartbeat-interval=0.1")

APP = """
import os, time
import numpy as np
import p2pgen
state = p2pgen.SharedState(tensors={"w": np.zeros(4, np.float32)})
peer = p2pgen.join(state=state)
for step in peer.steps():
    with step:
        time.sleep(0.02)
        buf = np.ones(4, np.float32)
        step.all_reduce(buf, op="sum")
        state.tensors["w"] += buf
        step.commit()
"""


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _agent(show: dict) -> dict:
    return show["agent"]


@pytest.mark.timeout(240)
def test_a_killed_application_is_replaced_by_its_warm_standby(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(APP)
    traces = tmp_path / "traces"
    traces.mkdir()
    cluster = Cluster(tmp_path, job="standby", detect=DETECT)
    a0, a1 = (f"127.0.0.1:{p}" for p in free_control_ports(2))
    env = {"P2PGEN_TRACE_DIR": str(traces)}
    pids: set[int] = set()
    try:
        cluster.start("p0", a0, [a1], [sys.executable, str(app)], extra=("--min-members=2", "--standby=1"), env=env)
        cluster.start("p1", a1, [a0], [sys.executable, str(app)], extra=("--min-members=2",), env=env)
        first = cluster.wait(a0, lambda s: len(active_members(s)) == 2 and _agent(s)["standby_pid"] is not None
                             and _agent(s)["incarnation"] is not None, timeout=90)
        app_pid, standby_pid = _agent(first)["app_pid"], _agent(first)["standby_pid"]
        incarnation = _agent(first)["incarnation"]
        pids |= {app_pid, standby_pid}
        assert cluster.wait(a1, lambda s: True)["agent"]["standby_pid"] is None      # --standby 0: none

        os.kill(app_pid, signal.SIGKILL)
        healed = cluster.wait(a0, lambda s: _agent(s)["app_pid"] == standby_pid
                              and ("p0", _agent(s)["incarnation"]) in active_members(s)
                              and _agent(s)["standby_pid"] not in (None, standby_pid), timeout=90)
        promoted = _agent(healed)["incarnation"]
        assert promoted == incarnation + 1                 # new: the last one seen plus one, never reused
        assert _agent(healed)["restarts"] == 1
        fresh = _agent(healed)["standby_pid"]
        pids.add(fresh)
        assert not pid_alive(app_pid) and pid_alive(standby_pid) and pid_alive(fresh)
        history = cluster.client(a0).history()
        assert any(("p0", incarnation) not in {(m["peer_id"], m["incarnation"]) for m in h["members"]}
                   and h["outcome"] == "activated" and h["generation"] > first["state"]["active"]["generation"]
                   for h in history)                       # the death is its own certified generation
        # the promoted process joined as that incarnation (its trace) and trains in it
        trace = traces / f"p0-{promoted}.jsonl"
        cluster.wait_until(lambda: trace.exists() and '"commit"' in trace.read_text(), 60, "a commit of p0#2")
        joined = [json.loads(line) for line in trace.read_text().splitlines() if '"joined"' in line]
        assert joined and joined[0]["standby"] is True and joined[0]["promoted"] is not None

        # a standby that dies while waiting is replaced; the application is untouched and no restart is counted
        os.kill(fresh, signal.SIGKILL)
        replaced = cluster.wait(a0, lambda s: _agent(s)["standby_pid"] not in (None, fresh), timeout=60)
        pids.add(_agent(replaced)["standby_pid"])
        assert _agent(replaced)["app_pid"] == standby_pid and _agent(replaced)["restarts"] == 1
        assert _agent(replaced)["incarnation"] == promoted
        assert "replacing it (not counted as a restart)" in cluster.agents["p0"].log.read_text()

        # the replacement is promoted in turn at the next death
        spare = _agent(cluster.wait(a0, lambda s: _agent(s)["standby_ready"], timeout=60))["standby_pid"]
        os.kill(standby_pid, signal.SIGKILL)
        again = cluster.wait(a0, lambda s: _agent(s)["app_pid"] == spare
                             and ("p0", _agent(s)["incarnation"]) in active_members(s)
                             and _agent(s)["standby_pid"] not in (None, spare), timeout=90)
        assert _agent(again)["incarnation"] == promoted + 1 and _agent(again)["restarts"] == 2
        pids.add(_agent(again)["standby_pid"])

        pids.add(_agent(cluster.wait(a1, lambda s: True))["app_pid"])
        for agent in cluster.agents.values():             # graceful stop: every process goes with its agent
            agent.signal(signal.SIGTERM)
        for agent in cluster.agents.values():
            agent.proc.wait(60)
        cluster.wait_until(lambda: not any(pid_alive(p) for p in pids), 20, "every application and standby gone")
    finally:
        cluster.stop_all()
        for pid in pids:                                  # never left behind, even when an assertion failed
            if pid_alive(pid) and str(app) in _cmdline(pid):    # still ours (a pid can be reused)
                os.kill(pid, signal.SIGKILL)

"""Integration: a silence that stalls the job is judged from the detector's stalled floor, one that does not is not.

Three agents train the exact integer workload (`apps/exact_train.py`, a collective every step) with the phi
detector, floor 1.5 s and stalled floor 0.3 s. SIGSTOP of p2's agent alone: its application keeps training, no
collective stalls, so p2 is evicted from the usual floor (its tombstone gives the plain phi reason). SIGSTOP of
p2's whole host (agent and application), once its new incarnation's collectives are under way (a stop while the
new generation still connects stalls no collective: the others then judge p2 from the usual floor, as a run
under load showed): the others' collective waits for it and receives nothing, their applications report the
stall to their agents, and p2 is evicted from the stalled floor (its tombstone says the job's collective waits
for it). No wall-clock figure is asserted: the reason names the rule that fired.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from p2pgen_lab.rigs.agents import active_members, free_control_ports

pytestmark = pytest.mark.timeout(120)

APP = [sys.executable, str(Path(__file__).parent / "apps" / "exact_train.py")]
DETECT = ("--detector=phi", "--detect-timeout=3.0", "--detect-floor=1.5", "--detect-stalled-floor=0.3",
          "--heartbeat-interval=0.1")
STALL_MARK = "(the job waits for it)"


def tombstone_of(show: dict, peer: str, incarnation: int) -> str | None:
    return next((t["reason"] for t in show["state"]["tombstones"]
                 if t["peer_id"] == peer and t["incarnation"] == incarnation), None)


def pause_until_evicted(cluster, observer: str, peer: str, incarnation: int, stop: callable, cont: callable) -> str:
    stop()
    try:
        evicted = cluster.wait(observer, lambda s: tombstone_of(s, peer, incarnation) is not None, timeout=30)
    finally:
        cont()
    return tombstone_of(evicted, peer, incarnation)


def test_only_a_silence_the_job_waits_for_is_judged_from_the_stalled_floor(cluster, monkeypatch, tmp_path):
    monkeypatch.setenv("EXACT_STEPS", "1000000")
    monkeypatch.setenv("EXACT_STEP_DELAY", "0.02")
    monkeypatch.setenv("EXACT_MARKERS", str(tmp_path))
    monkeypatch.setenv("EXACT_PROGRESS", str(tmp_path))
    root = str(Path(__file__).parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    cluster.detect = DETECT
    addrs = [f"127.0.0.1:{p}" for p in free_control_ports(3)]
    for i, addr in enumerate(addrs):
        cluster.start(f"p{i}", addr, [a for a in addrs if a != addr], command=APP,
                      extra=("--min-members=3", "--attach-grace=60"))
    show = cluster.wait(addrs[0], lambda s: len(active_members(s)) == 3, timeout=60)
    agent = cluster.agents["p2"]

    first = dict(active_members(show))["p2"]
    reason = pause_until_evicted(cluster, addrs[0], "p2", first, lambda: agent.signal(signal.SIGSTOP),
                                 lambda: agent.signal(signal.SIGCONT))
    assert "phi" in reason and STALL_MARK not in reason, reason          # the agent alone: nothing stalled

    back = cluster.wait(addrs[0], lambda s: dict(active_members(s)).get("p2", first) > first
                        and len(active_members(s)) == 3, timeout=60)
    second = dict(active_members(back))["p2"]
    progress = tmp_path / f"p2-{second}"
    cluster.wait_until(progress.exists, 60, f"p2#{second} committing")
    under_way = int(progress.read_text()) + 10
    cluster.wait_until(lambda: int(progress.read_text()) >= under_way, 60, f"p2#{second} at revision {under_way}")
    reason = pause_until_evicted(cluster, addrs[0], "p2", second, lambda: os.killpg(agent.pid, signal.SIGSTOP),
                                 lambda: os.killpg(agent.pid, signal.SIGCONT))
    assert STALL_MARK in reason, reason                                  # the host: the job waited for it

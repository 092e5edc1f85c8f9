"""Integration: `peer.channel` / `peer.inbox` under agents: the receiver is SIGKILLed mid-stream
and restarted by its agent as a new incarnation; every message is consumed exactly once (I6)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from p2pgen_lab.rigs.agents import free_control_ports
from tests.integration.apps.channel_app import KILL_AT, TOTAL

pytestmark = pytest.mark.timeout(150)

APP = [sys.executable, str(Path(__file__).parent / "apps" / "channel_app.py")]


def test_a_receiver_killed_mid_stream_consumes_every_message_exactly_once(cluster, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("CHANNEL_OUT", str(out))
    addrs = [f"127.0.0.1:{p}" for p in free_control_ports(2)]
    for i, addr in enumerate(addrs):
        cluster.start(f"p{i}", addr, [a for a in addrs if a != addr], command=APP,
                      extra=("--min-members=2", "--attach-grace=inf", f"--channel-dir={tmp_path / f'channels-p{i}'}"))
    deadline = time.monotonic() + 120
    consumed = out / "consumed.txt"
    while time.monotonic() < deadline:
        lines = consumed.read_text().split("\n") if consumed.exists() else []
        if any(line.startswith(f"{TOTAL - 1} ") for line in lines):
            break
        time.sleep(0.2)
    rows = [tuple(map(int, line.split())) for line in consumed.read_text().splitlines() if line.strip()]
    values = [v for v, _ in rows]
    assert (out / "killed").exists(), "the receiver never killed itself: the fault did not happen"
    assert sorted(values) == list(range(TOTAL)), f"not exactly once: {values}\n{cluster.logs()}"
    incarnations = {inc for v, inc in rows if v > KILL_AT}
    assert incarnations and min(incarnations) > min(inc for v, inc in rows if v <= KILL_AT)

"""The agent launcher: one `p2pgen join` command line, a process that leads its own group, and a kill that takes
the group whole."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from p2pgen.agent import launch

pytestmark = pytest.mark.timeout(30)


def test_the_join_command_line_names_job_peer_address_options_peers_and_application() -> None:
    cmd = launch.join_command("j", "p0", "127.0.0.1:20000", ["127.0.0.1:20005"], ["--min-members", "2"],
                              ["python", "train.py"], prefix=["ip", "netns", "exec", "h0"], verbose=True)
    assert cmd == ["ip", "netns", "exec", "h0", sys.executable, "-m", "p2pgen", "-v", "join", "--job", "j",
                   "--id", "p0", "--listen", "127.0.0.1:20000", "--min-members", "2", "--peer=127.0.0.1:20005",
                   "--", "python", "train.py"]
    assert launch.join_command("j", "p0", "a:1", []) == [sys.executable, "-m", "p2pgen", "join", "--job", "j",
                                                        "--id", "p0", "--listen", "a:1"]


def _gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            return True
        if stat[stat.rindex(")") + 2] == "Z":
            return True
        time.sleep(0.05)
    return False


def test_a_spawned_process_leads_its_group_and_kill_group_takes_its_children() -> None:
    code = "import subprocess, time; p = subprocess.Popen(['sleep', '30']); print(p.pid, flush=True); time.sleep(30)"
    proc = launch.spawn([sys.executable, "-c", code], subprocess.PIPE, subprocess.DEVNULL,
                        env={**os.environ, "P2PGEN_LAUNCH_TEST": "1"})
    try:
        child = int(proc.stdout.readline())
        assert os.getpgid(proc.pid) == proc.pid and os.getpgid(child) == proc.pid
        launch.kill_group(proc, wait_s=10)
        assert proc.returncode == -signal.SIGKILL and _gone(child)
    finally:
        if proc.poll() is None:
            launch.kill_group(proc, wait_s=10)
        proc.stdout.close()

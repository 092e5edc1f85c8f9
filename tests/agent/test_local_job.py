"""`p2pgen join --local N`: the output and lifecycle a newcomer sees.

A normal end prints no warning and one whole line per member summary; SIGTERM stops every agent; a
SIGKILLed runner takes its agents and their applications with it; a job whose applications all fail
exits non-zero and names the members with the last lines of their stderr.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from p2pgen_lab.rigs.agents import free_local_base, pid_alive

ROOT = Path(__file__).resolve().parents[2]
EXACT_APP = str(ROOT / "tests" / "integration" / "apps" / "exact_train.py")


def _local(n: int, *extra: str, command: list[str] | None = None) -> list[str]:
    """`p2pgen join --local n` on free ports (a fixed base collided with other tests' agents)."""
    base_port = free_local_base(n)
    cmd = [sys.executable, "-m", "p2pgen", "join", "--local", str(n), "--base-port", str(base_port),
           "--job", f"local-{base_port}", *extra]
    return cmd + (["--", *command] if command else [])


def _children(pid: int) -> list[int]:
    """Direct children of pid, from /proc."""
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid:
            kids.append(int(entry))
    return kids


def _wait_for_line(proc: subprocess.Popen, needle: str) -> list[str]:
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"the runner ended before printing {needle!r}:\n{''.join(lines)}")


@pytest.mark.timeout(150)
def test_normal_end_prints_no_warning_and_whole_summary_lines(tmp_path):
    env = {**os.environ, "EXACT_STEPS": "30", "EXACT_STEP_DELAY": "0.02"}
    done = subprocess.run(_local(3, command=[sys.executable, EXACT_APP]), env=env, capture_output=True,
                          text=True, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "WARNING" not in output, output
    assert "final state: identical on every member" in done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith("peer") and " 30 " in line]
    assert len(rows) == 3, done.stdout
    for line in output.splitlines():        # every relayed line is one process's whole line
        assert line.count("[peer") <= 1 and line.count("summary {") <= 1, line


@pytest.mark.timeout(120)
def test_failing_applications_make_a_non_zero_exit_naming_them(tmp_path):
    app = [sys.executable, "-c", "import sys; print('cannot open dataset /nowhere', file=sys.stderr); sys.exit(3)"]
    done = subprocess.run(_local(2, "--max-restarts", "1", "--attach-grace", "0", command=app),
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "agent(s) failed: peer" in done.stderr, done.stderr
    reports = done.stderr.split("FAILED: ")[1:]
    assert reports, done.stderr
    for report in reports:      # each names the member and shows its application's last words
        assert report.startswith("peer") and "exited with code 1" in report, report
        assert "cannot open dataset /nowhere" in report, report


@pytest.mark.timeout(120)
def test_sigterm_stops_every_agent_and_application(tmp_path):
    app = [sys.executable, "-c", "import time; time.sleep(600)"]
    proc = subprocess.Popen(_local(3, "--attach-grace", "0", command=app), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        _wait_for_line(proc, "generation 1 activated")
        agents = _children(proc.pid)
        apps = [a for agent in agents for a in _children(agent)]
        assert len(agents) == 3 and len(apps) == 3
        proc.send_signal(signal.SIGTERM)
        # the runner's own bound: SIGTERM to every agent, SIGKILL of what is left after 4 s
        assert proc.wait(timeout=10) == 130
        assert not [p for p in agents + apps if pid_alive(p)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(120)
def test_a_sigkilled_runner_takes_its_agents_and_applications_with_it(tmp_path):
    app = [sys.executable, "-c", "import time; time.sleep(600)"]
    proc = subprocess.Popen(_local(3, "--attach-grace", "0", command=app), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    agents: list[int] = []
    apps: list[int] = []
    try:
        _wait_for_line(proc, "generation 1 activated")
        agents = _children(proc.pid)
        apps = [a for agent in agents for a in _children(agent)]
        assert len(agents) == 3 and len(apps) == 3
        proc.kill()
        proc.wait()
        while [p for p in agents + apps if pid_alive(p)]:      # bounded by the test's timeout
            time.sleep(0.2)
    finally:
        for pid in agents + apps:           # leave nothing behind if the assertion above failed
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(150)
def test_applications_get_one_openmp_thread_unless_told_otherwise(tmp_path):
    """N applications on one host share its cores: like torchrun, OMP_NUM_THREADS defaults to 1 for each (numpy's
    BLAS and torch read it); a value the user set is passed on unchanged."""
    app = [sys.executable, "-c", "import os, sys; print('threads=' + os.environ.get('OMP_NUM_THREADS', 'unset'), "
                                 "file=sys.stderr); sys.exit(3)"]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    for given, expected in ((None, "threads=1"), ("3", "threads=3")):
        run_env = env if given is None else {**env, "OMP_NUM_THREADS": given}
        done = subprocess.run(_local(2, "--max-restarts", "0", "--attach-grace", "0", command=app),
                              env=run_env, capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert done.returncode == 1, done.stdout + done.stderr
        reports = done.stderr.split("FAILED: ")[1:]
        assert reports and all(expected in r for r in reports), done.stderr
        assert ("OMP_NUM_THREADS=1 for every application" in done.stdout) == (given is None), done.stdout

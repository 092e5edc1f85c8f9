"""A pretend host for the torchft peer of `p2pgen bench recovery`: one supervisor that keeps one process running.

    python -m p2pgen_lab.bench.apps.host --stopped-timeout 1.0 -- COMMAND...

torchft has no supervisor of its own (its replicas are meant to be restarted by a scheduler); this is the
smallest one that gives it what a p2pgen agent gives its application: COMMAND is started again whenever it
exits, and a COMMAND stopped (SIGSTOP) for longer than `--stopped-timeout` seconds is SIGKILLed, then
started again, as a p2pgen agent does to a stopped application after its detection timeout.
The benchmark's "host kill" SIGKILLs this process and its child together; the benchmark then starts a new host.
Invariant: at most one COMMAND process runs at a time, and it dies with this process (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time

from p2pgen.agent.supervisor import die_with_parent

RESTART_PAUSE_S = 0.05


def supervise(command: list[str], stopped_timeout: float) -> None:
    """Run `command` for ever: restart it when it exits, SIGKILL it when it stays stopped for `stopped_timeout`."""
    me = os.getpid()
    while True:
        child = subprocess.Popen(command, preexec_fn=lambda: die_with_parent(signal.SIGKILL, me))
        stopped_since: float | None = None
        while True:
            pid, status = os.waitpid(child.pid, os.WUNTRACED | os.WCONTINUED | os.WNOHANG)
            if pid and os.WIFSTOPPED(status):
                stopped_since = time.monotonic()
            elif pid and os.WIFCONTINUED(status):
                stopped_since = None
            elif pid:
                break
            if stopped_since is not None and time.monotonic() - stopped_since > stopped_timeout:
                os.kill(child.pid, signal.SIGKILL)
                stopped_since = None
            time.sleep(0.01)
        time.sleep(RESTART_PAUSE_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stopped-timeout", type=float, required=True,
                        help="seconds a stopped child may stay stopped before it is killed and restarted")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no COMMAND after --")
    supervise(command, args.stopped_timeout)


if __name__ == "__main__":
    main()

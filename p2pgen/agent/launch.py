"""The agent launcher: the one way `p2pgen join --local`, the lab's harnesses and its benchmarks start an agent.

Owns: the `p2pgen join` command line of one agent (`join_command`), the start of a process that leads its own
process group and dies with its starter (`spawn`), and the SIGKILL of such a process with its whole group, the
application its agent supervises included (`kill_group`).

Invariants kept: a process started here leads its own session (Ctrl-C at a terminal reaches only the starter,
and `kill_group` reaches the agent and its application); it receives `death_signal` when the starting thread
dies, even by SIGKILL, and exits at once if the starter died before it could be told (PR_SET_PDEATHSIG, then a
parent check); a process that has already exited is never mistaken for a live one (a group that is gone is a
no-op, never an error).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import IO

from p2pgen.agent.supervisor import die_with_parent


def join_command(job: str, peer_id: str, listen: str, peers: Sequence[str], options: Sequence[str] = (),
                 command: Sequence[str] | None = None, prefix: Sequence[str] = (), verbose: bool = False) -> list[str]:
    """The command line of one agent: `[PREFIX] python -m p2pgen [-v] join --job JOB --id PEER --listen ADDR
    OPTIONS --peer=P ... [-- COMMAND]`.

    Args:
        job: the job's name.
        peer_id: the agent's peer id.
        listen: its control address, HOST:PORT.
        peers: the other agents' control addresses, in order.
        options: further `join` options (detector, state directory, secret file, ...), in order.
        command: the application the agent supervises, if any.
        prefix: a command that execs the agent (`ip netns exec NS`), so that the pid is still the agent's.
        verbose: log at INFO (`p2pgen -v`).
    """
    cmd = [*prefix, sys.executable, "-m", "p2pgen", *(["-v"] if verbose else []), "join", "--job", job,
           "--id", peer_id, "--listen", listen, *options, *[f"--peer={p}" for p in peers]]
    if command:
        cmd += ["--", *command]
    return cmd


def spawn(cmd: Sequence[str], stdout: int | IO[bytes] | None, stderr: int | IO[bytes] | None,
          env: dict[str, str] | None = None, death_signal: int = signal.SIGKILL) -> subprocess.Popen:
    """Start `cmd` as the leader of its own session, to get `death_signal` when this thread dies.

    Args:
        cmd: the command line.
        stdout: where its output goes (a file, subprocess.PIPE, ...).
        stderr: where its errors go (subprocess.STDOUT: with its output).
        env: its whole environment (None: this process's).
        death_signal: SIGKILL (the lab's harnesses), or SIGTERM for a graceful leave (`join --local`).
    """
    starter = os.getpid()
    return subprocess.Popen(list(cmd), stdout=stdout, stderr=stderr, env=env, start_new_session=True,
                            preexec_fn=lambda: die_with_parent(death_signal, starter))


def kill_group(proc: subprocess.Popen, wait_s: float | None = None) -> None:
    """SIGKILL the process group `proc` leads (an agent and its application), then reap `proc`.

    Call it only while `proc` has not been reaped (until then its pid, and so its group id, cannot be reused).

    Args:
        proc: a process started by `spawn`.
        wait_s: how long to wait for it to be reaped (None: as long as it takes).

    Raises:
        subprocess.TimeoutExpired: it was not reaped within `wait_s`.
    """
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(wait_s)

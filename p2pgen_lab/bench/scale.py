"""`p2pgen bench scale`: how the control plane grows with the number of agents, on one machine.

Owns: for each agent count (default 4, 8, 16, 32), a job of that many agents on 127.0.0.1 whose members are
`sleep` applications (attach grace 0: the agents vote for them), started together, and four figures:
- formation_s: from the first agent started to the first generation active with every member;
- kill_to_active_s: from SIGKILL of one member's application to the next generation active without it (median of
  `--kills`, each after the previous one was back);
- raft_entries_per_change: Raft log entries from the kill to that activation (suspect, ready votes, activation,
  the restarted incarnation's registration included when it lands first);
- idle_cpu_percent_per_agent: CPU time of the agent processes over `--idle` seconds with nothing happening,
  divided by wall time and by the agent count (the leader's share included), and the busiest agent's;
- with `--threads`, the same split by thread (`/proc/PID/task/TID/stat`, each thread named by `py-spy dump`:
  heartbeat, raft, driver, voter-manager, other): the mean per agent and the busiest agent's.
Each row is printed beside the 4-agent row of the same run (ratios), since the machine is shared and noisy.
Invariant kept: every process started is stopped by pid (the `Cluster` of p2pgen_lab.rigs.agents).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from p2pgen_lab.rigs.agents import Cluster, active, active_members, free_control_ports

APP = [sys.executable, "-c", "import time; time.sleep(3600)"]


@dataclass(frozen=True)
class ScaleRow:
    agents: int
    voters: int
    formation_s: float
    kill_to_active_s: float
    raft_entries_per_change: float
    idle_cpu_percent_per_agent: float
    idle_cpu_percent_max: float
    idle_cpu_by_thread: dict[str, float] = field(default_factory=dict)       # mean per agent (--threads)
    idle_cpu_by_thread_max: dict[str, float] = field(default_factory=dict)   # the busiest agent's (--threads)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


THREAD_KINDS = (("heartbeat", "heartbeat"), ("raft-", "raft"), ("MainThread", "driver"),
                ("voter-manager", "voter-manager"))


def py_spy() -> str:
    """The py-spy executable (beside this Python, or on PATH); SystemExit saying how to get it otherwise."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("p2pgen bench scale --threads names threads with py-spy: pip install py-spy")
    return found


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of `pid`, by native thread id."""
    seconds = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue                                  # the thread ended meanwhile
        seconds[int(tid)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return seconds


def thread_kinds(pid: int, spy: str) -> dict[int, str]:
    """Native thread id -> kind (THREAD_KINDS, else "other"), from `py-spy dump`."""
    dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30).stdout
    kinds = {}
    for match in re.finditer(r'Thread (0x[0-9A-Fa-f]+|\d+) \([^)]*\): "([^"]*)"', dump):
        tid = int(match.group(1), 0)
        kinds[tid] = next((kind for prefix, kind in THREAD_KINDS if match.group(2).startswith(prefix)), "other")
    return kinds


def _split(pids: list[int], before: dict[int, dict[int, float]], wall: float) -> tuple[dict, dict]:
    """(mean % of a core per agent by thread kind, the busiest agent's split)."""
    spy, per_agent = py_spy(), []
    for pid in pids:
        kinds, now, split = thread_kinds(pid, spy), thread_cpu_seconds(pid), Counter()
        for tid, seconds in now.items():
            split[kinds.get(tid, "other")] += 100 * (seconds - before[pid].get(tid, 0.0)) / wall
        per_agent.append(split)
    total: Counter[str] = Counter()
    for split in per_agent:
        total.update(split)
    busiest = max(per_agent, key=lambda split: sum(split.values()))
    return ({k: round(v / len(pids), 3) for k, v in sorted(total.items())},
            {k: round(v, 3) for k, v in sorted(busiest.items())})


def measure(n: int, kills: int, idle_s: float, workdir: Path, threads: bool = False) -> ScaleRow:
    cluster = Cluster(workdir)
    cluster.detect = ("--attach-grace=0", "--detector=fixed", "--detect-timeout=1.0", "--detect-floor=0.3",
                      "--heartbeat-interval=0.1")
    addrs = [f"127.0.0.1:{p}" for p in free_control_ports(n)]
    try:
        started = time.time()
        for i, addr in enumerate(addrs):
            cluster.start(f"p{i}", addr, [a for a in addrs if a != addr], command=APP, extra=(f"--min-members={n}",))
        formed = cluster.wait(addrs[0], lambda s: len(active_members(s)) == n, timeout=60 + 5 * n)
        formation = active(formed)["activated_at"] - started
        time.sleep(2.0)                                     # the voter set settles
        shown = cluster.wait(addrs[0], lambda s: True)
        pids = [a.pid for a in cluster.started if a.alive()]
        before = [cpu_seconds(p) for p in pids]
        by_thread = {p: thread_cpu_seconds(p) for p in pids} if threads else {}
        t0 = time.monotonic()
        time.sleep(idle_s)
        wall = time.monotonic() - t0
        shares = [100 * (cpu_seconds(p) - b) / wall for p, b in zip(pids, before)]
        split = _split(pids, by_thread, wall) if threads else ({}, {})
        durations, entries = [], []
        for k in range(kills):
            durations_k, entries_k = _kill_one(cluster, addrs, addrs[(k * 7 + 1) % n])
            durations.append(durations_k)
            entries.append(entries_k)
        return ScaleRow(n, len(shown["raft"]["voters"]), formation, statistics.median(durations),
                        statistics.median(entries), sum(shares) / len(shares), max(shares), *split)
    finally:
        cluster.stop_all()


def _kill_one(cluster: Cluster, addrs: list[str], victim_addr: str) -> tuple[float, float]:
    observer = next(a for a in addrs if a != victim_addr)
    shown = cluster.wait(observer, lambda s: active(s) is not None and s["state"]["pending"] is None)
    g, index = active(shown)["generation"], shown["raft"]["index"]
    with cluster.client(victim_addr) as c:
        victim = c.show()
    peer, pid = victim["agent"]["peer_id"], victim["agent"]["app_pid"]
    incarnation = dict(active_members(shown))[peer]
    t0 = time.time()
    os.kill(pid, signal.SIGKILL)
    after = cluster.wait(observer, lambda s: active(s)["generation"] > g
                         and (peer, incarnation) not in active_members(s), timeout=60)
    took = active(after)["activated_at"] - t0
    entries = active(after)["raft_index"] - index
    cluster.wait(observer, lambda s: dict(active_members(s)).get(peer, 0) > incarnation
                 and s["state"]["pending"] is None, timeout=60)        # back before the next kill
    return took, entries


def run(counts: list[int], kills: int, idle_s: float, threads: bool = False) -> list[ScaleRow]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="p2pgen-scale-") as tmp:
        for n in counts:
            workdir = Path(tmp) / f"agents-{n}"
            workdir.mkdir()
            rows.append(measure(n, kills, idle_s, workdir, threads))
            print(f"  {n} agents measured", file=sys.stderr, flush=True)
    return rows


def format_table(rows: list[ScaleRow]) -> str:
    base = rows[0]
    header = ["agents", "voters", "formation s", "x", "kill->active s", "x", "Raft entries/change", "idle CPU %/agent",
              "max agent %"]
    lines = [header]
    for r in rows:
        lines.append([str(r.agents), str(r.voters), f"{r.formation_s:.2f}", f"{r.formation_s / base.formation_s:.2f}",
                      f"{r.kill_to_active_s:.3f}", f"{r.kill_to_active_s / base.kill_to_active_s:.2f}",
                      f"{r.raft_entries_per_change:.0f}", f"{r.idle_cpu_percent_per_agent:.2f}",
                      f"{r.idle_cpu_percent_max:.2f}"])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in lines]
    for r in rows:
        if r.idle_cpu_by_thread:
            text.append(f"{r.agents} agents, idle CPU % by thread, mean per agent: {_kinds(r.idle_cpu_by_thread)}; "
                        f"busiest agent: {_kinds(r.idle_cpu_by_thread_max)}")
    return "\n".join([f"p2pgen control plane scale on 127.0.0.1 (x: ratio to the {base.agents}-agent row)", *text])


def _kinds(split: dict[str, float]) -> str:
    return ", ".join(f"{kind} {share:.2f}" for kind, share in split.items())


def to_json(rows: list[ScaleRow]) -> str:
    return json.dumps({"rows": [asdict(r) for r in rows]}, indent=1)


def main(counts: list[int], kills: int, idle_s: float, as_json: bool, threads: bool = False) -> int:
    if threads:
        py_spy()                                      # before any agent starts: say what is missing now
    rows = run(counts, kills, idle_s, threads)
    print(to_json(rows) if as_json else format_table(rows))
    return 0

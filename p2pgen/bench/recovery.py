"""`p2pgen bench recovery`: how long membership changes take, on real agent processes.

Owns: the membership-recovery measurements of the foundation: SIGKILL of a supervised application,
SIGSTOP of one (detected after the stop grace), SIGKILL of the agent that is the Raft leader, and a
joiner becoming a member. Every figure is read from certificates (`activated_at` minus the wall time
of the fault), so polling cadence does not inflate it. Processes are stopped by pid at the end.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from p2pgen.testing.agents import Cluster, active, active_members, free_control_ports

APP = [sys.executable, "-c", "import time; time.sleep(3600)"]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def summarize(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": statistics.median(values), "p90": _percentile(values, 90),
            "p99": _percentile(values, 99), "max": max(values)}


def _leader_agent(cluster: Cluster, show: dict[str, Any]):
    port = int(show["raft"]["leader"].rsplit(":", 1)[1]) - 1
    return next(a for a in cluster.agents.values() if a.alive() and a.addr.endswith(f":{port}"))


def _without(peer: str, inc: int):
    return lambda s: active(s) is not None and (peer, inc) not in active_members(s)


def _with_newer(peer: str, inc: int):
    return lambda s: dict(active_members(s)).get(peer, -1) > inc


def run(trials: int, detect_timeout: float, workdir: Path) -> dict[str, list[float]]:
    cluster = Cluster(workdir, job="bench-recovery",
                      detect=("--attach-grace=0", "--detector=fixed", f"--detect-timeout={detect_timeout}",
                              f"--detect-floor={min(0.3, detect_timeout / 2)}", "--heartbeat-interval=0.1"))
    results: dict[str, list[float]] = {k: [] for k in (
        "sigkill_app_to_active_s", "app_back_as_new_incarnation_s", "sigstop_app_to_active_s",
        "leader_agent_kill_to_active_s", "agent_restart_to_member_s", "join_to_member_s")}
    try:
        addrs = [f"127.0.0.1:{p}" for p in free_control_ports(4)]
        members, spare = addrs[:3], addrs[3]
        for i, addr in enumerate(members):
            cluster.start(f"p{i}", addr, [a for a in members if a != addr], command=APP,
                          extra=("--min-members=3", "--max-restarts=1000"))
        cluster.wait(members[0], lambda s: len(active_members(s)) == 3, timeout=60)
        for trial in range(trials):
            victim = cluster.agents[f"p{trial % 3}"]
            observer = next(a.addr for a in cluster.agents.values() if a is not victim and a.alive())
            for sig, key in ((signal.SIGKILL, "sigkill_app_to_active_s"), (signal.SIGSTOP, "sigstop_app_to_active_s")):
                with cluster.client(victim.addr) as c:
                    shown = c.show()
                pid, inc = shown["agent"]["app_pid"], shown["agent"]["incarnation"]
                t0 = time.time()
                os.kill(pid, sig)
                gone = cluster.wait(observer, _without(victim.peer_id, inc))
                results[key].append(active(gone)["activated_at"] - t0)
                back = cluster.wait(observer, _with_newer(victim.peer_id, inc))
                if sig == signal.SIGKILL:
                    results["app_back_as_new_incarnation_s"].append(active(back)["activated_at"] - t0)
            shown = cluster.wait(observer, lambda s: len(active_members(s)) == 3 and s["state"]["pending"] is None)
            leader = _leader_agent(cluster, shown)
            inc = dict(active_members(shown))[leader.peer_id]
            observer = next(a.addr for a in cluster.agents.values() if a is not leader and a.alive())
            t0 = time.time()
            os.killpg(leader.pid, signal.SIGKILL)
            leader.proc.wait()
            gone = cluster.wait(observer, _without(leader.peer_id, inc))
            results["leader_agent_kill_to_active_s"].append(active(gone)["activated_at"] - t0)
            t0 = time.time()
            cluster.start(leader.peer_id, leader.addr, [a for a in members if a != leader.addr], command=APP,
                          extra=("--max-restarts=1000",))
            back = cluster.wait(observer, _with_newer(leader.peer_id, inc), timeout=60)
            results["agent_restart_to_member_s"].append(active(back)["activated_at"] - t0)
            t0 = time.time()
            joiner = cluster.start("joiner", spare, [members[trial % 3]])
            joined = cluster.wait(members[(trial + 1) % 3], lambda s: "joiner" in dict(active_members(s)), timeout=60)
            results["join_to_member_s"].append(active(joined)["activated_at"] - t0)
            joiner.signal(signal.SIGTERM)
            joiner.proc.wait(20)
            cluster.wait(observer, lambda s: "joiner" not in dict(active_members(s)) and len(s["raft"]["nodes"]) == 3)
    finally:
        cluster.stop_all()
    return results


def format_table(results: dict[str, list[float]], detect_timeout: float) -> str:
    rows = [["measurement (3 agents, 127.0.0.1)", "n", "p50 ms", "p90 ms", "p99 ms", "max ms"]]
    for key, values in results.items():
        if values:
            s = summarize(values)
            rows.append([key, str(s["n"])] + [f"{s[q] * 1000:.0f}" for q in ("p50", "p90", "p99", "max")])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.append(f"detector: fixed timeout {detect_timeout} s (SIGSTOP and agent kills are detected by timeout; "
                 "an application's exit is reported by its agent at once)")
    return "\n".join(lines)


def to_json(results: dict[str, list[float]], detect_timeout: float) -> str:
    out: dict[str, Any] = {k: summarize(v) for k, v in results.items() if v}
    out["detect_timeout_s"] = detect_timeout
    out["agent_kill_to_active_s"] = out.get("leader_agent_kill_to_active_s")   # the key `p2pgen sim` reads
    return json.dumps(out, indent=2, sort_keys=True)


def main(trials: int, detect_timeout: float, as_json: bool, out: str | None) -> int:
    with tempfile.TemporaryDirectory(prefix="p2pgen-bench-recovery-") as tmp:
        results = run(trials, detect_timeout, Path(tmp))
    text = to_json(results, detect_timeout)
    if out:
        Path(out).write_text(text)
    print(text if as_json else format_table(results, detect_timeout))
    return 0

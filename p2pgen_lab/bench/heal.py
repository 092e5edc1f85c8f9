"""Heal time of a killed application, with and without a warm standby (`p2pgen join --standby 1`).

`run_heal(...)` starts three agents (`p2pgen_lab.rigs.agents.Cluster`) whose application trains a small torch
model in the step loop (`p2pgen.join()`, `peer.steps()`; this module run with `--app`), SIGKILLs one
application at a time and measures the **heal**: from the kill to the replacement incarnation's first commit
(its trace file, `$P2PGEN_TRACE_DIR/<peer>-<incarnation>.jsonl`). Blocks with and without `--standby 1`
alternate (ABBA), each on a fresh cluster, `kills` trials per block. `format_heal()` prints p50/max per mode
and where the heal goes, phase by phase (seconds from the previous mark; median over trials):

- `retire`: the kill until the job certified a generation without the dead incarnation (the agent's
  relaunch waits for it: every death is its own generation in the history; `history` certificates);
- `launch`: until the agent started the next incarnation (its log: `started application` / `promoted standby`);
- `start+imports`: until the process was ready to join (`joined.join_called`; with a standby: `promoted`);
- `attach`: until `p2pgen.join()` returned (the Peer attached, its listeners bound: `joined` event);
- `register`: until the job's proposal with the new incarnation (its certificate's `proposed_at`: the
  agent's `register`);
- `vote`: until the new incarnation voted `ready` (the survivors vote at their next step boundary);
- `pull`: until its pull of the frontier state ended (`pulled`: the survivors' votes, the election and the
  transfer; 0 when it restored the frontier from its local copy and pulled nothing);
- `activate`: until it activated the generation (`active`);
- `first commit`: until its first committed step (`commit`).
Invariant: every process is stopped by pid (`Cluster.stop_all`) before a block returns; figures are
differences of wall-clock timestamps written by the processes on this machine, never of polling times.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from p2pgen_lab.bench.table import aligned
from p2pgen_lab.rigs.agents import Cluster, free_control_ports

PEERS = ("p0", "p1", "p2")
MODES = ("standby", "plain")
PHASES = ("retire", "launch", "start+imports", "attach", "register", "vote", "pull", "activate", "first commit")
TARGET_S = 0.5
# no --attach-grace: an agent that voted for a member that had not attached yet would cost a second generation
DETECT = ("--detector=fixed", "--detect-timeout=2.0", "--detect-floor=0.3", "--heartbeat-interval=0.1")
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*(?:started application|promoted standby) pid "
                      r"(\d+) (?:as|to) (\S+)#(\d+)")


# --- the application ---------------------------------------------------------------------------------------

def app_main(step_delay: float) -> None:
    """The benchmark's application: an MLP trained by SGD with momentum, every tensor in the SharedState; the
    global batch of revision r is drawn from r and split into `world` shards, gradients all-reduced (SUM)."""
    import torch

    import p2pgen
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    sizes = {"w1": (128, 64), "b1": (128,), "w2": (8, 128), "b2": (8,)}
    params = {k: torch.randn(*shape, generator=g) * 0.1 for k, shape in sizes.items()}
    state = p2pgen.SharedState(tensors={**params, **{f"m_{k}": torch.zeros_like(v) for k, v in params.items()}})
    peer = p2pgen.join(state=state)
    batch = 64
    for step in peer.steps():
        with step:
            time.sleep(step_delay)
            gen = torch.Generator().manual_seed(step.revision)
            x = torch.randn(batch, 64, generator=gen)
            y = torch.sin(x[:, :8])
            lo, hi = step.rank * batch // step.world, (step.rank + 1) * batch // step.world
            t = state.tensors
            ps = [t[k].detach().requires_grad_(True) for k in sizes]
            w1, b1, w2, b2 = ps
            loss = ((torch.tanh(x[lo:hi] @ w1.T + b1) @ w2.T + b2 - y[lo:hi]) ** 2).sum() / batch
            flat = torch.cat([gr.reshape(-1) for gr in torch.autograd.grad(loss, ps)])
            step.all_reduce(flat, op="sum")
            offset = 0
            with torch.no_grad():
                for k in sizes:
                    p, m = t[k], t[f"m_{k}"]
                    m.mul_(0.9).add_(flat[offset:offset + p.numel()].view_as(p))
                    p.add_(m, alpha=-0.05)
                    offset += p.numel()
            step.commit()


# --- reading what the processes wrote -----------------------------------------------------------------------

def _events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:                      # a line being written
            pass
    return out


def _first(events: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    return next((e for e in events if e["event"] == kind), None)


def _launches(log: Path) -> dict[tuple[str, int], tuple[float, int]]:
    """(peer, incarnation) -> (wall time the agent started or promoted its process, pid), from an agent's log."""
    out = {}
    for line in log.read_text(errors="replace").splitlines():
        m = LOG_LINE.match(line)
        if m:
            when = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out[(m.group(3), int(m.group(4)))] = (when, int(m.group(2)))
    return out


def analyze(kill: dict[str, Any], trace_dir: Path, history: list[dict[str, Any]],
            launches: dict[tuple[str, int], tuple[float, int]]) -> dict[str, Any]:
    """The heal of one kill and its phases (seconds from the previous mark), from the traces, the job's
    history and the agent's log. A mark that is missing counts as the previous one (a 0 s phase)."""
    peer, old, new, t0 = kill["peer"], kill["incarnation"], kill["new_incarnation"], kill["t"]
    ev = _events(trace_dir / f"{peer}-{new}.jsonl")
    joined, commit = _first(ev, "joined"), _first(ev, "commit")
    certs = [h["certificate"] for h in history if h["outcome"] == "activated" and h["certificate"]]
    without = next((c for c in certs if c["activated_at"] >= t0
                    and (peer, old) not in {(m["peer_id"], m["incarnation"]) for m in c["members"]}), None)
    with_new = next((c for c in certs if (peer, new) in {(m["peer_id"], m["incarnation"]) for m in c["members"]}),
                    None)
    ready, pulled, active = _first(ev, "ready"), _first(ev, "pulled"), _first(ev, "active")
    launched = launches.get((peer, new), (None, None))[0]
    ready_at = (joined.get("promoted") or joined.get("join_called")) if joined else None
    marks = [without and without["activated_at"], launched, ready_at, joined and joined["t"],
             with_new and with_new["proposed_at"], ready and ready["t"], pulled and pulled["t"], active and active["t"],
             commit and commit["t"]]
    phases, last = {}, t0
    for name, mark in zip(PHASES, marks):
        mark = last if mark is None else max(mark, last)     # log lines are to the ms
        phases[name] = mark - last
        last = mark
    process_start = (joined or {}).get("process_start")
    return {**kill, "heal": commit["t"] - t0 if commit else None, "phases": phases,
            "standby_used": bool(joined and joined.get("standby")),
            "process_started_before_kill": process_start is not None and process_start < t0,
            "generation": with_new and with_new["generation"]}


# --- running it --------------------------------------------------------------------------------------------

def _show(cluster: Cluster, addr: str) -> dict[str, Any] | None:
    try:
        with cluster.client(addr) as c:
            return c.show()
    except Exception:          # starting, restarting: the caller polls again
        return None


def _steady(cluster: Cluster, addrs: dict[str, str], standby: bool, trace_dir: Path) -> Callable[[], bool]:
    """Every member runs in one active generation of all three, has committed there, and (with standbys) every
    agent's standby called in."""
    def holds() -> bool:
        shows = [_show(cluster, a) for a in addrs.values()]
        if any(s is None or s["state"]["active"] is None for s in shows):
            return False
        cert = shows[0]["state"]["active"]
        if len(cert["members"]) != len(PEERS) or shows[0]["state"]["pending"] is not None:
            return False
        for s in shows:
            agent = s["agent"]
            if (s["agent"]["peer_id"], agent["incarnation"]) not in {(m["peer_id"], m["incarnation"])
                                                                     for m in cert["members"]}:
                return False
            if standby and not agent.get("standby_ready"):
                return False
            ev = _events(trace_dir / f"{agent['peer_id']}-{agent['incarnation']}.jsonl")
            if not any(e["event"] == "commit" and e["generation"] == cert["generation"] for e in ev):
                return False
        return True
    return holds


def run_block(mode: str, kills: int, first_victim: int, step_delay: float, workdir: Path,
              say: Callable[[str], None] = lambda line: None) -> list[dict[str, Any]]:
    """One cluster with (`standby`) or without (`plain`) warm standbys: `kills` SIGKILLs of an application,
    each once the job is steady again; the records of every kill."""
    trace_dir = workdir / "traces"
    trace_dir.mkdir(parents=True)
    cluster = Cluster(workdir, job=f"heal-{mode}", detect=DETECT)
    ports = free_control_ports(len(PEERS))
    addrs = {p: f"127.0.0.1:{port}" for p, port in zip(PEERS, ports)}
    extra = (f"--min-members={len(PEERS)}", f"--standby={1 if mode == 'standby' else 0}")
    command = [sys.executable, "-m", "p2pgen_lab.bench.heal", "--app", f"--step-delay={step_delay}"]
    records: list[dict[str, Any]] = []
    try:
        for p in PEERS:
            cluster.start(p, addrs[p], [a for q, a in addrs.items() if q != p], command, extra=extra,
                          env={"P2PGEN_TRACE_DIR": str(trace_dir), "OMP_NUM_THREADS": "1"})
        for k in range(kills):
            cluster.wait_until(_steady(cluster, addrs, mode == "standby", trace_dir), 180, f"{mode}: a steady job")
            time.sleep(0.5)                                   # a few steps in the steady generation
            victim = PEERS[(first_victim + k) % len(PEERS)]
            before = _show(cluster, addrs[victim])
            assert before is not None
            pid, incarnation = before["agent"]["app_pid"], before["agent"]["incarnation"]
            t = time.time()
            os.kill(pid, signal.SIGKILL)
            box: dict[str, int] = {}

            def healed() -> bool:
                for path in trace_dir.glob(f"{victim}-*.jsonl"):
                    inc = int(path.stem.rpartition("-")[2])
                    if inc > incarnation and any(e["event"] == "commit" for e in _events(path)):
                        box["new"] = inc
                        return True
                return False
            cluster.wait_until(healed, 120, f"{mode}: {victim}#{incarnation}'s replacement commits")
            records.append({"mode": mode, "peer": victim, "incarnation": incarnation, "pid": pid,
                            "new_incarnation": box["new"], "t": t})
            say(f"  {mode}: killed {victim}#{incarnation}; {victim}#{box['new']} committed")
        with cluster.client(addrs[PEERS[0]]) as c:
            history = c.history()
        launches = {}
        for agent in cluster.started:
            launches.update(_launches(agent.log))
    finally:
        cluster.stop_all()
    return [analyze(r, trace_dir, history, launches) for r in records]


def _summary(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": statistics.median(values), "max": max(values)} if values else {"n": 0}


def run_heal(rounds: int = 2, kills: int = 2, step_delay: float = 0.02, workdir: Path | None = None,
             say: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Heal times with and without a warm standby: `rounds` rounds of one block per mode (order ABBA), each
    block a fresh three-agent cluster with `kills` application kills. Returns {"trials": [...], "modes":
    {mode: {"heal": {n, p50, max}, "phases": {phase: p50}}}, "target_s", "step_delay"}."""
    own = workdir is None
    base = Path(tempfile.mkdtemp(prefix="p2pgen-heal-")) if own else workdir
    trials: list[dict[str, Any]] = []
    victim = 0
    for r in range(rounds):
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):
            say(f"round {r + 1}/{rounds}: {mode}")
            trials += run_block(mode, kills, victim, step_delay, base / f"r{r}-{mode}", say)
            victim += kills
    modes = {}
    for mode in MODES:
        mine = [t for t in trials if t["mode"] == mode and t["heal"] is not None]
        modes[mode] = {"heal": _summary([t["heal"] for t in mine]),
                       "phases": {p: statistics.median([t["phases"][p] for t in mine]) if mine else None
                                  for p in PHASES},
                       "standby_used": sum(t["standby_used"] for t in mine)}
    return {"trials": trials, "modes": modes, "target_s": TARGET_S, "step_delay": step_delay,
            "workdir": str(base)}


def format_heal(result: dict[str, Any]) -> str:
    modes = result["modes"]
    rows = [["", *[f"--standby {1 if m == 'standby' else 0}" for m in MODES]]]
    rows.append(["trials", *[str(modes[m]["heal"]["n"]) for m in MODES]])
    for key in ("p50", "max"):
        rows.append([f"heal {key} (s)", *[f"{modes[m]['heal'][key]:.3f}" if modes[m]["heal"]["n"] else "-"
                                         for m in MODES]])
    rows.append(["where it goes (p50 s):", *["" for _ in MODES]])
    for p in PHASES:
        rows.append([f"  {p}", *[f"{modes[m]['phases'][p]:.3f}" if modes[m]["phases"][p] is not None else "-"
                                 for m in MODES]])
    lines = ["heal: SIGKILL of one application of three (torch MLP, step delay "
             f"{result['step_delay']} s) -> its replacement's first commit; target with a standby "
             f"<= {result['target_s']} s"]
    lines += aligned(rows)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--app", action="store_true", help="run as the benchmark's application (under an agent)")
    parser.add_argument("--step-delay", type=float, default=0.02)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kills", type=int, default=2)
    parser.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    args = parser.parse_args()
    if args.app:
        app_main(args.step_delay)
        return
    result = run_heal(args.rounds, args.kills, args.step_delay, say=lambda line: print(line, flush=True))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    print(format_heal(result))


if __name__ == "__main__":
    main()

"""`p2pgen stress` (the churn test) and `p2pgen check-traces` (the Raft checker on a trace directory).

Owns: argument parsing, the live action lines (stdout, or stderr with `--json`), the final report as
text or `--json`, and the run directory (a temporary one is removed after a passing run and kept, with
its path printed, after a failing one; `--keep DIR` always keeps it). Exit code 0 only when the run
passed (see `verdict`); `check-traces` exits 0 only when the directory held agent traces and every
check passed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from p2pgen.agent.detectflags import add_detector_arguments, config_from_args, detector_flags
from p2pgen.termprogress import TermProgress
from p2pgen_lab.rigs.netns import add_arguments as add_cluster_arguments


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stress", help="churn test: agents killed, replaced, paused, joining and leaving while "
                                      "they train; Raft safety checked from traces",
                       description="Start N agents on 127.0.0.1 running a training application, inject one seeded "
                                   "fault every 0.5-3 s (application kill, agent kill and replacement at the same "
                                   "address, two agents killed together, SIGSTOP, join, graceful leave, a partition; "
                                   "with --hosts also a host's link cut and a zone partition; never more "
                                   "than a minority of the voters down), then check Raft safety, recovery and "
                                   "the final digests.")
    p.add_argument("--agents", type=int, default=5, help="agents at the start (default 5)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of faults (default 60)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fault plan")
    p.add_argument("--step-delay", type=float, default=0.01, help="seconds of pretend compute per step (default 0.01)")
    p.add_argument("--max-agents", type=int, help="joins stop at this many live agents (default agents + 2)")
    p.add_argument("--settle-timeout", type=float, default=60.0,
                   help="seconds after the faults for the job to settle and stop at one revision (default 60)")
    p.add_argument("--kinds", metavar="KIND,...", default="",
                   help="only these fault kinds (default: all: kill_app, kill_agent, kill_two, pause, join, leave, "
                        "partition, and with --hosts host_cut, zone_partition); the draws stay the same, so a seed "
                        "still replays one plan")
    p.add_argument("--fault-every", type=float, metavar="S",
                   help="mean seconds between faults (default 1.75: uniform 0.5-3 s); the draws stay the same")
    p.add_argument("--calm", type=float, default=0.0, metavar="S",
                   help="train S seconds without faults before them and report the goodput: the committed-step "
                        "rate with faults over that fault-free rate, with the lost time by fault kind")
    add_detector_arguments(p)
    add_cluster_arguments(p, "each agent (with its application)")
    p.add_argument("--json", action="store_true", help="the report as JSON on stdout (action lines go to stderr)")
    p.add_argument("--keep", metavar="DIR", help="keep the run directory (logs, traces, progress) under DIR")
    p.add_argument("app", nargs=argparse.REMAINDER,
                   help="-- COMMAND ...: the application (default: python examples/train_spot.py)")
    p.set_defaults(func=cmd_stress)

    c = sub.add_parser("check-traces", help="check Raft safety from a directory of agent traces",
                       description="Log matching, one leader per term, one registration per incarnation, one "
                                   "activation per generation, over every agent trace ($P2PGEN_TRACE_DIR) in DIR.")
    c.add_argument("dir", help="the trace directory")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_check_traces)


def cmd_check_traces(args: argparse.Namespace) -> int:
    from p2pgen.raft.checker import check_dir

    if not Path(args.dir).is_dir():
        print(f"p2pgen check-traces: {args.dir} is not a directory", file=sys.stderr)
        return 2
    result = check_dir(args.dir)
    print(json.dumps(result.to_json(), indent=1) if args.json else result.render())
    if not result.checked["processes"]:
        print(f"p2pgen check-traces: no agent trace record in {args.dir} (agents write them under "
              "$P2PGEN_TRACE_DIR)", file=sys.stderr)
        return 1
    return 0 if result.passed else 1


def cmd_stress(args: argparse.Namespace) -> int:
    from p2pgen.errors import P2PGenError
    from p2pgen_lab.stress.harness import FAULTS_BEGIN, FAULTS_END, StressConfig, run

    if args.agents < 2 or args.duration <= 0 or args.calm < 0 or (args.fault_every is not None
                                                                   and args.fault_every <= 0):
        print("p2pgen stress: --agents must be at least 2, --duration and --fault-every positive, --calm not "
              "negative", file=sys.stderr)
        return 2
    from p2pgen_lab.stress.plan import KINDS
    kinds = tuple(k for k in args.kinds.split(",") if k)
    if set(kinds) - set(KINDS):
        print(f"p2pgen stress: unknown --kinds {', '.join(sorted(set(kinds) - set(KINDS)))}; "
              f"the kinds are {', '.join(KINDS)}", file=sys.stderr)
        return 2
    from p2pgen_lab.rigs.netns import ClusterError, TopologyError, from_arguments

    if args.hosts and args.hosts < args.agents:
        print(f"p2pgen stress: --hosts {args.hosts} is fewer than --agents {args.agents}: one host per agent",
              file=sys.stderr)
        return 2
    max_agents = args.max_agents or args.agents + 2
    try:
        hosts = from_arguments(args.hosts, args.rate, args.topology)
    except (ClusterError, TopologyError) as e:
        print(f"p2pgen stress: {e}", file=sys.stderr)
        return 2
    try:
        detect = detector_flags(config_from_args(args))
    except ValueError as e:
        print(f"p2pgen stress: {e}", file=sys.stderr)
        return 2
    app = args.app[1:] if args.app[:1] == ["--"] else args.app
    config = StressConfig(agents=args.agents, duration=args.duration, seed=args.seed, command=list(app),
                          step_delay=args.step_delay, settle_timeout=args.settle_timeout,
                          max_agents=max_agents, min_agents=min(3, args.agents), kinds=kinds, hosts=hosts,
                          calm=args.calm, fault_every=args.fault_every, detect=detect)
    run_dir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="p2pgen-stress-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    out = sys.stderr if args.json else sys.stdout
    progress = TermProgress(args.duration, "p2pgen stress: faults", stream=out, enabled=not args.json, unit=" s")
    faults_began: list[float] = []

    def say(line: str) -> None:
        if line.endswith(FAULTS_BEGIN):
            faults_began.append(time.monotonic())
        elif line.endswith(FAULTS_END):
            progress.note = "settling"
        progress.write(line)

    progress.tick(lambda: time.monotonic() - faults_began[0] if faults_began else 0.0)
    try:
        report = run(config, run_dir, say=say)
    except P2PGenError as e:
        print(f"p2pgen stress: {e}", file=sys.stderr)
        return 2
    finally:
        progress.close()
    if args.json:
        print(json.dumps({"agents": args.agents, "duration_s": args.duration, "seed": args.seed,
                          **report.to_json()}, indent=1))
    else:
        print(render(report, args))
    if not args.keep and report.passed:
        shutil.rmtree(run_dir, ignore_errors=True)
    elif not args.keep:
        print(f"run directory kept: {run_dir}", file=out)
    return 0 if report.passed else 1


def recovery_by_kind(actions: list[dict[str, Any]]) -> list[str]:
    """One line per fault kind: how many, and the median and max seconds to the next committed step."""
    by_kind: dict[str, list[float | None]] = {}
    for a in actions:
        if a["kind"] != "none":
            by_kind.setdefault(a["kind"], []).append(a.get("recovery_s"))
    lines = []
    for kind, values in sorted(by_kind.items()):
        seen = [x for x in values if x is not None]
        figures = f"median {statistics.median(seen):.2f} s, max {max(seen):.2f} s" if seen else "no committed step"
        lines.append(f"  {kind:<15} {len(values):>3}  {figures}" + (f", {len(values) - len(seen)} never"
                                                                      if len(seen) < len(values) else ""))
    return lines


def render_goodput(g: Any) -> list[str]:
    """The goodput line and the table of lost time by fault kind."""
    from p2pgen_lab.stress.goodput import format_losses

    return [f"goodput: {g.ratio:.3f} ({g.fault_rate:.2f} committed steps/s over {g.fault_s:.0f} s of faults, "
            f"{g.calm_rate:.2f} over {g.calm_s:.0f} s without, same run)",
            "lost seconds by fault kind (each fault owns the time to the next), and the phases of the reforms "
            "it caused (seconds, summed; see p2pgen_lab.stress.goodput):", *("  " + r for r in format_losses(g))]


def render(report: Any, args: argparse.Namespace) -> str:
    v = report.verdict
    kinds = Counter(a["kind"] for a in report.actions)
    latencies = [a["recovery_s"] for a in report.actions if a.get("recovery_s") is not None]
    where = f" on {args.hosts} emulated hosts" + (f" ({args.rate} links)" if args.rate else "") if args.hosts else ""
    lines = [f"\np2pgen stress: {args.agents} agents{where}, {args.duration:.0f} s of faults, seed {args.seed}: "
             f"{'PASS' if report.passed else 'FAIL'}",
             f"actions: {len(report.actions)} (" + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) + ")"]
    if latencies:
        lines.append(f"first committed step after each fault: median {statistics.median(latencies):.2f} s, "
                     f"max {max(latencies):.2f} s, {sum(x is None for x in v.recovery)} never")
        lines += recovery_by_kind(report.actions)
    lines.append(f"longest stretch without a committed step while a majority of the voters was up: "
                 f"{v.max_stall_s:.2f} s")
    cuts = sum(kinds[k] for k in ("partition", "host_cut", "zone_partition"))
    if cuts:
        from p2pgen.faults import IN_FLIGHT_S

        found = sum(f.startswith("minority ") for f in report.failures)
        lines.append(f"progress on a cut-off side ({cuts} cut(s); a commit or a Raft leader there later than "
                     f"{IN_FLIGHT_S} s after the cut): {found or 'none'}")
    if report.goodput is not None:
        lines += render_goodput(report.goodput)
    lines.append(report.checker.render())
    silent = sum(r["regressed_from"] is None for r in v.regressions)
    lines.append("regressions: " + (f"{len(v.regressions)}, {silent} not declared by the certificate"
                                    if v.regressions else "none"))
    lines += [f"  generation {r['generation']} activated at revision {r['revision']} after revision "
              f"{r['highest_committed']} was committed: {r['steps_lost']} step(s) lost"
              + (f" (certificate: regressed from {r['regressed_from']})" if r["regressed_from"] is not None else "")
              for r in v.regressions]
    lines.append("revisions committed with different digests: " + (", ".join(
        str(m["revision"]) for m in v.mismatches[:10]) or "none"))
    lines.append("final digests of the live members:")
    lines += [f"  {peer:<6} revision {report.final_revisions[peer]}  {digest}"
              for peer, digest in sorted(v.final_digests.items())]
    if report.failures:
        lines.append("why it failed:")
        lines += [f"  - {f}" for f in report.failures]
    return "\n".join(lines)

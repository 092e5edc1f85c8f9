"""`p2pgen chaos`: run seeded fault schedules under the recovery policies and print the table.

Owns: argument parsing, the loop over (schedule, policy), progress lines on stderr (and a live done / total
line on a terminal, not with `--json`), the table or
`--json`, and the run directories (kept with `--keep`, else removed). Every run is judged twice: by the
semantic checker (`checker`, against the serial history) and by the Raft checker over the agents'
traces (`p2pgen.raft.checker`). Exit code 1 when the `certified` policy has a semantic failure or any
run (whatever its policy: the control plane is the same) has a Raft safety violation (both are p2pgen
bugs), else 0: the other policies are expected to fail semantically.
`--smoke` is the CI run (`schedule.smoke()`: 2 fixed short schedules, certified and comm-only); the full
matrix is the documented command in README.
`--sharded` runs the sharded variant (certified only: the other policies have no repartition): the
mini-training also keeps a sharded object (r = 2), every other fault is one during repartition
(`schedule.SHARD_KINDS`), and the checker also judges every shard exposed (`mismatched shard version`,
`misowned shard`); with `--smoke`, `schedule.smoke_sharded()`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from p2pgen.termprogress import TermProgress


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chaos", help="the membership-transition counterexample benchmark",
                       description="Inject faults at named step and transition boundaries into an exact "
                                   "mini-training on real agents; judge every run against the serial history.")
    p.add_argument("--policy", action="append", choices=("certified", "comm-only", "restart-all"),
                   help="policy to run (repeatable; default: all three)")
    p.add_argument("--schedules", type=int, default=40, help="schedules per policy (default 40)")
    p.add_argument("--injections", type=int, default=4, help="injections per schedule (default 4)")
    p.add_argument("--seed", type=int, default=0, help="schedule seed: the same seed replays the same faults")
    p.add_argument("--first", type=int, default=0, help="index of the first schedule (to split a matrix)")
    p.add_argument("--smoke", action="store_true", help="CI: 2 fixed short schedules, certified and comm-only")
    p.add_argument("--sharded", action="store_true",
                   help="the sharded variant: a sharded object (r=2) in the mini-training and faults during "
                        "repartition (certified only)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before a run counts as stalled")
    p.add_argument("--json", action="store_true", help="the summary and every run's verdict as JSON")
    p.add_argument("--keep", metavar="DIR", help="keep the run directories (logs) under DIR")
    p.set_defaults(func=cmd_chaos)


def cmd_chaos(args: argparse.Namespace) -> int:
    from p2pgen.raft import checker as raft_checker
    from p2pgen_lab.chaos import checker, report, runner, schedule

    if args.sharded and set(args.policy or ["certified"]) != {"certified"}:
        print("p2pgen chaos --sharded: only --policy certified has sharded state (comm-only and restart-all do "
              "not repartition); drop the other --policy options", file=sys.stderr)
        return 2
    policies = args.policy or (["certified"] if args.sharded else ["certified", "comm-only"] if args.smoke else
                               ["certified", "comm-only", "restart-all"])
    if args.smoke:
        schedules = schedule.smoke_sharded() if args.sharded else schedule.smoke()
    else:
        schedules = schedule.generate(args.seed, args.first + args.schedules, args.injections,
                                      args.sharded)[args.first:]
    count, per = len(schedules), max(len(s.injections) for s in schedules)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="p2pgen-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    config = runner.RunConfig(timeout=args.timeout, sharded=args.sharded)
    verdicts: dict[str, list[checker.Verdict]] = {p: [] for p in policies}
    rafts: dict[str, list[raft_checker.CheckResult]] = {p: [] for p in policies}
    runs: list[dict[str, Any]] = []
    progress = TermProgress(count * len(policies), "p2pgen chaos", enabled=not args.json, unit=" runs")
    try:
        for s in schedules:
            for policy in policies:
                progress.update(len(runs), f"{policy} #{s.index}")
                started = time.monotonic()
                result = runner.run(s, policy, root / f"{policy}-{s.index:04d}", config)
                verdict = checker.check(result.events, result.history, s.steps, result.stalled)
                minority = runner.partition_findings(result)
                if minority:
                    verdict.failures.append(checker.MINORITY)
                    verdict.evidence.extend(f"{checker.MINORITY}: {line}" for line in minority)
                raft = raft_checker.check_dir(result.run_dir / "traces")
                verdicts[policy].append(verdict)
                rafts[policy].append(raft)
                runs.append({"policy": policy, "schedule": s.to_json(), "harness": result.harness,
                             **verdict.to_json(), "raft": raft.to_json()})
                progress.write(f"[{policy} #{s.index}] {'pass' if verdict.passed else 'FAIL'} "
                               f"{', '.join(verdict.failures) or ('stalled' if verdict.stalled else '')} "
                               f"({verdict.injections} injections, {time.monotonic() - started:.1f} s); raft "
                               f"{report.raft_words(raft)}")
                progress.update(len(runs))
    finally:
        progress.close()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    rows = [report.summarize(p, verdicts[p], rafts[p]) for p in policies]
    if args.json:
        print(json.dumps({"seed": args.seed, "sharded": args.sharded, "first": args.first, "schedules": count,
                          "injections_per_schedule": per,
                          "summary": rows, "runs": runs}, indent=1))
    else:
        variant = " --sharded" if args.sharded else ""
        print(f"p2pgen chaos{variant} --seed {args.seed}: {count} schedule(s) x {len(policies)} policies, "
              f"{per} injection(s) each\n")
        print(report.table(rows))
    certified = verdicts.get("certified", [])
    unsafe = any(not r.passed for results in rafts.values() for r in results)
    return 1 if any(v.failures for v in certified) or unsafe else 0

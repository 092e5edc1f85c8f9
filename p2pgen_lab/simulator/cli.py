"""`p2pgen sim churn|detector`: the churn simulator's tables and figures from the command line.

Owns: the `sim` sub-commands, their flags and exit codes. Invariant: heavy imports (numpy, matplotlib,
the simulator) happen inside the handlers, so `p2pgen --help` stays instant.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from p2pgen_lab.simulator.report import RunSpec


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    sim = subparsers.add_parser("sim", help="simulate a cluster under churn (tables and figures)",
                                description="Discrete-event churn simulations judged by p2pgen's own detector.")
    sub = sim.add_subparsers(dest="sim_command", required=True, metavar="SIM")
    churn = sub.add_parser("churn", help="goodput vs MTBF: the published churn study's table, then p2pgen's "
                           "design changes")
    _common(churn)
    churn.add_argument("--timeout", type=float, default=None, metavar="S",
                       help="timeout of the row comparing p2pgen with a fixed heartbeat timeout (default: the "
                            "optimum of the detector sweep); the p2pgen row runs the agent's default detector")
    churn.set_defaults(func=churn_command)
    detector = sub.add_parser("detector", help="heartbeat-timeout sweep (the U-curve); fixed vs phi-accrual")
    _common(detector)
    detector.set_defaults(func=detector_command)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    parser.add_argument("--plot", metavar="PNG", help="also draw the figure into this PNG file")
    parser.add_argument("--runs", type=int, default=2, help="seeds averaged per table row (default 2)")
    parser.add_argument("--duration", type=float, default=20_000.0, metavar="S",
                        help="simulated seconds per run (default 20000)")
    parser.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--recovery-json", metavar="PATH",
                        help="reconfiguration costs from `p2pgen bench recovery --json` (default: assumed figures)")


def _spec(args: argparse.Namespace) -> RunSpec:
    from p2pgen_lab.simulator.costs import load_costs
    from p2pgen_lab.simulator.report import RunSpec

    if args.runs < 1 or args.duration <= 0:
        raise ValueError("--runs must be >= 1 and --duration positive")
    return RunSpec(runs=args.runs, duration=args.duration, seed=args.seed, costs=load_costs(args.recovery_json))


def detector_command(args: argparse.Namespace) -> int:
    from p2pgen_lab.simulator.report import detector_json, detector_text, run_detector

    try:
        result = run_detector(_spec(args))
    except (OSError, ValueError) as err:
        print(f"p2pgen sim detector: {err}", file=sys.stderr)
        return 2
    print(json.dumps(detector_json(result), indent=2) if args.json else detector_text(result))
    if args.plot:
        from p2pgen_lab.simulator.plots import detector_figure

        detector_figure(result, args.plot)
    return 0


def churn_command(args: argparse.Namespace) -> int:
    from p2pgen_lab.simulator.report import churn_json, churn_text, morph_runs, run_churn

    try:
        spec = _spec(args)
        result = run_churn(spec, args.timeout)
    except (OSError, ValueError) as err:
        print(f"p2pgen sim churn: {err}", file=sys.stderr)
        return 2
    print(json.dumps(churn_json(result), indent=2) if args.json else churn_text(result))
    if args.plot:
        from p2pgen_lab.simulator.plots import churn_figure

        churn_figure(result, morph_runs(result), args.plot)
    return 0

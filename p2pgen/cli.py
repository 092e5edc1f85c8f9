"""The `p2pgen` command line: `join | show | history | bench | sim | chaos | stress | fault ...`.

Owns: argument parsing and dispatch only. Each command family lives in its own module, which exposes
`add_commands(subparsers)`; a sub-parser stores its handler as `func`, called with the parsed args and
returning the process exit code. Heavy imports (torch, numpy) stay inside the handlers so that
`p2pgen --help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from p2pgen.agent.supervisor import stop_on_sigterm

COMMAND_MODULES = (
    "p2pgen.agent.cli",   # join, show, history
    "p2pgen.simulator.cli",
    "p2pgen.bench.cli",
    "p2pgen.chaos.cli",
    "p2pgen.stress.cli",  # stress, check-traces
    "p2pgen.faults",      # fault partition | heal
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="p2pgen", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop_on_sigterm()    # the harnesses (chaos, stress, bench) stop what they started; `join` sets its own handlers
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

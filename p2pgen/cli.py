"""The `p2pgen` command line: `join | show | history | bench | sim | chaos | stress | fault ...`.

Owns: argument parsing and dispatch only. Each command family lives in its own module, which exposes
`add_commands(subparsers)`; a sub-parser stores its handler as `func`, called with the parsed args and
returning the process exit code. Heavy imports (torch, numpy) stay inside the handlers so that
`p2pgen --help` is instant. The lab's families (sim, bench, chaos, stress) are imported only to run one of
their commands or to list every command: a runtime command (`join`, `show`, ...) loads none of the lab.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from p2pgen.agent.supervisor import stop_on_sigterm

COMMAND_MODULES = (
    "p2pgen.agent.cli",   # join, show, history
    "p2pgen.simulator.cli",
    "p2pgen.bench.cli",
    "p2pgen.chaos.cli",
    "p2pgen.stress.cli",  # stress, check-traces
    "p2pgen.faults",      # fault partition | heal
)
LAB_COMMANDS = {          # the lab's modules and the commands each registers
    "p2pgen.simulator.cli": ("sim",),
    "p2pgen.bench.cli": ("bench",),
    "p2pgen.chaos.cli": ("chaos",),
    "p2pgen.stress.cli": ("stress", "check-traces"),
}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`'s command: every command when `argv` is None, has no command or names none we
    know (so that help and errors list them all); a lab module only when `argv` runs one of its commands.

    Args:
        argv: the arguments after the program name, or None.
    """
    parser = argparse.ArgumentParser(prog="p2pgen", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    command = next((a for a in argv or () if not a.startswith("-")), None)
    for name in COMMAND_MODULES:
        lab = LAB_COMMANDS.get(name)
        if lab is None or command is None or command in lab:
            importlib.import_module(name).add_commands(sub)
    if command is not None and command not in sub.choices:       # unknown: the error lists every command
        for name, lab in LAB_COMMANDS.items():
            if command not in lab:
                importlib.import_module(name).add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop_on_sigterm()    # the harnesses (chaos, stress, bench) stop what they started; `join` sets its own handlers
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

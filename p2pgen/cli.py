"""The `p2pgen` command line: `join | show | history | fault ...`, and the commands other packages register.

Owns: argument parsing and dispatch only. Each command family lives in its own module, which exposes
`add_commands(subparsers)`; a sub-parser stores its handler as `func`, called with the parsed args and
returning the process exit code. Heavy imports (torch, numpy) stay inside the handlers so that
`p2pgen --help` is instant.

The runtime's families are named here (RUNTIME_MODULES). Any other family (the lab's `bench`, `sim`, `chaos`,
`stress`, `check-traces`) is registered through the entry point group COMMAND_GROUP, one entry per command:
`NAME = "module:add_commands"`. Such a module is imported only to run one of its commands or to list every
command, so a runtime command (`join`, `show`, ...) loads none of them; a module that fails to import still
lists its commands, and running one of them says which module failed and why (exit code 2).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint, entry_points

from p2pgen.agent.supervisor import stop_on_sigterm

RUNTIME_MODULES = (
    "p2pgen.agent.cli",   # join, show, history, recover
    "p2pgen.faults",      # fault partition | heal
)
COMMAND_GROUP = "p2pgen.commands"
BROKEN_EXIT = 2


def registered_commands() -> dict[str, EntryPoint]:
    """The commands other packages register in COMMAND_GROUP, by name."""
    return {ep.name: ep for ep in entry_points(group=COMMAND_GROUP)}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`'s command: every command when `argv` is None, has no command or names none we
    know (so that help and errors list them all); a registered command's module only when `argv` runs one of
    its commands.

    Args:
        argv: the arguments after the program name, or None.
    """
    parser = argparse.ArgumentParser(prog="p2pgen", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in RUNTIME_MODULES:
        importlib.import_module(name).add_commands(sub)
    command = next((a for a in argv or () if not a.startswith("-")), None)
    registered = registered_commands()
    if command in sub.choices:
        return parser
    wanted = [registered[command]] if command in registered else list(registered.values())
    by_module: dict[str, list[EntryPoint]] = {}
    for ep in wanted:
        if ep.name not in sub.choices:                 # a runtime command is never replaced
            by_module.setdefault(ep.value, []).append(ep)
    for eps in by_module.values():
        _register(sub, eps)
    return parser


def _register(sub: argparse._SubParsersAction, eps: list[EntryPoint]) -> None:
    """Add the commands of one entry point value (`eps`: the entries that name it) to `sub`; if its module
    fails to import, a stand-in for each entry's command that says why."""
    try:
        add_commands: Callable[[argparse._SubParsersAction], None] = eps[0].load()
    except Exception as e:  # any import-time failure of a plugin: reported by its commands, never a traceback
        reason = f"{type(e).__name__}: {e}"
        for ep in eps:
            p = sub.add_parser(ep.name, help=f"(unavailable: {ep.module} failed to import)", add_help=False,
                               prefix_chars="\0")       # no options: whatever follows is taken, then refused
            p.add_argument("rest", nargs="*")
            p.set_defaults(func=_broken(ep, reason))
        return
    add_commands(sub)


def _broken(ep: EntryPoint, reason: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        print(f"p2pgen {ep.name}: its module {ep.module} (entry point {ep.group}: {ep.name} = {ep.value}) failed "
              f"to import: {reason}", file=sys.stderr)
        return BROKEN_EXIT
    return run


def main(argv: list[str] | None = None) -> int:
    """Run one `p2pgen` command and return its exit code.

    Args:
        argv: the arguments after the program name (default: sys.argv[1:]).
    """
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop_on_sigterm()    # the harnesses (chaos, stress, bench) stop what they started; `join` sets its own handlers
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

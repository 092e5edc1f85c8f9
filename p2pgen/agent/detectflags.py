"""Command-line parameters of the detector, shared by `p2pgen join` and `p2pgen sim` (kept out of
`p2pgen.detect`, which stays pure: configs and decisions, no argparse).

Owns: the flag names, their defaults (those of `DetectorConfig`) and the conversion back to a config.
Invariant: `config_from_args` returns a valid `DetectorConfig` or raises ValueError saying which flag to fix.
"""

from __future__ import annotations

import argparse

from p2pgen.detect.config import KINDS, DetectorConfig

_FLAGS = {
    "detector": "kind",
    "detect_timeout": "timeout",
    "detect_floor": "floor",
    "phi_threshold": "phi_threshold",
    "heartbeat_interval": "heartbeat_interval",
    "detect_window": "window",
    "detect_stalled_floor": "stalled_floor",
}


def add_detector_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --detector, --detect-timeout, --detect-floor, --phi-threshold, --heartbeat-interval, --detect-window,
    --detect-stalled-floor."""
    d = DetectorConfig()
    g = parser.add_argument_group("failure detection")
    g.add_argument("--detector", choices=KINDS, default=d.kind,
                   help=f"'fixed' timeout or 'phi' accrual bounded by floor and timeout (default {d.kind})")
    g.add_argument("--detect-timeout", type=float, default=d.timeout, metavar="S",
                   help=f"a peer silent this long is always suspected (default {d.timeout} s)")
    g.add_argument("--detect-floor", type=float, default=d.floor, metavar="S",
                   help=f"a peer heard from within this time is never suspected (default {d.floor} s)")
    g.add_argument("--phi-threshold", type=float, default=d.phi_threshold, metavar="PHI",
                   help=f"phi level above which a peer is suspected (default {d.phi_threshold})")
    g.add_argument("--heartbeat-interval", type=float, default=d.heartbeat_interval, metavar="S",
                   help=f"seconds between heartbeats (default {d.heartbeat_interval} s)")
    g.add_argument("--detect-window", type=int, default=d.window, metavar="N",
                   help=f"heartbeat intervals kept per peer for phi (default {d.window})")
    g.add_argument("--detect-stalled-floor", type=float, default=d.stalled_floor, metavar="S",
                   help="the floor while this agent's application reports its collective stalled (the job waits "
                        f"for the silent peer; at most --detect-floor; default {d.stalled_floor} s)")


def detector_flags(config: DetectorConfig) -> tuple[str, ...]:
    """The `p2pgen join` flags that give an agent `config` (what a harness passes to the agents it starts)."""
    return tuple(f"--{flag.replace('_', '-')}={getattr(config, field)}" for flag, field in _FLAGS.items())


def config_from_args(args: argparse.Namespace) -> DetectorConfig:
    """The validated config for parsed args; ValueError naming the flag(s) to fix otherwise."""
    values = {field: getattr(args, flag) for flag, field in _FLAGS.items()}
    try:
        return DetectorConfig(**values)
    except ValueError as err:
        flags = ", ".join("--" + f.replace("_", "-") for f in _FLAGS)
        raise ValueError(f"{err} (flags: {flags})") from None

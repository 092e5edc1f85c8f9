"""The detector's command-line flags round-trip to a validated config."""

from __future__ import annotations

import argparse

import pytest

from p2pgen.agent.detectflags import add_detector_arguments, config_from_args
from p2pgen.detect import DetectorConfig


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_detector_arguments(parser)
    return parser.parse_args(argv)


def test_defaults_are_the_config_defaults():
    assert config_from_args(parse([])) == DetectorConfig()


def test_every_parameter_is_settable():
    args = parse(["--detector", "fixed", "--detect-timeout", "2.5", "--detect-floor", "0.5",
                  "--phi-threshold", "12", "--heartbeat-interval", "0.25", "--detect-window", "40"])
    assert config_from_args(args) == DetectorConfig(kind="fixed", timeout=2.5, floor=0.5, phi_threshold=12.0,
                                                    heartbeat_interval=0.25, window=40)


def test_a_bad_combination_names_the_flags():
    with pytest.raises(ValueError, match=r"lower the floor or raise the timeout.*--detect-floor"):
        config_from_args(parse(["--detect-timeout", "0.2", "--detect-floor", "0.5"]))


def test_an_unknown_kind_is_refused_by_the_parser():
    with pytest.raises(SystemExit):
        parse(["--detector", "gossip"])

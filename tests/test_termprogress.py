"""The terminal progress line of `chaos`, `bench recovery` and `stress`: shown on a terminal, never elsewhere."""

from __future__ import annotations

import io
import time

import pytest

from p2pgen.termprogress import CLEAR, TermProgress, format_duration


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_status_shows_done_total_elapsed_and_estimate():
    clock = Clock()
    p = TermProgress(10, "p2pgen chaos", stream=Terminal(), clock=clock, unit=" runs")
    clock.now += 30
    p.update(3, "certified #3")
    assert p.status() == "p2pgen chaos: 3/10 runs · 30 s elapsed · about 1:10 left · certified #3"


def test_on_a_terminal_the_line_is_redrawn_in_place_and_cleared_by_ordinary_lines():
    term = Terminal()
    p = TermProgress(4, "work", stream=term, clock=Clock())
    p.update(1)
    p.write("[certified #0] pass")
    p.update(2)
    p.close()
    out = term.getvalue()
    assert out.startswith(CLEAR + "work: 1/4")
    assert CLEAR + "[certified #0] pass\n" + CLEAR + "work: 1/4" in out
    assert CLEAR + "work: 2/4" in out
    assert out.endswith(CLEAR)                  # close() leaves a clean line


@pytest.mark.parametrize("stream, enabled", [(io.StringIO(), True), (Terminal(), False)])
def test_not_a_terminal_or_json_mode_gets_only_the_ordinary_lines(stream, enabled):
    p = TermProgress(4, "work", stream=stream, enabled=enabled, clock=Clock())
    p.update(1)
    p.write("a line")
    p.tick(lambda: 2.0, interval=0.01)
    p.update(4)
    p.close()
    assert stream.getvalue() == "a line\n"


def test_ticking_redraws_from_the_function_until_closed():
    term = Terminal()
    p = TermProgress(60, "p2pgen stress: faults", stream=term, clock=Clock(), unit=" s")
    p.tick(lambda: 12.0, interval=0.01)
    while "12/60 s" not in term.getvalue():     # bounded by the test timeout
        time.sleep(0.01)
    p.close()
    assert term.getvalue().endswith(CLEAR)


def test_no_estimate_before_any_work_and_after_all_of_it():
    p = TermProgress(2, "w", stream=Terminal(), clock=Clock())
    assert "left" not in p.status()
    p.update(2)
    assert "left" not in p.status()


def test_a_non_positive_total_is_refused():
    with pytest.raises(ValueError, match="must be positive"):
        TermProgress(0, "w")


@pytest.mark.parametrize("seconds, text", [(0, "0 s"), (42.4, "42 s"), (187, "3:07"), (3723, "1:02:03")])
def test_durations_read_naturally(seconds, text):
    assert format_duration(seconds) == text

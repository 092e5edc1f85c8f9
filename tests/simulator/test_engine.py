"""The churn simulator: deterministic under a seed, consistent accounting, and judged by `suspects`."""

from __future__ import annotations

import math

import numpy as np
import pytest

import p2pgen_lab.simulator.engine as engine
from p2pgen.detect import DetectorConfig
from p2pgen_lab.simulator.engine import simulate
from p2pgen_lab.simulator.model import Scenario, fixed_detector, pause_exceedance

SHORT = Scenario(duration=2_000.0, mtbf=20.0)


def fingerprint(run: engine.Run) -> tuple:
    return (run.stalls, run.sizes, run.losses, run.detect_latencies, run.failures, run.pauses,
            run.false_positives)


@pytest.mark.parametrize("rollback", ["none", "step", "checkpoint"])
def test_same_seed_same_run_and_another_seed_another(rollback):
    scenario = SHORT.with_(rollback=rollback, detector=DetectorConfig(kind="phi", timeout=2.0, floor=0.5,
                                                                      heartbeat_interval=0.1))
    assert fingerprint(simulate(scenario, 7)) == fingerprint(simulate(scenario, 7))
    assert fingerprint(simulate(scenario, 7)) != fingerprint(simulate(scenario, 8))


def test_the_failures_are_the_same_whatever_the_detector():
    """Common random numbers: a timeout sweep compares detectors on the very same churn."""
    a = simulate(SHORT.with_(detector=fixed_detector(5.0, 0.5)), 3)
    b = simulate(SHORT.with_(detector=fixed_detector(4.0, 0.5)), 3)
    first_hang = [s.start for s in a.stalls if s.kind == "hang"][:3]
    assert first_hang == [s.start for s in b.stalls if s.kind == "hang"][:3]


def test_every_detection_is_decided_by_the_runtime_function(monkeypatch):
    calls: list[float] = []
    real = engine.suspects

    def spy(now, history, config):
        calls.append(now)
        return real(now, history, config)

    monkeypatch.setattr(engine, "suspects", spy)
    run = simulate(SHORT.with_(duration=300.0), 1)
    assert run.failures > 0 and calls
    monkeypatch.setattr(engine, "suspects", lambda now, history, config: {})
    with pytest.raises(AssertionError, match="did not suspect"):
        simulate(SHORT.with_(duration=300.0), 1)


def test_fixed_timeout_detects_a_death_half_a_heartbeat_before_the_timeout_on_average():
    run = simulate(SHORT.with_(detector=fixed_detector(2.0, 0.5), duration=5_000.0), 0)
    assert len(run.detect_latencies) > 100
    assert all(1.5 <= x <= 2.0 + 0.02 for x in run.detect_latencies)
    assert np.mean(run.detect_latencies) == pytest.approx(1.75, abs=0.03)


@pytest.mark.parametrize("timeout", [0.5, 1.0, 2.0])
def test_false_positive_rate_is_the_chance_a_silence_outlasts_the_timeout(timeout):
    run = simulate(SHORT.with_(detector=fixed_detector(timeout, 0.5), duration=5_000.0), 0)
    expected = pause_exceedance(timeout, SHORT.pause_median, SHORT.pause_sigma)
    rate = run.false_positives / run.pauses
    assert rate == pytest.approx(expected, abs=4 * math.sqrt(expected / run.pauses) + 0.01)


def test_instant_process_detection_never_hangs_the_group():
    run = simulate(SHORT.with_(process_death_share=1.0, instant_process_detection=True), 2)
    assert run.failures > 0 and run.process_deaths == run.failures
    assert run.stall_by_kind()["hang"] == 0.0 and not run.detect_latencies


@pytest.mark.parametrize("rollback", ["none", "step", "checkpoint"])
def test_accounting_is_consistent(rollback):
    run = simulate(SHORT.with_(rollback=rollback, mtbf=8.0), 4)
    assert all(s.start <= s.end for s in run.stalls)
    assert all(0 <= size <= run.scenario.size for _, size in run.sizes)
    assert 0.0 <= run.stalled_time() <= run.additive_stall_time()
    assert 0.0 < run.goodput() <= 1.0
    end = run.progress(np.array([run.duration]))[0]
    assert end == pytest.approx(run.goodput() * run.duration)
    assert (rollback == "none") == (run.lost_work() == 0.0)
    grid = np.linspace(0, run.duration, 500)
    assert np.all(run.progress(grid) <= grid + 1e-9)


def test_rolling_back_to_a_checkpoint_loses_more_than_an_aborted_step():
    step = simulate(SHORT.with_(rollback="step"), 5)
    checkpoint = simulate(SHORT.with_(rollback="checkpoint"), 5)
    assert checkpoint.lost_work() > 5 * step.lost_work() > 0


def test_more_churn_means_less_goodput():
    goodputs = [simulate(SHORT.with_(mtbf=m), 6).goodput() for m in (200.0, 50.0, 12.0)]
    assert goodputs == sorted(goodputs, reverse=True)


def test_invalid_scenarios_say_what_to_fix():
    with pytest.raises(ValueError, match="rollback must be one of"):
        Scenario(rollback="sometimes")
    with pytest.raises(ValueError, match="process_death_share is a fraction"):
        Scenario(process_death_share=1.5)

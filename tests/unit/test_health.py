"""Burrow-style projection health over a sliding window (services/ops/health.py)."""

import pytest

from services.ops.health import HealthWindow, Sample

pytestmark = pytest.mark.unit


def window(samples, seconds=30.0):
    w = HealthWindow(seconds, min_samples=3)
    for s in samples:
        w.add(Sample(*s))
    return w


def test_caught_up_once_in_the_window_is_ok():
    assert window([(0, 0, 5, 0), (1, 5, 0, 0), (2, 5, 3, 0)]).status() == "OK"


def test_position_not_moving_with_lag_is_stalled():
    assert window([(0, 10, 4, 0), (1, 10, 6, 0), (2, 10, 9, 0)]).status() == "STALLED"


def test_lag_growing_in_every_sample_while_moving_is_lagging():
    assert window([(0, 10, 4, 0), (1, 12, 6, 0), (2, 15, 9, 0)]).status() == "LAGGING"


def test_lag_being_worked_off_is_ok():
    assert window([(0, 10, 9, 0), (1, 14, 6, 0), (2, 20, 3, 0)]).status() == "OK"
    # grew, then shrank: not monotonic, so not LAGGING
    assert window([(0, 10, 4, 0), (1, 11, 8, 0), (2, 20, 6, 0)]).status() == "OK"


def test_a_failed_batch_in_the_window_is_error():
    assert window([(0, 10, 0, 1), (1, 12, 0, 2), (2, 15, 0, 2)]).status() == "ERROR"


def test_too_few_samples_is_not_judged():
    assert window([(0, 10, 4, 0), (1, 10, 6, 0)]).status() == "OK"


def test_old_samples_leave_the_window_and_rate_uses_position_deltas():
    w = window([(0, 0, 9, 0), (10, 10, 9, 0), (20, 30, 9, 0), (45, 60, 9, 0)], seconds=30.0)
    assert [s.at for s in w.samples] == [20, 45]
    assert w.rate() == pytest.approx(30 / 25)

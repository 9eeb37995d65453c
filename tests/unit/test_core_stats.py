"""The stats arithmetic (core/stats.py): rates over sampled windows, backlog bytes over stored units."""

from __future__ import annotations

import pytest

from ister.core.stats import RateWindow, range_bytes, rates


def test_rate_over_the_newest_sample_at_least_a_tick_old() -> None:
    w = RateWindow()
    w.tick(0.0, (0, 0))
    w.tick(5.0, (100, 1000))
    # at 7 s: the newest sample (5 s) is 2 s old, the older one (0 s) 7 s: the window is 7 s
    got, window = rates(w.base(7.0, 5.0), 7.0, (140, 1400))
    assert window == 7.0 and got == pytest.approx([20.0, 200.0])
    # at 10 s the 5 s sample is old enough
    got, window = rates(w.base(10.0, 5.0), 10.0, (200, 2000))
    assert window == 5.0 and got == pytest.approx([20.0, 200.0])


def test_a_quiet_counter_falls_to_zero_and_costs_no_new_sample() -> None:
    w = RateWindow()
    w.tick(0.0, (0,))
    w.tick(5.0, (50,))
    newest = w.new
    w.tick(10.0, (50,))
    w.tick(15.0, (50,))
    assert w.new is newest and w.old is not None and w.old.counts == (50,)
    got, _ = rates(w.base(17.0, 5.0), 17.0, (50,))
    assert got == [0.0]
    # traffic resumes between ticks: the rate covers the time since the last quiet sample
    got, window = rates(w.base(17.0, 5.0), 17.0, (70,))
    assert window == 7.0 and got == pytest.approx([20 / 7])


def test_no_rate_without_a_window() -> None:
    w = RateWindow()
    assert rates(w.base(0.0, 5.0), 0.0, (1,)) == ([0.0], 0.0)
    w.tick(10.0, (5,))
    assert w.base(10.5, 5.0) is None  # half a second is noise
    assert rates(w.base(11.0, 5.0), 11.0, (15,))[0] == pytest.approx([10.0])
    assert rates(w.base(11.0, 5.0), 11.0, (2,))[0] == [0.0]  # a counter that restarted


def test_range_bytes_prorates_partial_units() -> None:
    units = [(0, 10, 1000), (10, 20, 2000), (20, 20, 0)]
    assert range_bytes(units, 0, 20) == 3000
    assert range_bytes(units, 5, 20) == 500 + 2000
    assert range_bytes(units, 5, 15) == 500 + 1000
    assert range_bytes(units, 20, 30) == 0  # offsets no unit holds count nothing
    assert range_bytes([], 0, 10) == 0

"""`core.backoff`: the capped exponential backoff of every retry loop, its jitter from a seeded source."""

from __future__ import annotations

import random

import pytest

from ister.core.backoff import Backoff, Retries


def test_doubles_from_first_to_the_cap() -> None:
    b = Backoff(first=0.5, cap=30.0)
    assert [b.delay(n) for n in range(1, 10)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert b.delay(0) == b.delay(-3) == 0.5  # fewer than one failure counts as one
    assert b.delay(10_000) == 30.0  # no overflow however long the series


def test_factor_and_a_cap_equal_to_first() -> None:
    assert [Backoff(1.0, 100.0, factor=3.0).delay(n) for n in (1, 2, 3, 4, 5, 6)] == [1, 3, 9, 27, 81, 100]
    assert Backoff(2.0, 2.0).delay(50) == 2.0
    assert Backoff(2.0, 8.0, factor=1.0).delay(50) == 2.0
    assert Backoff(2.0, 1.0).delay(1) == Backoff(2.0, 1.0).delay(9) == 1.0  # a cap below first caps all
    assert Backoff(0.0, 5.0).delay(30) == 0.0  # no wait at all


def test_jitter_scales_within_its_fraction() -> None:
    b = Backoff(first=1.0, cap=8.0, jitter=0.25)
    assert b.delay(3, draw=1.0) == 4.0
    assert b.delay(3, draw=0.0) == 3.0
    assert b.delay(3, draw=0.5) == 3.5


@pytest.mark.parametrize("seed", range(20))
def test_seeded_series_are_reproducible_and_bounded(seed: int) -> None:
    b = Backoff(first=0.2, cap=2.0, jitter=0.5)
    one = Retries(b, random.Random(seed).random)
    two = Retries(b, random.Random(seed).random)
    waits = [one.next() for _ in range(12)]
    assert waits == [two.next() for _ in range(12)]
    for n, wait in enumerate(waits, 1):
        assert b.ceiling(n) * 0.5 <= wait <= b.ceiling(n)


def test_a_series_counts_failures_and_starts_over_after_a_success() -> None:
    r = Retries(Backoff(first=1.0, cap=60.0))
    assert (r.peek(), r.next(), r.next(), r.next(), r.failures) == (1.0, 1.0, 2.0, 4.0, 3)
    r.reset()
    assert (r.failures, r.next()) == (0, 1.0)


@pytest.mark.parametrize(
    "kwargs",
    [{"first": -1.0, "cap": 1.0}, {"first": 2.0, "cap": -1.0}, {"first": 1.0, "cap": 2.0, "factor": 0.5},
     {"first": 1.0, "cap": 2.0, "jitter": 1.5}],
)  # fmt: skip
def test_nonsense_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(**kwargs)

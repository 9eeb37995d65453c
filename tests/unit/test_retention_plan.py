"""The retention planner (core/retention.py): which whole units go, and the start offset after them."""

from __future__ import annotations

import pytest

from ister.core.retention import (
    RetentionLimits,
    Unit,
    format_duration_ms,
    format_size_bytes,
    parse_duration_ms,
    parse_size_bytes,
    plan,
)
from ister.errors import InvalidArgument

NOW = 10_000_000


def units(*spec: tuple[int, int, int]) -> list[Unit]:
    """(records, size, age in ms) per unit, oldest first, offsets consecutive from 0."""
    out, first = [], 0
    for count, size, age in spec:
        out.append(Unit(first, first + count, size, NOW - age))
        first += count
    return out


def test_time_deletes_the_expired_prefix_only() -> None:
    us = units((10, 100, 9_000), (10, 100, 5_000), (10, 100, 8_000), (10, 100, 100))
    start, gone = plan(us, RetentionLimits(time_ms=6_000), NOW, safe_end=40, start=0)
    assert start == 10 and gone == us[:1]  # the third unit is expired too, but the second is not: a prefix


def test_size_keeps_at_least_the_limit() -> None:
    us = units((10, 100, 0), (10, 100, 0), (10, 100, 0), (10, 100, 0))
    start, gone = plan(us, RetentionLimits(time_ms=0, size_bytes=250), NOW, safe_end=40, start=0)
    assert start == 10 and gone == us[:1]  # deleting a second would leave 200 < 250
    start, gone = plan(us, RetentionLimits(time_ms=0, size_bytes=200), NOW, safe_end=40, start=0)
    assert start == 20 and gone == us[:2]


def test_nothing_past_what_is_exported_or_committed() -> None:
    us = units((10, 100, 9_000), (10, 100, 9_000))
    start, gone = plan(us, RetentionLimits(time_ms=1), NOW, safe_end=15, start=0)
    assert start == 10 and gone == us[:1]


def test_unlimited_deletes_nothing_but_leftovers_below_the_start() -> None:
    us = units((10, 100, 9_000), (10, 100, 9_000))
    assert plan(us, RetentionLimits(time_ms=0, size_bytes=0), NOW, 20, 0) == (0, [])
    # a unit wholly below the start (its deletion was interrupted) is always deleted; the start stays
    assert plan(us, RetentionLimits(time_ms=0), NOW, 20, 10) == (10, us[:1])


def test_the_start_never_goes_back() -> None:
    us = units((10, 100, 0))
    assert plan(us, RetentionLimits(), NOW, 10, start=25) == (25, us)


@pytest.mark.parametrize(
    ("text", "ms"), [("30s", 30_000), ("10m", 600_000), ("7d", 604_800_000), ("0", 0), ("1.5h", 5_400_000)]
)
def test_durations(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize(
    ("text", "n"), [("512MiB", 512 * 2**20), ("50GiB", 50 * 2**30), ("10GB", 10**10), ("0", 0), ("123", 123)]
)
def test_sizes(text: str, n: int) -> None:
    assert parse_size_bytes(text) == n


@pytest.mark.parametrize("bad", ["", "-5s", "7 days", "10x", "1e9d"])
def test_bad_durations_are_refused(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_duration_ms(bad)


@pytest.mark.parametrize("bad", ["", "-1", "5XB", "lots"])
def test_bad_sizes_are_refused(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_size_bytes(bad)


def test_formats() -> None:
    assert format_duration_ms(604_800_000) == "7d" and format_duration_ms(0) == "unlimited"
    assert format_size_bytes(50 * 2**30) == "50GiB" and format_size_bytes(0) == "unlimited"

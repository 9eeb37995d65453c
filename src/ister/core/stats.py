"""Pure arithmetic of the admin API's stats (docs/admin.md, "Stats"): rates from counters sampled over a
window, and the bytes of an offset range estimated from the stored units that hold it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# One sample per topic is refreshed every RATE_TICK_SECONDS; a rate covers the time since the newest
# sample at least RATE_TICK_SECONDS old (so between one and two ticks).
RATE_TICK_SECONDS = 5.0
MIN_WINDOW_SECONDS = 1.0  # a shorter window would give noise, not a rate


@dataclass(slots=True)
class Sample:
    """Counters of one thing (a topic, a producer, a subscription) at one time (monotonic seconds)."""

    at: float
    counts: tuple[int, ...]


class RateWindow:
    """The two latest samples of a set of counters; `rates` gives per-second rates over the older one.

    Counters that did not change since the newest sample only move its time forward (no new sample): a
    quiet thing costs no allocation per tick, and its rate is exactly 0 over any window.
    """

    __slots__ = ("new", "old")

    def __init__(self) -> None:
        self.old: Sample | None = None
        self.new: Sample | None = None

    def tick(self, now: float, counts: tuple[int, ...]) -> None:
        new = self.new
        if new is not None and new.counts == counts:
            # Nothing moved: the same counts held at the last tick and hold now.
            old = self.old
            if old is not None and old.counts == counts:
                old.at = new.at
            else:
                self.old = Sample(new.at, counts)
            new.at = now
            return
        self.old, self.new = new, Sample(now, counts)

    def base(self, now: float, min_age: float) -> Sample | None:
        """The newest sample at least `min_age` old, else the oldest one if it is at least
        `MIN_WINDOW_SECONDS` old (a topic loaded moments ago), else None."""
        for s in (self.new, self.old):
            if s is not None and now - s.at >= min_age:
                return s
        oldest = self.old or self.new
        return oldest if oldest is not None and now - oldest.at >= MIN_WINDOW_SECONDS else None


def rates(base: Sample | None, now: float, counts: Sequence[int]) -> tuple[list[float], float]:
    """(per-second rate of each counter since `base`, the window in seconds); zeros without a base or a
    window under 10 ms, and never negative (a counter that restarted)."""
    if base is None or len(base.counts) != len(counts):
        return [0.0] * len(counts), 0.0
    window = now - base.at
    if window < 0.01:
        return [0.0] * len(counts), 0.0
    return [max(0, c - b) / window for c, b in zip(counts, base.counts, strict=True)], window


def range_bytes(units: Iterable[tuple[int, int, int]], first: int, end: int) -> int:
    """Estimated stored bytes of offsets [first, end) from units (first, end, bytes) that hold them: a unit
    wholly inside counts whole, one partly inside by the share of its offsets inside (its records taken as
    equally large). Offsets no unit holds count nothing."""
    total = 0.0
    for a, b, size in units:
        if b <= a:
            continue
        lo, hi = max(a, first), min(b, end)
        if hi > lo:
            total += size * (hi - lo) / (b - a)
    return round(total)

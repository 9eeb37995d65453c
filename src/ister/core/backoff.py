"""`Backoff`: the one capped exponential backoff of every retry loop, with an optional jitter.

Pure: the jitter's random draw is an argument (a number in [0, 1), or a seeded generator for a `Retries`
series), so what a retry loop waits is reproducible in tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Backoff:
    """Failure n (1-based) waits min(cap, first * factor ** (n - 1)), times (1 - jitter + jitter * draw)
    for a draw in [0, 1): a jitter of 0.25 waits between 75 % and 100 % of that. A cap below `first` caps
    every wait; a `first` of 0 never waits."""

    first: float
    cap: float
    factor: float = 2.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if not (self.first >= 0 and self.cap >= 0 and self.factor >= 1 and 0 <= self.jitter <= 1):
            raise ValueError(f"a backoff needs first, cap >= 0, factor >= 1, 0 <= jitter <= 1: {self}")

    def ceiling(self, failures: int) -> float:
        """The wait after `failures` failures in a row before jitter (fewer than one counts as one)."""
        first, cap, factor = self.first, self.cap, self.factor
        if first == 0 or cap <= first or factor == 1:
            return min(first, cap)
        exponent = max(0, failures - 1)
        if exponent >= math.log(cap / first, factor):  # the cap, also where the power would overflow
            return cap
        return min(cap, first * factor**exponent)

    def delay(self, failures: int, draw: float = 1.0) -> float:
        """The wait after `failures` failures in a row, `draw` in [0, 1] choosing within the jitter."""
        return self.ceiling(failures) * (1.0 - self.jitter + self.jitter * draw)


@dataclass(slots=True)
class Retries:
    """One retry loop's series of failures under a `Backoff`: `next()` counts a failure and says how long to
    wait; `reset()` after a success starts over. `draw` gives the jitter's random numbers (a seeded
    `random.Random().random` in tests)."""

    backoff: Backoff
    draw: Callable[[], float] = field(default=lambda: 1.0)
    failures: int = 0

    def next(self) -> float:
        self.failures += 1
        return self.backoff.delay(self.failures, self.draw() if self.backoff.jitter else 1.0)

    def peek(self) -> float:
        """What the next failure would wait (before jitter), without counting one."""
        return self.backoff.ceiling(self.failures + 1)

    def reset(self) -> None:
        self.failures = 0

"""Connection plumbing shared by producers and consumers: URL normalising, the retry policy; channels and
credentials are the peer transport's (`client/transport.py`), named here for the client's modules."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from ister.core.backoff import Backoff


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = f"http://{url}"
    return url


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded retries: attempt n (1-based) waits min(max, base * 2**(n-1)) scaled by a jitter in [0.5, 1].

    A series of retries ends after `timeout` seconds since its first failure, or after `max_retries`
    retries when that is set, whichever comes first."""

    max_retries: int | None = None
    base: float = 0.2
    max: float = 2.0
    timeout: float = 30.0

    def delay(self, attempt: int) -> float:
        return Backoff(first=self.base, cap=self.max, jitter=0.5).delay(attempt, random.random())


class RetryBudget:
    """One series of retries of a failing operation under a `RetryPolicy`: `next_delay()` after each
    failure says how long to wait before the next attempt, or None when the budget is spent; `reset()`
    after a success (or progress) starts a fresh series."""

    __slots__ = ("attempts", "policy", "started")

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.attempts = 0
        self.started: float | None = None

    def reset(self) -> None:
        self.attempts = 0
        self.started = None

    @property
    def elapsed(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started

    def next_delay(self) -> float | None:
        now = time.monotonic()
        if self.started is None:
            self.started = now
        self.attempts += 1
        policy = self.policy
        left = policy.timeout - (now - self.started)
        if left <= 0 or (policy.max_retries is not None and self.attempts > policy.max_retries):
            return None
        return min(policy.delay(self.attempts), left)

    def spent(self, what: str, err: BaseException) -> str:
        """The message of the error that ends the series."""
        return f"{what}: gave up after {self.attempts} attempts in {self.elapsed:.1f} s: {err}"

"""Token buckets for rate limits (publish and dispatch rates, docs/limits.md); pure: time is an argument.

A bucket holds up to `burst` tokens and gains `rate` per second. `reserve(n, now)` takes `n` tokens at
once, going into debt when there are fewer, and answers how long the caller must wait before acting: the
time the debt takes to refill. Callers that wait their turn this way are served in the order they reserved,
at the configured rate on average, and a caller whose wait would be too long is refused without taking
anything (`reserve(..., max_wait=...)` answers None). A request larger than the burst is admitted against
a full bucket (it waits for the debt it leaves), so a batch larger than one second's worth is never
refused for its size alone.
"""

from __future__ import annotations

from dataclasses import dataclass


class TokenBucket:
    """One rate (units per second) with a burst allowance; `rate` 0 means unlimited."""

    __slots__ = ("_at", "_tokens", "burst", "rate")

    def __init__(self, rate: float, now: float, burst: float | None = None) -> None:
        self.rate = 0.0
        self.burst = 0.0
        self._tokens = 0.0
        self._at = now
        self.configure(rate, now, burst)

    def configure(self, rate: float, now: float, burst: float | None = None) -> None:
        """Change the rate (and the burst: one second's worth unless given) keeping the balance, capped to
        the new burst; a bucket that was unlimited starts full."""
        if rate < 0 or (burst is not None and burst < 0):
            raise ValueError("a rate and a burst are >= 0")
        self._refill(now)
        was_unlimited = not self.rate
        self.rate = float(rate)
        self.burst = float(burst) if burst is not None else float(rate)
        self._tokens = self.burst if was_unlimited else min(self._tokens, self.burst)

    def _refill(self, now: float) -> None:
        if now > self._at:
            if self.rate:
                self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now

    def tokens(self, now: float) -> float:
        """The balance at `now` (negative: debt)."""
        self._refill(now)
        return self._tokens

    def delay_for(self, n: float, now: float) -> float:
        """Seconds until `n` tokens could be taken without debt beyond what a full bucket allows."""
        if not self.rate:
            return 0.0
        self._refill(now)
        need = min(n, self.burst) if self.burst else n
        short = need - self._tokens
        return max(0.0, short / self.rate)

    def reserve(self, n: float, now: float, max_wait: float | None = None) -> float | None:
        """Take `n` tokens and answer the seconds to wait before using them (0: at once); None, taking
        nothing, when that wait would exceed `max_wait`."""
        if not self.rate:
            return 0.0
        wait = self.delay_for(n, now)
        if max_wait is not None and wait > max_wait:
            return None
        self._tokens -= n
        return wait


@dataclass(frozen=True, slots=True)
class Rate:
    """A limit in messages and bytes per second (0 each: none)."""

    messages: int = 0
    bytes: int = 0

    @property
    def unlimited(self) -> bool:
        return not self.messages and not self.bytes


class RateLimiter:
    """Messages and bytes per second together: a request waits for the slower of the two buckets.

    `admit(messages, size, now, max_wait)` answers (wait, None) or, when either bucket's wait would exceed
    `max_wait`, (None, which) naming the refusing limit ("messages" or "bytes") with nothing taken."""

    __slots__ = ("_bytes", "_messages", "rate")

    def __init__(self, rate: Rate, now: float) -> None:
        self.rate = rate
        self._messages = TokenBucket(rate.messages, now)
        self._bytes = TokenBucket(rate.bytes, now)

    def configure(self, rate: Rate, now: float) -> None:
        if rate != self.rate:
            self.rate = rate
            self._messages.configure(rate.messages, now)
            self._bytes.configure(rate.bytes, now)

    def admit(
        self, messages: int, size: int, now: float, max_wait: float | None = None
    ) -> tuple[float | None, str]:
        m_wait = self._messages.delay_for(messages, now)
        b_wait = self._bytes.delay_for(size, now)
        if max_wait is not None and m_wait > max_wait:
            return None, "messages"
        if max_wait is not None and b_wait > max_wait:
            return None, "bytes"
        self._messages.reserve(messages, now)
        self._bytes.reserve(size, now)
        return max(m_wait, b_wait), ""

"""Publish and dispatch rate limits of loaded topics (docs/limits.md); the buckets are `core/rate_limit.py`'s.

The limits come from the topic's own record (`/ister/rate-limits/{ns}/{topic}`), else its namespace's
policy; both are mirrored by a watch (`LocalCache`), so a change applies to running producers and
subscriptions within the watch's delay, and a publish reads no metadata. A namespace's rate applies to each
of its topics (each partition of a partitioned topic), as Pulsar's namespace publish rate does.

A publish over the rate waits its turn before it is accepted (the batch API reads the producer's stream no
further meanwhile, a Danube `SendMessage` is answered later): back-pressure, never a drop. One whose turn is
further away than `limits.max_publish_wait_seconds` is refused at once with RESOURCE_EXHAUSTED naming the
limit, and nothing of it is stored. Dispatch over `max_subscription_dispatch_rate` pauses the
subscription's deliveries until the rate allows the next one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ister.broker import metrics
from ister.clock import REAL_CLOCK, Clock
from ister.core.rate_limit import Rate, RateLimiter, TokenBucket
from ister.errors import ResourceExhausted
from ister.ids import TopicName, counted
from ister.metadata import keys
from ister.metadata.cache import LocalCache
from ister.metadata.records import NamespacePolicy, TopicRateLimits


@dataclass(frozen=True, slots=True)
class RatesInEffect:
    publish: Rate = field(default_factory=Rate)
    dispatch: int = 0  # messages per second per subscription
    # where each comes from: "topic" or "namespace"
    messages_source: str = "namespace"
    bytes_source: str = "namespace"
    dispatch_source: str = "namespace"


def rates_in_effect(policy: NamespacePolicy, own: TopicRateLimits | None) -> RatesInEffect:
    """A topic's own limits where it sets them, else its namespace's."""

    def pick(mine: int | None, theirs: int) -> tuple[int, str]:
        return (mine, "topic") if mine is not None else (theirs, "namespace")

    o = own if own is not None else TopicRateLimits()
    messages, m_src = pick(o.max_publish_rate, policy.max_publish_rate)
    size, b_src = pick(o.max_publish_rate_bytes, policy.max_publish_rate_bytes)
    dispatch, d_src = pick(o.max_subscription_dispatch_rate, policy.max_subscription_dispatch_rate)
    return RatesInEffect(Rate(messages, size), dispatch, m_src, b_src, d_src)


class RateSource:
    """Every topic's rate limits, as the metadata store holds them (through the broker's policy mirror)."""

    def __init__(self, cache: LocalCache, clock: Clock = REAL_CLOCK, max_wait: float = 10.0) -> None:
        self.cache = cache
        self.clock = clock
        self.max_wait = max_wait

    def for_topic(self, name: TopicName) -> TopicLimits:
        return TopicLimits(self, name)


class TopicLimits:
    """One loaded topic's rate limiters; the limits are looked up again only when their records change."""

    __slots__ = ("_ns_key", "_own_key", "_publish", "_rates", "_seen", "_source", "name")

    def __init__(self, source: RateSource, name: TopicName) -> None:
        self._source = source
        self.name = name
        self._ns_key = keys.namespace_policy(name.namespace)
        self._own_key = keys.topic_rate_limits(name)
        self._seen: tuple[object, object] = (False, False)  # the records the rates were taken from
        self._rates = RatesInEffect()
        self._publish: RateLimiter | None = None

    def rates(self) -> RatesInEffect:
        cache = self._source.cache
        ns, own = cache.get(self._ns_key), cache.get(self._own_key)
        if self._seen[0] is not ns or self._seen[1] is not own:
            policy = NamespacePolicy.lenient(ns.value if ns is not None else None)
            mine = TopicRateLimits.parse(own.value) if own is not None else None
            self._rates = rates_in_effect(policy, mine)
            self._seen = (ns, own)
        return self._rates

    async def admit_publish(self, messages: int, nbytes: int) -> None:
        """Wait for the publish rate to allow `messages` of `nbytes` payload bytes; ResourceExhausted (nothing
        taken) when that would take longer than the broker's `max_publish_wait_seconds`."""
        rates = self.rates()
        if rates.publish.unlimited:
            return
        clock = self._source.clock
        now = clock.monotonic()
        limiter = self._publish
        if limiter is None:
            limiter = self._publish = RateLimiter(rates.publish, now)
        else:
            limiter.configure(rates.publish, now)
        max_wait = self._source.max_wait
        wait, which = limiter.admit(messages, nbytes, now, max_wait)
        if wait is None:
            if which == "messages":
                limit, value, unit, src = (
                    "max_publish_rate",
                    rates.publish.messages,
                    "messages",
                    rates.messages_source,
                )
            else:
                limit, value, unit, src = (
                    "max_publish_rate_bytes",
                    rates.publish.bytes,
                    "bytes",
                    rates.bytes_source,
                )
            metrics.limit_refusals.labels(limit).inc()
            owner = f"topic {self.name}" if src == "topic" else f"namespace {self.name.namespace}"
            raise ResourceExhausted(
                f"{self.name}: {owner} allows {limit}={value} {unit}/s; this publish of "
                f"{counted(messages, 'message')}, {counted(nbytes, 'byte')} would wait longer than "
                f"limits.max_publish_wait_seconds={max_wait:g}"
            )
        if wait > 0:
            metrics.publish_throttled.inc()
            metrics.publish_throttled_seconds.inc(wait)
            await clock.sleep(wait)

    def dispatch_throttle(self) -> DispatchThrottle:
        return DispatchThrottle(self, self._source.clock)


class DispatchThrottle:
    """One subscription's dispatch rate: `pause()` says how long to hold deliveries, `charge(n)` counts
    what was delivered (a step may deliver up to its window at once; the next waits for the debt)."""

    __slots__ = ("_bucket", "_clock", "_limits", "_until")

    def __init__(self, limits: TopicLimits, clock: Clock) -> None:
        self._limits = limits
        self._clock = clock
        self._bucket: TokenBucket | None = None
        self._until = 0.0  # the end of the pause counted last (a loop woken during it counts it once)

    def _current(self, now: float) -> TokenBucket | None:
        rate = self._limits.rates().dispatch
        bucket = self._bucket
        if not rate:
            self._bucket = None
            return None
        if bucket is None:
            bucket = self._bucket = TokenBucket(rate, now)
        elif bucket.rate != rate:
            bucket.configure(rate, now)
        return bucket

    def pause(self) -> float:
        """Seconds until the next delivery may go (0: now)."""
        now = self._clock.monotonic()
        bucket = self._current(now)
        if bucket is None:
            return 0.0
        wait = bucket.delay_for(1, now)
        if wait > 0 and now + wait > self._until:
            metrics.dispatch_throttled_seconds.inc(now + wait - max(now, self._until))
            self._until = now + wait
        return wait

    def allowance(self) -> int | None:
        """How many new messages may be read into the window now (None: no limit; 0: none, pause)."""
        now = self._clock.monotonic()
        bucket = self._current(now)
        if bucket is None:
            return None
        if self.pause() > 0:
            return 0
        return max(1, int(bucket.tokens(now)))

    def charge(self, n: int) -> None:
        if n and self._bucket is not None:
            self._bucket.reserve(n, self._clock.monotonic())

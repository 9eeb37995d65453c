"""Latency histograms cheap enough for the publish, dispatch and fsync paths (docs/metrics.md).

prometheus_client's `Histogram.observe` walks its buckets in Python and takes a lock per bucket it adds to:
about 5 µs here, as much as the rest of a one-message publish's bookkeeping. `LatencyHistogram.observe` is
one `bisect` (in C) and two additions, about 0.3 µs. It is exported as a standard Prometheus histogram
(`_bucket{le}`, `_sum`, `_count`; cumulative buckets are computed at scrape time) by the collector
registered with prometheus_client's registry, so `histogram_quantile` works on it as on any other.

Threads: the event loop observes the loop-side histograms with no lock (one writer; a scrape copies the
counts with one `list.copy()`, atomic under the GIL, and at worst sees a `_sum` one observation ahead of
the buckets). A histogram observed from several threads (the WAL writer pool) is made with
`threadsafe=True` and observes under a lock: a `+=` on a list item is not atomic between threads.
Observations are per batch, per fsync, per delivery or per ack call, never per message.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import REGISTRY
from prometheus_client.core import HistogramMetricFamily, Metric

# 100 µs to 10 s: an fdatasync on a fast disk, a publish batch's durability and replication, a delivery
# that waited behind a backlog, an ack after a consumer's processing.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class LatencyHistogram:
    """One unlabelled histogram of seconds. `observe(seconds)`; negative values count as 0."""

    __slots__ = ("_lock", "bounds", "counts", "documentation", "name", "observe", "sum")

    def __init__(
        self,
        name: str,
        documentation: str,
        buckets: Sequence[float] = LATENCY_BUCKETS,
        *,
        threadsafe: bool = False,
    ) -> None:
        if not name.endswith("_seconds"):
            raise ValueError(f"{name}: a latency histogram's name ends in _seconds")
        bounds = tuple(float(b) for b in buckets)
        if list(bounds) != sorted(set(bounds)) or not bounds or math.isinf(bounds[-1]):
            raise ValueError(f"{name}: buckets must be finite, distinct and ascending")
        self.name = name
        self.documentation = documentation
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf only (le counts are cumulated later)
        self.sum = 0.0
        self._lock = threading.Lock()
        self.observe = self._observe_locked if threadsafe else self._observe

    def _observe(self, seconds: float) -> None:
        if seconds < 0:
            seconds = 0.0
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    def _observe_locked(self, seconds: float) -> None:
        if seconds < 0:
            seconds = 0.0
        i = bisect_left(self.bounds, seconds)
        with self._lock:
            self.counts[i] += 1
            self.sum += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def metric(self) -> Metric:
        counts = self.counts.copy()
        total = self.sum
        cumulative: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, math.inf), counts, strict=True):
            running += n
            cumulative.append(("+Inf" if math.isinf(bound) else repr(bound), running))
        return HistogramMetricFamily(self.name, self.documentation, buckets=cumulative, sum_value=total)


class _Collector:
    """Exports every LatencyHistogram made in this process (registered once with prometheus_client)."""

    def __init__(self) -> None:
        self.histograms: dict[str, LatencyHistogram] = {}

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        for histogram in list(self.histograms.values()):
            yield histogram.metric()


_collector = _Collector()
REGISTRY.register(_collector)


def histogram(
    name: str, documentation: str, buckets: Sequence[float] = LATENCY_BUCKETS, *, threadsafe: bool = False
) -> LatencyHistogram:
    """A new histogram, exported from now on (ValueError if the name is taken)."""
    if name in _collector.histograms:
        raise ValueError(f"histogram {name} exists already")
    made = LatencyHistogram(name, documentation, buckets, threadsafe=threadsafe)
    _collector.histograms[name] = made
    return made

"""Rates for the admin API's stats: every loaded topic's counters (and its producers' and subscriptions')
sampled every `RATE_TICK_SECONDS` by one task; a rate is the counters' change since the newest sample at
least one tick old, per second (docs/admin.md, "Stats").

Per topic this keeps two samples of a few integers (one when nothing moved), in a weak map: an unloaded
topic's samples go with it. A tick walks the loaded topics without awaiting, so it sees each one whole.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from ister.broker.topic import Topic
from ister.core.stats import RATE_TICK_SECONDS, RateWindow, rates
from ister.tasks import TaskSupervisor

K = TypeVar("K")


@dataclass(slots=True)
class TopicWindows:
    topic: RateWindow = field(default_factory=RateWindow)
    producers: dict[int, RateWindow] = field(default_factory=dict)
    subscriptions: dict[str, RateWindow] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TopicRates:
    msg_in: float
    byte_in: float
    msg_out: float
    byte_out: float
    window: float
    producers: dict[int, tuple[float, float]]  # producer id -> (messages/s, bytes/s)
    subscriptions: dict[str, tuple[float, float]]  # subscription -> (messages/s out, bytes/s out)


def topic_counts(topic: Topic) -> tuple[int, int, int, int]:
    out = bout = 0
    for sub in topic.subscriptions.values():
        out += sub.messages_out
        bout += sub.bytes_out
    return (topic.messages_in, topic.bytes_in, out, bout)


class RateKeeper:
    def __init__(
        self,
        topics: Callable[[], Iterable[Topic]],
        tick: float = RATE_TICK_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._topics = topics
        self.tick_seconds = tick
        self._clock = clock
        self._windows: weakref.WeakKeyDictionary[Topic, TopicWindows] = weakref.WeakKeyDictionary()
        self._tasks = TaskSupervisor("stats rates")  # its loop
        self._task: asyncio.Task[None] | None = None
        # Topics with subscriptions or tracked cursors at the last tick: the dispatch totals walk these,
        # not every loaded topic (100,000 loaded topics take 0.1 s to walk on a busy machine).
        self.subscribed: list[str] = []

    def start(self) -> None:
        if self._task is None and not self._tasks.closed:
            self._task = self._tasks.spawn(self._run(), "stats-rates")

    async def close(self) -> None:
        self._task = None
        await self._tasks.close()

    async def _run(self) -> None:
        while True:
            self.tick()
            await asyncio.sleep(self.tick_seconds)

    def tick(self) -> None:
        now = self._clock()
        subscribed: list[str] = []
        for topic in list(self._topics()):
            if topic.subscriptions or topic.cursors:
                subscribed.append(topic.name.full)
            w = self._windows.get(topic)
            if w is None:
                w = self._windows[topic] = TopicWindows()
            w.topic.tick(now, topic_counts(topic))
            _tick_each(w.producers, ((p.id, (p.messages, p.bytes)) for p in topic.producers.values()), now)
            _tick_each(
                w.subscriptions,
                ((s.name, (s.messages_out, s.bytes_out)) for s in topic.subscriptions.values()),
                now,
            )
        self.subscribed = subscribed

    def rates(self, topic: Topic) -> TopicRates:
        """The topic's rates now (zeros until its first sample)."""
        now = self._clock()
        w = self._windows.get(topic)
        if w is None:
            return TopicRates(0.0, 0.0, 0.0, 0.0, 0.0, {}, {})
        r, window = rates(w.topic.base(now, self.tick_seconds), now, topic_counts(topic))
        producers = {}
        for p in topic.producers.values():
            pw = w.producers.get(p.id)
            pr, _ = rates(pw.base(now, self.tick_seconds) if pw else None, now, (p.messages, p.bytes))
            producers[p.id] = (pr[0], pr[1])
        subs = {}
        for s in topic.subscriptions.values():
            sw = w.subscriptions.get(s.name)
            sr, _ = rates(sw.base(now, self.tick_seconds) if sw else None, now, (s.messages_out, s.bytes_out))
            subs[s.name] = (sr[0], sr[1])
        return TopicRates(r[0], r[1], r[2], r[3], window, producers, subs)


def _tick_each(windows: dict[K, RateWindow], items: Iterable[tuple[K, tuple[int, ...]]], now: float) -> None:
    seen: set[K] = set()
    for key, counts in items:
        seen.add(key)
        w = windows.get(key)
        if w is None:
            w = windows[key] = RateWindow()
        w.tick(now, counts)
    for key in [k for k in windows if k not in seen]:
        del windows[key]

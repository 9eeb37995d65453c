"""Export scheduling: one task runs the durable-tier passes of every reliable topic of the broker.

A pass (as before: rotate an idle active segment, export the closed segments, delete local files the tier
holds past retention) runs only for a topic that needs one: its WAL changed since its last pass, or that
pass left work that time alone can finish (an active segment waiting to be idle long enough to rotate,
closed files that retention may later delete, a failed pass waiting for its retry). A quiet topic whose
records are exported costs nothing until it is written again: no task, timer, thread or file per topic.

Each tick (every `storage.durable.export_interval_seconds`) walks the topics in slices (yielding to the
loop between slices) and runs the passes due with at most PASS_CONCURRENCY at once. A failed pass backs
off exponentially (up to 60 s) for that topic alone.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from dataclasses import dataclass

from ister.broker.topic import Topic
from ister.broker.topic_meter import TopicMeter
from ister.clock import REAL_CLOCK, Clock
from ister.core.backoff import Backoff
from ister.storage.objects import LocalRetention
from ister.tasks import TaskSupervisor

log = logging.getLogger(__name__)

PASS_CONCURRENCY = 4
SLICE = 1_000  # topics looked at between two yields to the event loop
MAX_BACKOFF_SECONDS = 60.0


@dataclass(slots=True)
class _State:
    seen: tuple[int, int, int] = (-1, -1, -1)  # (committed offset, first offset, segments) at the last pass
    pending: bool = True  # the last pass left work that needs no new append to be done
    not_before: float = 0.0  # the clock's monotonic time; a failed pass is retried no earlier than this
    failures: int = 0
    running: asyncio.Task[None] | None = None


class ExportScheduler:
    def __init__(
        self, retention: LocalRetention, interval: float, segment_max_age: float, clock: Clock = REAL_CLOCK
    ) -> None:
        self.retention = retention
        self._clock = clock
        self.interval = interval
        # A topic's n-th failed pass in a row waits interval * 2**n (at most 64 intervals, 60 s), jittered.
        cap = min(MAX_BACKOFF_SECONDS, interval * 2**6)
        self.backoff = Backoff(first=min(interval * 2, cap), cap=cap, jitter=0.25)
        self.segment_max_age = segment_max_age
        self._topics: dict[Topic, _State] = {}
        self._tasks = TaskSupervisor("durable export")  # the walk and its passes
        self._task: asyncio.Task[None] | None = None
        self._slots = asyncio.Semaphore(PASS_CONCURRENCY)
        self.passes = 0  # passes run so far
        self.exported = 0  # objects (exported pieces of segments) written so far
        self.ticks = 0  # walks over the topics so far
        self.meter = TopicMeter(
            clock.monotonic
        )  # per-topic storage and export-backlog series, refreshed by each walk

    def add(self, topic: Topic) -> None:
        """Export `topic` (it has an exporter) from now on; the first pass comes at the next tick."""
        self._topics[topic] = _State()
        if self._task is None and not self._tasks.closed:
            self._task = self._tasks.spawn(self._run(), "durable-export")

    def remove(self, topic: Topic) -> None:
        """Stop exporting `topic` (a pass under way is cancelled by `Topic.close`, which awaits it)."""
        self._topics.pop(topic, None)
        self.meter.forget(topic)

    async def close(self) -> None:
        self._task = None
        await self._tasks.close()

    def __len__(self) -> int:
        return len(self._topics)

    async def _run(self) -> None:
        clock = self._clock
        while True:
            # A list of the topics, not of (topic, state) pairs: 100,000 fresh tuples living through the
            # walk would be promoted and walked by the garbage collector.
            for i, topic in enumerate(list(self._topics)):
                if i and i % SLICE == 0:
                    await asyncio.sleep(0)
                state = self._topics.get(topic)
                if state is None or topic.closing:
                    continue
                self.meter.update(topic)
                if state.running is not None:
                    continue
                if clock.monotonic() < state.not_before or not self._needs_pass(topic, state):
                    continue
                await self._slots.acquire()
                if topic.closing or self._topics.get(topic) is not state:  # removed meanwhile
                    self._slots.release()
                    continue
                task = self._tasks.spawn(self._pass(topic, state), f"export {topic.name}")
                task.add_done_callback(functools.partial(self._pass_done, topic, state))
                state.running = task
                topic.tasks.append(task)  # Topic.close cancels and awaits it (and keeps it referenced)
            for _ in range(PASS_CONCURRENCY):  # the walk's passes are done when every slot is free
                await self._slots.acquire()
            for _ in range(PASS_CONCURRENCY):
                self._slots.release()
            self.meter.walk_done()
            self.ticks += 1
            await clock.sleep(self.interval)

    def _needs_pass(self, topic: Topic, state: _State) -> bool:
        wal = topic.wal
        if wal is None or wal.closed:
            return False
        return state.pending or state.seen != _snapshot(topic)

    async def _pass(self, topic: Topic, state: _State) -> None:
        exporter, wal = topic.exporter, topic.wal
        assert exporter is not None and wal is not None
        try:
            seen = _snapshot(topic)
            max_age = self.segment_max_age
            if max_age and wal.active_bytes > 0 and wal.idle_seconds() >= max_age:
                await wal.rotate()
                seen = _snapshot(topic)
            recorded = await exporter.export_closed()
            self.exported += len(recorded)  # not `+= len(await ...)`: that reads the count before the wait
            dropped = await wal.drop_segments(await exporter.deletable(self.retention))
            if dropped:
                log.info("%s: %d WAL files are in the durable tier; deleted locally", topic.name, dropped)
            state.seen = seen
            state.pending = self._work_left(topic)
            state.failures = 0
            self.passes += 1
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            state.failures += 1
            delay = self.backoff.delay(state.failures, random.random())
            state.not_before = self._clock.monotonic() + delay
            state.pending = True
            log.warning("%s: export failed (%s); retry in %.1f s", topic.name, exc, delay)

    def _pass_done(self, topic: Topic, state: _State, task: asyncio.Task[None]) -> None:
        """A pass ended (or was cancelled, possibly before it started): free its slot."""
        state.running = None
        if task in topic.tasks:
            topic.tasks.remove(task)
        self._slots.release()

    def _work_left(self, topic: Topic) -> bool:
        """Whether time alone can make more work for this topic (no new append needed)."""
        wal = topic.wal
        assert wal is not None
        if self.segment_max_age and wal.active_bytes > 0:
            return True  # the active segment rotates once idle long enough
        sizes = [size for _, _, size in wal.segments()]
        # A closed file may be deleted later only if the files after it hold keep_bytes (retention.py).
        return len(sizes) > 1 and sum(sizes[1:]) >= self.retention.keep_bytes


def _snapshot(topic: Topic) -> tuple[int, int, int]:
    wal = topic.wal
    assert wal is not None
    return (wal.committed_offset, wal.first_offset, wal.segment_count)

"""Per-topic storage series: WAL and object bytes, start and end offsets, export backlog (docs/metrics.md).

Refreshed by the export walk (`ExportScheduler`, every `storage.durable.export_interval_seconds`) for each
reliable topic with a durable tier, never on the publish path. A topic whose WAL did not change since the
last walk and that has nothing left to export costs a tuple comparison.

The export backlog is what the WAL holds past the last exported record: the bytes of the WAL files holding
such records, and the age of the oldest one. The age is measured on the walk's clock: each walk that finds
the committed end moved notes (end, time); the oldest record not exported was committed no later than the
first note past it, so the age is a lower bound, short by at most one export interval (and counted from the
topic's load on this broker for records older than that). The active segment is exported once rotated
(`storage.durable.segment_max_age_seconds` idle, or full), so a healthy topic's age stays below about
that plus the export interval; an age far beyond it means exports fail.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ister.broker import metrics
from ister.broker.topic import Topic

NOTES = 64  # (end, time) notes kept per topic while exports lag: the oldest matter, newer ones are dropped


@dataclass(slots=True)
class _Marks:
    series: tuple[metrics.Child, ...]
    seen: tuple[int, int, int, int] = (-1, -1, -1, -1)  # committed, first offset, segments, exported end
    descriptors: object = None  # the exporter's descriptor list the object bytes were summed from
    notes: deque[tuple[int, float]] = field(default_factory=deque)
    age: float = 0.0


class TopicMeter:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._marks: dict[Topic, _Marks] = {}
        self._oldest = 0.0  # the oldest export backlog seen by the walk under way

    def forget(self, topic: Topic) -> None:
        self._marks.pop(topic, None)  # its series go with the topic (metrics.forget_topic)

    def walk_done(self) -> None:
        """The walk visited every topic: publish the oldest export backlog it saw."""
        metrics.export_backlog_oldest.set(self._oldest)
        self._oldest = 0.0

    def update(self, topic: Topic) -> None:
        wal, exporter = topic.wal, topic.exporter
        if wal is None or exporter is None or wal.closed:
            return
        marks = self._marks.get(topic)
        if marks is None:
            name = topic.name.full
            families = metrics.STORAGE_FAMILIES
            marks = self._marks[topic] = _Marks(tuple(f.labels(name) for f in families))
        wal_b, obj_b, start_g, end_g, backlog_b, backlog_age = marks.series
        descriptors = exporter.descriptors
        committed = wal.committed_offset
        exported = max(descriptors[-1].end_offset + 1 if descriptors else 0, topic.start_offset)
        now = self._clock()
        seen = (committed, wal.first_offset, wal.segment_count, exported)
        if seen != marks.seen:
            marks.seen = seen
            segments = wal.segments()
            wal_b.set(sum(size for _, _, size in segments))
            start_g.set(topic.start_offset)
            end_g.set(committed)
            # the files holding offsets >= exported: each but the last ends where the next one starts
            backlog = sum(
                size
                for i, (_, _, size) in enumerate(segments)
                if i + 1 == len(segments) or segments[i + 1][0] > exported
            )
            backlog_b.set(backlog if committed > exported else 0)
        if descriptors is not marks.descriptors:
            marks.descriptors = descriptors
            obj_b.set(sum(d.size for d in descriptors))
        notes = marks.notes
        if committed > exported:
            while notes and notes[0][0] <= exported:
                notes.popleft()
            if not notes or (notes[-1][0] < committed and len(notes) < NOTES):
                notes.append((committed, now))
            marks.age = now - notes[0][1]
        else:
            notes.clear()
            marks.age = 0.0
        backlog_age.set(marks.age)
        if marks.age > self._oldest:
            self._oldest = marks.age

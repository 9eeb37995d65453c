"""Offset reads of a reliable topic without a subscription or cursor (the batch API's Offsets and Read)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator

from ister.broker.topic import Topic
from ister.broker.topics import TopicRegistry
from ister.errors import FailedPrecondition, InvalidArgument, Unavailable
from ister.ids import TopicName
from ister.limits import MAX_READ_OFFSET
from ister.storage.topic_storage import StoredOffsets, TopicStorage


class OffsetReads:
    def __init__(self, topics: TopicRegistry, storage: TopicStorage) -> None:
        self.topics = topics
        self.storage = storage

    async def reliable_topic(self, topic_name: str) -> Topic:
        """The loaded reliable topic (this broker must own it: UNAVAILABLE otherwise, as for every call)."""
        name = TopicName.parse(topic_name)
        topic = await self.topics.get(name)
        if topic.wal is None:
            raise FailedPrecondition(f"topic {name} is not reliable; only reliable topics have offsets")
        return topic

    async def stored_offsets(self, topic_name: str) -> StoredOffsets:
        topic = await self.reliable_topic(topic_name)
        assert topic.wal is not None
        found = await self.storage.stored_offsets(topic.name, topic.wal, topic.exporter)
        if found.earliest < topic.start_offset:  # retention deleted what lies below it
            found = dataclasses.replace(found, earliest=min(topic.start_offset, found.next))
        return found

    async def read_range(
        self, topic_name: str, start: int, end: int, max_records: int, max_bytes: int
    ) -> AsyncGenerator[list[tuple[int, bytes]], None]:
        """Batches of stored (offset, record) with start <= offset < min(end, head now), in offset order.

        Reads objects, then the WAL, like a subscription's reader, but never waits for new records. Offsets
        that are not stored (below the earliest, a gap after a failover without seal) are absent. Raises
        Unavailable when the topic leaves this broker during the read (the caller resumes elsewhere).
        """
        if start > end:
            raise InvalidArgument(f"bad offset range: start {start} is after end {end}")
        if end > MAX_READ_OFFSET:
            raise InvalidArgument(f"end {end} is above 2^63")
        if max_records < 1 or max_bytes < 1:
            raise InvalidArgument("max_records and max_bytes must be >= 1")
        topic = await self.reliable_topic(topic_name)
        wal = topic.wal
        assert wal is not None
        stop = min(end, wal.committed_offset)
        start = max(start, topic.start_offset)  # below it, retention deleted the records
        if start < wal.first_offset:
            start = max(start, await self.storage.earliest(topic.name, wal))
        if start >= stop:
            return
        reader = self.storage.reader(topic.name, wal, start)
        reader.strict_start = True  # a read that starts in lost or damaged data with no copy: DATA_LOSS
        expected = start
        try:
            while reader.next_offset < stop:
                if self.topics.topics.get(topic.name.full) is not topic:
                    raise Unavailable(f"topic {topic.name} moved during the read; redo the lookup")
                want = min(max_records, stop - reader.next_offset)
                # timeout=0: what is committed is returned at once; nothing is ever waited for.
                records = await reader.read(want, max_bytes, timeout=0)
                if records and (records[0][0] != expected or records[-1][0] - records[0][0] >= len(records)):
                    _report_gaps(topic, expected, records, stop)
                if not records or records[0][0] >= stop:
                    if reader.next_offset > expected:
                        topic.report_gap(expected, min(reader.next_offset, stop))
                    return
                if records[-1][0] >= stop:  # only after skipping a gap past `stop`
                    records = [r for r in records if r[0] < stop]
                expected = records[-1][0] + 1
                yield records
        finally:
            reader.close()


def _report_gaps(topic: Topic, expected: int, records: list[tuple[int, bytes]], stop: int) -> None:
    """Tell the topic about offsets a ranged read found missing before and between `records`."""
    for offset, _ in records:
        if offset >= stop:
            topic.report_gap(expected, stop)
            return
        if offset > expected:
            topic.report_gap(expected, offset)
        expected = offset + 1

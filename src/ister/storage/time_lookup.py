"""The first offset of a reliable topic whose record was published at or after a time, without a scan.

Units are searched in offset order: durable objects first (their descriptors carry the publish-time range
of their records, `min_publish_time_ms`/`max_publish_time_ms`), then the WAL's segment files (their first
records' publish times, read one each, bisected). Inside the one unit that holds the answer, a binary
search over the unit's sparse index reads one record per entry it visits, and one read of the interval
between two entries (at most INDEX_EVERY_FRAMES records) finds the record. So a lookup in a topic of a
million records reads a few dozen records, whatever the topic's length.

Publish times are the producers' clocks (core/publish_time.py has the rule the search follows).
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Sequence

from crc32c import crc32c

from ister.core.frames import HEADER, HEADER_SIZE
from ister.core.publish_time import first_unit, publish_time_of
from ister.errors import CorruptionError
from ister.ids import TopicName
from ister.metadata.store import MetadataStore
from ister.storage.objects.catalog import ObjectDescriptor, list_descriptors
from ister.storage.objects.segment import SegmentLayout, read_layout, read_segment_runs
from ister.storage.objects.store import ObjectStore
from ister.storage.wal import Wal

log = logging.getLogger(__name__)

PROBE_BYTES = 512  # the first GET of a probe inside an object: a record's header and, mostly, the record
INTERVAL_RECORDS = 1_000  # at most one index interval is read whole
TOO_OLD = -1

# (offset probed) -> (offset found, its publish time), or None when nothing is stored at or after it.
Probe = Callable[[int], Awaitable[tuple[int, int] | None]]


async def offset_for_time(
    name: TopicName,
    wal: Wal,
    objects: ObjectStore | None,
    metadata: MetadataStore,
    t_ms: int,
    earliest: int,
) -> int:
    """The first offset >= `earliest` whose record has publish time >= `t_ms`; the head (`next`) when
    every stored record is older. `metadata` is the MetadataStore holding the object descriptors."""
    head = wal.committed_offset
    if earliest >= head:
        return head
    wal_from = earliest
    if objects is not None:
        descriptors = [d for d in await list_descriptors(metadata, name) if d.end_offset >= earliest]
        i = first_unit([d.max_publish_time_ms for d in descriptors], t_ms)
        for d in descriptors[i:]:
            found = await _in_object(objects, d, t_ms, max(earliest, d.start_offset))
            if found is not None:
                return min(found, head)
        if descriptors:
            wal_from = max(wal_from, descriptors[-1].end_offset + 1)
    found = await _in_wal(wal, t_ms, wal_from, head)
    return min(found, head)


# -- objects --------------------------------------------------------------------------------------------
async def _in_object(store: ObjectStore, d: ObjectDescriptor, t_ms: int, lo: int) -> int | None:
    """The answer inside one object, or None when all of its records from `lo` on are older."""
    if d.max_publish_time_ms is not None and d.max_publish_time_ms < t_ms:
        return None
    if d.min_publish_time_ms is not None and d.min_publish_time_ms >= t_ms:
        return lo
    layout = await read_layout(store, d.key)
    entries = [e for e in layout.index if e[0] >= lo]
    if not entries or entries[0][0] != lo:
        entries.insert(0, (lo, -1))  # -1: position unknown, read through the records below

    async def probe(offset: int) -> tuple[int, int] | None:
        pos = _position(layout, offset)
        if pos is None:
            return await _first_in_range(store, d.key, offset, offset, t_ms=None)
        return await _probe_object(store, d.key, layout, offset, pos)

    start, stop = await _bisect_entries([e[0] for e in entries], probe, t_ms, d.end_offset + 1)
    found = await _first_in_range(store, d.key, start, stop - 1, t_ms)
    return found[0] if found is not None else (stop if stop <= d.end_offset else None)


def _position(layout: SegmentLayout, offset: int) -> int | None:
    i = bisect_left(layout.index, offset, key=lambda e: e[0])
    if i < len(layout.index) and layout.index[i][0] == offset:
        return layout.index[i][1]
    return None


async def _probe_object(
    store: ObjectStore, key: str, layout: SegmentLayout, offset: int, pos: int
) -> tuple[int, int] | None:
    """The publish time of the record whose frame starts at byte `pos` of the object (an index entry)."""
    end = min(pos + PROBE_BYTES, layout.footer.index_pos)
    data = layout.body_from_tail(pos, end)
    if data is None:
        data = await store.get_range(key, pos, end)
    if len(data) < HEADER_SIZE:
        raise CorruptionError(f"object {key!r}: short frame at byte {pos}")
    got, length, crc = HEADER.unpack_from(data, 0)
    if got != offset:
        raise CorruptionError(f"object {key!r}: byte {pos} holds offset {got}, its index says {offset}")
    if HEADER_SIZE + length > len(data):
        data = await store.get_range(key, pos, pos + HEADER_SIZE + length)
    record = memoryview(data)[HEADER_SIZE : HEADER_SIZE + length]
    if len(record) != length or crc32c(record) != crc:
        raise CorruptionError(f"object {key!r}: the frame of offset {offset} is damaged")
    t = publish_time_of(record)
    return (offset, TOO_OLD if t is None else t)


async def _first_in_range(
    store: ObjectStore, key: str, lo: int, hi: int, t_ms: int | None
) -> tuple[int, int] | None:
    """(offset, publish time) of the first record in [lo, hi] with publish time >= `t_ms` (None: the first
    record at all), read with the object's checks; None if there is none."""
    async for first, payloads in read_segment_runs(store, key, lo, hi):
        for i, record in enumerate(payloads):
            t = publish_time_of(record)
            t = TOO_OLD if t is None else t
            if t_ms is None or t >= t_ms:
                return first + i, t
    return None


# -- the WAL --------------------------------------------------------------------------------------------
async def wal_offset_for_time(wal: Wal, t_ms: int, earliest: int) -> int:
    """As `offset_for_time` within the local WAL only (no metadata, no durable tier): for a caller that knows
    the WAL's first record is older than `t_ms`."""
    return await _in_wal(wal, t_ms, max(earliest, wal.first_offset), wal.committed_offset)


async def _in_wal(wal: Wal, t_ms: int, lo: int, head: int) -> int:
    segments = [
        s
        for s in wal.segments_snapshot()
        if s.end_offset > s.first_offset and s.end_offset > lo and s.first_offset < head
    ]
    if not segments:
        return head

    async def probe(offset: int) -> tuple[int, int] | None:
        records = await _wal_read(wal, offset, 1)
        if not records:
            return None
        t = publish_time_of(records[0][1])
        return records[0][0], TOO_OLD if t is None else t

    # The segment that holds the answer: the last one whose first record is older than t_ms.
    starts = [max(s.first_offset, lo) for s in segments]
    first, _ = await _bisect_entries(starts, probe, t_ms, head)
    j = starts.index(first)
    seg = segments[j]
    end = min(seg.end_offset, head)
    entries = sorted({first, *(o for o, _ in seg.index.entries if first < o < end)})
    start, stop = await _bisect_entries(entries, probe, t_ms, end)
    found = await _wal_first(wal, start, stop, t_ms)
    if found is not None:
        return found
    if stop < end:
        return stop  # the index entry the search found at or after t_ms
    return starts[j + 1] if j + 1 < len(starts) else head


async def _wal_read(wal: Wal, offset: int, n: int) -> list[tuple[int, bytes]]:
    if offset >= wal.committed_offset:
        return []
    reader = wal.reader(max(offset, wal.first_offset))
    try:
        return await reader.read(max_records=n, timeout=0)
    finally:
        reader.close()


async def _wal_first(wal: Wal, start: int, stop: int, t_ms: int) -> int | None:
    offset = start
    while offset < stop:
        records = await _wal_read(wal, offset, min(INTERVAL_RECORDS, stop - offset))
        if not records:
            return None
        for at, record in records:
            if at >= stop:
                return None
            t = publish_time_of(record)
            if t is not None and t >= t_ms:
                return at
        offset = records[-1][0] + 1
    return None


# -- the search ------------------------------------------------------------------------------------------
async def _bisect_entries(entries: Sequence[int], probe: Probe, t_ms: int, end: int) -> tuple[int, int]:
    """[start, stop): the interval between two consecutive `entries` (offsets, ascending; the last runs to
    `end`) where the publish time reaches `t_ms`: the record at `start` is older than `t_ms` (or `start` is
    the first entry), the one at `stop` is not (or `stop` is `end`)."""
    lo, hi = 0, len(entries)  # answer index in [lo, hi): entries[lo] is older (or the first)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        got = await probe(entries[mid])
        if got is None or got[1] >= t_ms:
            hi = mid
        else:
            lo = mid
    stop = entries[hi] if hi < len(entries) else end
    return entries[lo], stop

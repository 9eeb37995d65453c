"""Idempotent publishes on a reliable topic: the dedup table (core/dedup.py) driven by the publish path.

The table is rebuilt when the topic loads (restart, move, failover) by reading the log's tail: the records
published within the window (found by publish time), at most `scan_max_records` of them, through the
topic's reader (durable tier, then WAL), so it also works where the WAL was trimmed or the topic moved.
Idempotent publishes wait for that scan (bounded: Unavailable after READY_TIMEOUT_SECONDS, which the client
retries); others never wait. docs/idempotence.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

import msgspec

from ister.broker import metrics
from ister.config import IdempotenceSettings
from ister.core.dedup import DedupTable, StoredBatch
from ister.core.record import idem_tag_of, publish_time_of, tag_record
from ister.errors import InvalidArgument, IsterError, StorageExhausted, Unavailable
from ister.ids import TopicName
from ister.storage.objects.tiered import TieredReader
from ister.storage.time_lookup import wal_offset_for_time
from ister.storage.topic_storage import TopicStorage
from ister.storage.wal import Wal, WalReader

log = logging.getLogger(__name__)

READY_TIMEOUT_SECONDS = 10.0
SCAN_RETRY_SECONDS = 2.0
SCAN_READ_RECORDS = 4_096
SCAN_READ_TIMEOUT_SECONDS = 1.0

Records = list[bytes | msgspec.Raw]
Publish = Callable[[Sequence[bytes | msgspec.Raw], Callable[[int], None]], Awaitable[int]]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class TopicDedup:
    """One reliable topic's idempotence state. Single-threaded (the event loop)."""

    def __init__(self, topic: str, settings: IdempotenceSettings) -> None:
        self.topic = topic
        self.settings = settings
        self.table = DedupTable(
            settings.max_producers, int(settings.window_seconds * 1000), settings.max_batches
        )
        self._evicted = 0  # the table's evictions counted in the metric so far
        self.ready = asyncio.Event()
        # (key, first sequence) -> the append of a batch still in flight: its retries wait for it
        self._inflight: dict[tuple[int, int], asyncio.Future[int]] = {}

    # -- rebuilding ------------------------------------------------------------------------------------------
    async def replay(self, reader: TieredReader | WalReader, start: int, end: int) -> None:
        """Restore the tags of records [start, end), read with `reader` (positioned at `start`)."""
        restore = self.table.restore
        offset = start
        while offset < end:
            records = await reader.read(SCAN_READ_RECORDS, timeout=SCAN_READ_TIMEOUT_SECONDS)
            if not records:
                break
            for off, data in records:
                if off >= end:
                    break
                tag = idem_tag_of(data)
                if tag is not None:
                    restore(*tag, off, publish_time_of(data) or now_ms())
            offset = records[-1][0] + 1

    # -- publishing ------------------------------------------------------------------------------------------
    def publish(
        self,
        key: int,
        first_seq: int,
        records: Records,
        publish: Publish,
        committed: Callable[[int], Awaitable[None]],
    ) -> asyncio.Future[int]:
        """Store `records` once for (key, first_seq); the future gives their first offset: a retry of a stored
        batch gets the original offsets (waiting for it while it is in flight), nothing stored again.

        Decided now when the table is ready (a refusal raises here, like any bad batch), so the append starts
        in the caller's order with no extra task in between; later otherwise."""
        if self.ready.is_set():
            return self._start(key, first_seq, records, publish, committed)
        return asyncio.ensure_future(self._when_ready(key, first_seq, records, publish, committed))

    async def _when_ready(
        self,
        key: int,
        first_seq: int,
        records: Records,
        publish: Publish,
        committed: Callable[[int], Awaitable[None]],
    ) -> int:
        try:
            async with asyncio.timeout(READY_TIMEOUT_SECONDS):
                await self.ready.wait()
        except TimeoutError:
            raise Unavailable(f"{self.topic}: rebuilding its idempotence table; retry") from None
        return await self._start(key, first_seq, records, publish, committed)

    def _start(
        self,
        key: int,
        first_seq: int,
        records: Records,
        publish: Publish,
        committed: Callable[[int], Awaitable[None]],
    ) -> asyncio.Future[int]:
        count = len(records)
        try:
            verdict = self.table.check(key, first_seq, count, now_ms())
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        except IsterError:
            metrics.idempotent_refused.inc()
            raise
        dup = verdict.duplicate
        if dup is not None:
            metrics.idempotent_duplicates.inc(count)
            return self._original(key, dup, committed)
        batch = self.table.accept(key, first_seq, count, now_ms())
        evicted = self.table.evicted
        if evicted > self._evicted:
            metrics.idempotent_evicted.inc(evicted - self._evicted)
        self._evicted = evicted
        records[0] = tag_record(records[0], key, first_seq, count)
        fut = asyncio.ensure_future(publish(records, lambda offset: self.table.stored(batch, offset)))
        k = (key, first_seq)
        self._inflight[k] = fut
        fut.add_done_callback(lambda f: self._done(k, key, batch, f))
        return fut

    def _done(self, k: tuple[int, int], key: int, batch: StoredBatch, fut: asyncio.Future[int]) -> None:
        if self._inflight.get(k) is fut:
            del self._inflight[k]
        if fut.cancelled():
            exc: BaseException | None = asyncio.CancelledError()
        else:
            exc = fut.exception()
        if exc is None:
            return
        # Nothing stored: failed before the WAL took the offsets, or refused by its writer for want of
        # space (which hands the offsets back). Otherwise (a timeout, the caller gone) the WAL still writes
        # the records: the batch stays, and its retry waits for them to be committed.
        if batch.first_offset is None or isinstance(exc, StorageExhausted):
            batch.first_offset = None
            self.table.failed(key, batch)

    def _original(
        self, key: int, dup: StoredBatch, committed: Callable[[int], Awaitable[None]]
    ) -> asyncio.Future[int]:
        fut = self._inflight.get((key, dup.first_seq))
        if fut is not None:
            return asyncio.shield(fut)  # a retry that goes away must not cancel the first copy's append
        return asyncio.ensure_future(self._after_commit(dup, committed))

    async def _after_commit(self, dup: StoredBatch, committed: Callable[[int], Awaitable[None]]) -> int:
        if dup.first_offset is None:
            raise Unavailable(f"{self.topic}: the first copy of this batch is still being stored; retry")
        # Its first append is over; when that one failed after the WAL took it (its replicas were too
        # slow), the retry is acknowledged only once the records are committed.
        await committed(dup.first_offset + dup.count)
        return dup.first_offset


async def rebuild_from_log(dedup: TopicDedup, storage: TopicStorage, name: TopicName, wal: Wal) -> None:
    """Rebuild `dedup` from the topic's stored tail; retried (every SCAN_RETRY_SECONDS) until it succeeds
    or the topic unloads (this task is cancelled). Idempotent publishes wait for it meanwhile.

    The scan reads up to what is durable here, past what readers may see yet: a promoted follower holds
    records its predecessor acknowledged that it has not counted as committed itself yet (it will: a new
    leader's log is the one its followers keep)."""
    settings = dedup.settings
    while True:
        head = wal.durable_offset
        try:
            if head == 0:  # a new topic: nothing to learn
                dedup.ready.set()
                return
            since = now_ms() - int(settings.window_seconds * 1000)
            start = await _scan_start(storage, name, wal, head, since, settings.scan_max_records)
            local = max(start, min(wal.first_offset, head))
            if start < local:  # below the WAL: the durable tier
                tiered = storage.reader(name, wal, start)
                try:
                    await dedup.replay(tiered, start, local)
                finally:
                    tiered.close()
            reader = wal.reader(local, durable=True)
            try:
                await dedup.replay(reader, local, head)
            finally:
                reader.close()
            dedup.ready.set()
            if len(dedup.table):
                n = len(dedup.table)
                log.info(
                    "%s: idempotence: %d producers restored from offsets %d..%d", name, n, start, head - 1
                )
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s: rebuilding the idempotence table failed (%s); retrying", name, exc)
            t = dedup.table
            dedup.table = DedupTable(t.max_producers, t.window_ms, t.max_batches)
            await asyncio.sleep(SCAN_RETRY_SECONDS)


async def _scan_start(
    storage: TopicStorage, name: TopicName, wal: Wal, head: int, since: int, max_records: int
) -> int:
    """Where the scan starts. When the local WAL's first record is older than the window, the window lies
    in the WAL: no metadata or durable-tier call (a broker loading many topics makes none per topic)."""
    first = wal.first_offset
    if first < head:
        reader = wal.reader(first, durable=True)
        try:
            records = await reader.read(1, timeout=SCAN_READ_TIMEOUT_SECONDS)
        finally:
            reader.close()
        t = publish_time_of(records[0][1]) if records else None
        if t is not None and t < since:
            start = max(first, head - max_records)
            if start < wal.committed_offset:
                start = max(start, await wal_offset_for_time(wal, since, start))
            return start
    start = max(await storage.earliest(name, wal), head - max_records)
    if start < wal.committed_offset:
        start = max(start, await storage.offset_for_time(name, wal, since))
    return start

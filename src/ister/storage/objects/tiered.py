"""TieredReader: durable objects for offsets below the WAL, then the WAL, then live appends.

Same interface as `WalReader` (`read`, `available`, `close`, `next_offset`, `closed`, `skipped`,
`damaged`, `strict_start`), so the broker can use it wherever it used `wal.reader(start)`. One
`next_offset` drives every source, so no offset is returned twice and none is skipped, except:

- a hole in the durable tier below the WAL (offsets that no object holds and the WAL no longer has, e.g.
  the un-exported tail of a broker that failed without a seal): skipped with a warning, listed in `skipped`;
- a hole in the WAL (a range lost below its high-water mark or damaged in a segment file, `Wal.holes()`):
  read from the objects when a descriptor covers it (logged once per hole), otherwise skipped, logged once
  per hole as data loss and listed in both `skipped` and `damaged` (or DataLoss with `strict_start`).

Skipped ranges are (first, last), inclusive. One `read` never returns records from both sides of a skip.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from ister.core.frameblock import FrameBlock
from ister.errors import CorruptionError, CorruptRange, DataLoss, NotFound, OffsetOutOfRange, StorageError
from ister.limits import MiB
from ister.metadata.keys import TopicLike
from ister.metadata.store import MetadataStore
from ister.storage.wal import Wal, WalReader
from ister.storage.wal.holes import Hole

from . import catalog
from .catalog import DEFAULT_METADATA_TIMEOUT, ObjectDescriptor
from .segment import READ_CHUNK, read_segment_blocks
from .store import ObjectStore

log = logging.getLogger(__name__)

Record = tuple[int, bytes]


class TieredReader:
    """Reads `topic` from `start`: objects (by descriptor, one object at a time, ranged GETs of
    `chunk_bytes`), then `wal.reader(...)` from the WAL's first offset on, which continues live.

    `read(timeout=...)` applies its timeout only to waiting for new records (the WAL/live phase); reads
    from objects always fetch and are bounded by the object store's own timeouts.
    """

    def __init__(
        self,
        topic: TopicLike,
        wal: Wal,
        object_store: ObjectStore,
        metadata_store: MetadataStore,
        start: int,
        *,
        chunk_bytes: int = READ_CHUNK,
        metadata_timeout: float = DEFAULT_METADATA_TIMEOUT,
    ) -> None:
        if start < 0:
            raise ValueError("start must be >= 0")
        if start > wal.next_offset:
            raise OffsetOutOfRange(f"offset {start} is beyond the WAL's next offset {wal.next_offset}")
        self.topic = topic
        self._wal = wal
        self._objects = object_store
        self._metadata = metadata_store
        self._chunk_bytes = chunk_bytes
        self._metadata_timeout = metadata_timeout
        self._next = start  # used while no WAL reader is active
        self._wal_reader: WalReader | None = (
            wal.reader(start, skip_holes=False) if start >= wal.first_offset else None
        )
        self._wal_missing: int | None = None  # the offset at which the WAL last said "not here"
        self._hole: Hole | None = None  # the WAL hole holding the next offset (read from objects)
        self._descriptors: list[ObjectDescriptor] | None = None
        self._batches: AsyncIterator[FrameBlock] | None = None
        self._object_end = -1
        self._pending: FrameBlock | None = None  # read from the object, not yet returned
        self._ahead: asyncio.Future[FrameBlock | None] | None = None  # the object's next chunk, being read
        self._reading = False
        self._closed = False
        self.skipped: list[tuple[int, int]] = []  # holes skipped: (first, last) offsets
        self.damaged: list[tuple[int, int]] = []  # the skipped ones that were lost or damaged data
        self.strict_start = False  # raise DataLoss for a damaged range met before the first record
        # The topic's start offset (retention); a skip up to it is expected, not a gap to warn about.
        self.start_floor: Callable[[], int] = _zero
        self._returned = False

    @property
    def next_offset(self) -> int:
        return self._wal_reader.next_offset if self._wal_reader is not None else self._next

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_objects(self) -> bool:
        """True while reading from the durable tier."""
        return self._wal_reader is None

    def available(self) -> int:
        return max(0, self._wal.committed_offset - self.next_offset)

    def close(self) -> None:
        self._closed = True
        if self._wal_reader is not None:
            self._wal_reader.close()
        self._drop_batches()
        self._pending = None

    def _drop_batches(self) -> None:
        """Forget the object being read (and cancel its read-ahead)."""
        if self._ahead is not None:
            self._ahead.cancel()
            self._ahead = None
        self._batches = None

    async def read(
        self,
        max_records: int = 512,
        max_bytes: int = 4 * MiB,
        timeout: float | None = None,  # noqa: ASYNC109 (same signature as WalReader.read)
    ) -> list[Record]:
        """>= 1 consecutive records from next_offset, or [] when `timeout` passes with nothing new (live).

        Raises StorageError once the WAL is closed and everything was returned, or if this reader was
        closed; CorruptionError for a damaged object; ObjectStoreUnavailable (retriable) when the object
        store fails (the next call retries from the same offset).
        """
        got = await self.read_frames(max_records, max_bytes, timeout)
        return got.records() if isinstance(got, FrameBlock) else got

    async def read_frames(
        self,
        max_records: int = 512,
        max_bytes: int = 4 * MiB,
        timeout: float | None = None,  # noqa: ASYNC109 (same signature as WalReader.read)
    ) -> list[Record] | FrameBlock:
        """As `read`, but what comes from the durable tier comes as a `FrameBlock`: the object's frames as
        they sit in it, checked once, no record copied (`max_bytes` then counts frame bytes). Records from the
        WAL come as `read` returns them."""
        if max_records < 1 or max_bytes < 1:
            raise ValueError("max_records and max_bytes must be >= 1")
        if self._reading:
            raise RuntimeError("TieredReader.read called concurrently on the same reader")
        self._reading = True
        try:
            return await self._read(max_records, max_bytes, timeout)
        finally:
            self._reading = False

    async def _read(
        self,
        max_records: int,
        max_bytes: int,
        timeout: float | None,  # noqa: ASYNC109 (passed to WalReader.read)
    ) -> list[Record] | FrameBlock:
        while True:
            if self._closed:
                raise StorageError("reader closed")
            reader = self._wal_reader
            if reader is not None:
                try:
                    records = await reader.read(max_records, max_bytes, timeout)
                except OffsetOutOfRange:
                    # The WAL no longer holds next_offset (retention removed its file): use the objects.
                    self._next = reader.next_offset
                    self._wal_missing = self._next
                    reader.close()
                    self._wal_reader = None
                    continue
                except CorruptRange as exc:
                    # Lost or damaged in the WAL: the objects may hold a good copy.
                    self._next = reader.next_offset
                    self._hole = self._wal.hole_at(self._next) or Hole(exc.first, exc.end, False, str(exc))
                    reader.close()
                    self._wal_reader = None
                    continue
                if records:
                    self._returned = True
                return records
            block = await self._read_objects(max_records, max_bytes)
            if block is not None:
                self._returned = True
                return block

    def _take(self, pending: FrameBlock, max_records: int, max_bytes: int) -> FrameBlock:
        n = pending.prefix(max_records, max_bytes)
        out = pending.slice(pending.first, pending.first + n)
        self._pending = pending.slice(out.end, pending.end) if n < pending.count else None
        self._next = out.end
        return out

    async def _read_objects(self, max_records: int, max_bytes: int) -> FrameBlock | None:
        """Frames from the current object, or None after switching source (the caller loops)."""
        if self._pending is not None:
            return self._take(self._pending, max_records, max_bytes)
        if self._batches is not None:
            ahead, self._ahead = self._ahead, None
            try:
                batch = await (ahead if ahead is not None else _next_block(self._batches))
            except NotFound:
                # Retention deleted the object (its descriptor went first): look the catalog up again,
                # which now starts at the topic's start offset.
                self._drop_batches()
                self._descriptors = None
                return None
            except BaseException:
                self._drop_batches()  # the next read starts again from self._next
                raise
            if batch is None:
                self._batches = None
                if self._next != self._object_end + 1:
                    raise CorruptionError(
                        f"object of {self.topic} ended at offset {self._next - 1}, "
                        f"expected {self._object_end}"
                    )
                return None
            if batch.first != self._next:
                self._drop_batches()
                raise CorruptionError(
                    f"object of {self.topic} continues at offset {batch.first}, expected {self._next}"
                )
            if batch.end <= self._object_end:
                # Read ahead: the next ranged GET runs while this chunk is delivered.
                self._ahead = asyncio.ensure_future(_next_block(self._batches))
                self._ahead.add_done_callback(_retrieve)
            return self._take(batch, max_records, max_bytes)
        await self._choose_source()
        return None

    async def _choose_source(self) -> None:
        offset = self._next
        wal = self._wal
        first = wal.first_offset
        hole = self._hole
        if hole is not None and not hole.first <= offset < hole.end:
            hole = self._hole = None
        if hole is None and offset >= first:
            hole = self._hole = wal.hole_at(offset)
        if offset >= first and self._wal_missing != offset and hole is None:
            self._wal_reader = wal.reader(offset, skip_holes=False)
            return
        desc = await self._find(offset)
        if desc is not None and desc.start_offset <= offset:
            end = min(desc.end_offset, first - 1) if offset < first else desc.end_offset
            if hole is not None:
                end = min(end, hole.end - 1)
                if wal.damage.first_report(hole, "tier"):
                    log.warning(
                        "%s: offsets %d..%d are lost or damaged in the local WAL (%s); reading them from "
                        "the durable tier",
                        self.topic,
                        hole.first,
                        hole.end - 1,
                        hole.why,
                    )
            self._batches = read_segment_blocks(
                self._objects, desc.key, offset, end, chunk_bytes=self._chunk_bytes
            )
            self._object_end = end
            return
        if hole is not None:
            target = hole.end
            if desc is not None and offset < desc.start_offset < target:
                target = desc.start_offset  # the tier holds a later part of the hole
            if self.strict_start and not self._returned:
                raise DataLoss(
                    f"offsets {offset}..{target - 1} of {self.topic} are lost or damaged in the WAL and the "
                    f"durable tier holds no copy ({hole.why})"
                )
            if wal.damage.first_report(hole, "lost"):
                log.error(
                    "%s: offsets %d..%d are lost or damaged in the local WAL (%s) and the durable tier holds "
                    "no copy: readers skip them (data loss)",
                    self.topic,
                    offset,
                    target - 1,
                    hole.why,
                )
            self.skipped.append((offset, target - 1))
            self.damaged.append((offset, target - 1))
            self._next = target
            return
        targets = [t for t in (desc.start_offset if desc else None, first) if t is not None and t > offset]
        if not targets:
            raise OffsetOutOfRange(f"offset {offset} of {self.topic} is neither in the WAL nor in an object")
        target = min(targets)
        log.log(
            logging.INFO if self.below_start(target) else logging.WARNING,
            "%s: offsets %d..%d are in neither the durable tier nor the WAL (deleted by retention, or a "
            "known gap after a failover without seal); skipping to %d",
            self.topic,
            offset,
            target - 1,
            target,
        )
        self.skipped.append((offset, target - 1))
        self._next = target
        self._wal_missing = None

    def below_start(self, target: int) -> bool:
        return target <= self.start_floor()

    async def _find(self, offset: int) -> ObjectDescriptor | None:
        """The descriptor holding `offset` or the next one after it; re-lists the catalog on a miss."""
        if self._descriptors is not None:
            desc = catalog.covering(self._descriptors, offset)
            if desc is not None:
                return desc
        self._descriptors = await catalog.list_descriptors(
            self._metadata, self.topic, timeout=self._metadata_timeout
        )
        return catalog.next_descriptor(self._descriptors, offset)


def _zero() -> int:
    return 0


async def _next_block(blocks: AsyncIterator[FrameBlock]) -> FrameBlock | None:
    """The next chunk of an object, None at its end."""
    try:
        return await anext(blocks)
    except StopAsyncIteration:
        return None


def _retrieve(future: asyncio.Future[FrameBlock | None]) -> None:
    """A read-ahead's failure is raised by the read that awaits it; one nobody awaits (the reader was closed
    or moved on) is dropped here rather than logged as never retrieved."""
    if not future.cancelled():
        future.exception()


__all__ = ["TieredReader"]
